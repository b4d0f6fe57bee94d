//! `shutdown()`: idempotent, from any thread and from inside a task (pool and inline) without
//! deadlock; stops new schedules; returns exactly the timers that neither ran nor were
//! cancelled, with their tasks unrun; their handles then report Cancelled.

mod support;

use shardwheel::{Executor, ScheduleError, TimerHandle, TimerState, UnfiredTimer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, mpsc};
use std::time::{Duration, Instant};
use support::{DropCounter, Rng, counter, get, timer_on, wait_until};

fn ids(n: usize) -> Arc<Vec<AtomicUsize>> {
    Arc::new((0..n).map(|_| AtomicUsize::new(0)).collect())
}

/// 100 timers: 10 fired, 10 cancelled, 80 pending. Shutdown returns the 80 with deadlines and
/// unrun tasks, which `run` runs; handles report Cancelled; schedules fail with Shutdown (the
/// task dropped unrun); a second shutdown returns nothing.
#[test]
fn returns_unfired_timers_and_stops_schedules() {
    let timer = timer_on(&Executor::DefaultPool);
    let runs = ids(100);
    let mut handles = Vec::new();
    let start = Instant::now();
    for i in 0..100 {
        let delay = if i < 10 {
            Duration::from_millis(1)
        } else {
            Duration::from_secs(3600 + i as u64)
        };
        let runs = runs.clone();
        handles.push(
            timer
                .schedule(delay, move || {
                    runs[i].fetch_add(1, Ordering::SeqCst);
                })
                .unwrap(),
        );
    }
    for handle in &handles[10..20] {
        assert!(handle.cancel());
    }
    assert!(wait_until(Duration::from_secs(1), || (0..10)
        .all(|i| get(&runs[i]) == 1)));
    assert!(!timer.is_shut_down());
    let unfired = timer.shutdown();
    assert!(timer.is_shut_down());
    assert_eq!(unfired.len(), 80);
    assert!(
        runs.iter().all(|r| get(r) <= 1) && (10..100).all(|i| get(&runs[i]) == 0),
        "shutdown must not run tasks"
    );
    for unfired in &unfired {
        let deadline = unfired.deadline().expect("a representable deadline");
        assert!(deadline >= start + Duration::from_secs(3600));
        assert!(deadline <= Instant::now() + Duration::from_secs(3700));
    }
    for unfired in unfired {
        unfired.run();
    }
    for i in 0..100 {
        let expected = usize::from(!(10..20).contains(&i));
        assert_eq!(get(&runs[i]), expected, "timer {i}");
    }
    for (i, handle) in handles.iter().enumerate() {
        let expected = if i < 10 {
            TimerState::Expired
        } else {
            TimerState::Cancelled
        };
        assert_eq!(handle.state(), expected, "timer {i}");
        assert!(!handle.cancel());
        assert!(!handle.reset(Duration::ZERO));
    }
    let stats = timer.stats();
    assert_eq!(
        (stats.scheduled, stats.fired, stats.cancelled, stats.pending),
        (100, 10, 90, 0)
    );
    for delay in [Duration::ZERO, Duration::from_secs(1), Duration::MAX] {
        let drops = counter();
        let guard = DropCounter(drops.clone());
        let result = timer.schedule(delay, move || {
            let _keep = &guard;
            panic!("scheduled after shutdown");
        });
        assert_eq!(result.unwrap_err(), ScheduleError::Shutdown);
        assert_eq!(get(&drops), 1, "the refused task is dropped at once");
    }
    assert_eq!(
        timer
            .schedule_at(Instant::now(), || {})
            .map(|_| ())
            .unwrap_err(),
        ScheduleError::Shutdown
    );
    assert!(timer.shutdown().is_empty(), "shutdown is idempotent");
    assert!(timer.clone().shutdown().is_empty());
    assert_eq!(
        timer.stats().scheduled,
        100,
        "refused schedules are not counted"
    );
}

/// Several threads call shutdown at once: no deadlock, and between them they get every
/// pending timer exactly once.
#[test]
fn concurrent_shutdowns_split_the_timers() {
    for round in 0..50 {
        let timer = timer_on(&Executor::DefaultPool);
        const TIMERS: usize = 50;
        let runs = ids(TIMERS);
        let handles: Vec<TimerHandle> = (0..TIMERS)
            .map(|i| {
                let runs = runs.clone();
                timer
                    .schedule(Duration::from_secs(3600), move || {
                        runs[i].fetch_add(1, Ordering::SeqCst);
                    })
                    .unwrap()
            })
            .collect();
        let barrier = Arc::new(Barrier::new(4));
        let callers: Vec<_> = (0..4)
            .map(|_| {
                let (timer, barrier) = (timer.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    timer.shutdown()
                })
            })
            .collect();
        let mut returned: Vec<UnfiredTimer> = Vec::new();
        let mut non_empty = 0;
        for caller in callers {
            let part = caller.join().expect("shutdown caller");
            non_empty += usize::from(!part.is_empty());
            returned.extend(part);
        }
        assert_eq!(returned.len(), TIMERS, "round {round}");
        assert!(
            non_empty <= 1,
            "round {round}: only the first shutdown returns timers"
        );
        for unfired in returned {
            unfired.run();
        }
        for i in 0..TIMERS {
            assert_eq!(get(&runs[i]), 1, "round {round}: timer {i}");
            assert_eq!(handles[i].state(), TimerState::Cancelled);
        }
    }
}

