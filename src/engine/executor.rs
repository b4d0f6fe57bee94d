//! Where expired tasks run: a rayon pool (the engine's own or the caller's), or inline on the
//! shard thread for tasks that only wake something.

use super::shard::ShardShared;
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

impl Dispatch {
    /// Hands a batch of expired tasks to the pool, or runs them here when inline.
    pub(crate) fn run(&self, batch: Vec<Task>, shard: &Arc<ShardShared>) {
        match self {
            Dispatch::Pool(pool) => {
                let shard = shard.clone();
                pool.spawn(move || {
                    use rayon::prelude::*;
                    batch
                        .into_par_iter()
                        .with_min_len(64)
                        .for_each(|task| run_task(task, &shard));
                });
            }
            Dispatch::Inline => {
                for task in batch {
                    run_task(task, shard);
                }
            }
        }
    }
}
