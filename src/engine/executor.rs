//! Where expired tasks run: a rayon pool (the engine's own or the caller's), or inline on the
//! shard thread for tasks that only wake something; and how the engine survives user code.
//!
//! # Containing user code
//!
//! Everything a user hands the engine is user code: a task's closure when it runs, and also
//! when it is dropped unrun (everything it captured has a destructor), repeating tasks, the
//! `Waker` a [`Sleep`](crate::Sleep) wakes (and drops), and the payload of any of their panics
//! (whose own destructor may panic again). The engine calls into it in one way only: through
//! [`contain`] (or its uncounted twin [`drop_uncounted`], where no shard is at hand), which
//! catches a panic, counts it in [`Stats::panicked`](crate::Stats::panicked)
//! and drops its payload inside a second guard (a payload whose destructor panics too is
//! forgotten: leaked, never dropped). So a user panic never unwinds into the engine: no shard
//! thread dies of one, and no pool job lets one escape (rayon aborts the process on a panic
//! that escapes a spawned job).
//!
//! Every place engine code runs or drops user code, and so calls [`contain`]:
//!
//! | where | runs or drops |
//! |-------|---------------|
//! | [`run_task`] (pool batches, `spill`, inline on the shard, shutdown's wake-ups) | one-shot tasks and wakers: run |
//! | `handoff::run_repeating` | a repeating task: one run; dropped when it stopped or panicked |
//! | every `pool.spawn` body (`handoff::spill`, `handoff::hand_off`) | the job as a whole |
//! | `handoff::run_here`, shutdown's `ShardOwner::close` | tasks of cancelled or ended timers: dropped |
//! | `ShardShared::discard_late_messages`, `ShardShared::submit`'s refusals | tasks in late messages, tasks of refused schedules: dropped |
//! | `Drop` of `Handoff`, `ShardOwner` and `ShardShared` (its inbox) | tasks still held when they go (a failed shard): dropped |
//!
//! Dropping on the shard thread happens only after the turn let go of the owner's state (the
//! turn collects tasks into a `Handoff`, see `handoff.rs`), so user code never sees the shard
//! mid-change, and may even call `shutdown()` (see `worker::hand_off`). The one exception runs
//! no user code: a task whose closure has no drop glue at all (`mem::needs_drop` is false, so
//! nothing it captured has a destructor; `Task::drop_runs_user_code`) is dropped inside the
//! turn, where it is found (`Handoff::discard`).
//!
//! Only a panic while already unwinding cannot be contained: a task whose captured value
//! panics in its destructor while the task's own panic unwinds aborts the process (Rust's
//! rule, not the engine's).

use super::time_slice;
use crate::error::ScheduleError;
use crate::stats::ShardCounters;
use crate::sync::OnceLock;
use crate::sync::registry;
use crate::task::Task;
use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::Ordering;

/// Where a [`Timer`](crate::Timer) runs expired tasks.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub enum Executor {
    /// A rayon pool owned by the engine (the default), with one thread per CPU this process may
    /// use ([`std::thread::available_parallelism`]), named `shardwheel-pool-N`. It is started
    /// when the first closure task is scheduled: futures alone (`sleep`, `timeout`,
    /// `interval`) never start it.
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
    Pool(registry::Arc<Pool>),
    Inline,
}

/// A rayon pool, the caller's or the engine's own; the engine's is built by the first
/// [`Dispatch::ready_for_closures`], on the scheduling thread.
///
/// Every closure task's schedule calls `ready_for_closures` before it sends the task, so a
/// shard that holds a closure task always finds the pool built (the inbox orders the two).
#[derive(Debug)]
pub(crate) struct Pool {
    pool: OnceLock<registry::Arc<rayon::ThreadPool>>,
    /// Threads of the engine's own pool.
    threads: usize,
    /// Whether the engine's own pool's threads ask for short time slices
    /// ([`time_slice`]).
    short_time_slices: bool,
}

impl Pool {
    /// The caller's pool.
    pub(crate) fn given(pool: registry::Arc<rayon::ThreadPool>) -> Pool {
        Pool {
            pool: OnceLock::from(pool),
            threads: 0,
            short_time_slices: false,
        }
    }

    /// The engine's own pool of `threads` threads, not started yet.
    pub(crate) fn deferred(threads: usize, short_time_slices: bool) -> Pool {
        Pool {
            pool: OnceLock::new(),
            threads,
            short_time_slices,
        }
    }

