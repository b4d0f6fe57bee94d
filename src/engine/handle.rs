//! The user's side of a timer: [`TimerHandle`].

use super::shared::{ShardShared, Via};
use super::slot::TimerState;
use super::worker;
use crate::error::ScheduleError;
use crate::sync::Arc;
use crate::task::Task;
use std::fmt;
use std::time::{Duration, Instant};

/// How a closure timer reaches its shard: by message ([`Via::Inbox`] says why). Under loom by
/// its stage, so that the models reach the stage protocol through the public API (the stage
/// never looks at the task); repeating timers keep the models on the inbox's.
#[cfg(not(shardwheel_loom))]
const CLOSURE_TIMERS_VIA: Via = Via::Inbox;
#[cfg(shardwheel_loom)]
const CLOSURE_TIMERS_VIA: Via = Via::Stage;

/// A handle to a scheduled timer: cancel it, push its deadline back, or ask its state.
///
/// Handles are cheap to clone and may be sent to and shared between threads. Dropping every
/// handle detaches the timer: it still fires. A handle keeps only its own slot alive (not the
/// engine): handles that outlive their [`Timer`](crate::Timer) are harmless, and report the
/// timers that shutdown returned as [`TimerState::Cancelled`].
pub struct TimerHandle {
    pub(crate) shard: Arc<ShardShared>,
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

impl TimerHandle {
    /// Schedules `task` at tick `deadline` on `shard` ([`ShardShared::submit`]).
    pub(crate) fn submit(
        shard: &Arc<ShardShared>,
        deadline: u64,
        task: Task,
    ) -> Result<TimerHandle, ScheduleError> {
        // Only one-shot timers may be staged (see `Via`).
        let via = if task.is_repeating() {
            Via::Inbox
        } else {
            CLOSURE_TIMERS_VIA
        };
        let (index, generation, _) = shard.submit(deadline, move || task, via)?;
        Ok(TimerHandle {
            shard: shard.clone(),
            index,
            generation,
        })
    }

    /// Cancels the timer. Returns true iff this call prevented the task from running: false if
    /// it already fired, or was cancelled before (by any handle, or by shutdown). O(1); the
    /// task and bookkeeping are dropped by the owning shard at its next turn.
    pub fn cancel(&self) -> bool {
        self.shard.cancel(self.index, self.generation)
    }

    /// Moves the deadline to `delay` from now (earlier or later). Returns true iff the timer
    /// was still pending, in which case its task runs at the new deadline and not at the old
    /// one (a deadline moved earlier may meet the timer firing already: true then too, the
    /// task running no earlier than the new deadline). False: it fired at a deadline no later
    /// than the new one, or was cancelled; this call moved nothing.
    ///
    /// Pushing a one-shot timer's deadline later (the common case: an idle timeout pushed
    /// back on activity) writes the deadline in place and sends no message: the owning shard
    /// notices when it reaches the old deadline.
    ///
    /// A repeating timer's resets each send a message; at most 2^17 - 1 of them may wait for
    /// its shard at once, and a further reset waits until the shard has applied some (applying
    /// them itself where the shard could not: on the shard's own thread, or with a manual
    /// clock).
    pub fn reset(&self, delay: Duration) -> bool {
        self.reset_to_tick(self.shard.clock.tick_after(delay))
    }

    /// Moves the deadline to `deadline` (rounded up to the tick; a past instant fires at the
    /// shard's next turn). Returns true iff the timer was still pending.
    pub fn reset_at(&self, deadline: Instant) -> bool {
        self.reset_to_tick(self.shard.clock.tick_at(deadline))
    }

    pub(crate) fn reset_to_tick(&self, deadline: u64) -> bool {
        self.shard
            .reset(self.index, self.generation, deadline, worker::let_catch_up)
    }

    /// The timer's state now.
    pub fn state(&self) -> TimerState {
        self.shard.slots.state(self.index, self.generation)
    }
}

impl Clone for TimerHandle {
    fn clone(&self) -> TimerHandle {
        self.shard.slots.clone_handle(self.index);
        TimerHandle {
            shard: self.shard.clone(),
            index: self.index,
            generation: self.generation,
        }
    }
}

impl Drop for TimerHandle {
    fn drop(&mut self) {
        self.shard.slots.drop_handle(self.index);
    }
}

impl fmt::Debug for TimerHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TimerHandle")
            .field("slot", &self.index)
            .field("generation", &self.generation)
            .field("state", &self.state())
            .finish()
    }
}

/// The hook of [`test_hooks::set_after_cancel_transition`](crate::test_hooks::set_after_cancel_transition).
#[cfg(feature = "test-hooks")]
pub(crate) mod cancel_hook {
    use std::cell::RefCell;

    thread_local! {
        static AFTER_CANCEL_TRANSITION: RefCell<Option<Box<dyn FnMut()>>> =
            const { RefCell::new(None) };
    }

    /// See [`test_hooks::set_after_cancel_transition`](crate::test_hooks::set_after_cancel_transition).
    pub fn set_after_cancel_transition(hook: Option<Box<dyn FnMut()>>) {
        AFTER_CANCEL_TRANSITION.with(|slot| *slot.borrow_mut() = hook);
    }

    /// Runs this thread's hook, if set (none while the thread's thread-locals are destroyed:
    /// a kept timer is let go of then, see `futures::kept`).
    pub(crate) fn after_cancel_transition() {
        let _ = AFTER_CANCEL_TRANSITION.try_with(|slot| {
            if let Some(hook) = slot.borrow_mut().as_mut() {
                hook();
            }
        });
    }
}
