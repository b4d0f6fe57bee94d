//! Hooks for the engine's own tests (feature `test-hooks`, which `.ci/test` turns on): not part
//! of the API, and compiled only with that feature.

use crate::Timer;

/// Sets (or, with `None`, clears) a hook that this thread's successful
/// [`TimerHandle::cancel`](crate::TimerHandle::cancel) calls run between their state change and
/// the push of their `Cancel` message: a canceller descheduled there, made deterministic.
pub fn set_after_cancel_transition(hook: Option<Box<dyn FnMut()>>) {
    crate::engine::handle::cancel_hook::set_after_cancel_transition(hook);
}

/// Sets (or, with `None`, clears) a hook that this thread's one-shot
/// [`TimerHandle::reset`](crate::TimerHandle::reset) calls run between their swap of the deadline
/// and their second read of the timer's state: a resetter descheduled while the shard decides on
/// the deadline it just wrote, made deterministic.
pub fn set_after_reset_swap(hook: Option<Box<dyn FnMut()>>) {
    crate::engine::slot::reset_hook::set_after_reset_swap(hook);
}

/// Makes shard `shard`'s thread panic at its next turn, as an engine bug would, to test that a
/// dead shard is reported ([`Stats::failed_shards`](crate::Stats::failed_shards)).
///
/// # Panics
///
/// If `shard` is not below the shard count.
pub fn kill_shard_thread(timer: &Timer, shard: usize) {
    timer.kill_shard_thread(shard);
}
