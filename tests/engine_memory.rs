//! Memory stays flat under churn: with many pending (long) timers, a sustained stream of
//! cancel + schedule does not grow the resident set beyond a small bound after the fill.
//! These tests read the process's resident set, so they run one at a time.

mod support;

use shardwheel::{Timer, TimerHandle};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::time::{Duration, Instant};
use support::{Rng, counter, get, resident_pages};

static RSS: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    RSS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Waits until each shard has applied every message sent before: a zero-delay marker from
/// each of the given threads' home shards runs only after the messages queued before it.
fn settle(markers: &[mpsc::Sender<mpsc::Sender<()>>]) {
    let (done, receiver) = mpsc::channel();
    for marker in markers {
        marker.send(done.clone()).unwrap();
    }
    for _ in markers {
        receiver
            .recv_timeout(Duration::from_secs(30))
            .expect("shards settle");
    }
}

/// Operations a churning thread does before it waits for its shard to catch up. Without this
/// pacing, two threads churning flat out on a 2-core machine outrun the shard threads of a
/// debug build (not of a release build), and the backlog of messages and not yet released
/// slots, not a leak, dominates the resident set.
const BURST: usize = 4096;

/// Fills `pending` timers (1 to 2 hours) from two threads, then churns cancel + schedule for
/// `churn` on both, in bursts of [`BURST`]; returns (resident pages after the fill, highest during and after churn,
/// operations done).
fn churn(pending: usize, churn: Duration, paced: bool) -> (u64, u64, u64) {
    const THREADS: usize = 2;
    let timer = Timer::builder().shards(2).build().unwrap();
    let fired = counter();
    let (phase_sender, phase_receiver) = mpsc::channel::<&'static str>();
    let mut controls = Vec::new();
    let mut workers = Vec::new();
    let operations = Arc::new(std::sync::atomic::AtomicU64::new(0));
    for t in 0..THREADS {
        let (control, commands) = mpsc::channel::<mpsc::Sender<()>>();
        controls.push(control);
        let (timer, fired, phase, operations) = (
            timer.clone(),
            fired.clone(),
            phase_sender.clone(),
            operations.clone(),
        );
        workers.push(std::thread::spawn(move || {
            let mut rng = Rng::new(t as u64 + 1);
            let schedule = |rng: &mut Rng| -> TimerHandle {
                let fired = fired.clone();
                let delay = Duration::from_millis(3_600_000 + rng.below(3_600_000));
                timer
                    .schedule(delay, move || {
                        fired.fetch_add(1, Ordering::Relaxed);
                    })
                    .unwrap()
            };
            let mut handles: Vec<TimerHandle> =
                (0..pending / THREADS).map(|_| schedule(&mut rng)).collect();
            // Marker: answers once this thread's shard has applied everything before it.
            let marker = |timer: &Timer, done: mpsc::Sender<()>| {
                timer
                    .schedule(Duration::ZERO, move || done.send(()).unwrap())
                    .unwrap();
            };
            marker(&timer, commands.recv().unwrap());
            phase.send("filled").unwrap();
            let deadline = Instant::now() + churn;
            let mut ops = 0u64;
            while Instant::now() < deadline {
                for _ in 0..BURST {
                    let index = rng.below(handles.len() as u64) as usize;
                    assert!(handles[index].cancel(), "a 1-hour timer is pending");
                    handles[index] = schedule(&mut rng);
                    ops += 1;
                }
                if !paced {
                    continue;
                }
                // Pace the churn to what the shard can apply: wait until it has caught up.
                let (done, caught_up) = mpsc::channel();
                marker(&timer, done);
                caught_up
                    .recv_timeout(Duration::from_secs(30))
                    .expect("shard catches up");
            }
            operations.fetch_add(ops, Ordering::Relaxed);
            marker(&timer, commands.recv().unwrap());
            handles
        }));
    }
    drop(phase_sender);
    settle(&controls);
    for _ in 0..THREADS {
        assert_eq!(phase_receiver.recv().unwrap(), "filled");
    }
    let baseline = resident_pages();
    let mut highest = baseline;
    // Sample while the workers churn.
    let end = Instant::now() + churn;
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
        highest = highest.max(resident_pages());
    }
    settle(&controls);
    highest = highest.max(resident_pages());
    let handles: Vec<Vec<TimerHandle>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    highest = highest.max(resident_pages());
    let stats = timer.stats();
    let ops = operations.load(Ordering::Relaxed);
    assert_eq!(get(&fired), 0);
    assert_eq!(stats.pending, (pending / THREADS * THREADS) as u64);
    assert_eq!(stats.cancelled, ops);
    drop(handles);
    (baseline, highest, ops)
}

fn check(pending: usize, duration: Duration, paced: bool) {
    let _serial = serial();
    let start = Instant::now();
    let (baseline, highest, ops) = churn(pending, duration, paced);
    let page_kib = 4;
    println!(
        "{pending} pending: resident {} MiB after the fill, at most {} MiB during {duration:?} \
         of {} churn ({ops} cancel+schedule, {:.0}/s); {:?} in all",
        baseline * page_kib / 1024,
        highest * page_kib / 1024,
        if paced { "paced" } else { "unpaced" },
        ops as f64 / duration.as_secs_f64(),
        start.elapsed()
    );
    assert!(
        ops as usize > pending / 2,
        "churn too slow to mean anything: {ops} ops"
    );
    assert!(
        highest * 100 <= baseline * 125,
        "resident set grew from {baseline} to {highest} pages (+{}%)",
        (highest - baseline) * 100 / baseline
    );
}

