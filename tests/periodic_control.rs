//! Repeating timers under control: runs of one timer never overlap (even on a parallel pool),
//! `cancel` stops future runs (a run in progress finishes), a panicking run ends only its own
//! timer and is counted, and `reset` moves the next run.

mod support;

use shardwheel::{Executor, MissedTickBehavior, Timer, TimerState};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use support::{Record, Rng, millis_since, quiet_intentional_panics, wait_until};

fn timer() -> Timer {
    Timer::builder().shards(2).build().expect("build timer")
}

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// Tracks how many runs are active at once, and the most ever seen.
#[derive(Default)]
struct Concurrency {
    active: AtomicUsize,
    most: AtomicUsize,
}

impl Concurrency {
    /// Enters; returns how many were active before.
    fn enter(&self) -> usize {
        let before = self.active.fetch_add(1, Ordering::SeqCst);
        self.most.fetch_max(before + 1, Ordering::SeqCst);
        before
    }

    fn exit(&self) {
        self.active.fetch_sub(1, Ordering::SeqCst);
    }
}

#[test]
fn runs_of_one_timer_never_overlap_even_on_a_parallel_pool() {
    const TIMERS: usize = 4;
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .build()
            .unwrap(),
    );
    let timer = Timer::builder()
        .shards(2)
        .executor(Executor::ThreadPool(pool))
        .build()
        .unwrap();
    let all = Arc::new(Concurrency::default());
    let mut timers = Vec::new();
    for index in 0..TIMERS {
        let own = Arc::new(Concurrency::default());
        let overlaps = Arc::new(AtomicUsize::new(0));
        let runs = Arc::new(AtomicUsize::new(0));
        let (own_in, overlaps_in, runs_in, all_in) =
            (own.clone(), overlaps.clone(), runs.clone(), all.clone());
        let missed = [
            MissedTickBehavior::Burst,
            MissedTickBehavior::Skip,
            MissedTickBehavior::Delay,
            MissedTickBehavior::Burst,
        ][index];
        // The period (1 ms) is shorter than a run (3 ms): every run makes the next one due.
        let handle = if index == 3 {
            timer.schedule_with_fixed_delay(ms(1), Duration::from_micros(100), move || {
                all_in.enter();
                if own_in.enter() != 0 {
                    overlaps_in.fetch_add(1, Ordering::SeqCst);
                }
                std::thread::sleep(ms(3));
                runs_in.fetch_add(1, Ordering::SeqCst);
                own_in.exit();
                all_in.exit();
            })
        } else {
            timer.schedule_repeating(ms(1), missed, move || {
                all_in.enter();
                if own_in.enter() != 0 {
                    overlaps_in.fetch_add(1, Ordering::SeqCst);
                }
                std::thread::sleep(ms(3));
                runs_in.fetch_add(1, Ordering::SeqCst);
                own_in.exit();
                all_in.exit();
            })
        }
        .unwrap();
        timers.push((handle, own, overlaps, runs));
    }
    std::thread::sleep(ms(400));
    for (index, (handle, own, overlaps, runs)) in timers.iter().enumerate() {
        assert!(handle.cancel());
        let runs = runs.load(Ordering::SeqCst);
        assert_eq!(
            overlaps.load(Ordering::SeqCst),
            0,
            "timer {index} overlapped itself"
        );
        assert_eq!(own.most.load(Ordering::SeqCst), 1, "timer {index}");
        assert!(runs >= 10, "timer {index} ran only {runs} times");
    }
    // The pool did run different timers in parallel, so the check above meant something.
    assert!(
        all.most.load(Ordering::SeqCst) >= 2,
        "no parallelism at all"
    );
}

