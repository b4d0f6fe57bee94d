//! Stages (`src/engine/stage.rs`): a `Sleep`'s timer reaches its shard through its thread's
//! ring. A full ring falls back to the shard's inbox; a ring outlives its thread; a sleep
//! dropped on its own thread takes its timer back (rewinding its cell if it was the last), one
//! dropped elsewhere cancels it; every timer ends exactly once. `rewinds_race_the_shards_drains`
//! fails (debug builds: `tail - head` overflows in `Stage::push`) with the rewind bug its loom
//! model was written for (`Consumer::pop` taking only `position == tail` for empty).

use shardwheel::{Clock, Executor, Sleep, Timer};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Wake, Waker};
use std::time::Duration;

/// A waker that counts its wake-ups.
struct Counting(AtomicUsize);

impl Wake for Counting {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn counting() -> (Arc<Counting>, Waker) {
    let counter = Arc::new(Counting(AtomicUsize::new(0)));
    (counter.clone(), Waker::from(counter))
}

/// Polls `sleep` once with `waker`: it must be pending (its timer staged).
fn arm(sleep: &mut Sleep, waker: &Waker) {
    let mut context = Context::from_waker(waker);
    assert!(Pin::new(sleep).poll(&mut context).is_pending());
}

fn manual(clock: &Clock, shards: usize) -> Timer {
    Timer::builder()
        .shards(shards)
        .executor(Executor::Inline)
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// With no shard thread to drain it, one thread stages more timers than a ring holds: the rest
/// take the inbox. Every third sleep is dropped (taken back while staged, or cancelled); the
/// rest wake once.
#[test]
fn a_full_stage_falls_back_to_the_inbox() {
    let clock = Clock::manual();
    let timer = manual(&clock, 1);
    let (woken, waker) = counting();
    let mut sleeps: Vec<Option<Sleep>> = (0..10_000)
        .map(|_| {
            let mut sleep = timer.sleep(Duration::from_millis(5));
            arm(&mut sleep, &waker);
            Some(sleep)
        })
        .collect();
    for sleep in sleeps.iter_mut().step_by(3) {
        sleep.take();
    }
    clock.advance(Duration::from_millis(10));
    assert_eq!(woken.0.load(Ordering::SeqCst), 10_000 - 3334);
    let stats = timer.stats();
    assert_eq!(
        (stats.pending, stats.fired, stats.cancelled),
        (0, 6666, 3334)
    );
}

/// Many short-lived threads each arm sleeps and exit, handing them over; later threads take
/// their rings over. Every sleep's timer fires once.
#[test]
fn stages_outlive_their_threads() {
    let clock = Clock::manual();
    let timer = manual(&clock, 2);
    let (woken, waker) = counting();
    let mut kept = Vec::new();
    for round in 0..50 {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (timer, waker) = (timer.clone(), waker.clone());
                std::thread::spawn(move || {
                    (0..10)
                        .map(|_| {
                            let mut sleep = timer.sleep(Duration::from_millis(1));
                            arm(&mut sleep, &waker);
                            sleep
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for thread in threads {
            kept.extend(thread.join().unwrap());
        }
        if round % 7 == 0 {
            clock.advance(Duration::from_millis(2));
        }
    }
    clock.advance(Duration::from_millis(2));
    assert_eq!(woken.0.load(Ordering::SeqCst), 2000);
    assert_eq!(timer.stats().fired, 2000);
}

/// Sleeps dropped on another thread than the one that armed them cannot be taken back: they
/// are cancelled (no message while still staged) and end once.
#[test]
fn sleeps_dropped_elsewhere_are_cancelled() {
    let clock = Clock::manual();
    let timer = manual(&clock, 1);
    let (woken, waker) = counting();
    let sleeps: Vec<Sleep> = (0..1000)
        .map(|_| {
            let mut sleep = timer.sleep(Duration::from_millis(5));
            arm(&mut sleep, &waker);
            sleep
        })
        .collect();
    std::thread::spawn(move || drop(sleeps)).join().unwrap();
    clock.advance(Duration::from_millis(10));
    assert_eq!(woken.0.load(Ordering::SeqCst), 0);
    let stats = timer.stats();
    assert_eq!((stats.pending, stats.fired, stats.cancelled), (0, 0, 1000));
    drop(waker);
    assert_eq!(Arc::strong_count(&woken), 1, "every timer's waker dropped");
}

/// A thread arms sleeps and drops most of them at once (a server's timeouts), with shard
/// threads running: every end is counted once and the survivors wake.
#[test]
fn retracted_on_a_running_engine() {
    let timer = Timer::builder().shards(2).build().unwrap();
    let (woken, waker) = counting();
    let mut survivors = Vec::new();
    for i in 0..20_000 {
        let mut sleep = timer.sleep(Duration::from_millis(20));
        arm(&mut sleep, &waker);
        if i % 100 == 0 {
            survivors.push(sleep);
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while woken.0.load(Ordering::SeqCst) < survivors.len() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(woken.0.load(Ordering::SeqCst), survivors.len());
    let stats = timer.stats();
    assert_eq!(
        (stats.pending, stats.fired, stats.cancelled),
        (0, 200, 19_800)
    );
    drop(survivors);
    assert!(timer.shutdown().is_empty());
}

/// On the system clock, with the shard thread draining as it goes: one thread arms and drops
/// sleeps (each taken back, most by rewinding their cell) and keeps every 64th, while another
/// keeps the shard turning (and so draining the first one's stage) with closure timers it
/// schedules and cancels. Every sleep's timer ends exactly once (none lost, none run twice),
/// and nothing hangs.
#[test]
fn rewinds_race_the_shards_drains() {
    let timer = Timer::builder().shards(1).build().unwrap();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = {
        let (timer, done) = (timer.clone(), done.clone());
        std::thread::spawn(move || {
            let mut churned = 0u64;
            while !done.load(Ordering::Relaxed) {
                let handle = timer.schedule(Duration::from_secs(60), || {}).unwrap();
                assert!(handle.cancel());
                churned += 1;
            }
            churned
        })
    };
    let (woken, waker) = counting();
    let (kept_woken, kept_waker) = counting();
    let mut kept = Vec::new();
    for round in 0..400_000u32 {
        if round % 64 == 0 {
            let mut sleep = timer.sleep(Duration::from_millis(20));
            arm(&mut sleep, &kept_waker);
            kept.push(sleep);
        } else {
            let mut sleep = timer.sleep(Duration::from_secs(60));
            arm(&mut sleep, &waker);
        }
    }
    done.store(true, Ordering::Relaxed);
    let churned = churn.join().unwrap();
    // Every kept sleep's timer fires (a cell the shard skipped would never be adopted).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while kept_woken.0.load(Ordering::SeqCst) < kept.len() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let stats = timer.stats();
    assert_eq!(
        (
            kept_woken.0.load(Ordering::SeqCst),
            stats.fired,
            stats.pending
        ),
        (kept.len(), kept.len() as u64, 0),
        "{stats:?} ({churned} closure timers churned)"
    );
    assert_eq!(stats.scheduled, stats.fired + stats.cancelled, "{stats:?}");
    assert_eq!(woken.0.load(Ordering::SeqCst), 0, "a dropped sleep woke");
}

/// A thread's first sleep on a shard makes its stage: on the heap, not on a small stack.
#[test]
fn a_thread_with_a_small_stack_stages_a_sleep() {
    let timer = Timer::builder().shards(1).build().expect("build timer");
    let pending = std::thread::Builder::new()
        .stack_size(64 * 1024)
        .spawn(move || {
            let mut sleep = std::pin::pin!(timer.sleep(Duration::from_secs(60)));
            let mut context = Context::from_waker(Waker::noop());
            sleep.as_mut().poll(&mut context).is_pending()
        })
        .expect("spawn a thread")
        .join()
        .expect("the small-stack thread did not finish");
    assert!(pending);
}