    /// The pool, started now if needed. A failed start is retried by the next call.
    fn start(&self) -> Result<&rayon::ThreadPool, ScheduleError> {
        if let Some(pool) = self.pool.get() {
            return Ok(pool);
        }
        let short_time_slices = self.short_time_slices;
        let built = rayon::ThreadPoolBuilder::new()
            .num_threads(self.threads)
            .thread_name(|index| format!("shardwheel-pool-{index}"))
            .start_handler(move |_| {
                if short_time_slices {
                    time_slice::request_for_current_thread();
                }
            })
            .build()
            .map_err(|_| ScheduleError::ExecutorUnavailable)?;
        // A concurrent start may have won: then `built` is dropped and its threads end.
        Ok(self.pool.get_or_init(|| registry::Arc::new(built)))
    }

    /// The pool if it has started.
    fn started(&self) -> Option<&rayon::ThreadPool> {
        self.pool.get().map(|pool| &**pool)
    }
}

/// Calls user code (running or dropping it: see [Containing user code](self#containing-user-code)).
/// A panic is caught, counted in the shard's `panicked` counter (`counters`), and its payload
/// dropped inside a second guard; returns `None` then.
pub(crate) fn contain<R>(counters: &ShardCounters, user_code: impl FnOnce() -> R) -> Option<R> {
    match catch_unwind(AssertUnwindSafe(user_code)) {
        Ok(value) => Some(value),
        Err(payload) => {
            counters.panicked.fetch_add(1, Ordering::Relaxed);
            drop_payload(payload);
            None
        }
    }
}

/// Drops user code's `value` (a task, a message holding one) with [`contain`].
pub(crate) fn drop_contained<T>(counters: &ShardCounters, value: T) {
    contain(counters, move || drop(value));
}

/// Drops `value` under the same guards as [`contain`], counting nothing: for a `Handoff`
/// dropped with tasks still in it (no shard at hand; only when the engine itself failed
/// mid-turn), for the payload of an engine panic, and for the task of an `UnfiredTimer` (its
/// engine is shut down).
pub(crate) fn drop_uncounted<T>(value: T) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(move || drop(value))) {
        drop_payload(payload);
    }
}

/// Drops a panic payload; one whose destructor panics as well is forgotten (leaked).
fn drop_payload(payload: Box<dyn Any + Send>) {
    if let Err(nested) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        std::mem::forget(nested);
    }
}

/// Runs one task with [`contain`], so that neither the executor nor the engine goes down
/// with it.
pub(crate) fn run_task(task: Task, counters: &ShardCounters) {
    contain(counters, || task.run());
}

/// One-shot tasks a shard hands to the pool at once, mid-turn, when many expire together.
const SPILL_EVERY: usize = 128;

/// Runs a batch of one-shot tasks on the pool, split across its threads.
pub(crate) fn run_batch(tasks: Vec<Task>, counters: &ShardCounters) {
    use rayon::prelude::*;
    if tasks.len() <= 64 {
        tasks.into_iter().for_each(|task| run_task(task, counters));
    } else {
        tasks
            .into_par_iter()
            .with_min_len(64)
            .for_each(|task| run_task(task, counters));
    }
}

impl Dispatch {
    /// Makes sure expired closure tasks will have somewhere to run: starts the engine's pool if
    /// it has not started. Called by every schedule of a closure task, before it is sent.
    #[inline]
    pub(crate) fn ready_for_closures(&self) -> Result<(), ScheduleError> {
        match self {
            Dispatch::Pool(pool) => pool.start().map(drop),
            Dispatch::Inline => Ok(()),
        }
    }

    /// How many expired one-shot tasks a shard collects before handing them over mid-turn
    /// (see [`handoff::spill`](super::handoff::spill)); never while the pool has not started.
    pub(crate) fn spill_every(&self) -> usize {
        match self {
            Dispatch::Pool(pool) if pool.started().is_some() => SPILL_EVERY,
            Dispatch::Pool(_) | Dispatch::Inline => usize::MAX,
        }
    }

    /// The pool, if tasks go to one and it has started.
    pub(crate) fn started_pool(&self) -> Option<&rayon::ThreadPool> {
        match self {
            Dispatch::Pool(pool) => pool.started(),
            Dispatch::Inline => None,
        }
    }
}
