//! The async API on a manual clock (`Clock::manual()`): sleeps (poll, advance, poll),
//! resets of a sleep, timeouts and intervals with each missed-tick policy. Nothing moves until
//! the test calls `clock.advance(d)`, so every assertion is exact and none of them sleeps.
//! Closure timers on the same clock are `manual_clock.rs`.

mod support;

use shardwheel::MissedTickBehavior;
use std::task::Poll;
use std::time::{Duration, Instant};
use support::{counting_waker, manual_timer, poll_noop, poll_once};

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

#[test]
fn a_sleep_completes_on_the_advance_that_reaches_its_deadline() {
    let (clock, timer) = manual_timer(2, ms(1));
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
    let (clock, timer) = manual_timer(2, ms(1));
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
    let (clock, timer) = manual_timer(2, ms(1));
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
fn intervals_tick_on_the_manual_clock() {
    let (clock, timer) = manual_timer(2, ms(1));
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
    let (clock, timer) = manual_timer(2, ms(1));
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

/// Skip with a period beyond 2^64 ns (584 years): the point it skips to is still on the grid
/// (its distance behind the grid once went through a u64 and was cut).
#[test]
fn interval_skip_keeps_the_grid_of_a_period_of_centuries() {
    let (clock, timer) = manual_timer(1, ms(1));
    let year = Duration::from_secs(365 * 86_400);
    let start = clock.now().checked_sub(year * 600).expect("600 years back");
    let period = year * 700;
    let mut interval = timer.interval_at(start, period);
    interval.set_missed_tick_behavior(MissedTickBehavior::Skip);
    assert_eq!(
        poll_noop(&mut Box::pin(interval.tick())),
        Poll::Ready(start)
    );
    // The next point is start + 700 years, 100 years from now.
    clock.advance(year * 99);
    assert!(poll_noop(&mut Box::pin(interval.tick())).is_pending());
    clock.advance(year * 2);
    assert_eq!(
        poll_noop(&mut Box::pin(interval.tick())),
        Poll::Ready(start + period)
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
    let (clock, timer) = manual_timer(2, ms(1));
    clock.advance(ms(10));
    let mut sleep = timer.sleep_until(clock.now() - ms(5));
    assert!(
        poll_noop(&mut sleep).is_ready(),
        "a passed deadline did not complete at once"
    );
    let mut zero = timer.sleep(Duration::ZERO);
    assert!(poll_noop(&mut zero).is_ready());
}

#[test]
fn a_sleep_moved_later_keeps_its_timer_until_it_fires_then_schedules_one_for_the_new_deadline() {
    let (clock, timer) = manual_timer(1, ms(1));
    let start = clock.now();
    let (woken, waker) = counting_waker();
    let mut sleep = timer.sleep(ms(10));
    assert!(poll_once(&mut sleep, &waker).is_pending());
    let before = timer.stats();
    // Later, three times: the timer stays where it is; each counts as a reset once the sleep
    // lets go of that timer.
    for later in [20, 30, 40] {
        std::pin::Pin::new(&mut sleep).reset(start + ms(later));
    }
    let after = timer.stats();
    assert_eq!(after.scheduled, before.scheduled, "no timer scheduled");
    assert_eq!(after.reset, before.reset, "counted when the timer goes");
    assert_eq!(sleep.deadline(), start + ms(40));
    // The timer fires at 10 ms: one early wake-up; the sleep is not elapsed, and its poll
    // lets go of the timer (counting the resets) and schedules one for 40 ms.
    clock.advance(ms(10));
    assert_eq!(woken.wakes(), 1);
    assert!(!sleep.is_elapsed());
    assert!(poll_once(&mut sleep, &waker).is_pending());
    assert_eq!(timer.stats().reset, before.reset + 3);
    assert_eq!(timer.stats().scheduled, before.scheduled + 1);
    assert_eq!(timer.stats().pending, 1);
    // Earlier than that timer: moved in place.
    std::pin::Pin::new(&mut sleep).reset(start + ms(35));
    clock.advance(ms(24));
    assert_eq!(woken.wakes(), 1);
    assert!(poll_once(&mut sleep, &waker).is_pending());
    clock.advance(ms(1));
    assert_eq!(woken.wakes(), 2);
    assert!(sleep.is_elapsed());
    assert_eq!(poll_once(&mut sleep, &waker), Poll::Ready(()));
    assert_eq!(clock.now() - start, ms(35));
    assert_eq!(timer.stats().pending, 0);
}

#[test]
fn a_sleep_moved_later_completes_at_once_if_its_new_deadline_passed_before_its_poll() {
    let (clock, timer) = manual_timer(1, ms(1));
    let start = clock.now();
    let (woken, waker) = counting_waker();
    let mut sleep = timer.sleep(ms(10));
    assert!(poll_once(&mut sleep, &waker).is_pending());
    std::pin::Pin::new(&mut sleep).reset(start + ms(20));
    // One advance past both deadlines: the timer fires (at 10 ms); the poll finds 20 ms passed.
    clock.advance(ms(25));
    assert_eq!(woken.wakes(), 1);
    assert!(sleep.is_elapsed());
    assert_eq!(poll_once(&mut sleep, &waker), Poll::Ready(()));
    assert_eq!(timer.stats().pending, 0);
}
