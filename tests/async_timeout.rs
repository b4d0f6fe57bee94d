//! `Timer::timeout` / `Timer::timeout_at`: `Result<T, Elapsed>`, never early, lazy (a future
//! ready at its first poll costs no timer), and dropping a pending `Timeout` cancels its timer.

mod support;

use futures::executor::block_on;
use shardwheel::{Elapsed, Timeout};
use std::future::{pending, ready};
use std::time::{Duration, Instant};
use support::{poll_noop, timer, use_counters, wait_until};

fn assert_error<E: std::error::Error + Send + Sync + 'static>(_: &E) {}

#[test]
fn elapsed_is_a_std_error() {
    let timer = timer(2);
    let result: Result<(), Elapsed> = block_on(timer.timeout(Duration::from_millis(1), pending()));
    let error = result.unwrap_err();
    assert_error(&error);
    let boxed: Box<dyn std::error::Error> = Box::new(error);
    assert_eq!(boxed.to_string(), "deadline has elapsed");
}

#[test]
fn the_output_is_returned_when_the_future_wins() {
    let timer = timer(2);
    let result: Result<u32, Elapsed> = block_on(timer.timeout(Duration::from_secs(10), ready(7)));
    assert_eq!(result, Ok(7));
    // A slower future that still beats the deadline: a shorter sleep.
    let before = Instant::now();
    let inner = timer.sleep(Duration::from_millis(10));
    let result = block_on(timer.timeout(Duration::from_secs(10), inner));
    assert_eq!(result, Ok(()));
    assert!(before.elapsed() >= Duration::from_millis(10));
    // The winner's deadline timer was cancelled when the Timeout was dropped; the first
    // timeout, ready at once, never had one.
    assert!(wait_until(Duration::from_secs(1), || timer.pending() == 0));
    let stats = timer.stats();
    assert_eq!((stats.scheduled, stats.cancelled), (2, 1));
}

#[test]
fn the_deadline_elapses_never_early() {
    let timer = timer(2);
    for millis in [1u64, 5, 20] {
        let delay = Duration::from_millis(millis);
        let before = Instant::now();
        let result = block_on(timer.timeout(delay, pending::<()>()));
        let took = before.elapsed();
        assert_eq!(
            result.map_err(|error| error.to_string()),
            Err("deadline has elapsed".to_string())
        );
        assert!(took >= delay, "timeout({delay:?}) elapsed after {took:?}");
    }
}

#[test]
fn timeout_at_uses_an_absolute_deadline() {
    let timer = timer(2);
    let deadline = Instant::now() + Duration::from_millis(30);
    let result = block_on(timer.timeout_at(deadline, pending::<()>()));
    assert!(result.is_err());
    assert!(Instant::now() >= deadline);

    let far = Instant::now() + Duration::from_secs(30);
    assert_eq!(block_on(timer.timeout_at(far, ready("done"))), Ok("done"));
    // A passed deadline: the future still gets its first poll, and wins if it is ready.
    let passed = Instant::now() - Duration::from_millis(1);
    assert_eq!(block_on(timer.timeout_at(passed, ready(1))), Ok(1));
    assert!(block_on(timer.timeout_at(passed, pending::<()>())).is_err());
}

#[test]
fn a_slow_inner_future_loses_to_the_deadline() {
    let timer = timer(2);
    let before = Instant::now();
    let slow = timer.sleep(Duration::from_secs(20));
    let result = block_on(timer.timeout(Duration::from_millis(15), slow));
    assert!(result.is_err());
    let took = before.elapsed();
    assert!(
        took >= Duration::from_millis(15) && took < Duration::from_secs(5),
        "took {took:?}"
    );
    // Both timers are gone: one fired, the inner sleep's was cancelled with the Timeout.
    assert_eq!(timer.pending(), 0);
}

#[test]
fn dropping_a_pending_timeout_cancels_its_timer() {
    let timer = timer(2);
    let mut timeouts: Vec<Timeout<std::future::Pending<()>>> = (0..1000)
        .map(|_| timer.timeout(Duration::from_secs(60), pending()))
        .collect();
    for timeout in &mut timeouts {
        assert!(poll_noop(timeout).is_pending());
    }
    assert_eq!(timer.pending(), 1000);
    let cancelled = timer.stats().cancelled;
    drop(timeouts);
    assert_eq!(timer.pending(), 0);
    assert_eq!(timer.stats().cancelled - cancelled, 1000);
}

#[test]
fn into_inner_gives_the_future_back_and_cancels_the_deadline() {
    let timer = timer(2);
    let mut timeout = timer.timeout(Duration::from_secs(60), pending::<()>());
    assert!(poll_noop(&mut timeout).is_pending());
    assert_eq!(timer.pending(), 1);
    let future = timeout.into_inner();
    assert_eq!(timer.pending(), 0);
    let mut future = Box::pin(future);
    assert!(poll_noop(&mut future).is_pending());
    // Never polled: no timer at all.
    let timeout = timer.timeout(Duration::from_secs(60), ready(5));
    assert_eq!(block_on(timeout.into_inner()), 5);
    assert_eq!(timer.stats().scheduled, 1);
}

/// Lazy registration: a future ready at its first poll completes its timeout without touching
/// the engine (no schedule, no cancel), and so does a never-polled timeout's drop.
#[test]
fn a_timeout_ready_at_its_first_poll_leaves_the_engine_untouched() {
    let timer = timer(2);
    let before = timer.stats();
    for round in 0..1000u32 {
        assert_eq!(
            block_on(timer.timeout(Duration::from_secs(5), ready(round))),
            Ok(round)
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        assert_eq!(
            block_on(timer.timeout_at(deadline, async move { round })),
            Ok(round)
        );
        drop(timer.timeout(Duration::from_secs(5), pending::<()>()));
    }
    let after = timer.stats();
    assert_eq!(
        use_counters(&after),
        use_counters(&before),
        "a ready-at-first-poll timeout touched the engine"
    );
    assert_eq!(timer.pending(), 0);
    // `get_ref` and `get_mut` reach the inner future.
    let mut timeout = timer.timeout(Duration::from_secs(5), ready(3));
    let inner: *const _ = timeout.get_ref();
    assert!(std::ptr::eq(inner, timeout.get_mut()));
}
