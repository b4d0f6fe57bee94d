//! The process-wide default timer behind `shardwheel::sleep` & co.: configured once before its
//! first use (a refused configuration leaves it unbuilt; a second one is a typed error), and the
//! free functions' lazy registration (a timeout whose future is ready at its first poll, or a
//! sleep never polled, leaves `stats()` untouched). One test: the default timer is
//! process-wide, and this binary checks the order of its configuration.

mod support;

use futures::executor::block_on;
use shardwheel::{BuildError, DefaultTimerError, Timer};
use std::future::{pending, ready};
use std::time::{Duration, Instant};
use support::use_counters;

#[test]
fn the_default_timer_is_configured_once_and_the_free_functions_register_lazily() {
    // A refused configuration leaves the default timer unbuilt.
    let refused = shardwheel::set_default_timer(Timer::builder().shards(0)).unwrap_err();
    assert!(
        matches!(refused, DefaultTimerError::Build(BuildError::NoShards)),
        "{refused:?}"
    );
    assert!(std::error::Error::source(&refused).is_some());

    let timer =
        shardwheel::set_default_timer(Timer::builder().shards(1)).expect("first configuration");
    assert_eq!(timer.stats().shards.len(), 1);
    let again = shardwheel::set_default_timer(Timer::builder().shards(3)).unwrap_err();
    assert!(matches!(again, DefaultTimerError::AlreadyBuilt));
    assert!(again.to_string().contains("already built"), "{again}");
    let same = shardwheel::default_timer().expect("default timer");
    assert!(std::ptr::eq(same, timer));
    assert_eq!(same.stats().shards.len(), 1);

    // Lazy registration: no schedule, no cancel.
    let before = timer.stats();
    for round in 0..1000u32 {
        let answer = block_on(shardwheel::timeout(Duration::from_secs(5), ready(round)));
        assert_eq!(answer, Ok(round));
        let deadline = Instant::now() + Duration::from_secs(5);
        assert_eq!(
            block_on(shardwheel::timeout_at(deadline, async move { round })),
            Ok(round)
        );
        drop(shardwheel::sleep(Duration::from_secs(5)));
        drop(shardwheel::timeout(Duration::from_secs(5), pending::<()>()));
        drop(shardwheel::interval(Duration::from_secs(5)));
    }
    let after = timer.stats();
    assert_eq!(
        use_counters(&after),
        use_counters(&before),
        "lazy registration touched the engine"
    );

    // The free functions run on it.
    let started = Instant::now();
    block_on(shardwheel::sleep(Duration::from_millis(10)));
    // A sleep first polled after a deadline its shard has seen pass needs no timer.
    let seen = timer.stats();
    block_on(shardwheel::sleep_until(started));
    assert_eq!(use_counters(&timer.stats()), use_counters(&seen));
    assert!(started.elapsed() >= Duration::from_millis(10));
    assert!(
        block_on(shardwheel::timeout(
            Duration::from_millis(5),
            pending::<()>()
        ))
        .is_err()
    );
    let mut interval = shardwheel::interval_at(Instant::now(), Duration::from_millis(5));
    let first = block_on(interval.tick());
    assert_eq!(block_on(interval.tick()), first + Duration::from_millis(5));
    let after = timer.stats();
    assert_eq!(after.scheduled - before.scheduled, 3);
    assert_eq!(after.fired - before.fired, 3);
    assert_eq!(timer.pending(), 0);
}