/// A task calls `shutdown()` (pool: on a pool thread; inline: on its shard's thread, while
/// another shard's task may be doing the same): no deadlock, the other pending timers are
/// returned, later schedules fail.
#[test]
fn shutdown_from_inside_a_task() {
    for executor in [Executor::DefaultPool, Executor::Inline] {
        for round in 0..30 {
            let timer = timer_on(&executor);
            let (sender, receiver) = mpsc::channel::<Vec<UnfiredTimer>>();
            let long_runs = counter();
            let mut long_handles = Vec::new();
            // From two fresh threads at once, so that both shards get timers; each schedules
            // 5 long timers, then (both done) a short one that shuts the engine down, which
            // may be refused if the other thread's already did.
            let barrier = Arc::new(Barrier::new(2));
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let (timer, sender, long_runs, barrier) = (
                        timer.clone(),
                        sender.clone(),
                        long_runs.clone(),
                        barrier.clone(),
                    );
                    std::thread::spawn(move || {
                        let mut handles = Vec::new();
                        for _ in 0..5 {
                            let long_runs = long_runs.clone();
                            handles.push(
                                timer
                                    .schedule(Duration::from_secs(3600), move || {
                                        long_runs.fetch_add(1, Ordering::SeqCst);
                                    })
                                    .unwrap(),
                            );
                        }
                        barrier.wait();
                        let inner = timer.clone();
                        let short = timer.schedule(Duration::from_millis(1), move || {
                            let unfired = inner.shutdown();
                            assert!(inner.is_shut_down());
                            assert_eq!(
                                inner.schedule(Duration::ZERO, || {}).map(|_| ()),
                                Err(ScheduleError::Shutdown)
                            );
                            sender.send(unfired).unwrap();
                        });
                        let short = match short {
                            Ok(handle) => Some(handle),
                            Err(error) => {
                                assert_eq!(error, ScheduleError::Shutdown);
                                None
                            }
                        };
                        (handles, short)
                    })
                })
                .collect();
            let mut shorts = Vec::new();
            for thread in threads {
                let (handles, short) = thread.join().unwrap();
                long_handles.extend(handles);
                shorts.extend(short);
            }
            drop(sender);
            let mut returned = receiver
                .recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("{executor:?} round {round}: shutdown task stuck"));
            // The first shutdown is over: each short timer either fired (its task sends once it
            // has called shutdown too) or was returned (its task holds a sender until run).
            let expired = shorts
                .iter()
                .filter(|h| h.state() == TimerState::Expired)
                .count();
            assert!(
                expired >= 1,
                "{executor:?} round {round}: no shutdown task ran"
            );
            for _ in 1..expired {
                returned.extend(
                    receiver
                        .recv_timeout(Duration::from_secs(10))
                        .unwrap_or_else(|_| panic!("{executor:?} round {round}: 2nd task stuck")),
                );
            }
            assert_eq!(
                returned.len() + expired,
                long_handles.len() + shorts.len(),
                "{executor:?} round {round}: every timer either ran or was returned"
            );
            assert!(returned.len() >= 10, "{executor:?} round {round}");
            assert!(timer.is_shut_down());
            assert!(timer.shutdown().is_empty());
            assert_eq!(get(&long_runs), 0);
            let before = returned.len();
            for unfired in returned {
                unfired.run();
            }
            // Running a returned shutdown task calls shutdown again: harmless.
            assert_eq!(
                get(&long_runs),
                10,
                "{executor:?} round {round} ({before} returned)"
            );
            for handle in &long_handles {
                assert_ne!(handle.state(), TimerState::Pending);
            }
        }
    }
}

/// What one round of [`race_schedules_with_shutdown`] saw.
struct RaceOutcome {
    accepted: usize,
    refused: usize,
    /// Refused schedules whose task was still alive when `schedule` returned the error.
    refused_alive_at_return: usize,
}

