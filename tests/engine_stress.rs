//! Stress: two threads mix schedule, cancel and reset, more than a million operations in all,
//! and hand some handles to each other to cancel across threads. Checks, after quiescence:
//! scheduled = fired + cancelled + pending (each equal to what the threads observed), every
//! task ran at most once and never before its deadline, and no task whose `cancel()`
//! returned true ever ran.

mod support;

use shardwheel::{Timer, TimerHandle};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};
use support::{Rng, wait_until};

/// Operations per thread (schedule, cancel, reset, or a cancel from the other thread).
const OPS_PER_THREAD: usize = 1_000_000;
const THREADS: usize = 2;
/// Above this many live timers a thread stops scheduling more.
const MAX_LIVE: usize = 20_000;
const LONG: Duration = Duration::from_secs(3600);

/// Per timer id, written by tasks and cancellers.
struct Shared {
    base: Instant,
    runs: Vec<AtomicU32>,
    ran_at: Vec<AtomicU64>,
    cancels: Vec<AtomicU32>,
}

/// Per timer id, known only to its owning thread.
#[derive(Clone, Copy, Default)]
struct Owned {
    /// Nanoseconds since `base` before which the task must not run (from the last schedule or
    /// successful reset).
    not_before: u64,
    /// Its last deadline (schedule or successful reset) is an hour away: it must still be
    /// pending at the end unless cancelled.
    long: bool,
    resets: u32,
}

struct Report {
    owned: Vec<Owned>,
    scheduled: u64,
    resets: u64,
    ops: u64,
    /// Handles still held at the end (kept alive until the checks are done).
    _live: Vec<TimerHandle>,
}

fn nanos_since(base: Instant, instant: Instant) -> u64 {
    instant.duration_since(base).as_nanos() as u64
}

fn worker(
    t: usize,
    timer: Timer,
    shared: Arc<Shared>,
    to_other: mpsc::Sender<(usize, TimerHandle)>,
    from_other: mpsc::Receiver<(usize, TimerHandle)>,
) -> Report {
    let mut rng = Rng::new(0xC0FFEE + t as u64);
    let first_id = t * OPS_PER_THREAD;
    let mut owned = vec![Owned::default(); OPS_PER_THREAD];
    let mut live: Vec<(usize, TimerHandle)> = Vec::new();
    let (mut scheduled, mut resets, mut ops) = (0u64, 0u64, 0u64);
    let cancel = |id: usize, handle: &TimerHandle| {
        if handle.cancel() {
            shared.cancels[id].fetch_add(1, Ordering::SeqCst);
        }
    };
    let random_delay = |rng: &mut Rng, long_percent: u64| {
        if rng.below(100) < long_percent {
            LONG
        } else {
            Duration::from_micros(rng.below(3000))
        }
    };
    for iteration in 0..OPS_PER_THREAD {
        if iteration % 16 == 0 {
            while let Ok((id, handle)) = from_other.try_recv() {
                cancel(id, &handle);
            }
        }
        let roll = rng.below(100);
        if live.is_empty() || (roll < 40 && live.len() < MAX_LIVE) {
            let id = first_id + scheduled as usize;
            let delay = random_delay(&mut rng, 20);
            let task_shared = shared.clone();
            let before = Instant::now();
            let handle = timer
                .schedule(delay, move || {
                    let now = nanos_since(task_shared.base, Instant::now());
                    task_shared.ran_at[id].store(now, Ordering::SeqCst);
                    task_shared.runs[id].fetch_add(1, Ordering::SeqCst);
                })
                .expect("schedule");
            owned[id - first_id] = Owned {
                not_before: nanos_since(shared.base, before) + delay.as_nanos() as u64,
                long: delay == LONG,
                resets: 0,
            };
            scheduled += 1;
            live.push((id, handle));
        } else if roll < 65 {
            let (id, handle) = live.swap_remove(rng.below(live.len() as u64) as usize);
            cancel(id, &handle);
        } else if roll < 92 {
            let index = rng.below(live.len() as u64) as usize;
            let (id, handle) = &live[index];
            let delay = random_delay(&mut rng, 10);
            let before = Instant::now();
            if handle.reset(delay) {
                let entry = &mut owned[id - first_id];
                entry.not_before = nanos_since(shared.base, before) + delay.as_nanos() as u64;
                entry.long = delay == LONG;
                entry.resets += 1;
                resets += 1;
            } else {
                live.swap_remove(index);
            }
        } else {
            // The other thread cancels this one (we keep our handle, and may still cancel
            // or reset it ourselves).
            let (id, handle) = &live[rng.below(live.len() as u64) as usize];
            to_other.send((*id, handle.clone())).unwrap();
        }
        ops += 1;
    }
    drop(to_other);
    for (id, handle) in from_other {
        cancel(id, &handle);
    }
    owned.truncate(scheduled as usize);
    Report {
        owned,
        scheduled,
        resets,
        ops,
        _live: live.into_iter().map(|(_, handle)| handle).collect(),
    }
}

