//! The same async test bodies run against `tokio::time` and shardwheel's free functions (the
//! process-wide default timer), each on a tokio current-thread runtime, a tokio multi-thread
//! runtime and `futures::executor::block_on` (tokio's side there under an entered multi-thread
//! runtime, whose workers drive its timers). A body that passes on tokio and fails on
//! shardwheel is a semantic difference from tokio. Shardwheel's sides run on runtimes without
//! tokio's timers (no `enable_time`).
//!
//! Real, short durations: the bodies compare behaviour (never early, at once, on the grid,
//! which ticks a missed-tick policy returns), with generous upper bounds for a loaded machine.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

/// Upper bound on how late anything may complete on a loaded machine.
const SLACK: Duration = Duration::from_millis(500);

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// Polls `future` once, from inside an async body.
async fn poll_once<F: Future + ?Sized>(mut future: Pin<&mut F>) -> Poll<F::Output> {
    std::future::poll_fn(move |cx| Poll::Ready(future.as_mut().poll(cx))).await
}

/// The scenarios, written once against whatever `sleep`, `interval`, `Instant`, ... the module
/// that invokes this macro imports.
macro_rules! scenarios {
    () => {
        use super::{SLACK, ms, poll_once};
        use std::future::pending;
        use std::pin::pin;
        use std::time::Duration;

        pub async fn sleep_completes_after_its_delay_never_before() {
            for millis in [0u64, 1, 10, 25] {
                let delay = ms(millis);
                let before = Instant::now();
                sleep(delay).await;
                let took = before.elapsed();
                assert!(took >= delay, "sleep({delay:?}) completed after {took:?}");
                assert!(took < delay + SLACK, "sleep({delay:?}) took {took:?}");
            }
        }

        pub async fn sleep_until_reports_its_deadline_and_elapsed_state() {
            let deadline = Instant::now() + ms(20);
            let mut sleep = pin!(sleep_until(deadline));
            assert_eq!(sleep.deadline(), deadline);
            assert!(!sleep.is_elapsed());
            assert!(poll_once(sleep.as_mut()).await.is_pending());
            assert!(!sleep.is_elapsed());
            sleep.as_mut().await;
            assert!(Instant::now() >= deadline);
            assert!(sleep.is_elapsed());
            // Ready again when polled again.
            assert!(poll_once(sleep.as_mut()).await.is_ready());
            // A deadline that has passed completes at the first poll.
            let passed = Instant::now() - ms(10);
            let mut late = pin!(sleep_until(passed));
            assert!(poll_once(late.as_mut()).await.is_ready());
        }

        pub async fn reset_moves_a_pending_sleep_and_rearms_a_completed_one() {
            let mut sleep = pin!(sleep(Duration::from_secs(10)));
            assert!(poll_once(sleep.as_mut()).await.is_pending());
            // Earlier.
            let start = Instant::now();
            sleep.as_mut().reset(start + ms(20));
            assert_eq!(sleep.deadline(), start + ms(20));
            sleep.as_mut().await;
            let took = start.elapsed();
            assert!(took >= ms(20) && took < ms(20) + SLACK, "took {took:?}");
            // After completion.
            let again = Instant::now() + ms(15);
            sleep.as_mut().reset(again);
            assert!(!sleep.is_elapsed());
            sleep.as_mut().await;
            assert!(Instant::now() >= again);
            // Later: the old deadline passes without completing it.
            let start = Instant::now();
            let mut later = pin!(sleep_for(ms(10)));
            assert!(poll_once(later.as_mut()).await.is_pending());
            later.as_mut().reset(start + ms(40));
            later.as_mut().await;
            assert!(Instant::now() >= start + ms(40));
            // Into the past: at once.
            let before = Instant::now();
            later.as_mut().reset(before - ms(5));
            later.as_mut().await;
            assert!(before.elapsed() < SLACK);
        }

        pub async fn timeout_returns_the_output_or_elapses_never_early() {
            assert_eq!(timeout(ms(50), async { 7 }).await.ok(), Some(7));
            // The future is polled first: ready wins even over a zero or passed deadline.
            assert_eq!(timeout(Duration::ZERO, async { 8 }).await.ok(), Some(8));
            let passed = Instant::now() - ms(1);
            assert_eq!(timeout_at(passed, async { 9 }).await.ok(), Some(9));
            assert!(timeout(Duration::ZERO, pending::<()>()).await.is_err());
            let before = Instant::now();
            assert!(timeout(ms(20), pending::<()>()).await.is_err());
            let took = before.elapsed();
            assert!(took >= ms(20) && took < ms(20) + SLACK, "took {took:?}");
            // The inner future wins the race.
            assert!(timeout(Duration::from_secs(5), sleep(ms(10))).await.is_ok());
            let deadline = Instant::now() + ms(15);
            assert!(timeout_at(deadline, pending::<()>()).await.is_err());
            assert!(Instant::now() >= deadline);
            // get_ref, get_mut, into_inner.
            let mut wrapped = timeout(ms(10), std::future::ready(3));
            let inner: *const std::future::Ready<i32> = wrapped.get_ref();
            assert!(std::ptr::eq(inner, wrapped.get_mut()));
            assert_eq!(wrapped.into_inner().await, 3);
            // Dropped while pending: nothing happens later.
            let mut dropped = pin!(timeout(ms(5), pending::<()>()));
            assert!(poll_once(dropped.as_mut()).await.is_pending());
        }

        pub async fn interval_ticks_at_once_then_on_the_grid() {
            let period = ms(50);
            let before = Instant::now();
            let mut interval = interval(period);
            let after = Instant::now();
            assert_eq!(interval.period(), period);
            assert_eq!(interval.missed_tick_behavior(), MissedTickBehavior::Burst);
            let first = interval.tick().await;
            assert!(
                first >= before && first <= after,
                "the first tick is due at creation"
            );
            assert!(before.elapsed() < period, "the first tick was not at once");
            for k in 1..4u32 {
                let due = interval.tick().await;
                assert_eq!(due, first + period * k, "tick {k} off the grid");
                assert!(Instant::now() >= due, "tick {k} early");
            }
        }

        pub async fn interval_at_starts_at_its_start() {
            let start = Instant::now() + ms(30);
            let mut interval = interval_at(start, ms(10));
            assert_eq!(interval.tick().await, start);
            assert!(Instant::now() >= start);
            assert_eq!(interval.tick().await, start + ms(10));
            assert!(Instant::now() >= start + ms(10));
        }

        pub async fn interval_resets() {
            let period = ms(30);
            let mut interval = interval(period);
            interval.tick().await;
            // reset_immediately: the next tick now.
            let before = Instant::now();
            interval.reset_immediately();
            let due = interval.tick().await;
            assert!(due >= before && due <= Instant::now());
            assert!(before.elapsed() < period);
            // The grid goes on from it.
            assert_eq!(interval.tick().await, due + period);
            // reset: one period from now.
            let before = Instant::now();
            interval.reset();
            let due = interval.tick().await;
            assert!(due >= before + period && Instant::now() >= due, "reset");
            // reset_after.
            let before = Instant::now();
            interval.reset_after(ms(10));
            let due = interval.tick().await;
            assert!(
                due >= before + ms(10) && due < before + ms(10) + SLACK,
                "reset_after"
            );
            // reset_at.
            let at = Instant::now() + ms(15);
            interval.reset_at(at);
            assert_eq!(interval.tick().await, at);
            assert_eq!(interval.tick().await, at + period);
        }

        const PERIOD: Duration = Duration::from_millis(30);

        /// The first tick, then the thread blocks for 100 ms (three grid points pass
        /// unobserved), then `count` ticks: (first, unblocked, [(due, seen)]).
        async fn ticks_after_a_block(
            behavior: MissedTickBehavior,
            count: usize,
        ) -> (Instant, Instant, Vec<(Instant, Instant)>) {
            let mut interval = interval(PERIOD);
            interval.set_missed_tick_behavior(behavior);
            assert_eq!(interval.missed_tick_behavior(), behavior);
            let first = interval.tick().await;
            std::thread::sleep(ms(100));
            let unblocked = Instant::now();
            let mut ticks = Vec::new();
            for _ in 0..count {
                let due = interval.tick().await;
                ticks.push((due, Instant::now()));
            }
            (first, unblocked, ticks)
        }

        fn on_the_grid(first: Instant, due: Instant) -> bool {
            (due - first).as_nanos() % PERIOD.as_nanos() == 0
        }

        pub async fn missed_ticks_burst() {
            let (first, unblocked, ticks) = ticks_after_a_block(MissedTickBehavior::Burst, 5).await;
            for (k, (due, seen)) in ticks.iter().enumerate() {
                assert_eq!(*due, first + PERIOD * (k as u32 + 1), "tick {k}");
                assert!(*seen >= *due, "tick {k} early");
            }
            // The three points passed during the block come back to back.
            assert!(ticks[2].0 <= unblocked);
            let burst = ticks[2].1 - unblocked;
            assert!(burst < PERIOD * 2, "the burst took {burst:?}");
        }

        pub async fn missed_ticks_skip() {
            let (first, unblocked, ticks) = ticks_after_a_block(MissedTickBehavior::Skip, 4).await;
            // The tick pending during the block comes late with its own due instant; the
            // next is the first grid point after it was seen: the others were dropped.
            assert_eq!(ticks[0].0, first + PERIOD);
            assert!(
                ticks[1].0 > unblocked,
                "a point passed during the block was returned"
            );
            for (k, pair) in ticks.windows(2).enumerate() {
                let ((due, seen), (next, _)) = (pair[0], pair[1]);
                assert!(on_the_grid(first, next), "tick {} off the grid", k + 1);
                assert!(
                    next > due && next - PERIOD <= seen.max(due),
                    "tick {}",
                    k + 1
                );
            }
        }

        /// Code that compiles against tokio compiles here: `?` turns `Elapsed` into an
        /// `io::Error`, and a `match` over the missed-tick policies needs no `_` arm.
        pub async fn elapsed_is_an_io_error_and_the_policies_match_exhaustively() {
            async fn read_within(delay: Duration) -> std::io::Result<u32> {
                timeout(delay, pending::<()>()).await?;
                Ok(1)
            }
            let error = read_within(ms(1)).await.unwrap_err();
            assert_eq!(error.kind(), std::io::ErrorKind::TimedOut);
            let name = |policy| match policy {
                MissedTickBehavior::Burst => "burst",
                MissedTickBehavior::Delay => "delay",
                MissedTickBehavior::Skip => "skip",
            };
            assert_eq!(name(MissedTickBehavior::default()), "burst");
        }

        pub async fn missed_ticks_delay() {
            let (first, unblocked, ticks) = ticks_after_a_block(MissedTickBehavior::Delay, 4).await;
            assert_eq!(ticks[0].0, first + PERIOD);
            // Restarted one period after the late tick was seen.
            let restart = ticks[1].0 - PERIOD;
            assert!(
                restart >= unblocked && restart <= ticks[0].1,
                "not restarted from the late tick"
            );
            for (k, pair) in ticks.windows(2).enumerate() {
                let ((due, seen), (next, _)) = (pair[0], pair[1]);
                let restart = next - PERIOD;
                assert!(
                    next == due + PERIOD || (restart >= due && restart <= seen),
                    "tick {}",
                    k + 1
                );
            }
        }
    };
}

