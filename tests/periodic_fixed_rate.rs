//! Repeating timers on the system clock: fixed rate without drift, the first run one period
//! (or the initial delay) after the call, the three missed-tick policies, fixed delay measured
//! from the end of the previous run, and zero periods rejected.
//!
//! Lower bounds (never early) are exact; upper bounds allow some scheduling slack.

mod support;

use shardwheel::{MissedTickBehavior, ScheduleError, Timer};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{Record, millis_since, wait_until};

/// Slack allowed for a run to start after its due time on a busy 2-core machine (other
/// builds running): upper bounds use it, and the periods are long enough that each policy's
/// signature stands out by more than this.
const SLACK: Duration = Duration::from_millis(80);

fn timer() -> Timer {
    Timer::builder().shards(2).build().expect("build timer")
}

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

#[test]
fn fixed_rate_runs_start_one_period_after_the_call_and_do_not_drift() {
    let timer = timer();
    let (period, work) = (ms(20), ms(8));
    let runs = Record::new();
    let record = runs.clone();
    let start = Instant::now();
    // Burst keeps run k on grid point k even on a loaded machine (late runs catch up), so
    // run k's lateness is exactly `run k - (start + k * period)`.
    let handle = timer
        .schedule_repeating(period, MissedTickBehavior::Burst, move || {
            record.stamp();
            // Each run takes a while: a fixed-delay timer would drift by 8 ms per run,
            // 160 ms by run 20.
            std::thread::sleep(work);
        })
        .unwrap();
    assert!(wait_until(Duration::from_secs(5), || runs.len() >= 20));
    assert!(handle.cancel());
    let runs = runs.get();
    let shown = millis_since(start, &runs);
    let mut lateness = Vec::new();
    for (k, run) in runs.iter().enumerate().take(20) {
        let due = start + period * (k as u32 + 1);
        assert!(*run >= due, "run {} early: {shown:?}", k + 1);
        lateness.push(*run - due);
    }
    let twentieth = lateness[19];
    lateness.sort();
    let median = lateness[lateness.len() / 2];
    eprintln!(
        "fixed rate: run 20 started {twentieth:?} after start + 20 periods; median lateness {median:?}"
    );
    assert!(
        median < ms(10),
        "drifting: lateness {lateness:?}, runs {shown:?}"
    );
    assert!(twentieth < SLACK, "run 20 is {twentieth:?} late: {shown:?}");
}

#[test]
fn the_first_run_of_schedule_repeating_after_follows_the_initial_delay() {
    let timer = timer();
    let (initial, period) = (ms(5), ms(25));
    let runs = Record::new();
    let record = runs.clone();
    let start = Instant::now();
    let handle = timer
        .schedule_repeating_after(initial, period, MissedTickBehavior::Burst, move || {
            record.stamp()
        })
        .unwrap();
    assert!(wait_until(Duration::from_secs(5), || runs.len() >= 6));
    handle.cancel();
    let runs = runs.get();
    for (k, run) in runs.iter().enumerate().take(6) {
        let due = start + initial + period * k as u32;
        assert!(
            *run >= due,
            "run {k} early: {:?}",
            millis_since(start, &runs)
        );
    }
    assert!(
        runs[0] < start + initial + SLACK,
        "first run late: {:?}",
        millis_since(start, &runs)
    );
}

const PERIOD: Duration = Duration::from_millis(200);

/// Starts of the runs of a fixed-rate timer with period 200 ms whose first run (due at 200 ms)
/// takes 500 ms, so the grid points at 400 and 600 ms pass while it runs; and when that first
/// run ended.
fn slow_first_run(missed: MissedTickBehavior) -> (Instant, Vec<Instant>, Instant) {
    let timer = timer();
    let runs = Record::new();
    let first_end = Arc::new(Mutex::new(None));
    let (record, end) = (runs.clone(), first_end.clone());
    let start = Instant::now();
    let handle = timer
        .schedule_repeating(PERIOD, missed, move || {
            record.stamp();
            if record.len() == 1 {
                std::thread::sleep(ms(500));
                *end.lock().unwrap() = Some(Instant::now());
            }
        })
        .unwrap();
    assert!(wait_until(Duration::from_secs(5), || runs.len() >= 4));
    handle.cancel();
    let end = first_end.lock().unwrap().expect("first run ended");
    (start, runs.get(), end)
}

#[test]
fn burst_runs_the_missed_points_back_to_back() {
    let (start, runs, first_end) = slow_first_run(MissedTickBehavior::Burst);
    let shown = millis_since(start, &runs);
    // Every run k is on the original grid and never early ...
    for (k, run) in runs.iter().enumerate() {
        assert!(
            *run >= start + PERIOD * (k as u32 + 1),
            "run {} early: {shown:?}",
            k + 1
        );
    }
    // ... the two missed points (400, 600 ms) run right after the slow run (which ended near
    // 700 ms; Skip or Delay would leave a period or more before the third run) ...
    assert!(
        runs[1] < first_end + SLACK && runs[2] < first_end + SLACK,
        "no burst: {shown:?}"
    );
    // ... then the grid goes on.
    assert!(
        runs[3] >= start + PERIOD * 4 && runs[3] < start + PERIOD * 4 + SLACK,
        "{shown:?}"
    );
}

