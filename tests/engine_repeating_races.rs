//! A repeating timer's end, counted exactly once whatever order its run, a panic, a cancel, a
//! reset and shutdown come in; and messages that arrive after their timer ended (even after
//! the idle shard gave its entry table back) are checked, not applied blindly.
//!
//! Each test drives a one-shard engine by hand (manual clock, inline executor), so every
//! interleaving below is deterministic.

mod support;

use shardwheel::{Clock, Executor, MissedTickBehavior, Timer, TimerHandle, TimerState};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{DropCounter, counter, get, quiet_intentional_panics};

const MS: Duration = Duration::from_millis(1);

/// A one-shard timer on a manual clock, tasks inline, at most `max_pending` pending timers.
fn manual_timer(clock: &Clock, max_pending: usize) -> Timer {
    Timer::builder()
        .shards(1)
        .executor(Executor::Inline)
        .clock(clock.clone())
        .max_pending(max_pending)
        .build()
        .expect("build timer")
}

/// A handle the task itself can reach (set once the schedule returned it).
type SharedHandle = Arc<Mutex<Option<TimerHandle>>>;

/// What a repeating timer's run does to itself.
#[derive(Clone, Copy, Debug)]
enum DuringRun {
    /// Cancels itself, then panics.
    CancelThenPanic,
    /// Resets itself (a deferred reset), cancels itself, then panics.
    ResetCancelThenPanic,
    /// Cancels itself, then returns normally.
    Cancel,
    /// Resets itself, then panics.
    ResetThenPanic,
}

/// Schedules a repeating timer (every millisecond) whose first run does `what` to itself; its
/// closure holds a drop counter. Returns its handle.
fn repeating_doing(
    timer: &Timer,
    what: DuringRun,
    runs: &Arc<std::sync::atomic::AtomicUsize>,
    drops: &Arc<std::sync::atomic::AtomicUsize>,
) -> TimerHandle {
    let shared: SharedHandle = Arc::new(Mutex::new(None));
    let (inner, runs, guard) = (shared.clone(), runs.clone(), DropCounter(drops.clone()));
    let handle = timer
        .schedule_repeating(MS, MissedTickBehavior::Skip, move || {
            let _guard = &guard;
            runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let handle = inner.lock().unwrap().clone().expect("handle set");
            match what {
                DuringRun::CancelThenPanic => {
                    assert!(handle.cancel(), "cancel during the run");
                    panic!("on purpose: run panics after its cancel");
                }
                DuringRun::ResetCancelThenPanic => {
                    assert!(handle.reset(5 * MS), "reset during the run");
                    assert!(handle.cancel(), "cancel during the run");
                    panic!("on purpose: run panics after a reset and a cancel");
                }
                DuringRun::Cancel => assert!(handle.cancel(), "cancel during the run"),
                DuringRun::ResetThenPanic => {
                    assert!(handle.reset(5 * MS), "reset during the run");
                    panic!("on purpose: run panics after a reset");
                }
            }
        })
        .expect("schedule repeating");
    *shared.lock().unwrap() = Some(handle.clone());
    handle
}

/// Finding 1 of the hardening issue: a repeating timer cancelled during a run that then
/// panicked gave its `max_pending` place back twice (once for the cancel, once for the run's
/// end), so `pending()` drifted down and more schedules got in than the limit allows.
#[test]
fn cancel_during_a_panicking_run_gives_the_place_back_once() {
    quiet_intentional_panics();
    let clock = Clock::manual();
    let timer = manual_timer(&clock, 5);
    let _long: Vec<TimerHandle> = (0..2)
        .map(|_| timer.schedule(Duration::from_secs(3600), || {}).unwrap())
        .collect();
    let (runs, drops) = (counter(), counter());
    for round in 0..3 {
        let handle = repeating_doing(&timer, DuringRun::CancelThenPanic, &runs, &drops);
        assert_eq!(timer.pending(), 3, "round {round}: before the run");
        clock.advance(MS);
        assert_eq!(get(&runs), round + 1, "round {round}: one run");
        assert_eq!(
            get(&drops),
            round + 1,
            "round {round}: its task dropped once"
        );
        assert_eq!(handle.state(), TimerState::Cancelled);
        assert_eq!(timer.pending(), 2, "round {round}: after the run");
        let stats = timer.stats();
        assert_eq!(stats.pending, 2, "round {round}: stats {stats:?}");
        assert_eq!(stats.fired, 0, "round {round}: stats {stats:?}");
        assert_eq!(
            stats.cancelled,
            round as u64 + 1,
            "round {round}: stats {stats:?}"
        );
    }
    // Exactly three more places: the limit is still exact.
    let more: Vec<_> = (0..4)
        .map(|_| timer.schedule(Duration::from_secs(3600), || {}))
        .collect();
    assert_eq!(more.iter().filter(|result| result.is_ok()).count(), 3);
    assert_eq!(timer.pending(), 5);
    assert_eq!(get(&runs), 3, "no timer ran again");
}