/// One million pending timers and 4 s of churn (about 10 s in all in a debug build).
#[test]
fn memory_flat_under_churn() {
    check(1_000_000, Duration::from_secs(4), true);
}

/// The long version: one million pending timers and 10 s of churn. Run with
/// `cargo test --release --test engine_memory -- --ignored`.
#[test]
#[ignore = "slow: 10 s of churn; run in release"]
fn memory_flat_under_long_churn() {
    check(1_000_000, Duration::from_secs(10), true);
}

/// Churn flat out, without waiting for the shards: the shards must keep up by themselves.
/// They do in a release build (about 1 million operations a second from two threads on two
/// cores, resident set flat); in a debug build they fall behind and the backlog grows the
/// resident set, so run with
/// `cargo test --release --test engine_memory -- --ignored`.
#[test]
#[ignore = "slow: 8 s of unpaced churn; run in release (flat since submitters yield past a 64k backlog)"]
fn memory_flat_under_unpaced_churn() {
    check(1_000_000, Duration::from_secs(8), false);
}

/// Waits (up to 10 s) until the resident set is at least three quarters of the slot table of
/// `timers` timers (16 bytes each) below `held_pages`, and prints what happened.
fn assert_slot_memory_returns(held_pages: u64, timers: usize, what: &str) {
    const PAGE_BYTES: u64 = 4096;
    let slot_pages = (16 * timers as u64) / PAGE_BYTES;
    let started = Instant::now();
    let released = support::wait_until(Duration::from_secs(10), || {
        held_pages.saturating_sub(resident_pages()) >= slot_pages * 3 / 4
    });
    println!(
        "{what}: resident {} KiB before, {} KiB {:?} after (slot table: {} KiB)",
        held_pages * PAGE_BYTES / 1024,
        resident_pages() * PAGE_BYTES / 1024,
        started.elapsed(),
        slot_pages * PAGE_BYTES / 1024
    );
    assert!(released, "the slot table's memory was not given back");
}

/// Cancelling every timer gives the slot table's memory (16 bytes a timer) back to the
/// operating system, but only once the last handle is gone: a handle held keeps it, and
/// dropping that handle later still releases it (the idle shard tries again, backing off).
#[test]
fn slot_memory_returns_once_every_handle_is_gone() {
    const TIMERS: usize = 500_000;
    let _serial = serial();
    let timer = Timer::builder().shards(1).build().unwrap();
    let mut handles: Vec<TimerHandle> = (0..TIMERS)
        .map(|_| timer.schedule(Duration::from_secs(3600), || {}).unwrap())
        .collect();
    let held = handles.pop().unwrap();
    for handle in handles.drain(..) {
        assert!(handle.cancel());
    }
    drop(handles);
    assert!(held.cancel());
    // Once the shard has applied every cancel (a marker runs after them), its entry table goes
    // after 20 ms; the slot table stays while `held` lives.
    let (done, ran) = mpsc::channel();
    timer
        .schedule(Duration::ZERO, move || done.send(()).unwrap())
        .unwrap();
    ran.recv_timeout(Duration::from_secs(30))
        .expect("the shard applies the cancels");
    std::thread::sleep(Duration::from_millis(300));
    let held_pages = resident_pages();
    drop(held);
    assert_slot_memory_returns(
        held_pages,
        TIMERS,
        &format!("{TIMERS} timers, one handle held, then dropped"),
    );
    // The engine works on, from a released table.
    let fired = counter();
    let handle = {
        let fired = fired.clone();
        timer
            .schedule(Duration::from_millis(1), move || {
                fired.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap()
    };
    assert!(support::wait_until(Duration::from_secs(10), || get(&fired) == 1));
    assert_eq!(handle.state(), shardwheel::TimerState::Expired);
}

/// The same for sleeps: their thread takes back those its shard has not adopted yet, keeping
/// a few of their slots as spares for its next sleeps (`engine/slot/spares.rs`), and the
/// memory still goes back once every sleep is dropped. (The entry table's release alone can
/// pass this bound; that the flush of the spares lets the slot table go too is checked by the
/// slot table's unit tests and the `spare_slots_vs_reclaim` loom model.)
#[test]
fn slot_memory_returns_once_every_sleep_is_dropped() {
    const SLEEPS: usize = 300_000;
    let _serial = serial();
    let timer = Timer::builder().shards(1).build().unwrap();
    let (_, waker) = support::counting_waker();
    let mut sleeps: Vec<_> = (0..SLEEPS)
        .map(|_| Box::pin(timer.sleep(Duration::from_secs(3600))))
        .collect();
    for sleep in &mut sleeps {
        assert!(support::poll_once(sleep, &waker).is_pending());
    }
    // The shard adopts what it has been woken for; the last sleeps stay staged.
    std::thread::sleep(Duration::from_millis(300));
    let held_pages = resident_pages();
    // Last armed, first dropped: the staged ones are taken back by this thread.
    while let Some(sleep) = sleeps.pop() {
        drop(sleep);
    }
    assert_slot_memory_returns(
        held_pages,
        SLEEPS,
        &format!("{SLEEPS} sleeps, armed, then dropped"),
    );
    // The engine works on, from a released table, and this thread's spares too.
    let mut sleep = Box::pin(timer.sleep(Duration::from_millis(1)));
    assert!(support::poll_once(&mut sleep, &waker).is_pending());
    assert!(support::wait_until(Duration::from_secs(10), || {
        support::poll_once(&mut sleep, &waker).is_ready()
    }));
}
