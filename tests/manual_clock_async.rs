//! `Clock::manual()`: timers move only when the test calls `advance`, and when `advance`
//! returns every timer due by the new time has been handed to run (with `Executor::Inline`,
//! has run), so every assertion here is exact and none of them sleeps. Covers one-shot timers,
//! sleeps (poll, advance, poll), timeouts, repeating timers with each missed-tick policy, fixed
//! delay, reset and cancel, and intervals.

#[path = "async_support.rs"]
mod support;

use shardwheel::{Clock, Executor, MissedTickBehavior, Timer, TimerState};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};
use support::{Rng, counting_waker, poll_noop, poll_once, wait_until};

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// A manual clock and an inline-executor timer on it.
fn manual() -> (Clock, Timer) {
    let clock = Clock::manual();
    let timer = Timer::builder()
        .clock(clock.clone())
        .shards(2)
        .executor(Executor::Inline)
        .build()
        .expect("build timer");
    (clock, timer)
}

/// Times (since `origin`) at which a task ran, read from the manual clock inside the task.
#[derive(Clone)]
struct Runs {
    clock: Clock,
    origin: Instant,
    at: Arc<Mutex<Vec<Duration>>>,
}

impl Runs {
    fn new(clock: &Clock) -> Runs {
        Runs {
            clock: clock.clone(),
            origin: clock.now(),
            at: Arc::default(),
        }
    }

    fn record(&self) {
        let now = self.clock.now() - self.origin;
        self.at.lock().unwrap().push(now);
    }

    fn millis(&self) -> Vec<u64> {
        self.at
            .lock()
            .unwrap()
            .iter()
            .map(|at| at.as_millis() as u64)
            .collect()
    }

    fn exact(&self) -> Vec<Duration> {
        self.at.lock().unwrap().clone()
    }
}

/// Advances in 1 ms steps.
fn step(clock: &Clock, millis: u64) {
    for _ in 0..millis {
        clock.advance(ms(1));
    }
}