/// The rest of the class: every order of reset, cancel, panic and normal return within a run
/// counts the timer's end once (as a cancel when a cancel succeeded, else as a fire), and the
/// task is dropped once.
#[test]
fn every_end_of_a_run_is_counted_once() {
    quiet_intentional_panics();
    for what in [
        DuringRun::CancelThenPanic,
        DuringRun::ResetCancelThenPanic,
        DuringRun::Cancel,
        DuringRun::ResetThenPanic,
    ] {
        let clock = Clock::manual();
        let timer = manual_timer(&clock, 2);
        let (runs, drops) = (counter(), counter());
        let handle = repeating_doing(&timer, what, &runs, &drops);
        clock.advance(MS);
        clock.advance(20 * MS);
        assert_eq!(get(&runs), 1, "{what:?}: ran once");
        assert_eq!(get(&drops), 1, "{what:?}: task dropped once");
        let cancelled = !matches!(what, DuringRun::ResetThenPanic);
        let (state, fired, ended_by_cancel) = if cancelled {
            (TimerState::Cancelled, 0, 1)
        } else {
            (TimerState::Expired, 1, 0)
        };
        assert_eq!(handle.state(), state, "{what:?}");
        let stats = timer.stats();
        assert_eq!(
            (stats.pending, stats.fired, stats.cancelled),
            (0, fired, ended_by_cancel),
            "{what:?}: {stats:?}"
        );
        assert_eq!(timer.pending(), 0, "{what:?}");
        assert!(
            !handle.cancel(),
            "{what:?}: ended timers cannot be cancelled"
        );
        assert!(!handle.reset(MS), "{what:?}: nor reset");
        assert!(timer.schedule(MS, || {}).is_ok() && timer.schedule(MS, || {}).is_ok());
        assert!(timer.schedule(MS, || {}).is_err(), "{what:?}: limit exact");
    }
}

/// Shutdown while a repeating timer is out running on a pool (its run waits): its end is
/// counted once, by its cancel during the run (`cancel`) or else by the run's late hand-back,
/// and its task is dropped once.
fn shutdown_during_a_run(cancel: bool) {
    quiet_intentional_panics();
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap(),
    );
    let clock = Clock::manual();
    let timer = Timer::builder()
        .shards(1)
        .executor(Executor::ThreadPool(pool))
        .clock(clock.clone())
        .max_pending(3)
        .build()
        .unwrap();
    let (entered_in, entered) = std::sync::mpsc::channel();
    let (release, release_in) = std::sync::mpsc::channel::<()>();
    let release_in = Mutex::new(release_in);
    let drops = counter();
    let guard = DropCounter(drops.clone());
    let handle = timer
        .schedule_repeating(MS, MissedTickBehavior::Skip, move || {
            let _guard = &guard;
            entered_in.send(()).unwrap();
            release_in.lock().unwrap().recv().unwrap();
            panic!("on purpose: run ends after shutdown");
        })
        .unwrap();
    clock.advance(MS);
    entered.recv().unwrap();
    if cancel {
        assert!(handle.cancel());
    }
    assert!(
        timer.shutdown().is_empty(),
        "a running timer is not returned"
    );
    release.send(()).unwrap();
    assert!(
        support::wait_until(Duration::from_secs(5), || get(&drops) == 1
            && timer.pending() == 0
            && timer.stats().cancelled == 1),
        "cancel {cancel}: task dropped once, end counted: {:?}",
        timer.stats()
    );
    std::thread::sleep(20 * MS);
    let stats = timer.stats();
    assert_eq!(get(&drops), 1);
    assert_eq!(timer.pending(), 0, "cancel {cancel}: {stats:?}");
    assert_eq!(
        (stats.pending, stats.fired, stats.cancelled),
        (0, 0, 1),
        "cancel {cancel}: {stats:?}"
    );
    assert_eq!(handle.state(), TimerState::Cancelled);
}

