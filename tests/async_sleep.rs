//! `Timer::sleep` / `Timer::sleep_until`: the `Sleep` future's type, its never-early
//! completion, lazy registration (no timer before the first pending poll), cancellation on drop
//! (with the memory behind it released at once), `Sleep::reset` (and `reset_after`) in both
//! directions and after completion, and what a sleep does when the engine cannot keep its timer
//! (panics; the `try_` constructor and `poll_sleep` report the error).

mod support;

use futures::executor::block_on;
use shardwheel::{Interval, ScheduleError, Sleep, Timeout, Timer};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};
use support::{counting_waker, poll_noop, poll_once, timer, use_counters, wait_until};

/// Compile-time checks: these only build if the bounds hold.
fn assert_send<T: Send>() {}
fn assert_sync<T: Sync>() {}
fn assert_unpin<T: Unpin>() {}
fn assert_future<F: std::future::Future<Output = O>, O>(_: &F) {}

#[test]
fn sleep_is_send_sync_unpin_and_outputs_unit() {
    assert_send::<Sleep>();
    assert_sync::<Sleep>();
    assert_unpin::<Sleep>();
    assert_send::<Timeout<std::future::Pending<()>>>();
    assert_send::<Interval>();
    let timer = timer(2);
    let sleep = timer.sleep(Duration::from_millis(1));
    assert_future::<_, ()>(&sleep);
    let until = timer.sleep_until(Instant::now());
    assert_future::<_, ()>(&until);
    // A Sleep can be moved to another thread and awaited there.
    std::thread::spawn(move || block_on(sleep)).join().unwrap();
    block_on(until);
}

