//! `Timer::interval`: tokio's semantics: the first tick at once, `tick().await` returns the due
//! instants of a fixed-rate grid, the interval is a `Stream`, and the three missed-tick policies
//! (system clock; see `manual_clock_async.rs` for the exact manual-clock versions and
//! `async_like_tokio.rs` for the same scenarios run against tokio's `Interval`).

mod support;

use futures::StreamExt;
use futures::executor::block_on;
use shardwheel::{Interval, MissedTickBehavior, ScheduleError, Timer};
use std::time::{Duration, Instant};

fn timer() -> Timer {
    Timer::builder().shards(2).build().expect("build timer")
}

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// Makes an interval; returns it with instants taken just before and after.
fn interval(
    timer: &Timer,
    period: Duration,
    missed: MissedTickBehavior,
) -> (Instant, Interval, Instant) {
    let before = Instant::now();
    let mut interval = timer.interval(period);
    interval.set_missed_tick_behavior(missed);
    assert_eq!(interval.missed_tick_behavior(), missed);
    (before, interval, Instant::now())
}

#[test]
fn ticks_return_the_due_instants_of_the_grid() {
    let timer = timer();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let period = ms(15);
        // Burst returns every grid point even when a loaded machine makes a tick late.
        let (before, mut interval, after) = interval(&timer, period, MissedTickBehavior::Burst);
        assert_eq!(interval.period(), period);
        let first = interval.tick().await;
        // The first tick at once, due when the interval was made.
        assert!(first >= before && first <= after);
        assert!(Instant::now() - after < period);
        for k in 1..6u32 {
            let due = interval.tick().await;
            assert_eq!(due, first + period * k, "tick {k} off the grid");
            assert!(Instant::now() >= due, "tick {k} early");
        }
    });
}

#[test]
fn an_interval_is_a_stream_of_tick_instants() {
    let timer = timer();
    let period = ms(10);
    let (before, mut interval, after) = interval(&timer, period, MissedTickBehavior::Burst);
    let ticks: Vec<Instant> = block_on(interval.by_ref().take(4).collect());
    assert_eq!(ticks.len(), 4);
    assert!(ticks[0] >= before && ticks[0] <= after);
    for (k, tick) in ticks.iter().enumerate() {
        assert_eq!(*tick, ticks[0] + period * k as u32);
    }
    assert!(Instant::now() >= ticks[3]);
    // The stream goes on where `take` left it.
    assert_eq!(block_on(interval.next()), Some(ticks[0] + period * 4));
    // Under tokio too.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let next = runtime.block_on(async move { interval.next().await });
    assert_eq!(next, Some(ticks[0] + period * 5));
}

const PERIOD: Duration = Duration::from_millis(50);

/// Ticks of a 50 ms interval: the first tick (at once), then the thread blocks for 180 ms so
/// that at least three grid points pass unobserved, then `count` more ticks. Returns the grid
/// origin (the first tick, due when the interval was made), the instant the block ended, and
/// (due, seen) of every tick, the first included.
type Ticks = (Instant, Instant, Vec<(Instant, Instant)>);

fn block_after_the_first_tick(missed: MissedTickBehavior, count: usize) -> Ticks {
    let timer = timer();
    let (_, mut interval, _) = interval(&timer, PERIOD, missed);
    block_on(async {
        let first = interval.tick().await;
        let mut ticks = vec![(first, Instant::now())];
        std::thread::sleep(ms(180));
        let unblocked = Instant::now();
        for _ in 0..count {
            let due = interval.tick().await;
            ticks.push((due, Instant::now()));
        }
        (first, unblocked, ticks)
    })
}

fn on_the_grid(origin: Instant, due: Instant) -> bool {
    (due - origin).as_nanos().is_multiple_of(PERIOD.as_nanos())
}

#[test]
fn burst_ticks_return_the_missed_points_back_to_back() {
    let (origin, unblocked, ticks) = block_after_the_first_tick(MissedTickBehavior::Burst, 6);
    // Every grid point comes back, in order, none skipped, none early.
    for (k, (due, seen)) in ticks.iter().enumerate() {
        assert_eq!(*due, origin + PERIOD * k as u32, "tick {k}");
        assert!(*seen >= *due);
    }
    // Those already due at the unblock came at once: much faster than one per period.
    let missed: Vec<_> = ticks[1..]
        .iter()
        .filter(|(due, _)| *due <= unblocked)
        .collect();
    assert!(
        missed.len() >= 3,
        "{} points were due at the unblock",
        missed.len()
    );
    let burst = missed.last().unwrap().1 - unblocked;
    let one_per_period = PERIOD * (missed.len() as u32 - 1);
    eprintln!("burst of {} ticks in {burst:?}", missed.len());
    assert!(
        burst < one_per_period / 2,
        "the burst of {} ticks took {burst:?}",
        missed.len()
    );
}

