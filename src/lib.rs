//! shardwheel: a timer engine for servers that keep millions of timeouts in flight.
//!
//! Request deadlines, idle-connection timeouts, heartbeats and retries are mostly cancelled or
//! pushed back before they fire, so scheduling, cancelling and resetting must be nearly free and
//! must scale with cores. shardwheel keeps one hierarchical timing wheel per core ([`wheel`]),
//! each owned by one pinned thread; other threads reach it through lock-free queues, and
//! expired tasks run on a rayon pool.
//!
//! ```
//! use shardwheel::{Timer, TimerState};
//! use std::time::Duration;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let timer = Timer::new()?;
//! let handle = timer.schedule(Duration::from_secs(10), || println!("timed out"))?;
//! assert!(handle.reset(Duration::from_secs(20))); // activity: push the deadline back
//! assert!(handle.cancel());
//! assert_eq!(handle.state(), TimerState::Cancelled);
//! # Ok(())
//! # }
//! ```
//!
//! Async code finds `tokio::time`'s functions under the same names and with the same semantics,
//! on any executor: [`sleep`], [`sleep_until`], [`timeout`], [`timeout_at`], [`interval`] and
//! [`interval_at`] on a process-wide default timer ([`set_default_timer`] configures it), or
//! the same methods on a [`Timer`]. With the `hyper` feature, `HyperTimer` runs hyper's timeouts.
//!
//! ```
//! use std::time::Duration;
//! # fn main() -> Result<(), shardwheel::Elapsed> {
//! futures::executor::block_on(async {
//!     shardwheel::sleep(Duration::from_millis(1)).await;
//!     let answer = shardwheel::timeout(Duration::from_secs(1), async { 42 }).await?;
//!     assert_eq!(answer, 42);
//!     Ok(())
//! })
//! # }
//! ```
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod clock;
mod cycle_clock;
mod default_timer;
pub mod design;
mod engine;
mod error;
mod futures;
#[cfg(feature = "hyper")]
mod hyper_timer;
mod periodic;
mod prefetch;
mod stats;
mod sync;
mod task;
mod timer;
pub mod wheel;

pub use clock::Clock;
pub use default_timer::{
    default_timer, interval, interval_at, set_default_timer, sleep, sleep_until, timeout,
    timeout_at,
};
pub use engine::executor::Executor;
pub use engine::handle::TimerHandle;
pub use engine::handoff::UnfiredTimer;
pub use engine::slot::TimerState;
pub use error::{BuildError, DefaultTimerError, ScheduleError};
pub use futures::{Elapsed, Interval, Sleep, Timeout};
#[cfg(feature = "hyper")]
pub use hyper_timer::HyperTimer;
pub use periodic::MissedTickBehavior;
#[allow(deprecated)]
pub use periodic::MissedTicks;
pub use stats::{ShardStats, Stats};
pub use timer::{Builder, Timer};

/// The slot table, for the loom models of its reclaim protocol only.
#[cfg(shardwheel_loom)]
#[doc(hidden)]
pub use engine::slot::SlotTableHook;

/// The inbox's message queue, for the loom model of its protocol only.
#[cfg(shardwheel_loom)]
#[doc(hidden)]
pub use engine::queue::QueueHook;

/// A shard's inbox, for the loom model of its parking protocol only.
#[cfg(shardwheel_loom)]
#[doc(hidden)]
pub use engine::inbox::InboxHook;

#[cfg(feature = "test-hooks")]
#[doc(hidden)]
pub mod test_hooks;

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
