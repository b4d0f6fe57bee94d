//! A `reset()` that returns false moved nothing: its timer had fired (at the deadline before
//! the reset) or was cancelled. Found by the soak test: a one-shot reset far later (returned
//! true), then reset to "now" (returned false), ran at once, seconds before the deadline of the
//! reset that had returned true. The second reset's deadline swap was read by the shard, which
//! fired on it, while the reset, seeing the timer fired, reported that it had come too late.
//!
//! The first test makes the race deterministic (a hook between the reset's swap and its second
//! read of the state drives the shard); the second hammers it on the system clock: many timers,
//! all reset far later first, are reset to a due deadline while the shard visits them (at their
//! original tick, where a lazy reset leaves them). None can fire at its far deadline during the
//! test, so every one of those resets must return true.

mod support;

#[cfg(feature = "test-hooks")]
use shardwheel::{Clock, Executor, TimerState};
use shardwheel::{Timer, TimerHandle};
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use support::wait_until;

/// A resetter descheduled between its swap of the deadline and its second read of the state,
/// while the shard reaches the timer and finds the new (due) deadline: the timer fires on it,
/// so the reset must return true (before the fix it returned false: "too late, nothing moved",
/// with the task run seconds before the deadline of the reset that had returned true).
#[cfg(feature = "test-hooks")]
#[test]
fn earlier_reset_meeting_the_fire_returns_true() {
    let clock = Clock::manual();
    let timer = Timer::builder()
        .shards(1)
        .executor(Executor::Inline)
        .clock(clock.clone())
        .build()
        .expect("timer");
    let runs = Arc::new(AtomicU32::new(0));
    let ran_at = Arc::new(std::sync::Mutex::new(None));
    let handle = {
        let (runs, ran_at, clock) = (runs.clone(), ran_at.clone(), clock.clone());
        timer
            .schedule(Duration::from_millis(1), move || {
                runs.fetch_add(1, SeqCst);
                *ran_at.lock().unwrap() = Some(clock.now());
            })
            .expect("schedule")
    };
    // Later: moved in place, the entry stays at its first tick.
    let far = clock.now() + FAR;
    assert!(handle.reset(FAR));
    // Back to due, and the shard reaches the first tick right after the swap.
    let start = clock.now();
    {
        let clock = clock.clone();
        shardwheel::test_hooks::set_after_reset_swap(Some(Box::new(move || {
            clock.advance(Duration::from_millis(2));
        })));
    }
    let moved = handle.reset(Duration::ZERO);
    shardwheel::test_hooks::set_after_reset_swap(None);
    assert_eq!(
        runs.load(SeqCst),
        1,
        "the shard did not fire on the due deadline"
    );
    assert_eq!(handle.state(), TimerState::Expired);
    let ran_at = ran_at.lock().unwrap().expect("ran");
    assert!(ran_at >= start && ran_at < far);
    assert!(
        moved,
        "reset() returned false (moved nothing), yet its timer ran at its new deadline, {:?} \
         before the deadline of the reset that had returned true",
        far - ran_at
    );
    // A reset after the fire moves nothing and says so.
    assert!(!handle.reset(Duration::ZERO));
    assert!(!handle.reset(FAR));
}

const THREADS: usize = 2;
const PER_THREAD: usize = 2000;
const FAR: Duration = Duration::from_secs(60);

/// One round: returns how many due resets returned false (each a timer that fired because of
/// a reset that said it came too late).
fn round(timer: &Timer) -> usize {
    let barrier = Arc::new(Barrier::new(THREADS));
    // Every timer of the round is due at the same tick, ahead of the time their scheduling
    // takes (a debug build on a loaded machine).
    let first_deadline = Instant::now() + Duration::from_millis(100);
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let (timer, barrier) = (timer.clone(), barrier.clone());
            std::thread::spawn(move || {
                let runs = Arc::new(AtomicU32::new(0));
                let handles: Vec<TimerHandle> = (0..PER_THREAD)
                    .map(|_| {
                        let runs = runs.clone();
                        let handle = timer
                            .schedule_at(first_deadline, move || {
                                runs.fetch_add(1, SeqCst);
                            })
                            .expect("schedule");
                        assert!(
                            handle.reset(FAR),
                            "a far reset before the first deadline failed"
                        );
                        handle
                    })
                    .collect();
                barrier.wait();
                while Instant::now() < first_deadline {
                    std::hint::spin_loop();
                }
                // The shard is at the timers' first tick now, finding their far deadlines:
                // move them back to due, racing it.
                let refused = handles
                    .iter()
                    .filter(|handle| !handle.reset(Duration::ZERO))
                    .count();
                // Every timer is due now: all run.
                let ran = wait_until(Duration::from_secs(30), || {
                    runs.load(SeqCst) as usize == PER_THREAD
                });
                assert!(ran, "due timers did not run");
                refused
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|thread| thread.join().expect("thread"))
        .sum()
}

#[test]
fn reset_that_returns_false_moved_nothing() {
    let timer = Timer::builder().shards(1).build().expect("timer");
    let mut refused = 0;
    for _ in 0..10 {
        refused += round(&timer);
    }
    assert_eq!(
        refused, 0,
        "resets of pending timers returned false, yet their timers fired at the new deadline"
    );
}