#[test]
fn two_threads_a_million_operations() {
    let start = Instant::now();
    let timer = Timer::builder().shards(2).build().unwrap();
    let ids = THREADS * OPS_PER_THREAD;
    let shared = Arc::new(Shared {
        base: Instant::now(),
        runs: (0..ids).map(|_| AtomicU32::new(0)).collect(),
        ran_at: (0..ids).map(|_| AtomicU64::new(0)).collect(),
        cancels: (0..ids).map(|_| AtomicU32::new(0)).collect(),
    });
    let (to_b, from_a) = mpsc::channel();
    let (to_a, from_b) = mpsc::channel();
    let a = {
        let (timer, shared) = (timer.clone(), shared.clone());
        std::thread::spawn(move || worker(0, timer, shared, to_b, from_b))
    };
    let b = {
        let (timer, shared) = (timer.clone(), shared.clone());
        std::thread::spawn(move || worker(1, timer, shared, to_a, from_a))
    };
    let reports = [a.join().expect("thread A"), b.join().expect("thread B")];
    let work_time = start.elapsed();

    let ops: u64 = reports.iter().map(|r| r.ops).sum();
    let scheduled: u64 = reports.iter().map(|r| r.scheduled).sum();
    let resets: u64 = reports.iter().map(|r| r.resets).sum();
    assert!(ops >= 1_000_000, "only {ops} operations");
    // What must have happened to each timer, from its owner's view and the cancel counts.
    let (mut expect_pending, mut expect_fired, mut cancelled) = (0u64, 0u64, 0u64);
    for (t, report) in reports.iter().enumerate() {
        for (offset, owned) in report.owned.iter().enumerate() {
            let id = t * OPS_PER_THREAD + offset;
            match shared.cancels[id].load(Ordering::SeqCst) {
                0 if owned.long => expect_pending += 1,
                0 => expect_fired += 1,
                1 => cancelled += 1,
                n => panic!("timer {id}: cancel() returned true {n} times"),
            }
        }
    }
    let total_runs = || -> u64 {
        shared
            .runs
            .iter()
            .map(|r| r.load(Ordering::SeqCst) as u64)
            .sum()
    };
    assert!(
        wait_until(Duration::from_secs(20), || {
            let stats = timer.stats();
            total_runs() >= expect_fired && stats.fired >= expect_fired
        }),
        "no quiescence: {} runs, {expect_fired} expected, {:?}",
        total_runs(),
        timer.stats()
    );
    std::thread::sleep(Duration::from_millis(20)); // room for a wrong extra run
    let stats = timer.stats();
    println!(
        "{ops} operations ({scheduled} schedules, {resets} successful resets, {cancelled} \
         successful cancels) in {work_time:?}; fired {}, pending {}, lateness p50 {:?} p99 {:?} \
         max {:?}",
        stats.fired, stats.pending, stats.lateness_p50, stats.lateness_p99, stats.lateness_max
    );
    assert_eq!(stats.scheduled, scheduled);
    assert_eq!(stats.cancelled, cancelled);
    assert_eq!(stats.fired, expect_fired);
    assert_eq!(stats.pending, expect_pending);
    assert_eq!(
        stats.scheduled,
        stats.fired + stats.cancelled + stats.pending
    );
    assert_eq!(total_runs(), expect_fired);
    assert!(
        stats.reset <= resets,
        "{} resets applied, {resets} accepted",
        stats.reset
    );
    assert_eq!(stats.panicked, 0);

    let mut early = Vec::new();
    for (t, report) in reports.iter().enumerate() {
        for (offset, owned) in report.owned.iter().enumerate() {
            let id = t * OPS_PER_THREAD + offset;
            let runs = shared.runs[id].load(Ordering::SeqCst);
            let cancels = shared.cancels[id].load(Ordering::SeqCst);
            assert!(runs <= 1, "timer {id} ran {runs} times");
            if cancels == 1 {
                assert_eq!(runs, 0, "timer {id}: cancel() returned true, yet it ran");
            } else if owned.long {
                assert_eq!(runs, 0, "timer {id} ran before its 1-hour deadline");
            } else {
                assert_eq!(runs, 1, "timer {id} never ran");
                let ran_at = shared.ran_at[id].load(Ordering::SeqCst);
                if ran_at < owned.not_before {
                    early.push((id, owned.not_before - ran_at, owned.resets));
                }
            }
        }
    }
    assert!(
        early.is_empty(),
        "{} tasks ran early (id, nanoseconds early, resets): {:?}",
        early.len(),
        &early[..early.len().min(10)]
    );
    let unfired = timer.shutdown();
    assert_eq!(unfired.len() as u64, expect_pending);
    drop(reports);
    println!("total {:?}", start.elapsed());
}