#[test]
fn skip_drops_the_missed_points_and_returns_to_the_grid() {
    let (start, runs, first_end) = slow_first_run(MissedTickBehavior::Skip);
    let shown = millis_since(start, &runs);
    // The first grid point after the slow run ended (800 ms, unless the machine made the
    // slow run end later still).
    let point = ((first_end - start).as_nanos() / PERIOD.as_nanos()) as u32 + 1;
    assert!(point >= 4);
    // The missed points (400, 600 ms) were dropped: the second run is that grid point ...
    assert!(
        runs[1] >= start + PERIOD * point && runs[1] < start + PERIOD * point + SLACK,
        "{shown:?}"
    );
    // ... and the original grid goes on.
    assert!(
        runs[2] >= start + PERIOD * (point + 1) && runs[2] < start + PERIOD * (point + 1) + SLACK,
        "{shown:?}"
    );
    assert!(runs[3] >= start + PERIOD * (point + 2), "{shown:?}");
}

#[test]
fn delay_restarts_the_grid_from_the_late_run() {
    let (start, runs, first_end) = slow_first_run(MissedTickBehavior::Delay);
    let shown = millis_since(start, &runs);
    // The second run (due at 400 ms) starts late, right after the slow run ...
    assert!(
        runs[1] >= first_end && runs[1] < first_end + SLACK,
        "{shown:?}"
    );
    // ... and the grid restarts from its start: one period later, not at 800 ms. (The engine
    // reads the run's start just before our stamp: allow a tick's rounding.)
    let third = runs[2];
    assert!(third >= runs[1] + PERIOD - ms(1), "{shown:?}");
    assert!(third < runs[1] + PERIOD + SLACK, "{shown:?}");
    assert!(runs[3] >= runs[1] + PERIOD * 2 - ms(1), "{shown:?}");
}

#[test]
fn fixed_delay_measures_from_the_end_of_the_previous_run() {
    let timer = timer();
    let (initial, delay, work) = (ms(10), ms(30), ms(20));
    let spans = Arc::new(Mutex::new(Vec::<(Instant, Instant)>::new()));
    let record = spans.clone();
    let start = Instant::now();
    let handle = timer
        .schedule_with_fixed_delay(initial, delay, move || {
            let began = Instant::now();
            std::thread::sleep(work);
            record.lock().unwrap().push((began, Instant::now()));
        })
        .unwrap();
    assert!(wait_until(Duration::from_secs(5), || spans
        .lock()
        .unwrap()
        .len()
        >= 6));
    handle.cancel();
    let spans = spans.lock().unwrap().clone();
    assert!(spans[0].0 >= start + initial);
    for pair in spans.windows(2) {
        let ((_, end), (next, _)) = (pair[0], pair[1]);
        assert!(
            next >= end + delay,
            "a run started {:?} after the previous ended",
            next - end
        );
    }
    // Start to start is delay + run time (50 ms), not the 30 ms a fixed rate would give.
    let five_gaps = spans[5].0 - spans[0].0;
    assert!(five_gaps >= (delay + work) * 5, "{five_gaps:?}");
    assert!(five_gaps < (delay + work) * 5 + SLACK * 3, "{five_gaps:?}");
}

#[test]
fn a_zero_period_is_rejected() {
    let timer = timer();
    let never = || panic!("a rejected timer ran");
    assert_eq!(
        timer
            .schedule_repeating(Duration::ZERO, MissedTickBehavior::Burst, never)
            .unwrap_err(),
        ScheduleError::ZeroPeriod
    );
    assert_eq!(
        timer
            .schedule_repeating_after(ms(1), Duration::ZERO, MissedTickBehavior::Skip, never)
            .unwrap_err(),
        ScheduleError::ZeroPeriod
    );
    assert_eq!(
        timer
            .schedule_with_fixed_delay(ms(1), Duration::ZERO, never)
            .unwrap_err(),
        ScheduleError::ZeroPeriod
    );
    assert_eq!(
        timer
            .try_interval_at(Instant::now(), Duration::ZERO)
            .unwrap_err(),
        ScheduleError::ZeroPeriod
    );
    assert_eq!(
        ScheduleError::ZeroPeriod.to_string(),
        "a repeating timer needs a period longer than zero"
    );
    // A zero initial delay is fine: only the period must be positive.
    let runs = Record::new();
    let record = runs.clone();
    let handle = timer
        .schedule_repeating_after(
            Duration::ZERO,
            ms(1000),
            MissedTickBehavior::Skip,
            move || record.stamp(),
        )
        .unwrap();
    assert!(wait_until(Duration::from_secs(2), || runs.len() == 1));
    handle.cancel();
    assert_eq!(timer.stats().scheduled, 1);
}