/// Two threads schedule (1-hour delays) in a loop while the main thread shuts the engine down;
/// each scheduler stops after 50 refusals. Checks: every schedule either failed with Shutdown
/// (its task never runs and is dropped by the time `shutdown()` has returned) or succeeded
/// and its timer is among those shutdown returned; nothing is lost or duplicated.
fn race_schedules_with_shutdown(round: usize) -> RaceOutcome {
    let timer = timer_on(&Executor::DefaultPool);
    const THREADS: usize = 2;
    const CAP: usize = 100_000;
    let runs = ids(THREADS * CAP);
    let barrier = Arc::new(Barrier::new(THREADS + 1));
    let schedulers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (timer, runs, barrier) = (timer.clone(), runs.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let mut accepted = Vec::new();
                let mut refused = Vec::new();
                let mut alive_at_return = 0;
                for i in 0..CAP {
                    let id = t * CAP + i;
                    let drops = counter();
                    let guard = DropCounter(drops.clone());
                    let runs = runs.clone();
                    let task = move || {
                        let _guard = guard;
                        runs[id].fetch_add(1, Ordering::SeqCst);
                    };
                    match timer.schedule(Duration::from_secs(3600), task) {
                        Ok(handle) => accepted.push((id, handle)),
                        Err(ScheduleError::Shutdown) => {
                            alive_at_return += usize::from(get(&drops) == 0);
                            refused.push((id, drops));
                            if refused.len() == 50 {
                                break;
                            }
                        }
                        Err(error) => panic!("unexpected {error}"),
                    }
                }
                (accepted, refused, alive_at_return)
            })
        })
        .collect();
    barrier.wait();
    std::thread::sleep(Duration::from_micros(200 + 50 * (round % 20) as u64));
    let unfired = timer.shutdown();
    let mut accepted = Vec::new();
    let mut refused = Vec::new();
    let mut refused_alive_at_return = 0;
    for scheduler in schedulers {
        let (a, r, alive) = scheduler.join().expect("scheduler");
        accepted.extend(a);
        refused.extend(r);
        refused_alive_at_return += alive;
    }
    assert_eq!(
        unfired.len(),
        accepted.len(),
        "round {round}: shutdown returned {} timers, {} schedules succeeded",
        unfired.len(),
        accepted.len()
    );
    for (id, drops) in &refused {
        assert_eq!(
            get(drops),
            1,
            "round {round}: refused task {id} not dropped"
        );
        assert_eq!(get(&runs[*id]), 0, "round {round}: refused task {id} ran");
    }
    for unfired in unfired {
        unfired.run();
    }
    for (id, handle) in &accepted {
        assert_eq!(get(&runs[*id]), 1, "round {round}: accepted task {id}");
        assert_eq!(handle.state(), TimerState::Cancelled, "round {round}: {id}");
    }
    let stats = timer.stats();
    assert_eq!(stats.scheduled, accepted.len() as u64, "round {round}");
    assert_eq!(stats.cancelled, accepted.len() as u64, "round {round}");
    assert_eq!(stats.pending, 0);
    RaceOutcome {
        accepted: accepted.len(),
        refused: refused.len(),
        refused_alive_at_return,
    }
}

/// Schedules race shutdown: see [`race_schedules_with_shutdown`].
#[test]
fn shutdown_racing_schedules() {
    let (mut accepted, mut refused, mut late) = (0, 0, 0);
    for round in 0..60 {
        let outcome = race_schedules_with_shutdown(round);
        accepted += outcome.accepted;
        refused += outcome.refused;
        late += outcome.refused_alive_at_return;
    }
    println!(
        "{accepted} schedules accepted and returned by shutdown, {refused} refused \
         ({late} of them with the task dropped only later, by shutdown)"
    );
}

/// Cancels race shutdown: for each timer exactly one of {cancel returned true, shutdown
/// returned it}.
#[test]
fn shutdown_racing_cancels_and_resets() {
    let mut rng = Rng::new(17);
    for round in 0..150 {
        let timer = timer_on(&Executor::DefaultPool);
        const TIMERS: usize = 600;
        let runs = ids(TIMERS);
        let handles: Vec<TimerHandle> = (0..TIMERS)
            .map(|i| {
                let runs = runs.clone();
                timer
                    .schedule(Duration::from_secs(3600), move || {
                        runs[i].fetch_add(1, Ordering::SeqCst);
                    })
                    .unwrap()
            })
            .collect();
        let handles = Arc::new(handles);
        let cancelled = Arc::new(Mutex::new(Vec::new()));
        let barrier = Arc::new(Barrier::new(3));
        let workers: Vec<_> = (0..2)
            .map(|w| {
                let (handles, cancelled, barrier) =
                    (handles.clone(), cancelled.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    for i in (w..TIMERS).step_by(2) {
                        if i % 3 == 0 {
                            handles[i].reset(Duration::from_secs(7200));
                        } else if handles[i].cancel() {
                            cancelled.lock().unwrap().push(i);
                        }
                    }
                })
            })
            .collect();
        barrier.wait();
        std::thread::sleep(Duration::from_micros(rng.below(400)));
        let unfired = timer.shutdown();
        for worker in workers {
            worker.join().unwrap();
        }
        let returned = unfired.len();
        for unfired in unfired {
            unfired.run();
        }
        let cancelled = cancelled.lock().unwrap();
        assert_eq!(
            returned + cancelled.len(),
            TIMERS,
            "round {round}: returned {returned} + cancelled {}",
            cancelled.len()
        );
        for &i in cancelled.iter() {
            assert_eq!(
                get(&runs[i]),
                0,
                "round {round}: cancelled timer {i} was returned"
            );
        }
        assert_eq!(runs.iter().map(get).sum::<usize>(), returned);
        for handle in handles.iter() {
            assert_eq!(handle.state(), TimerState::Cancelled);
        }
        let stats = timer.stats();
        assert_eq!((stats.cancelled, stats.pending), (TIMERS as u64, 0));
    }
}
