//! Expired work on its way to the executor: what a turn collected ([`Handoff`]), how it is
//! handed out ([`hand_off`], [`spill`]), a repeating timer's run and its way back to the shard
//! ([`run_repeating`]), and the timers shutdown returns unrun ([`UnfiredTimer`]).
//!
//! Everything here runs user code: only with the owner's state let go of (see
//! [Containing user code](super::executor#containing-user-code)).

use super::executor::{Dispatch, contain, drop_contained, drop_uncounted, run_batch, run_task};
use super::shared::ShardShared;
use crate::sync::Arc;
use crate::task::Task;
use std::time::Instant;

/// A timer that was still pending when the engine shut down: its task, returned unrun.
/// Dropping it drops the task (its closure and what it captured); a panic there is caught and
/// discarded, as the engine's own drops of tasks are (so dropping a `Timer` with timers
/// pending, which drops them, cannot panic or abort).
#[derive(Debug)]
pub struct UnfiredTimer {
    /// `None` once run.
    task: Option<Task>,
    deadline: Option<Instant>,
}

impl UnfiredTimer {
    pub(crate) fn new(task: Task, deadline: Option<Instant>) -> UnfiredTimer {
        UnfiredTimer {
            task: Some(task),
            deadline,
        }
    }

    /// When the timer would have fired (`None` if beyond representable time).
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Runs the task now, on the calling thread (a panic in it reaches the caller).
    pub fn run(mut self) {
        if let Some(task) = self.task.take() {
            task.run();
        }
    }
}

impl Drop for UnfiredTimer {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            drop_uncounted(task);
        }
    }
}

/// One run of a repeating timer, handed to the executor.
pub(crate) struct RepeatingRun {
    pub(crate) index: u32,
    pub(crate) task: Task,
}

/// What one turn of a shard produced: tasks to run and tasks to drop, all handed off only
/// after the owner's state is no longer borrowed (user code never runs inside a turn; tasks
/// whose drop runs none are dropped at once instead, see [`discard`](Self::discard)).
#[derive(Default)]
pub(crate) struct Handoff {
    /// One-shot tasks for the executor.
    pub(crate) expired: Vec<Task>,
    /// One-shot tasks to run on the shard thread (wakers).
    pub(crate) inline: Vec<Task>,
    /// Runs of repeating timers, for the executor.
    pub(crate) repeating: Vec<RepeatingRun>,
    /// Tasks of cancelled timers, to drop.
    pub(crate) dropped: Vec<Task>,
}

impl Handoff {
    pub(crate) fn is_empty(&self) -> bool {
        self.expired.is_empty()
            && self.inline.is_empty()
            && self.repeating.is_empty()
            && self.dropped.is_empty()
    }

    /// Takes the task of a cancelled or ended timer: dropped at once when that runs no user
    /// code, else kept in `dropped` for the hand-off to drop contained.
    #[inline]
    pub(crate) fn discard(&mut self, task: Task) {
        if task.drop_runs_user_code() {
            self.dropped.push(task);
        } else {
            drop(task);
        }
    }

    /// Whether any task was handed out to run.
    pub(crate) fn ran_anything(&self) -> bool {
        !(self.expired.is_empty() && self.inline.is_empty() && self.repeating.is_empty())
    }
}

impl Drop for Handoff {
    /// A hand-off empties it; tasks left in one are dropped only when the engine failed
    /// mid-turn. Still user code: each is dropped contained.
    fn drop(&mut self) {
        let runs = self.repeating.drain(..).map(|run| run.task);
        for task in (self.expired.drain(..))
            .chain(self.inline.drain(..))
            .chain(runs)
            .chain(self.dropped.drain(..))
        {
            drop_uncounted(task);
        }
    }
}

/// Runs one run of a repeating timer and hands it back to its shard, re-armed for its next
/// run, or ended if it asked to stop or panicked.
pub(crate) fn run_repeating(run: RepeatingRun, shard: &ShardShared) {
    let RepeatingRun { index, mut task } = run;
    let clock = &shard.clock;
    let now = || clock.now_nanos();
    let outcome = contain(&shard.counters, || {
        task.run_repeating(clock.now_nanos(), &now)
    });
    match outcome {
        Some(Some(next_nanos)) => {
            shard.rearm(index, clock.tick_at_nanos(next_nanos), Some(task));
        }
        // Stopped, or panicked (counted): the task is dropped here, before the shard hears.
        Some(None) | None => {
            drop_contained(&shard.counters, task);
            shard.rearm(index, u64::MAX, None);
        }
    }
}

/// Hands one-shot tasks to the pool in the middle of a turn (every
/// [`Dispatch::spill_every`] of them). Runs no user code here.
pub(crate) fn spill(dispatch: &Dispatch, tasks: Vec<Task>, shard: &Arc<ShardShared>) {
    if let Some(pool) = dispatch.started_pool() {
        let shard = shard.clone();
        pool.spawn(move || {
            contain(&shard.counters, || run_batch(tasks, &shard.counters));
        });
    } else {
        // Unreachable: `spill_every` is `usize::MAX` here.
        debug_assert!(false, "spill without a started pool");
    }
}

/// Hands out a turn's work: one-shot and repeating tasks to the pool (or here, when inline),
/// inline tasks here, dropped tasks dropped here. Call with no owner state borrowed: user
/// code runs.
pub(crate) fn hand_off(dispatch: &Dispatch, handoff: &mut Handoff, shard: &Arc<ShardShared>) {
    let expired = std::mem::take(&mut handoff.expired);
    let repeating = std::mem::take(&mut handoff.repeating);
    match dispatch.started_pool() {
        Some(pool) if !(expired.is_empty() && repeating.is_empty()) => {
            let shard = shard.clone();
            pool.spawn(move || {
                use rayon::prelude::*;
                contain(&shard.counters, || {
                    run_batch(expired, &shard.counters);
                    repeating
                        .into_par_iter()
                        .for_each(|run| run_repeating(run, &shard));
                });
            });
        }
        Some(_) => {}
        // Inline dispatch; or a closure task without a started pool, which
        // `ready_for_closures` rules out: then it runs here rather than not at all.
        None => {
            for task in expired {
                run_task(task, &shard.counters);
            }
            for run in repeating {
                run_repeating(run, shard);
            }
        }
    }
    run_here(handoff, shard);
}

/// Runs the inline tasks (wakers) and drops the dropped tasks of `handoff` on this thread:
/// the end of every hand-off, and of shutdown (whose wake-ups let awaiting tasks see it).
pub(crate) fn run_here(handoff: &mut Handoff, shard: &ShardShared) {
    for task in handoff.inline.drain(..) {
        run_task(task, &shard.counters);
    }
    for task in handoff.dropped.drain(..) {
        drop_contained(&shard.counters, task);
    }
}
