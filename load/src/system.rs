//! The systems under test behind one trait: shardwheel itself, and the baselines of
//! `--compare` (tokio's timer in `tokio_timer.rs`, a JDK-style heap in `heap.rs`).

use crate::job::{Job, fire_plain};
use crate::report::anomaly;
use std::time::{Duration, Instant};

/// A timer implementation under load. Each workload builds a fresh one and shuts it down.
pub trait System: Send + Sync + Sized + 'static {
    /// What `schedule` returns: cancel, reset.
    type Handle: Send + Sync + 'static;

    /// The `system` field of the JSON output.
    const NAME: &'static str;

    /// One line on how a timer is represented (printed in the report's header).
    fn describe() -> String;

    /// A fresh engine with its default configuration.
    fn build() -> Self;

    /// Runs `body` on a submitting thread (tokio needs its runtime entered there).
    fn on_thread<R>(&self, body: impl FnOnce() -> R) -> R {
        body()
    }

    /// Schedules `job` after `delay`. `None` if the engine refused (reported as an anomaly).
    fn schedule(&self, delay: Duration, job: Job) -> Option<Self::Handle>;

    /// Schedules `job` at `deadline`.
    fn schedule_at(&self, deadline: Instant, job: Job) -> Option<Self::Handle>;

    /// Cancels; true iff this call stopped the task from running.
    fn cancel(&self, handle: Self::Handle) -> bool;

    /// Moves the deadline to now + `delay`; true iff the timer was still pending.
    fn reset(&self, handle: &Self::Handle, delay: Duration) -> bool;

    /// Stops the engine (pending timers are dropped unrun).
    fn shutdown(self);
}

/// shardwheel with its default configuration (`Timer::new()`).
pub struct Shardwheel {
    timer: shardwheel::Timer,
}

impl Shardwheel {
    /// Runs `timer` (the engine bench builds it with a given shard count).
    pub fn with_timer(timer: shardwheel::Timer) -> Shardwheel {
        Shardwheel { timer }
    }

    /// The timer under test.
    pub fn timer(&self) -> &shardwheel::Timer {
        &self.timer
    }

    fn accepted(
        scheduled: Result<shardwheel::TimerHandle, shardwheel::ScheduleError>,
    ) -> Option<shardwheel::TimerHandle> {
        match scheduled {
            Ok(handle) => Some(handle),
            Err(error) => {
                anomaly(format!("shardwheel: schedule refused: {error}"));
                None
            }
        }
    }
}

impl System for Shardwheel {
    type Handle = shardwheel::TimerHandle;
    const NAME: &'static str = "shardwheel";

    fn describe() -> String {
        format!(
            "Timer::new() (default config); handle TimerHandle = {} B; task closure (u64 id, \
             or u64 + &'static storm slots) stored inline",
            std::mem::size_of::<shardwheel::TimerHandle>()
        )
    }

    fn build() -> Shardwheel {
        match shardwheel::Timer::new() {
            Ok(timer) => Shardwheel { timer },
            Err(error) => {
                eprintln!("error: could not start shardwheel: {error}");
                std::process::exit(1);
            }
        }
    }

    #[inline]
    fn schedule(&self, delay: Duration, job: Job) -> Option<Self::Handle> {
        let scheduled = match job.sink {
            None => {
                let id = job.id;
                self.timer.schedule(delay, move || fire_plain(id))
            }
            Some(_) => self.timer.schedule(delay, move || job.run()),
        };
        Shardwheel::accepted(scheduled)
    }

    #[inline]
    fn schedule_at(&self, deadline: Instant, job: Job) -> Option<Self::Handle> {
        let scheduled = match job.sink {
            None => {
                let id = job.id;
                self.timer.schedule_at(deadline, move || fire_plain(id))
            }
            Some(_) => self.timer.schedule_at(deadline, move || job.run()),
        };
        Shardwheel::accepted(scheduled)
    }

    #[inline]
    fn cancel(&self, handle: Self::Handle) -> bool {
        handle.cancel()
    }

    #[inline]
    fn reset(&self, handle: &Self::Handle, delay: Duration) -> bool {
        handle.reset(delay)
    }

    fn shutdown(self) {
        drop(self.timer.shutdown());
    }
}
