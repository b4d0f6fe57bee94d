//! Cancellation: exactly one of {task runs, `cancel()` returns true}, also when cancel races
//! expiry from another thread; `state()`; cancelled tasks are released promptly; handles of
//! one timer never touch another's; handles outliving their engine are harmless.

mod support;

use shardwheel::{Executor, Timer, TimerHandle, TimerState};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, mpsc};
use std::time::{Duration, Instant};
use support::{DropCounter, Rng, counter, get, timer, wait_until};

fn counters(n: usize) -> Arc<Vec<AtomicUsize>> {
    Arc::new((0..n).map(|_| AtomicUsize::new(0)).collect())
}

/// Timers due in 0 to 1.5 ms, cancelled from another thread at about their deadline: for each
/// timer, runs + successful cancels is exactly 1; the late cancels (and second cancels) return
/// false; the counters agree.
#[test]
fn cancel_racing_expiry_exactly_once() {
    for executor in [Executor::DefaultPool, Executor::Inline] {
        let timer = Timer::builder()
            .shards(2)
            .executor(executor.clone())
            .build()
            .unwrap();
        const ROUNDS: usize = 150;
        const BATCH: usize = 100;
        const TOTAL: usize = ROUNDS * BATCH;
        let runs = counters(TOTAL);
        let cancels = counters(TOTAL);
        let (sender, receiver) = mpsc::sync_channel::<(usize, TimerHandle, Instant)>(BATCH);
        let canceller = {
            let cancels = cancels.clone();
            std::thread::spawn(move || {
                let mut rng = Rng::new(3);
                for (id, handle, target) in receiver {
                    while Instant::now() < target {
                        std::hint::spin_loop();
                    }
                    if handle.cancel() {
                        cancels[id].fetch_add(1, Ordering::SeqCst);
                        assert_eq!(handle.state(), TimerState::Cancelled);
                    }
                    // Whatever the first cancel did, a second one never succeeds.
                    assert!(!handle.cancel(), "timer {id}: second cancel returned true");
                    if rng.below(4) == 0 {
                        assert!(!handle.clone().cancel());
                    }
                }
            })
        };
        let mut rng = Rng::new(5);
        for round in 0..ROUNDS {
            for i in 0..BATCH {
                let id = round * BATCH + i;
                let delay = Duration::from_micros(rng.below(1500));
                let runs = runs.clone();
                let scheduled = Instant::now();
                let handle = timer
                    .schedule(delay, move || {
                        runs[id].fetch_add(1, Ordering::SeqCst);
                    })
                    .unwrap();
                let target = scheduled + Duration::from_micros(rng.below(2000));
                sender.send((id, handle, target)).unwrap();
            }
        }
        drop(sender);
        canceller.join().expect("canceller thread");
        assert!(
            wait_until(Duration::from_secs(5), || (0..TOTAL).all(|id| get(
                &runs[id]
            ) + get(
                &cancels[id]
            ) >= 1)),
            "{executor:?}: some timer neither ran nor was cancelled"
        );
        std::thread::sleep(Duration::from_millis(20)); // room for a wrong second run
        let (mut ran, mut cancelled) = (0, 0);
        for id in 0..TOTAL {
            let (r, c) = (get(&runs[id]), get(&cancels[id]));
            assert_eq!(
                r + c,
                1,
                "{executor:?}: timer {id} ran {r} times and was cancelled {c} times"
            );
            ran += r;
            cancelled += c;
        }
        let stats = timer.stats();
        assert_eq!(stats.fired, ran as u64);
        assert_eq!(stats.cancelled, cancelled as u64);
        assert_eq!(stats.scheduled, TOTAL as u64);
        assert_eq!(stats.pending, 0);
        println!("{executor:?}: {ran} ran, {cancelled} cancelled");
        assert!(ran > 0 && cancelled > 0, "the race was not exercised");
    }
}

