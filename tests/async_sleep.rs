//! `Timer::sleep` / `Timer::sleep_until`: the `Sleep` future's type, its never-early
//! completion, cancellation on drop (with the memory behind it released at once), and
//! `Sleep::reset` in both directions and after completion.

#[path = "async_support.rs"]
mod support;

use futures::executor::block_on;
use shardwheel::{Interval, ScheduleError, Sleep, Timeout, Timer};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};
use support::{counting_waker, poll_noop, poll_once, wait_until};

fn timer() -> Timer {
    Timer::builder().shards(2).build().expect("build timer")
}

/// Compile-time checks: these only build if the bounds hold.
fn assert_send<T: Send>() {}
fn assert_unpin<T: Unpin>() {}
fn assert_future<F: std::future::Future<Output = O>, O>(_: &F) {}

#[test]
fn sleep_is_send_unpin_and_outputs_a_schedule_result() {
    assert_send::<Sleep>();
    assert_unpin::<Sleep>();
    assert_send::<Timeout<std::future::Pending<()>>>();
    assert_send::<Interval>();
    let timer = timer();
    let sleep = timer.sleep(Duration::from_millis(1));
    assert_future::<_, Result<(), ScheduleError>>(&sleep);
    let until = timer.sleep_until(Instant::now());
    assert_future::<_, Result<(), ScheduleError>>(&until);
    // A Sleep can be moved to another thread and awaited there.
    let waited = std::thread::spawn(move || block_on(sleep)).join().unwrap();
    assert_eq!(waited, Ok(()));
    assert_eq!(block_on(until), Ok(()));
}

#[test]
fn sleep_completes_and_is_never_early() {
    let timer = timer();
    for millis in [0u64, 1, 2, 5, 13, 30] {
        let delay = Duration::from_millis(millis);
        let before = Instant::now();
        let sleep = timer.sleep(delay);
        assert!(sleep.deadline() >= before + delay);
        assert_eq!(block_on(sleep), Ok(()));
        let took = before.elapsed();
        assert!(took >= delay, "sleep({delay:?}) completed after {took:?}");
        assert!(
            took < delay + Duration::from_secs(1),
            "sleep({delay:?}) took {took:?}"
        );
    }
}

#[test]
fn sleep_until_is_never_early_and_a_passed_deadline_completes() {
    let timer = timer();
    let deadline = Instant::now() + Duration::from_millis(25);
    let mut sleep = timer.sleep_until(deadline);
    assert_eq!(sleep.deadline(), deadline);
    assert!(!sleep.is_elapsed());
    assert_eq!(block_on(&mut sleep), Ok(()));
    assert!(Instant::now() >= deadline);
    assert!(sleep.is_elapsed());
    // Polling a completed sleep again stays ready.
    assert_eq!(poll_noop(&mut sleep), Poll::Ready(Ok(())));

    let passed = Instant::now() - Duration::from_millis(50);
    let before = Instant::now();
    assert_eq!(block_on(timer.sleep_until(passed)), Ok(()));
    assert!(before.elapsed() < Duration::from_millis(500));
}

