//! Where expired tasks run: a rayon pool (the engine's own or the caller's), or inline on the
//! shard thread for tasks that only wake something.

use super::shard::{Handoff, RepeatingRun, ShardShared};
use crate::sync::Arc;
use crate::sync::registry;
use crate::task::Task;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::Ordering;

/// Where a [`Timer`](crate::Timer) runs expired tasks.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub enum Executor {
    /// A rayon pool owned by the engine, with one thread per core (the default).
    #[default]
    DefaultPool,
    /// The caller's own rayon pool.
    ThreadPool(registry::Arc<rayon::ThreadPool>),
    /// On the shard's own thread, right after its turn: for tasks that only wake something.
    /// A slow inline task delays every timer of its shard.
    Inline,
}

/// The executor as the shards use it.
#[derive(Clone, Debug)]
pub(crate) enum Dispatch {
    Pool(registry::Arc<rayon::ThreadPool>),
    Inline,
}

/// Runs one task, catching and counting a panic so that neither the executor nor the engine
/// goes down with it.
pub(crate) fn run_task(task: Task, shard: &ShardShared) {
    if catch_unwind(AssertUnwindSafe(|| task.run())).is_err() {
        shard.counters.panicked.fetch_add(1, Ordering::Relaxed);
    }
}

/// One-shot tasks a shard hands to the pool at once, mid-turn, when many expire together.
const SPILL_EVERY: usize = 128;

/// Runs a batch of one-shot tasks on the pool, split across its threads.
fn run_batch(tasks: Vec<Task>, shard: &ShardShared) {
    use rayon::prelude::*;
    if tasks.len() <= 64 {
        tasks.into_iter().for_each(|task| run_task(task, shard));
    } else {
        tasks
            .into_par_iter()
            .with_min_len(64)
            .for_each(|task| run_task(task, shard));
    }
}

/// Runs one run of a repeating timer and hands it back to its shard, re-armed for its next
/// run, or ended if it asked to stop or panicked.
pub(crate) fn run_repeating(run: RepeatingRun, shard: &ShardShared) {
    let RepeatingRun { index, mut task } = run;
    let clock = &shard.clock;
    let now = || clock.now_nanos();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        task.run_repeating(clock.now_nanos(), &now)
    }));
    match outcome {
        Ok(Some(next_nanos)) => {
            ShardShared::rearm(shard, index, clock.tick_at_nanos(next_nanos), Some(task));
        }
        Ok(None) => ShardShared::rearm(shard, index, u64::MAX, None),
        Err(_) => {
            shard.counters.panicked.fetch_add(1, Ordering::Relaxed);
            drop(task);
            ShardShared::rearm(shard, index, u64::MAX, None);
        }
    }
}

impl Dispatch {
    /// How many expired one-shot tasks a shard collects before handing them over mid-turn
    /// (see [`spill`](Self::spill)).
    pub(crate) fn spill_every(&self) -> usize {
        match self {
            Dispatch::Pool(_) => SPILL_EVERY,
            Dispatch::Inline => usize::MAX,
        }
    }

    /// Hands one-shot tasks to the pool in the middle of a turn. Runs no user code here.
    pub(crate) fn spill(&self, tasks: Vec<Task>, shard: &Arc<ShardShared>) {
        if let Dispatch::Pool(pool) = self {
            let shard = shard.clone();
            pool.spawn(move || run_batch(tasks, &shard));
        } else {
            debug_assert!(false, "inline dispatch never spills");
        }
    }

    /// Hands out a turn's work: one-shot and repeating tasks to the pool (or here, when
    /// inline), inline tasks here, dropped tasks dropped here. Call with no shard state
    /// borrowed: user code runs.
    pub(crate) fn hand_off(&self, handoff: &mut Handoff, shard: &Arc<ShardShared>) {
        let expired = std::mem::take(&mut handoff.expired);
        let repeating = std::mem::take(&mut handoff.repeating);
        match self {
            Dispatch::Pool(pool) if !(expired.is_empty() && repeating.is_empty()) => {
                let shard = shard.clone();
                pool.spawn(move || {
                    use rayon::prelude::*;
                    run_batch(expired, &shard);
                    repeating
                        .into_par_iter()
                        .for_each(|run| run_repeating(run, &shard));
                });
            }
            Dispatch::Pool(_) => {}
            Dispatch::Inline => {
                for task in expired {
                    run_task(task, shard);
                }
                for run in repeating {
                    run_repeating(run, shard);
                }
            }
        }
        for task in handoff.inline.drain(..) {
            run_task(task, shard);
        }
        handoff.dropped.clear();
    }
}