/// Several threads cancel clones of the same handle at once: exactly one wins, and then the
/// task never runs; or the task won and no cancel does.
#[test]
fn concurrent_cancels_exactly_one_wins() {
    let timer = timer(2);
    const ROUNDS: usize = 1000;
    const THREADS: usize = 3;
    let barrier = Arc::new(Barrier::new(THREADS + 1));
    let (senders, workers): (Vec<_>, Vec<_>) = (0..THREADS)
        .map(|_| {
            let (sender, receiver) = mpsc::channel::<TimerHandle>();
            let barrier = barrier.clone();
            let worker = std::thread::spawn(move || {
                let mut wins = Vec::new();
                for handle in receiver {
                    barrier.wait();
                    wins.push(handle.cancel());
                }
                wins
            });
            (sender, worker)
        })
        .unzip();
    let runs = counters(ROUNDS);
    let mut rng = Rng::new(9);
    for round in 0..ROUNDS {
        let runs = runs.clone();
        let delay = Duration::from_micros(rng.below(2) * 500);
        let handle = timer
            .schedule(delay, move || {
                runs[round].fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
        for sender in &senders {
            sender.send(handle.clone()).unwrap();
        }
        let release = Instant::now() + Duration::from_micros(rng.below(800));
        while Instant::now() < release {
            std::hint::spin_loop();
        }
        barrier.wait();
    }
    drop(senders);
    let wins: Vec<Vec<bool>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    std::thread::sleep(Duration::from_millis(20));
    let mut cancelled = 0;
    for round in 0..ROUNDS {
        let won = wins.iter().filter(|w| w[round]).count();
        let ran = get(&runs[round]);
        assert_eq!(
            won + ran,
            1,
            "round {round}: {won} cancels won, ran {ran} times"
        );
        cancelled += won;
    }
    println!("{cancelled} of {ROUNDS} cancelled, the rest ran");
    assert!(cancelled > 0, "no cancel won");
}

/// After the run: the task ran once, `cancel()` returns false (twice), state is Expired.
#[test]
fn task_never_runs_twice_and_cancel_after_run_is_false() {
    let timer = timer(2);
    const TIMERS: usize = 300;
    let runs = counters(TIMERS);
    let handles: Vec<TimerHandle> = (0..TIMERS)
        .map(|i| {
            let runs = runs.clone();
            timer
                .schedule(Duration::from_micros((i % 4) as u64 * 700), move || {
                    runs[i].fetch_add(1, Ordering::SeqCst);
                })
                .unwrap()
        })
        .collect();
    assert!(wait_until(Duration::from_secs(5), || runs
        .iter()
        .all(|r| get(r) >= 1)));
    for (i, handle) in handles.iter().enumerate() {
        assert_eq!(handle.state(), TimerState::Expired, "timer {i}");
        assert!(!handle.cancel(), "timer {i}: cancel after the run");
        assert!(!handle.cancel(), "timer {i}: second cancel after the run");
        assert_eq!(handle.state(), TimerState::Expired, "timer {i}");
    }
    std::thread::sleep(Duration::from_millis(20));
    for (i, runs) in runs.iter().enumerate() {
        assert_eq!(get(runs), 1, "timer {i}");
    }
    let stats = timer.stats();
    assert_eq!((stats.fired, stats.cancelled), (TIMERS as u64, 0));
}

/// `state()`: Pending, then Cancelled after cancel (second cancel false, also through a clone),
/// Expired after the run, Cancelled after shutdown.
#[test]
fn state_transitions() {
    let timer = timer(2);
    let ran = counter();
    let ran_clone = ran.clone();
    let fires = timer
        .schedule(Duration::from_millis(3), move || {
            ran_clone.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    let cancels = timer
        .schedule(Duration::from_millis(3), || panic!("cancelled task ran"))
        .unwrap();
    let stays = timer
        .schedule(Duration::from_secs(3600), || panic!("1-hour task ran"))
        .unwrap();
    for handle in [&fires, &cancels, &stays] {
        assert_eq!(handle.state(), TimerState::Pending);
    }
    let clone = cancels.clone();
    assert!(cancels.cancel());
    assert!(!cancels.cancel());
    assert!(!clone.cancel());
    assert_eq!(cancels.state(), TimerState::Cancelled);
    assert_eq!(clone.state(), TimerState::Cancelled);
    assert!(wait_until(Duration::from_secs(1), || get(&ran) == 1));
    assert_eq!(fires.state(), TimerState::Expired);
    std::thread::sleep(Duration::from_millis(10));
    assert_eq!(cancels.state(), TimerState::Cancelled);
    assert_eq!(stays.state(), TimerState::Pending);
    let unfired = timer.shutdown();
    assert_eq!(unfired.len(), 1);
    assert_eq!(stays.state(), TimerState::Cancelled);
    assert_eq!(fires.state(), TimerState::Expired);
    assert_eq!(cancels.state(), TimerState::Cancelled);
    assert!(!stays.cancel(), "shutdown already cancelled it");
    assert_eq!(timer.stats().panicked, 0);
    drop(unfired); // dropped, not run
}

/// A cancelled 1-hour task is dropped (with what it captured) soon after `cancel()`, not at
/// its deadline: with the shard asleep until that hour, busy, or with other long timers.
#[test]
fn cancel_releases_task_promptly() {
    for executor in [Executor::DefaultPool, Executor::Inline] {
        let timer = Timer::builder()
            .shards(2)
            .executor(executor.clone())
            .build()
            .unwrap();
        let _others: Vec<TimerHandle> = (0..100)
            .map(|i| {
                timer
                    .schedule(Duration::from_secs(1800 + i), || {})
                    .unwrap()
            })
            .collect();
        let mut slowest = Duration::ZERO;
        for round in 0..20 {
            let captured = Arc::new(());
            let drops = counter();
            let guard = DropCounter(drops.clone());
            let held = captured.clone();
            let handle = timer
                .schedule(Duration::from_secs(3600), move || {
                    let _keep = (&held, &guard);
                    panic!("cancelled task ran");
                })
                .unwrap();
            if round % 2 == 0 {
                // Let the shard store it and fall asleep for long.
                std::thread::sleep(Duration::from_millis(5));
            }
            assert_eq!(Arc::strong_count(&captured), 2);
            let start = Instant::now();
            assert!(handle.cancel());
            assert!(
                wait_until(Duration::from_secs(1), || Arc::strong_count(&captured) == 1
                    && get(&drops) == 1),
                "{executor:?} round {round}: cancelled task not dropped within 1 s"
            );
            slowest = slowest.max(start.elapsed());
            assert_eq!(get(&drops), 1, "dropped exactly once");
        }
        println!("{executor:?}: cancelled tasks dropped at most {slowest:?} after cancel()");
        assert_eq!(timer.stats().panicked, 0);
    }
}

/// Mass cancel (the shard is left with no timer and may give its memory back) racing resets
/// of the same timers, then new timers in the freed slots: every old timer is settled exactly
/// once (cancelled, or reset and then cancelled), old handles stay inert, new timers fire
/// exactly once.
#[test]
fn mass_cancel_racing_resets_then_reuse() {
    let timer = timer(2);
    for round in 0..6 {
        const TIMERS: usize = 10_000;
        let handles: Arc<Vec<TimerHandle>> = Arc::new(
            (0..TIMERS)
                .map(|_| {
                    timer
                        .schedule(Duration::from_secs(3600), || panic!("old timer ran"))
                        .unwrap()
                })
                .collect(),
        );
        let cancels = counters(TIMERS);
        let barrier = Arc::new(Barrier::new(3));
        let cancellers: Vec<_> = (0..2)
            .map(|c| {
                let (handles, cancels, barrier) =
                    (handles.clone(), cancels.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    for i in (c..TIMERS).step_by(2) {
                        if handles[i].cancel() {
                            cancels[i].fetch_add(1, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        let resetter = {
            let (handles, barrier) = (handles.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let mut accepted = 0;
                for handle in handles.iter().rev() {
                    accepted += usize::from(handle.reset(Duration::from_secs(7200)));
                }
                accepted
            })
        };
        for canceller in cancellers {
            canceller.join().unwrap();
        }
        let resets = resetter.join().unwrap();
        for i in 0..TIMERS {
            assert_eq!(get(&cancels[i]), 1, "round {round}: timer {i}");
            assert_eq!(handles[i].state(), TimerState::Cancelled);
        }
        assert!(wait_until(Duration::from_secs(2), || timer.stats().pending == 0));
        std::thread::sleep(Duration::from_millis(5)); // let the shards go idle
        // New timers reuse the freed slots.
        let runs = counters(TIMERS);
        let fresh: Vec<TimerHandle> = (0..TIMERS)
            .map(|i| {
                let runs = runs.clone();
                timer
                    .schedule(Duration::from_micros((i % 2000) as u64), move || {
                        runs[i].fetch_add(1, Ordering::SeqCst);
                    })
                    .unwrap()
            })
            .collect();
        for handle in handles.iter().step_by(97) {
            assert!(!handle.cancel());
            assert!(!handle.reset(Duration::ZERO));
            assert_eq!(handle.state(), TimerState::Cancelled);
        }
        assert!(
            wait_until(Duration::from_secs(5), || runs.iter().all(|r| get(r) >= 1)),
            "round {round}: not every new timer ran"
        );
        std::thread::sleep(Duration::from_millis(10));
        assert!(
            runs.iter().all(|r| get(r) == 1),
            "round {round}: a task ran twice"
        );
        for handle in &fresh {
            assert_eq!(handle.state(), TimerState::Expired);
        }
        drop(handles);
        let stats = timer.stats();
        assert_eq!(stats.pending, 0);
        assert_eq!(stats.panicked, 0);
        println!("round {round}: {resets} resets accepted before the cancels");
    }
}

/// Dropping every handle detaches a timer: it still fires.
#[test]
fn dropped_handle_still_fires() {
    let timer = timer(2);
    let ran = counter();
    for _ in 0..50 {
        let ran = ran.clone();
        drop(
            timer
                .schedule(Duration::from_millis(1), move || {
                    ran.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap(),
        );
    }
    assert!(wait_until(Duration::from_secs(2), || get(&ran) == 50));
}

/// Two timers whose timers use the same slot index and generation: cancelling or resetting
/// through timer A's handles never touches timer B's timers.
#[test]
fn handles_never_cross_timers() {
    for round in 0..20 {
        let a = timer(1);
        let b = timer(1);
        let ran_b = counter();
        let ran_b_clone = ran_b.clone();
        // Far enough ahead that the cancel below comes first even on a loaded machine.
        let handle_a = a
            .schedule(Duration::from_millis(200), || {
                panic!("A's cancelled task ran")
            })
            .unwrap();
        let handle_b = b
            .schedule(Duration::from_millis(2), move || {
                ran_b_clone.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
        let long_a = a.schedule(Duration::from_secs(3600), || {}).unwrap();
        let long_b = b.schedule(Duration::from_secs(3600), || {}).unwrap();
        // Same slot and generation in both engines (first slots of fresh shards).
        let strip = |h: &TimerHandle| {
            let text = format!("{h:?}");
            text[..text.find("state").unwrap()].to_string()
        };
        assert_eq!(strip(&handle_a), strip(&handle_b), "round {round}");
        assert_eq!(strip(&long_a), strip(&long_b), "round {round}");
        assert!(handle_a.cancel());
        assert!(long_a.reset(Duration::from_millis(1)));
        assert_eq!(handle_b.state(), TimerState::Pending);
        assert!(wait_until(Duration::from_secs(1), || get(&ran_b) == 1));
        assert_eq!(handle_b.state(), TimerState::Expired);
        assert_eq!(handle_a.state(), TimerState::Cancelled);
        assert!(wait_until(Duration::from_secs(1), || long_a.state()
            == TimerState::Expired));
        assert_eq!(
            long_b.state(),
            TimerState::Pending,
            "A's reset moved B's timer"
        );
        assert!(long_b.cancel());
        let (sa, sb) = (a.stats(), b.stats());
        assert_eq!((sa.fired, sa.cancelled, sa.panicked), (1, 1, 0));
        assert_eq!((sb.fired, sb.cancelled, sb.panicked), (1, 1, 0));
    }
}

/// Handles outliving their engine: cancel and reset return false, state is Cancelled (Expired
/// for one that ran), clone and drop are fine.
#[test]
fn handles_outliving_the_engine_are_harmless() {
    let timer = timer(2);
    let ran = counter();
    let ran_clone = ran.clone();
    let expired = timer
        .schedule(Duration::ZERO, move || {
            ran_clone.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    assert!(wait_until(Duration::from_secs(1), || get(&ran) == 1));
    let pending: Vec<TimerHandle> = (0..10)
        .map(|_| {
            timer
                .schedule(Duration::from_secs(3600), || panic!("ran after drop"))
                .unwrap()
        })
        .collect();
    let cancelled = timer.schedule(Duration::from_secs(3600), || {}).unwrap();
    assert!(cancelled.cancel());
    drop(timer);
    for handle in &pending {
        assert_eq!(handle.state(), TimerState::Cancelled);
        assert!(!handle.cancel());
        assert!(!handle.reset(Duration::ZERO));
        let clone = handle.clone();
        assert_eq!(clone.state(), TimerState::Cancelled);
        drop(clone);
        let _ = format!("{handle:?}");
    }
    assert_eq!(expired.state(), TimerState::Expired);
    assert!(!expired.cancel());
    assert!(!expired.reset(Duration::ZERO));
    assert_eq!(cancelled.state(), TimerState::Cancelled);
    assert!(!cancelled.cancel());
    // Handles may also be dropped from another thread, after the engine.
    std::thread::spawn(move || drop(pending)).join().unwrap();
    drop((expired, cancelled));
}