#[test]
fn many_concurrent_sleeps_each_complete_never_early() {
    let timer = timer();
    let threads: Vec<_> = (0..8u64)
        .map(|thread| {
            let timer = timer.clone();
            std::thread::spawn(move || {
                for round in 0..10u64 {
                    let delay = Duration::from_micros(300 * ((thread * 7 + round * 3) % 17));
                    let before = Instant::now();
                    block_on(timer.sleep(delay)).unwrap();
                    let took = before.elapsed();
                    assert!(took >= delay, "{delay:?} took {took:?}");
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
}

#[test]
fn a_sleep_beyond_representable_time_stays_pending() {
    let timer = timer();
    let mut sleep = timer.sleep(Duration::MAX);
    assert!(poll_noop(&mut sleep).is_pending());
    assert_eq!(timer.pending(), 1);
    drop(sleep);
    assert_eq!(timer.pending(), 0);
}

#[test]
fn dropping_pending_sleeps_cancels_their_timers_and_releases_them_at_once() {
    const SLEEPS: usize = 100_000;
    let timer = timer();
    let (counter, waker) = counting_waker();
    let before = timer.stats();
    let mut sleeps: Vec<Sleep> = (0..SLEEPS)
        .map(|_| timer.sleep(Duration::from_secs(60)))
        .collect();
    for sleep in &mut sleeps {
        assert!(poll_once(sleep, &waker).is_pending());
    }
    assert_eq!(timer.pending(), SLEEPS);
    // Each pending sleep holds a clone of the waker (plus `counter` and `waker` themselves).
    assert_eq!(Arc::strong_count(&counter), SLEEPS + 2);

    let dropped_at = Instant::now();
    drop(sleeps);
    let drop_took = dropped_at.elapsed();
    // Cancellation is synchronous: the counters move before `drop` returns.
    let after = timer.stats();
    assert_eq!(after.cancelled - before.cancelled, SLEEPS as u64);
    assert_eq!(timer.pending(), 0);
    // The shard drops the cancelled timers' tasks (and with them the wakers) at its next turn.
    assert!(
        wait_until(Duration::from_secs(5), || Arc::strong_count(&counter) == 2),
        "wakers still held: {}",
        Arc::strong_count(&counter) - 2
    );
    let released_in = dropped_at.elapsed();
    eprintln!(
        "dropping {SLEEPS} pending sleeps: drop {drop_took:?}, all released after {released_in:?}"
    );
    assert!(
        released_in < Duration::from_secs(2),
        "release took {released_in:?}"
    );
    assert_eq!(counter.wakes(), 0, "a cancelled sleep woke its task");
    // Nothing left to fire.
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(timer.stats().fired, before.fired);
}

#[test]
fn dropping_an_unpolled_sleep_cancels_it_too() {
    let timer = timer();
    let sleeps: Vec<Sleep> = (0..1000)
        .map(|_| timer.sleep(Duration::from_secs(60)))
        .collect();
    assert_eq!(timer.pending(), 1000);
    drop(sleeps);
    assert_eq!(timer.pending(), 0);
    assert_eq!(timer.stats().cancelled, 1000);
}

#[test]
fn dropping_a_completed_sleep_cancels_nothing() {
    let timer = timer();
    let mut sleep = timer.sleep(Duration::from_millis(2));
    block_on(&mut sleep).unwrap();
    drop(sleep);
    let stats = timer.stats();
    assert_eq!(stats.cancelled, 0);
    assert_eq!(stats.fired, 1);
    assert_eq!(timer.pending(), 0);
}

#[test]
fn reset_moves_the_deadline_earlier() {
    let timer = timer();
    let mut sleep = timer.sleep(Duration::from_secs(30));
    assert!(poll_noop(&mut sleep).is_pending());
    let reset_at = Instant::now();
    let deadline = reset_at + Duration::from_millis(20);
    sleep.reset(deadline);
    assert_eq!(sleep.deadline(), deadline);
    block_on(&mut sleep).unwrap();
    let now = Instant::now();
    assert!(now >= deadline);
    assert!(
        now - reset_at < Duration::from_secs(2),
        "took {:?}",
        now - reset_at
    );
    // The timer was reused, not replaced: one schedule, one reset, one fire.
    assert!(wait_until(Duration::from_secs(1), || timer.stats().reset == 1));
    let stats = timer.stats();
    assert_eq!((stats.scheduled, stats.fired, stats.cancelled), (1, 1, 0));
}

#[test]
fn reset_moves_the_deadline_later() {
    let timer = timer();
    let start = Instant::now();
    let mut sleep = timer.sleep(Duration::from_millis(10));
    assert!(poll_noop(&mut sleep).is_pending());
    let deadline = start + Duration::from_millis(120);
    sleep.reset(deadline);
    // Well past the original deadline it is still pending.
    std::thread::sleep(Duration::from_millis(40));
    assert!(poll_noop(&mut sleep).is_pending());
    block_on(&mut sleep).unwrap();
    assert!(Instant::now() >= deadline);
}

#[test]
fn reset_after_completion_arms_the_sleep_again() {
    let timer = timer();
    let mut sleep = timer.sleep(Duration::from_millis(5));
    block_on(&mut sleep).unwrap();
    assert!(sleep.is_elapsed());

    let again = Instant::now() + Duration::from_millis(40);
    sleep.reset(again);
    assert!(!sleep.is_elapsed());
    assert!(poll_noop(&mut sleep).is_pending());
    block_on(&mut sleep).unwrap();
    assert!(Instant::now() >= again);

    // Into the past: completes promptly.
    let before = Instant::now();
    sleep.reset(before - Duration::from_millis(5));
    block_on(&mut sleep).unwrap();
    assert!(before.elapsed() < Duration::from_millis(500));
    assert_eq!(timer.stats().scheduled, 3);
}

#[test]
fn sleep_on_a_shut_down_timer_fails_with_a_schedule_error() {
    let timer = timer();
    timer.shutdown();
    assert_eq!(
        block_on(timer.sleep(Duration::from_millis(1))),
        Err(ScheduleError::Shutdown)
    );
    let mut sleep = timer.sleep_until(Instant::now());
    assert_eq!(
        poll_noop(&mut sleep),
        Poll::Ready(Err(ScheduleError::Shutdown))
    );
}

#[test]
fn a_sleep_that_cannot_get_a_timer_reports_full() {
    let timer = Timer::builder().shards(1).max_pending(1).build().unwrap();
    let mut first = timer.sleep(Duration::from_secs(60));
    assert!(poll_noop(&mut first).is_pending());
    let mut second = timer.sleep(Duration::from_millis(1));
    assert_eq!(
        poll_noop(&mut second),
        Poll::Ready(Err(ScheduleError::Full))
    );
    drop(first);
    // Reset retries the registration.
    second.reset(Instant::now());
    assert_eq!(block_on(second), Ok(()));
}

/// A task awaiting a sleep when its engine shuts down must be woken (the sleep then reports
/// `Err(ScheduleError::Shutdown)`), or it would wait forever.
#[test]
fn shutdown_wakes_a_task_awaiting_a_sleep() {
    let timer = timer();
    let sleep = timer.sleep(Duration::from_secs(60));
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || sender.send(block_on(sleep)));
    std::thread::sleep(Duration::from_millis(50));
    drop(timer.shutdown());
    let result = receiver.recv_timeout(Duration::from_secs(2));
    assert_eq!(
        result,
        Ok(Err(ScheduleError::Shutdown)),
        "the awaiting task was never woken"
    );
}

#[test]
fn sizes_of_sleep_beside_tokio() {
    let ours = std::mem::size_of::<Sleep>();
    let tokio = std::mem::size_of::<tokio::time::Sleep>();
    eprintln!(
        "size_of::<shardwheel::Sleep>() = {ours} (+ heap: Arc'd waker cell and a 48-byte engine slot), \
         size_of::<tokio::time::Sleep>() = {tokio} (timer entry inline)"
    );
    assert!(ours <= 64, "Sleep grew to {ours} bytes");
}
