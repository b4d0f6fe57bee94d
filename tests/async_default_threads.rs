//! The default timer as each thread that makes its sleeps sees it (each copies what its sleeps
//! need of it at its first sleep): the same timer on every thread, with the configuration it
//! was built with. One test: the default timer is process-wide, and this binary configures it.

use shardwheel::Timer;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// Under a `max_pending` limit the default timer keeps no timers (a kept timer would hold a
/// place of the limit): a dropped sleep's timer is cancelled at once, on whichever thread made
/// it. Without the limit it would stay pending, kept.
#[test]
fn sleeps_on_every_thread_are_the_configured_default_timers() {
    let timer = shardwheel::set_default_timer(Timer::builder().shards(1).max_pending(16))
        .expect("first configuration");
    let sleep_three = || {
        let mut cx = Context::from_waker(Waker::noop());
        let far = Duration::from_secs(60);
        let mut sleep = pin!(shardwheel::sleep(far));
        assert_eq!(sleep.as_mut().poll(&mut cx), Poll::Pending);
        let mut until = pin!(shardwheel::sleep_until(Instant::now() + far));
        assert_eq!(until.as_mut().poll(&mut cx), Poll::Pending);
        let mut timeout = pin!(shardwheel::timeout(far, std::future::pending::<()>()));
        assert_eq!(timeout.as_mut().poll(&mut cx), Poll::Pending);
    };
    let threads: Vec<_> = (0..2).map(|_| std::thread::spawn(sleep_three)).collect();
    for thread in threads {
        thread.join().expect("sleeping thread");
    }
    // This thread goes on after its sleeps: a timer kept here would still count as pending.
    sleep_three();
    let stats = timer.stats();
    assert_eq!(
        stats.scheduled, 9,
        "every sleep on the default timer: {stats:?}"
    );
    assert_eq!(stats.pending, 0, "no timer kept under the limit: {stats:?}");
    assert_eq!(stats.cancelled, 9, "{stats:?}");
}