#[test]
fn shutdown_during_a_cancelled_run_counts_its_end_once() {
    shutdown_during_a_run(true);
}

#[test]
fn shutdown_during_a_run_counts_its_end_once() {
    shutdown_during_a_run(false);
}

/// Finding 3 of the hardening issue: a canceller descheduled between its state change and its
/// push delivers its `Cancel` after the run's `Rearm` ended the timer and the idle shard gave
/// its entry table back; the shard indexed the empty table and panicked ("index out of bounds:
/// the len is 0"), and later timers never fired. The `test-hooks` feature holds the canceller
/// there deterministically.
#[cfg(feature = "test-hooks")]
#[test]
fn late_cancel_after_the_entry_table_was_given_back() {
    use std::sync::mpsc;
    let clock = Clock::manual();
    let timer = manual_timer(&clock, usize::MAX);
    // More than the 4096 entries an idle shard keeps: it gives the table back when idle.
    let many: Vec<TimerHandle> = (0..5000)
        .map(|_| timer.schedule(Duration::from_secs(3600), || {}).unwrap())
        .collect();
    let (runs, drops) = (counter(), counter());
    let (cancel_now_in, cancel_now) = mpsc::channel::<TimerHandle>();
    let (transitioned_in, transitioned) = mpsc::channel::<()>();
    let (push_in, push) = mpsc::channel::<()>();
    let canceller = std::thread::spawn(move || {
        let handle = cancel_now.recv().unwrap();
        shardwheel::test_hooks::set_after_cancel_transition(Some(Box::new(move || {
            transitioned_in.send(()).unwrap();
            push.recv().unwrap();
        })));
        handle.cancel()
    });
    let shared: SharedHandle = Arc::new(Mutex::new(None));
    let handle = {
        let (inner, runs, guard) = (shared.clone(), runs.clone(), DropCounter(drops.clone()));
        timer
            .schedule_repeating(MS, MissedTickBehavior::Skip, move || {
                let _guard = &guard;
                runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                // Cancelled from another thread during the run: its Cancel is pushed only
                // after this run's Rearm has ended the timer.
                let handle = inner.lock().unwrap().clone().unwrap();
                cancel_now_in.send(handle).unwrap();
                transitioned.recv().unwrap();
            })
            .unwrap()
    };
    *shared.lock().unwrap() = Some(handle.clone());
    for handle in &many {
        assert!(handle.cancel());
    }
    drop(many);
    clock.advance(MS); // The run; its Rearm ends the timer: the shard is idle.
    assert_eq!(handle.state(), TimerState::Cancelled);
    clock.advance(MS);
    clock.advance(30 * MS); // Idle for longer than the release delay: the table goes.
    push_in.send(()).unwrap();
    assert!(
        canceller.join().unwrap(),
        "the late canceller's cancel succeeded"
    );
    clock.advance(MS); // Applies the late Cancel.
    // The shard still works: a later timer fires, and the counts are exact.
    let fired = counter();
    let fired_in = fired.clone();
    timer
        .schedule(MS, move || {
            fired_in.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        })
        .unwrap();
    clock.advance(2 * MS);
    assert_eq!(get(&fired), 1, "a later timer fired");
    assert_eq!((get(&runs), get(&drops)), (1, 1));
    let stats = timer.stats();
    assert_eq!(
        (stats.pending, stats.fired, stats.cancelled),
        (0, 1, 5001),
        "{stats:?}"
    );
    assert_eq!(timer.pending(), 0);
}