#[test]
fn sleep_completes_and_is_never_early() {
    let timer = timer(2);
    for millis in [0u64, 1, 2, 5, 13, 30] {
        let delay = Duration::from_millis(millis);
        let before = Instant::now();
        let sleep = timer.sleep(delay);
        assert!(sleep.deadline() >= before + delay);
        block_on(sleep);
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
    let timer = timer(2);
    let deadline = Instant::now() + Duration::from_millis(25);
    let mut sleep = timer.sleep_until(deadline);
    assert_eq!(sleep.deadline(), deadline);
    assert!(!sleep.is_elapsed());
    block_on(&mut sleep);
    assert!(Instant::now() >= deadline);
    assert!(sleep.is_elapsed());
    // Polling a completed sleep again stays ready.
    assert_eq!(poll_noop(&mut sleep), Poll::Ready(()));

    let passed = Instant::now() - Duration::from_millis(50);
    let before = Instant::now();
    block_on(timer.sleep_until(passed));
    assert!(before.elapsed() < Duration::from_millis(500));
}

#[test]
fn many_concurrent_sleeps_each_complete_never_early() {
    let timer = timer(2);
    let threads: Vec<_> = (0..8u64)
        .map(|thread| {
            let timer = timer.clone();
            std::thread::spawn(move || {
                for round in 0..10u64 {
                    let delay = Duration::from_micros(300 * ((thread * 7 + round * 3) % 17));
                    let before = Instant::now();
                    block_on(timer.sleep(delay));
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
    let timer = timer(2);
    let mut sleep = timer.sleep(Duration::MAX);
    assert!(poll_noop(&mut sleep).is_pending());
    assert_eq!(timer.pending(), 1);
    drop(sleep);
    assert_eq!(timer.pending(), 0);
}

#[test]
fn dropping_pending_sleeps_cancels_their_timers_and_releases_them_at_once() {
    const SLEEPS: usize = 100_000;
    let timer = timer(2);
    let (counter, waker) = counting_waker();
    let before = timer.stats();
    let mut sleeps: Vec<Sleep> = (0..SLEEPS)
        .map(|_| timer.sleep(Duration::from_secs(60)))
        .collect();
    for sleep in &mut sleeps {
        assert!(poll_once(sleep, &waker).is_pending());
    }
    assert_eq!(timer.pending(), SLEEPS);
    // Each pending sleep's timer task holds a clone of the waker (the sleep itself only its
    // identity), plus `counter` and `waker` themselves.
    assert_eq!(Arc::strong_count(&counter), SLEEPS + 2);

    let dropped_at = Instant::now();
    drop(sleeps);
    let drop_took = dropped_at.elapsed();
    // Cancellation is synchronous: the counters move before `drop` returns.
    let after = timer.stats();
    assert_eq!(after.cancelled - before.cancelled, SLEEPS as u64);
    assert_eq!(timer.pending(), 0);
    // The shard drops the cancelled timers' tasks (and with them their clones) at its next
    // turn.
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

/// Lazy registration: a sleep schedules its timer at its first pending poll, not before, so an
/// unpolled sleep costs the engine nothing, and neither does its drop.
#[test]
fn an_unpolled_sleep_never_touches_the_engine() {
    let timer = timer(2);
    let before = timer.stats();
    let sleeps: Vec<Sleep> = (0..1000)
        .map(|_| timer.sleep(Duration::from_secs(60)))
        .collect();
    assert_eq!(timer.pending(), 0);
    drop(sleeps);
    let after = timer.stats();
    assert_eq!(use_counters(&after), use_counters(&before));
    // A sleep first polled after a deadline a shard has seen pass (a shard turned for a later
    // timer since) completes without a timer.
    let mut late = timer.sleep(Duration::from_millis(2));
    block_on(timer.sleep(Duration::from_millis(5)));
    assert_eq!(poll_noop(&mut late), Poll::Ready(()));
    assert_eq!(timer.stats().scheduled, before.scheduled + 1);
    // One whose deadline passed since the shards last turned gets a timer, which fires at once.
    let mut recent = timer.sleep(Duration::from_millis(1));
    std::thread::sleep(Duration::from_millis(3));
    block_on(&mut recent);
    let before = timer.stats();
    // The first pending poll schedules it.
    let mut sleep = timer.sleep(Duration::from_secs(60));
    assert!(poll_noop(&mut sleep).is_pending());
    assert_eq!(timer.pending(), 1);
    drop(sleep);
    assert_eq!(timer.pending(), 0);
    assert_eq!(timer.stats().cancelled, before.cancelled + 1);
}

#[test]
fn dropping_a_completed_sleep_cancels_nothing() {
    let timer = timer(2);
    let mut sleep = timer.sleep(Duration::from_millis(2));
    block_on(&mut sleep);
    drop(sleep);
    let stats = timer.stats();
    assert_eq!(stats.cancelled, 0);
    assert_eq!(stats.fired, 1);
    assert_eq!(timer.pending(), 0);
}

#[test]
fn reset_moves_the_deadline_earlier() {
    let timer = timer(2);
    let mut sleep = timer.sleep(Duration::from_secs(30));
    let reset_at = Instant::now();
    let deadline = reset_at + Duration::from_millis(20);
    // One task polls throughout (a poll under another task's waker replaces the timer).
    block_on(async {
        assert!(poll_in_task(&mut sleep).await.is_pending());
        Pin::new(&mut sleep).reset(deadline);
        assert_eq!(sleep.deadline(), deadline);
        (&mut sleep).await;
    });
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
    let timer = timer(2);
    let start = Instant::now();
    let mut sleep = timer.sleep(Duration::from_millis(10));
    assert!(poll_noop(&mut sleep).is_pending());
    let deadline = start + Duration::from_millis(120);
    // tokio's form, on a pinned sleep.
    let mut pinned = std::pin::pin!(sleep);
    pinned.as_mut().reset(deadline);
    // Well past the original deadline it is still pending.
    std::thread::sleep(Duration::from_millis(40));
    assert!(poll_noop(&mut pinned).is_pending());
    block_on(&mut pinned);
    assert!(Instant::now() >= deadline);
}

#[test]
fn resets_that_leave_the_timer_are_counted_when_the_sleep_lets_it_go() {
    let timer = timer(1);
    let mut sleep = timer.sleep(Duration::from_secs(60));
    assert!(poll_noop(&mut sleep).is_pending());
    // Later than the armed timer's deadline: the timer stays, and the sleep counts them.
    for _ in 0..3 {
        Pin::new(&mut sleep).reset_after(Duration::from_secs(120));
    }
    drop(sleep);
    let stats = timer.stats();
    assert_eq!(
        (stats.scheduled, stats.cancelled, stats.reset),
        (1, 1, 3),
        "{stats:?}"
    );
    assert_eq!(stats.shards[0].reset, 3);
}

#[test]
fn reset_after_is_never_early_in_either_direction() {
    let timer = timer(2);
    let sleep = timer.sleep(Duration::from_millis(10));
    let mut pinned = std::pin::pin!(sleep);
    assert!(poll_noop(&mut pinned).is_pending());
    // Later than the timer: it stays, and the sleep schedules anew when it fires.
    let later_from = Instant::now();
    pinned.as_mut().reset_after(Duration::from_millis(80));
    assert!(pinned.deadline() >= later_from + Duration::from_millis(80));
    std::thread::sleep(Duration::from_millis(30));
    assert!(poll_noop(&mut pinned).is_pending());
    block_on(&mut pinned);
    assert!(Instant::now() >= later_from + Duration::from_millis(80));
    // Earlier than an armed timer's: moved in place.
    let mut sleep = timer.sleep(Duration::from_secs(60));
    assert!(poll_noop(&mut sleep).is_pending());
    let earlier_from = Instant::now();
    Pin::new(&mut sleep).reset_after(Duration::from_millis(20));
    block_on(&mut sleep);
    assert!(Instant::now() >= earlier_from + Duration::from_millis(20));
    // A delay beyond representable time never ends.
    Pin::new(&mut sleep).reset_after(Duration::MAX);
    assert!(poll_noop(&mut sleep).is_pending());
}

#[test]
fn reset_after_completion_arms_the_sleep_again() {
    let timer = timer(2);
    let mut sleep = timer.sleep(Duration::from_millis(5));
    block_on(&mut sleep);
    assert!(sleep.is_elapsed());

    let again = Instant::now() + Duration::from_millis(40);
    Pin::new(&mut sleep).reset(again);
    assert!(!sleep.is_elapsed());
    block_on(async {
        assert!(poll_in_task(&mut sleep).await.is_pending());
        (&mut sleep).await;
    });
    assert!(Instant::now() >= again);

    // Into the past: completes at the next poll, without a timer.
    let before = Instant::now();
    Pin::new(&mut sleep).reset(before - Duration::from_millis(5));
    block_on(&mut sleep);
    assert!(before.elapsed() < Duration::from_millis(500));
    assert_eq!(timer.stats().scheduled, 2);
}

/// Polls `sleep` once, from inside a task (with the task's waker).
async fn poll_in_task(sleep: &mut Sleep) -> Poll<()> {
    std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *sleep).poll(cx))).await
}

/// A pending sleep polled under another task's waker replaces its timer (the old one's task
/// would wake the old task); under the same task's waker it keeps it.
#[test]
fn a_poll_under_another_waker_replaces_the_timer() {
    let timer = timer(2);
    let (first, first_waker) = counting_waker();
    let (second, second_waker) = counting_waker();
    let mut sleep = timer.sleep(Duration::from_millis(30));
    assert!(poll_once(&mut sleep, &first_waker).is_pending());
    assert!(poll_once(&mut sleep, &first_waker).is_pending());
    assert_eq!(timer.stats().scheduled, 1);
    assert!(poll_once(&mut sleep, &second_waker).is_pending());
    let stats = timer.stats();
    assert_eq!((stats.scheduled, stats.cancelled), (2, 1));
    assert!(wait_until(Duration::from_secs(2), || second.wakes() == 1));
    assert_eq!(first.wakes(), 0, "the replaced timer woke the old waker");
    assert_eq!(poll_once(&mut sleep, &second_waker), Poll::Ready(()));
}

/// Polls `sleep` with `poll_sleep`, which reports what `poll` panics on.
fn poll_sleep_noop(sleep: &mut Sleep) -> Poll<Result<(), ScheduleError>> {
    Pin::new(sleep).poll_sleep(&mut std::task::Context::from_waker(std::task::Waker::noop()))
}

/// The panic message of `run`, which must panic.
fn panic_message(run: impl FnOnce()) -> String {
    let payload =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).expect_err("no panic");
    match payload.downcast::<String>() {
        Ok(message) => *message,
        Err(payload) => payload
            .downcast::<&str>()
            .map_or_else(|_| String::new(), |m| m.to_string()),
    }
}

/// As tokio's: a sleep whose engine cannot keep its timer panics when polled (it must neither
/// complete, which would make a loop around it spin, nor hang); the `try_` constructor and
/// `poll_sleep` report the error instead.
#[test]
fn sleep_on_a_shut_down_timer_panics_and_the_fallible_forms_report_it() {
    support::quiet_intentional_panics();
    let timer = timer(2);
    let seen_to_pass = Instant::now();
    block_on(timer.sleep(Duration::from_millis(2)));
    timer.shutdown();
    // Making a sleep is fine (lazy); polling it panics, naming the error.
    let message = panic_message(|| block_on(timer.sleep(Duration::from_millis(1))));
    assert!(
        message.contains(&ScheduleError::Shutdown.to_string()),
        "{message}"
    );
    let mut sleep = timer.sleep(Duration::from_millis(1));
    assert_eq!(
        poll_sleep_noop(&mut sleep),
        Poll::Ready(Err(ScheduleError::Shutdown))
    );
    assert_eq!(
        timer
            .try_sleep_until(Instant::now() + Duration::from_millis(1))
            .unwrap_err(),
        ScheduleError::Shutdown
    );
    // A deadline the engine saw pass before it shut down needs no timer: it completes.
    block_on(timer.sleep_until(seen_to_pass));
}

#[test]
fn a_sleep_that_cannot_get_a_timer_reports_full() {
    support::quiet_intentional_panics();
    let timer = Timer::builder().shards(1).max_pending(1).build().unwrap();
    let mut first = timer.sleep(Duration::from_secs(60));
    assert!(poll_noop(&mut first).is_pending());
    let mut second = timer.sleep(Duration::from_millis(1));
    assert_eq!(
        poll_sleep_noop(&mut second),
        Poll::Ready(Err(ScheduleError::Full))
    );
    let soon = Instant::now() + Duration::from_millis(1);
    assert_eq!(
        timer.try_sleep_until(soon).unwrap_err(),
        ScheduleError::Full
    );
    let message = panic_message(|| block_on(timer.sleep(Duration::from_millis(1))));
    assert!(
        message.contains(&ScheduleError::Full.to_string()),
        "{message}"
    );
    drop(first);
    // The next poll tries again.
    block_on(second);
    let armed = timer
        .try_sleep_until(Instant::now() + Duration::from_millis(1))
        .unwrap();
    assert_eq!(timer.pending(), 1);
    block_on(armed);
}

/// A task awaiting a sleep when its engine shuts down must be woken (the sleep then reports
/// `Err(ScheduleError::Shutdown)` through `poll_sleep`, and `poll` panics), or it would wait
/// forever.
#[test]
fn shutdown_wakes_a_task_awaiting_a_sleep() {
    let timer = timer(2);
    let mut sleep = timer.sleep(Duration::from_secs(60));
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let result = block_on(std::future::poll_fn(|cx| {
            Pin::new(&mut sleep).poll_sleep(cx)
        }));
        sender.send(result)
    });
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
        "size_of::<shardwheel::Sleep>() = {ours} (+ a 48-byte engine slot once polled), \
         size_of::<tokio::time::Sleep>() = {tokio} (timer entry inline)"
    );
    // 80: the engine, the deadline, the timer slot with where it was staged and its tick (when
    // the timer is due, which a reset may move the deadline past), the waker identity.
    assert!(ours <= 80, "Sleep grew to {ours} bytes");
}