#[test]
fn timers_move_only_when_the_clock_advances() {
    let (clock, timer) = manual();
    assert!(clock.is_manual() && !Clock::system().is_manual());
    let fired = Arc::new(AtomicUsize::new(0));
    let flag = fired.clone();
    let start = clock.now();
    timer
        .schedule(ms(50), move || {
            flag.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    // Real time passes; the manual clock and the timer do not move.
    std::thread::sleep(ms(80));
    assert_eq!(clock.now(), start);
    assert_eq!(fired.load(Ordering::SeqCst), 0);
    clock.advance(ms(49));
    assert_eq!(fired.load(Ordering::SeqCst), 0);
    assert_eq!(timer.pending(), 1);
    clock.advance(ms(1));
    assert_eq!(
        fired.load(Ordering::SeqCst),
        1,
        "advance returned before the task ran"
    );
    assert_eq!(clock.now() - start, ms(50));
    assert_eq!(timer.pending(), 0);
    assert_eq!(timer.stats().fired, 1);
}

#[test]
fn advance_returns_after_every_due_timer_has_run() {
    let (clock, timer) = manual();
    let mut rng = Rng::new(3);
    let due: Vec<u64> = (0..2000).map(|_| rng.between(1, 300)).collect();
    let ran = Arc::new(AtomicUsize::new(0));
    for &millis in &due {
        let ran = ran.clone();
        timer
            .schedule(ms(millis), move || {
                ran.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
    }
    for now in 1..=300u64 {
        clock.advance(ms(1));
        let expected = due.iter().filter(|&&millis| millis <= now).count();
        assert_eq!(ran.load(Ordering::SeqCst), expected, "at {now} ms");
    }
    // A second timer on the same clock is driven by the same advance.
    let other = Timer::builder()
        .clock(clock.clone())
        .executor(Executor::Inline)
        .build()
        .unwrap();
    let flag = ran.clone();
    other
        .schedule(ms(5), move || {
            flag.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    clock.advance(ms(5));
    assert_eq!(ran.load(Ordering::SeqCst), due.len() + 1);
}

#[test]
fn with_a_pool_executor_advance_hands_the_tasks_over() {
    let clock = Clock::manual();
    let timer = Timer::builder()
        .clock(clock.clone())
        .shards(1)
        .build()
        .unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let flag = ran.clone();
    timer
        .schedule(ms(10), move || {
            flag.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    clock.advance(ms(9));
    assert_eq!(timer.stats().fired, 0);
    clock.advance(ms(1));
    // Handed to the pool by now; it runs there shortly.
    assert_eq!(timer.stats().fired, 1);
    assert!(wait_until(Duration::from_secs(2), || ran
        .load(Ordering::SeqCst)
        == 1));
}

#[test]
fn a_sleep_completes_on_the_advance_that_reaches_its_deadline() {
    let (clock, timer) = manual();
    let (woken, waker) = counting_waker();
    let mut sleep = timer.sleep(ms(30));
    assert_eq!(sleep.deadline(), clock.now() + ms(30));
    assert!(poll_once(&mut sleep, &waker).is_pending());
    clock.advance(ms(29));
    assert_eq!(woken.wakes(), 0);
    assert!(poll_once(&mut sleep, &waker).is_pending());
    clock.advance(ms(1));
    assert_eq!(woken.wakes(), 1, "the wake-up runs inline within advance");
    assert_eq!(poll_once(&mut sleep, &waker), Poll::Ready(()));

    // sleep_until, with a deadline between ticks: rounded up to the next 1 ms tick.
    let mut until = timer.sleep_until(clock.now() + Duration::from_micros(2500));
    assert!(poll_once(&mut until, &waker).is_pending());
    clock.advance(ms(2));
    assert!(poll_once(&mut until, &waker).is_pending());
    clock.advance(ms(1));
    assert_eq!(poll_once(&mut until, &waker), Poll::Ready(()));
}

#[test]
fn sleep_reset_earlier_later_and_after_completion() {
    let (clock, timer) = manual();
    let start = clock.now();
    let mut sleep = timer.sleep(ms(100));
    assert!(poll_noop(&mut sleep).is_pending());
    // Earlier.
    std::pin::Pin::new(&mut sleep).reset(start + ms(10));
    clock.advance(ms(10));
    assert!(poll_noop(&mut sleep).is_ready());
    // After completion, later.
    std::pin::Pin::new(&mut sleep).reset(start + ms(40));
    assert!(poll_noop(&mut sleep).is_pending());
    clock.advance(ms(29));
    assert!(poll_noop(&mut sleep).is_pending());
    clock.advance(ms(1));
    assert!(poll_noop(&mut sleep).is_ready());
    // Pending, then later still: the old deadline passes without completing it.
    std::pin::Pin::new(&mut sleep).reset(start + ms(50));
    assert!(poll_noop(&mut sleep).is_pending());
    std::pin::Pin::new(&mut sleep).reset(start + ms(70));
    clock.advance(ms(10));
    assert!(poll_noop(&mut sleep).is_pending());
    clock.advance(ms(19));
    assert!(poll_noop(&mut sleep).is_pending());
    clock.advance(ms(1));
    assert!(poll_noop(&mut sleep).is_ready());
    assert_eq!(clock.now() - start, ms(70));
}

#[test]
fn timeouts_follow_the_manual_clock() {
    let (clock, timer) = manual();
    let mut timeout = timer.timeout(ms(50), std::future::pending::<()>());
    assert!(poll_noop(&mut timeout).is_pending());
    clock.advance(ms(49));
    assert!(poll_noop(&mut timeout).is_pending());
    clock.advance(ms(1));
    assert!(matches!(poll_noop(&mut timeout), Poll::Ready(Err(_))));

    drop(timeout);

    // The inner future wins: a shorter sleep on the same clock.
    let mut timeout = timer.timeout(ms(50), timer.sleep(ms(20)));
    assert!(poll_noop(&mut timeout).is_pending());
    assert_eq!(timer.pending(), 2);
    clock.advance(ms(20));
    assert_eq!(poll_noop(&mut timeout), Poll::Ready(Ok(())));
    // Dropping the Timeout cancels its own (still pending) deadline.
    drop(timeout);
    assert_eq!(timer.pending(), 0);

    let mut timeout = timer.timeout_at(clock.now() + ms(5), std::future::pending::<()>());
    assert!(poll_noop(&mut timeout).is_pending());
    clock.advance(ms(4));
    assert!(poll_noop(&mut timeout).is_pending());
    clock.advance(ms(1));
    assert!(poll_noop(&mut timeout).is_ready());
}

#[test]
fn fixed_rate_runs_exactly_on_the_grid() {
    let (clock, timer) = manual();
    let runs = Runs::new(&clock);
    let record = runs.clone();
    let handle = timer
        .schedule_repeating(ms(10), MissedTickBehavior::Skip, move || record.record())
        .unwrap();
    let after = Runs::new(&clock);
    let record = after.clone();
    let delayed = timer
        .schedule_repeating_after(ms(3), ms(7), MissedTickBehavior::Burst, move || {
            record.record()
        })
        .unwrap();
    step(&clock, 200);
    assert_eq!(runs.millis(), (1..=20).map(|k| 10 * k).collect::<Vec<_>>());
    // Exactly, to the nanosecond: run k at start + k * period.
    assert_eq!(runs.exact()[19], ms(200));
    assert_eq!(
        after.millis(),
        (0..=28).map(|k| 3 + 7 * k).collect::<Vec<_>>()
    );
    assert!(handle.cancel() && delayed.cancel());
    step(&clock, 50);
    assert_eq!(runs.millis().len(), 20);
    assert_eq!(timer.pending(), 0);
}

/// A repeating timer with period 10 ms, then one advance of 35 ms (the points at 10, 20 and
/// 30 ms are all due at once), then 1 ms steps to 60 ms. Returns when each run happened.
fn one_big_advance(missed: MissedTickBehavior) -> Vec<u64> {
    let (clock, timer) = manual();
    let runs = Runs::new(&clock);
    let record = runs.clone();
    let _handle = timer
        .schedule_repeating(ms(10), missed, move || record.record())
        .unwrap();
    clock.advance(ms(35));
    step(&clock, 25);
    runs.millis()
}

#[test]
fn burst_runs_every_missed_point_within_the_advance() {
    assert_eq!(
        one_big_advance(MissedTickBehavior::Burst),
        [35, 35, 35, 40, 50, 60]
    );
}

#[test]
fn skip_drops_the_missed_points_and_keeps_the_grid() {
    assert_eq!(one_big_advance(MissedTickBehavior::Skip), [35, 40, 50, 60]);
}

#[test]
fn delay_restarts_the_grid_from_the_late_run() {
    assert_eq!(one_big_advance(MissedTickBehavior::Delay), [35, 45, 55]);
}

#[test]
fn fixed_delay_counts_from_the_end_of_each_run() {
    let (clock, timer) = manual();
    let runs = Runs::new(&clock);
    let record = runs.clone();
    let _handle = timer
        .schedule_with_fixed_delay(ms(5), ms(10), move || record.record())
        .unwrap();
    step(&clock, 40);
    assert_eq!(runs.millis(), [5, 15, 25, 35]);
    // A late run: the next one is a full delay after it, not on any grid.
    clock.advance(ms(17)); // to 57: the run due at 45 runs now
    step(&clock, 20);
    assert_eq!(runs.millis(), [5, 15, 25, 35, 57, 67, 77]);
}

#[test]
fn reset_and_cancel_of_a_repeating_timer() {
    let (clock, timer) = manual();
    let runs = Runs::new(&clock);
    let record = runs.clone();
    let handle = timer
        .schedule_repeating(ms(100), MissedTickBehavior::Skip, move || record.record())
        .unwrap();
    clock.advance(ms(30));
    // Bring the next run forward to 40 ms: the grid restarts there.
    assert!(handle.reset(ms(10)));
    step(&clock, 250);
    assert_eq!(runs.millis(), [40, 140, 240]);
    // Push it back: from 280 ms, the run due at 340 moves to 400.
    assert!(handle.reset_at(clock.now() + ms(120)));
    step(&clock, 200);
    assert_eq!(runs.millis(), [40, 140, 240, 400]);
    assert!(handle.cancel());
    assert_eq!(handle.state(), TimerState::Cancelled);
    step(&clock, 300);
    assert_eq!(runs.millis().len(), 4);
    assert!(!handle.reset(ms(1)), "a cancelled timer cannot be reset");
}

#[test]
fn a_task_that_cancels_its_own_timer_runs_no_more() {
    let (clock, timer) = manual();
    let runs = Runs::new(&clock);
    let record = runs.clone();
    let slot: Arc<Mutex<Option<shardwheel::TimerHandle>>> = Arc::default();
    let own = slot.clone();
    let handle = timer
        .schedule_repeating(ms(10), MissedTickBehavior::Burst, move || {
            record.record();
            if record.at.lock().unwrap().len() == 3 {
                assert!(own.lock().unwrap().as_ref().unwrap().cancel());
            }
        })
        .unwrap();
    *slot.lock().unwrap() = Some(handle);
    step(&clock, 100);
    assert_eq!(runs.millis(), [10, 20, 30]);
}

#[test]
fn intervals_tick_on_the_manual_clock() {
    let (clock, timer) = manual();
    let origin = clock.now();
    let mut interval = timer.interval(ms(10));
    interval.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut tick = Box::pin(async move {
        let mut ticks = Vec::new();
        for _ in 0..3 {
            ticks.push(interval.tick().await);
        }
        ticks
    });
    // The first tick at once, then one per 10 ms.
    for _ in 0..19 {
        assert!(poll_noop(&mut tick).is_pending());
        clock.advance(ms(1));
    }
    assert!(poll_noop(&mut tick).is_pending());
    clock.advance(ms(1));
    assert_eq!(
        poll_noop(&mut tick),
        Poll::Ready(vec![origin, origin + ms(10), origin + ms(20)])
    );
}

/// Ticks of a 10 ms interval: the first at once, then after one advance of 35 ms, then 1 ms
/// steps to 60 ms: (due, seen) in ms since the interval was made.
fn interval_after_a_big_advance(missed: MissedTickBehavior) -> Vec<(u64, u64)> {
    let (clock, timer) = manual();
    let origin = clock.now();
    let mut interval = timer.interval(ms(10));
    interval.set_missed_tick_behavior(missed);
    let since = |instant: Instant| (instant - origin).as_millis() as u64;
    let mut ticks = Vec::new();
    let seen = |interval: &mut shardwheel::Interval, ticks: &mut Vec<(u64, u64)>| {
        let mut next = Box::pin(interval.tick());
        // A tick reset to a deadline already past fires at the shard's next turn, which on a
        // manual clock is the next advance: give it one that does not move the time.
        for _ in 0..2 {
            if let Poll::Ready(due) = poll_noop(&mut next) {
                ticks.push((since(due), since(clock.now())));
                return true;
            }
            clock.advance(Duration::ZERO);
        }
        false
    };
    while seen(&mut interval, &mut ticks) {}
    clock.advance(ms(35));
    while seen(&mut interval, &mut ticks) {}
    for _ in 0..25 {
        clock.advance(ms(1));
        while seen(&mut interval, &mut ticks) {}
    }
    ticks
}

#[test]
fn interval_burst_returns_every_missed_point() {
    assert_eq!(
        interval_after_a_big_advance(MissedTickBehavior::Burst),
        [
            (0, 0),
            (10, 35),
            (20, 35),
            (30, 35),
            (40, 40),
            (50, 50),
            (60, 60)
        ]
    );
}

#[test]
fn interval_skip_returns_to_the_grid() {
    assert_eq!(
        interval_after_a_big_advance(MissedTickBehavior::Skip),
        [(0, 0), (10, 35), (40, 40), (50, 50), (60, 60)]
    );
}

#[test]
fn interval_delay_restarts_from_the_late_tick() {
    assert_eq!(
        interval_after_a_big_advance(MissedTickBehavior::Delay),
        [(0, 0), (10, 35), (45, 45), (55, 55)]
    );
}

/// `sleep_until` documents "at once if it has passed". On a manual clock a sleep whose deadline
/// has already passed stays pending until the test advances the clock again (even by zero):
/// nothing drives the shard in between. An interval with `MissedTickBehavior::Burst` after a big
/// advance shows it too: its second tick never completes without another `advance`.
#[test]
fn a_sleep_whose_deadline_has_passed_completes_without_another_advance() {
    let (clock, timer) = manual();
    clock.advance(ms(10));
    let mut sleep = timer.sleep_until(clock.now() - ms(5));
    assert!(
        poll_noop(&mut sleep).is_ready(),
        "a passed deadline did not complete at once"
    );
    let mut zero = timer.sleep(Duration::ZERO);
    assert!(poll_noop(&mut zero).is_ready());
}