#[test]
fn cancel_stops_future_runs_and_the_run_in_progress_finishes() {
    let timer = timer();
    let runs = Arc::new(AtomicUsize::new(0));
    let finished = Arc::new(AtomicUsize::new(0));
    let (started, is_started) = mpsc::channel();
    let (runs_in, finished_in) = (runs.clone(), finished.clone());
    let handle = timer
        .schedule_repeating(ms(5), MissedTickBehavior::Burst, move || {
            let run = runs_in.fetch_add(1, Ordering::SeqCst) + 1;
            if run == 3 {
                let _ = started.send(());
                std::thread::sleep(ms(100));
            }
            finished_in.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    is_started
        .recv_timeout(Duration::from_secs(5))
        .expect("third run started");
    assert_eq!(handle.state(), TimerState::Pending);
    assert!(handle.cancel(), "cancelling a repeating timer mid-run");
    assert_eq!(handle.state(), TimerState::Cancelled);
    assert!(!handle.cancel(), "a second cancel");
    // The run in progress finishes ...
    assert!(wait_until(Duration::from_secs(2), || finished
        .load(Ordering::SeqCst)
        == 3));
    // ... and none starts afterwards (20 periods later).
    std::thread::sleep(ms(100));
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert!(wait_until(Duration::from_secs(1), || timer.pending() == 0));
}

/// Cancels at random moments. A run handed to the executor just before `cancel()` may reach
/// the task body after `cancel()` returned (that is the run in progress); any further run is a
/// failure.
#[test]
fn no_run_starts_after_cancel_returned_true() {
    let timer = timer();
    let mut rng = Rng::new(11);
    let mut in_flight_at_cancel = 0;
    for round in 0..40 {
        let cancelled = Arc::new(AtomicBool::new(false));
        let runs = Arc::new(AtomicUsize::new(0));
        let late = Arc::new(AtomicUsize::new(0));
        let (cancelled_in, runs_in, late_in) = (cancelled.clone(), runs.clone(), late.clone());
        let missed = [
            MissedTickBehavior::Burst,
            MissedTickBehavior::Skip,
            MissedTickBehavior::Delay,
        ][round % 3];
        let handle = timer
            .schedule_repeating(ms(1), missed, move || {
                if cancelled_in.load(Ordering::SeqCst) {
                    late_in.fetch_add(1, Ordering::SeqCst);
                }
                runs_in.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_micros(200));
            })
            .unwrap();
        std::thread::sleep(Duration::from_micros(rng.between(500, 6000)));
        assert!(handle.cancel());
        cancelled.store(true, Ordering::SeqCst);
        let at_cancel = runs.load(Ordering::SeqCst);
        // Five periods later: at most the one run that was in progress.
        std::thread::sleep(ms(5));
        let after = runs.load(Ordering::SeqCst) - at_cancel;
        let late = late.load(Ordering::SeqCst);
        assert!(
            after <= 1 && late <= 1,
            "round {round}: {after} runs after cancel, {late} saw it"
        );
        in_flight_at_cancel += late;
    }
    eprintln!("{in_flight_at_cancel} of 40 cancels caught a run in progress");
    assert!(wait_until(Duration::from_secs(1), || timer.pending() == 0));
}

#[test]
fn a_panicking_run_ends_its_timer_only_and_is_counted() {
    quiet_intentional_panics();
    let timer = timer();
    let faulty_runs = Arc::new(AtomicUsize::new(0));
    let steady_runs = Arc::new(AtomicUsize::new(0));
    let faulty_in = faulty_runs.clone();
    let faulty = timer
        .schedule_repeating(ms(2), MissedTickBehavior::Skip, move || {
            if faulty_in.fetch_add(1, Ordering::SeqCst) + 1 == 3 {
                panic!("third run panics on purpose");
            }
        })
        .unwrap();
    let steady_in = steady_runs.clone();
    let steady = timer
        .schedule_repeating(ms(2), MissedTickBehavior::Skip, move || {
            steady_in.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    assert!(wait_until(Duration::from_secs(5), || timer
        .stats()
        .panicked
        == 1));
    let steady_then = steady_runs.load(Ordering::SeqCst);
    // The other timer carries on (ten more runs: 20 periods of the faulty one) ...
    assert!(
        wait_until(Duration::from_secs(5), || steady_runs
            .load(Ordering::SeqCst)
            >= steady_then + 10),
        "the other timer stopped"
    );
    // ... while the faulty one never ran again.
    assert_eq!(
        faulty_runs.load(Ordering::SeqCst),
        3,
        "the timer ran on after its panic"
    );
    assert_ne!(faulty.state(), TimerState::Pending);
    assert!(!faulty.cancel(), "an ended timer cannot be cancelled");
    assert_eq!(steady.state(), TimerState::Pending);
    assert!(steady.cancel());
    let stats = timer.stats();
    assert_eq!(stats.panicked, 1);
    assert!(wait_until(Duration::from_secs(1), || timer.pending() == 0));
}

#[test]
fn reset_moves_the_next_run_and_restarts_the_grid() {
    let timer = timer();
    let runs = Record::new();
    let record = runs.clone();
    let period = ms(60);
    let start = Instant::now();
    let handle = timer
        .schedule_repeating(period, MissedTickBehavior::Skip, move || record.stamp())
        .unwrap();
    assert!(wait_until(Duration::from_secs(5), || runs.len() == 1));
    // After the first run (due at 60 ms), push the next one 150 ms out instead of 120 ms.
    let reset_at = Instant::now();
    assert!(handle.reset(ms(150)));
    assert!(wait_until(Duration::from_secs(5), || runs.len() == 3));
    handle.cancel();
    let runs = runs.get();
    let shown = millis_since(start, &runs);
    assert!(runs[1] >= reset_at + ms(150), "{shown:?}");
    assert!(runs[1] < reset_at + ms(150) + ms(80), "{shown:?}");
    // The grid restarted from the reset deadline: the next run is a period after it (about
    // 270 ms), not on the original grid (240 ms).
    assert!(runs[2] >= reset_at + ms(150) + period, "{shown:?}");
    assert!(runs[2] < reset_at + ms(150) + period + ms(80), "{shown:?}");
}

#[test]
fn reset_brings_a_distant_run_forward() {
    let timer = timer();
    let runs = Record::new();
    let record = runs.clone();
    let handle = timer
        .schedule_repeating(
            Duration::from_secs(3600),
            MissedTickBehavior::Burst,
            move || record.stamp(),
        )
        .unwrap();
    let reset_at = Instant::now();
    assert!(handle.reset(ms(20)));
    assert!(wait_until(Duration::from_secs(2), || runs.len() == 1));
    assert!(runs.get()[0] >= reset_at + ms(20));
    // The next run is an hour after that one, not 20 ms.
    std::thread::sleep(ms(60));
    assert_eq!(runs.len(), 1);
    assert_eq!(handle.state(), TimerState::Pending);
    assert!(handle.reset(Duration::ZERO));
    assert!(wait_until(Duration::from_secs(2), || runs.len() == 2));
    assert!(handle.cancel());
}

#[test]
fn a_reset_during_a_run_moves_the_run_after_it() {
    let timer = timer();
    let runs = Record::new();
    let record = runs.clone();
    let (started, is_started) = mpsc::channel();
    let handle = timer
        .schedule_repeating(ms(10), MissedTickBehavior::Burst, move || {
            record.stamp();
            if record.len() == 1 {
                let _ = started.send(());
                // Long enough that, without the reset, the next run would be due at once.
                std::thread::sleep(ms(40));
            }
        })
        .unwrap();
    is_started.recv_timeout(Duration::from_secs(5)).unwrap();
    let reset_at = Instant::now();
    assert!(handle.reset(ms(120)), "reset while running");
    // At least three: the runs after the reset come every 10 ms, and a loaded machine may keep
    // this thread from looking while there are exactly three.
    assert!(wait_until(Duration::from_secs(5), || runs.len() >= 3));
    handle.cancel();
    let runs = runs.get();
    let shown = millis_since(reset_at, &runs);
    assert!(
        runs[1] >= reset_at + ms(120),
        "the reset was lost: {shown:?}"
    );
    // Its grid restarted from the reset deadline: the run after it is due 10 ms later.
    assert!(runs[2] >= reset_at + ms(130), "{shown:?}");
}
