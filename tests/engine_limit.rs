//! `max_pending(n)`: scheduling past n fails with `ScheduleError::Full`, a place frees up at
//! once on cancel or expiry, and under concurrency the pending count never exceeds n.

mod support;

use shardwheel::{ScheduleError, Timer, TimerHandle};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{DropCounter, Rng, counter, get, wait_until};

fn limited(max: usize) -> Timer {
    Timer::builder()
        .shards(2)
        .max_pending(max)
        .build()
        .expect("build timer")
}

/// Past n: `Full`, the rejected task is dropped unrun and not counted; a cancel frees a place
/// at once.
#[test]
fn full_past_max_and_cancel_frees_a_place() {
    let timer = limited(3);
    let handles: Vec<TimerHandle> = (0..3)
        .map(|_| timer.schedule(Duration::from_secs(3600), || {}).unwrap())
        .collect();
    assert_eq!(timer.pending(), 3);
    for _ in 0..5 {
        let drops = counter();
        let guard = DropCounter(drops.clone());
        let rejected = timer.schedule(Duration::ZERO, move || {
            let _keep = &guard;
            panic!("rejected task ran");
        });
        assert_eq!(rejected.unwrap_err(), ScheduleError::Full);
        assert_eq!(get(&drops), 1, "a rejected task is dropped at once");
    }
    assert_eq!(
        timer
            .schedule_at(Instant::now(), || {})
            .map(|_| ())
            .unwrap_err(),
        ScheduleError::Full
    );
    assert_eq!(
        timer.stats().scheduled,
        3,
        "rejected schedules are not counted"
    );
    let mut replacements = Vec::new();
    for handle in &handles {
        assert!(handle.cancel());
        assert_eq!(timer.pending(), 2);
        // The place is free right after cancel() returns.
        replacements.push(
            timer
                .schedule(Duration::from_secs(3600), || {})
                .expect("a place frees up at once on cancel"),
        );
        assert_eq!(timer.pending(), 3);
        assert_eq!(
            timer
                .schedule(Duration::from_secs(3600), || {})
                .unwrap_err(),
            ScheduleError::Full
        );
    }
    for handle in &replacements {
        assert!(handle.cancel());
    }
    assert_eq!(timer.pending(), 0);
    assert_eq!(timer.stats().panicked, 0);
}