#[test]
fn skip_ticks_drop_the_missed_points_and_keep_the_grid() {
    let (origin, unblocked, ticks) = block_after_the_first_tick(MissedTickBehavior::Skip, 4);
    let mut skipped = 0;
    for (i, pair) in ticks.windows(2).enumerate() {
        let ((due, seen), (next, _)) = (pair[0], pair[1]);
        assert!(on_the_grid(origin, next), "tick {} off the grid", i + 1);
        assert!(next > due);
        if next > due + PERIOD {
            // Only points that had passed when the tick before was seen were dropped.
            assert!(
                next - PERIOD <= seen,
                "tick {}: a point not yet due was skipped",
                i + 1
            );
            skipped += (next - due).as_nanos() / PERIOD.as_nanos() - 1;
        }
    }
    // The tick that was pending during the block comes late with its own due instant; the
    // next one is a grid point after the unblock: every point in between was dropped.
    assert!(ticks[1].0 <= unblocked);
    assert!(
        ticks[2].0 > unblocked,
        "a point passed during the block was returned"
    );
    assert!(skipped >= 2, "only {skipped} points were skipped");
}

#[test]
fn delay_ticks_restart_the_grid_from_the_late_tick() {
    let (_, unblocked, ticks) = block_after_the_first_tick(MissedTickBehavior::Delay, 4);
    for (i, pair) in ticks.windows(2).enumerate() {
        let ((due, seen), (next, _)) = (pair[0], pair[1]);
        // Either on time (one period on), or late (seen more than 5 ms after it was due):
        // restarted one period after the late tick was seen (the interval reads the clock
        // between `due` and `seen`).
        let restart = next - PERIOD;
        assert!(
            next == due + PERIOD || (restart >= due && restart <= seen),
            "tick {}: {next:?} after {due:?} seen at {seen:?}",
            i + 1
        );
    }
    // The tick after the block restarted the grid from when it was seen.
    let restart = ticks[2].0 - PERIOD;
    assert!(
        restart >= unblocked && restart <= ticks[1].1,
        "not restarted from the late tick"
    );
}

#[test]
fn a_zero_period_interval_panics_and_try_interval_at_rejects_it() {
    support::quiet_intentional_panics();
    let timer = timer();
    assert_eq!(
        timer
            .try_interval_at(Instant::now(), Duration::ZERO)
            .unwrap_err(),
        ScheduleError::ZeroPeriod
    );
    let zero = std::panic::AssertUnwindSafe(|| timer.interval(Duration::ZERO));
    assert!(std::panic::catch_unwind(zero).is_err());
    assert_eq!(MissedTickBehavior::default(), MissedTickBehavior::Burst);
}

#[test]
fn an_interval_schedules_at_its_second_tick_and_dropping_it_cancels_its_timer() {
    let timer = timer();
    let mut intervals: Vec<Interval> = (0..100).map(|_| timer.interval(ms(1000))).collect();
    assert_eq!(timer.pending(), 0);
    let waker = std::task::Waker::noop();
    for interval in &mut intervals {
        // The first tick is due at once: no timer.
        assert!(
            interval
                .poll_tick(&mut std::task::Context::from_waker(waker))
                .is_ready()
        );
        assert_eq!(timer.stats().scheduled, 0);
    }
    for interval in &mut intervals {
        assert!(
            interval
                .poll_tick(&mut std::task::Context::from_waker(waker))
                .is_pending()
        );
    }
    assert_eq!(timer.pending(), 100);
    drop(intervals);
    assert_eq!(timer.pending(), 0);
}

#[test]
fn an_interval_on_a_shut_down_timer_panics_after_its_first_tick() {
    support::quiet_intentional_panics();
    let timer = timer();
    timer.shutdown();
    assert_eq!(
        timer.try_interval_at(Instant::now(), ms(5)).unwrap_err(),
        ScheduleError::Shutdown
    );
    let mut interval = timer.interval(ms(5));
    // Due at once: needs no timer.
    block_on(interval.tick());
    let second =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| block_on(interval.next())));
    assert!(second.is_err(), "the second tick did not panic");
}