mod tokio_api {
    pub use tokio::time::{
        Instant, MissedTickBehavior, interval, interval_at, sleep, sleep_until, timeout, timeout_at,
    };
    pub fn sleep_for(delay: std::time::Duration) -> tokio::time::Sleep {
        sleep(delay)
    }
    scenarios!();
}

mod shardwheel_api {
    pub use shardwheel::{
        MissedTickBehavior, interval, interval_at, sleep, sleep_until, timeout, timeout_at,
    };
    pub use std::time::Instant;
    pub fn sleep_for(delay: std::time::Duration) -> shardwheel::Sleep {
        sleep(delay)
    }
    scenarios!();
}

fn current_thread(tokio_time: bool) -> tokio::runtime::Runtime {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    if tokio_time {
        builder.enable_time();
    }
    builder.build().expect("tokio runtime")
}

fn multi_thread(tokio_time: bool) -> tokio::runtime::Runtime {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(2);
    if tokio_time {
        builder.enable_time();
    }
    builder.build().expect("tokio runtime")
}

/// For each scenario, a module of six tests: tokio's and shardwheel's functions, each on the
/// three executors.
macro_rules! run_everywhere {
    ($($scenario:ident),* $(,)?) => {$(
        mod $scenario {
            use super::{current_thread, multi_thread, shardwheel_api, tokio_api};

            #[test]
            fn tokio_current_thread() {
                current_thread(true).block_on(tokio_api::$scenario());
            }

            #[test]
            fn tokio_multi_thread() {
                multi_thread(true).block_on(tokio_api::$scenario());
            }

            #[test]
            fn tokio_futures_executor() {
                let runtime = multi_thread(true);
                let _entered = runtime.enter();
                futures::executor::block_on(tokio_api::$scenario());
            }

            #[test]
            fn shardwheel_current_thread() {
                current_thread(false).block_on(shardwheel_api::$scenario());
            }

            #[test]
            fn shardwheel_multi_thread() {
                multi_thread(false).block_on(shardwheel_api::$scenario());
            }

            #[test]
            fn shardwheel_futures_executor() {
                futures::executor::block_on(shardwheel_api::$scenario());
            }
        }
    )*};
}

run_everywhere!(
    sleep_completes_after_its_delay_never_before,
    sleep_until_reports_its_deadline_and_elapsed_state,
    reset_moves_a_pending_sleep_and_rearms_a_completed_one,
    timeout_returns_the_output_or_elapses_never_early,
    interval_ticks_at_once_then_on_the_grid,
    interval_at_starts_at_its_start,
    interval_resets,
    missed_ticks_burst,
    missed_ticks_skip,
    missed_ticks_delay,
    elapsed_is_an_io_error_and_the_policies_match_exhaustively,
);