/// A place frees up at once on expiry: once a task has run, a schedule succeeds.
#[test]
fn expiry_frees_a_place() {
    let timer = limited(2);
    for round in 0..5 {
        let ran = counter();
        for _ in 0..2 {
            let ran = ran.clone();
            timer
                .schedule(Duration::from_millis(1), move || {
                    ran.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap_or_else(|error| panic!("round {round}: schedule failed: {error}"));
        }
        assert!(wait_until(Duration::from_secs(1), || get(&ran) == 2));
        // The tasks ran, so their timers are no longer pending.
        let stats = timer.stats();
        assert_eq!(stats.fired, 2 * (round + 1) as u64);
        assert_eq!(stats.pending, 0);
        assert_eq!(
            timer.pending(),
            0,
            "round {round}: pending() after both timers fired (stats: {stats:?})"
        );
    }
}

/// With `max_pending(1)`, a task that holds the only place can schedule its successor from
/// inside itself: its place was given back before it ran.
#[test]
fn expiry_frees_the_place_before_the_task_runs() {
    fn chain(timer: Timer, left: usize, done: std::sync::mpsc::Sender<Result<(), String>>) {
        if left == 0 {
            done.send(Ok(())).unwrap();
            return;
        }
        let next = timer.clone();
        let sender = done.clone();
        if let Err(error) = timer.schedule(Duration::from_micros(300), move || {
            chain(next, left - 1, sender)
        }) {
            done.send(Err(format!("{left} left: {error}"))).unwrap();
        }
    }
    let timer = limited(1);
    let (sender, receiver) = std::sync::mpsc::channel();
    chain(timer.clone(), 30, sender);
    let outcome = receiver
        .recv_timeout(Duration::from_secs(5))
        .expect("the chain finishes");
    assert_eq!(outcome, Ok(()));
    assert!(wait_until(Duration::from_secs(1), || timer.pending() == 0));
    assert_eq!(timer.stats().fired, 30);
}

/// Several threads hammer schedule/cancel with long delays while a monitor checks
/// `pending() <= n` continuously; at the end pending returns to 0.
#[test]
fn never_exceeded_under_concurrency_with_cancel() {
    hammer(false);
}

/// As above, with short delays so that expiry frees places too.
#[test]
fn never_exceeded_under_concurrency_with_expiry() {
    hammer(true);
}

fn hammer(expire: bool) {
    const MAX: usize = 64;
    const THREADS: usize = 3;
    const OPS: usize = 100_000;
    let timer = limited(MAX);
    let done = Arc::new(AtomicBool::new(false));
    let monitor = {
        let timer = timer.clone();
        let done = done.clone();
        std::thread::spawn(move || {
            let mut checks = 0u64;
            let mut highest = 0;
            while !done.load(Ordering::SeqCst) {
                let pending = timer.pending();
                assert!(pending <= MAX, "pending {pending} > max_pending {MAX}");
                highest = highest.max(pending);
                checks += 1;
            }
            (checks, highest)
        })
    };
    let ran = counter();
    let full = counter();
    let accepted = counter();
    let cancelled = counter();
    let leftovers = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (timer, ran, full, accepted, cancelled, leftovers) = (
                timer.clone(),
                ran.clone(),
                full.clone(),
                accepted.clone(),
                cancelled.clone(),
                leftovers.clone(),
            );
            std::thread::spawn(move || {
                let mut rng = Rng::new(100 + t as u64);
                let mut live: Vec<TimerHandle> = Vec::new();
                for _ in 0..OPS {
                    if live.is_empty() || rng.below(2) == 0 {
                        let delay = if expire && rng.below(2) == 0 {
                            Duration::from_micros(rng.below(1000))
                        } else {
                            Duration::from_secs(3600)
                        };
                        let ran = ran.clone();
                        match timer.schedule(delay, move || {
                            ran.fetch_add(1, Ordering::SeqCst);
                        }) {
                            Ok(handle) => {
                                accepted.fetch_add(1, Ordering::SeqCst);
                                live.push(handle);
                            }
                            Err(ScheduleError::Full) => {
                                full.fetch_add(1, Ordering::SeqCst);
                                if expire {
                                    std::thread::yield_now();
                                }
                            }
                            Err(error) => panic!("unexpected {error}"),
                        }
                    } else {
                        let index = rng.below(live.len() as u64) as usize;
                        if live.swap_remove(index).cancel() {
                            cancelled.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
                leftovers.lock().unwrap().extend(live);
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("worker");
    }
    // Cancel what is left; whatever was not cancelled must run (short) or was cancelled now.
    for handle in leftovers.lock().unwrap().drain(..) {
        if handle.cancel() {
            cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
    let settled = wait_until(Duration::from_secs(5), || {
        get(&ran) + get(&cancelled) == get(&accepted)
    });
    done.store(true, Ordering::SeqCst);
    let (checks, highest) = monitor.join().expect("monitor: pending exceeded max");
    assert!(settled, "not every accepted timer ran or was cancelled");
    println!(
        "accepted {}, full {}, ran {}, cancelled {}; {checks} checks, highest pending {highest}",
        get(&accepted),
        get(&full),
        get(&ran),
        get(&cancelled)
    );
    assert!(get(&full) > 0, "the limit was never reached");
    assert!(
        wait_until(Duration::from_secs(1), || timer.pending() == 0),
        "pending() is {} after every timer ran or was cancelled",
        timer.pending()
    );
    let stats = timer.stats();
    assert_eq!(stats.scheduled, get(&accepted) as u64);
    assert_eq!(stats.fired + stats.cancelled, stats.scheduled);
    assert_eq!(stats.pending, 0);
    // And the limit is fully available again.
    let again: Vec<TimerHandle> = (0..MAX)
        .map(|_| timer.schedule(Duration::from_secs(3600), || {}).unwrap())
        .collect();
    assert_eq!(
        timer.schedule(Duration::from_secs(1), || {}).unwrap_err(),
        ScheduleError::Full
    );
    drop(again);
}

/// Timers returned by shutdown give their places back; after shutdown, `Shutdown` wins over
/// `Full`.
#[test]
fn shutdown_releases_places() {
    let timer = limited(4);
    let handles: Vec<TimerHandle> = (0..4)
        .map(|_| timer.schedule(Duration::from_secs(3600), || {}).unwrap())
        .collect();
    assert_eq!(
        timer.schedule(Duration::ZERO, || {}).unwrap_err(),
        ScheduleError::Full
    );
    assert_eq!(timer.shutdown().len(), 4);
    assert_eq!(timer.pending(), 0);
    assert_eq!(
        timer.schedule(Duration::ZERO, || {}).unwrap_err(),
        ScheduleError::Shutdown
    );
    drop(handles);
}
