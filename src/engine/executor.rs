//! Where expired tasks run: a rayon pool (the engine's own or the caller's), or inline on the
//! shard thread for tasks that only wake something; and how the engine survives user code.
//!
//! # Containing user code
//!
//! Everything a user hands the engine is user code: a task's closure when it runs, and also
//! when it is dropped unrun (everything it captured has a destructor), repeating tasks, the
//! `Waker` a [`Sleep`](crate::Sleep) wakes (and drops), and the payload of any of their panics
//! (whose own destructor may panic again). The engine calls into it in one way only: through
//! [`contain`] (or its uncounted twin [`drop_uncounted`], where no shard is at hand), which catches a panic, counts it in [`Stats::panicked`](crate::Stats::panicked)
//! and drops its payload inside a second guard (a payload whose destructor panics too is
//! forgotten: leaked, never dropped). So a user panic never unwinds into the engine: no shard
//! thread dies of one, and no pool job lets one escape (rayon aborts the process on a panic
//! that escapes a spawned job).
//!
//! Every place engine code runs or drops user code, and so calls [`contain`]:
//!
//! | where | runs or drops |
//! |-------|---------------|
//! | [`run_task`] (pool batches, `spill`, inline on the shard, `Engine::drive`, shutdown's wake-ups) | one-shot tasks and wakers: run |
//! | [`run_repeating`] | a repeating task: one run; dropped when it stopped or panicked |
//! | every `pool.spawn` body ([`Dispatch::spill`], [`Dispatch::hand_off`]) | the job as a whole |
//! | [`Dispatch::hand_off`], shutdown's `close` | tasks of cancelled or ended timers: dropped |
//! | `ShardShared::discard_late_messages`, `ShardShared::submit`'s refusals | tasks in late messages, tasks of refused schedules: dropped |
//! | `Drop` of `Handoff`, `ShardCore` and `ShardShared` (its inbox) | tasks still held when they go (a failed shard): dropped |
//!
//! Dropping on the shard thread happens only after the turn let go of the shard's state (the
//! turn collects tasks into a `Handoff`, see `shard.rs`), so user code never sees the shard
//! mid-change, and may even call `shutdown()` (see `worker::hand_off`).
//!
//! Only a panic while already unwinding cannot be contained: a task whose captured value
//! panics in its destructor while the task's own panic unwinds aborts the process (Rust's
//! rule, not the engine's).

use super::shard::{Handoff, RepeatingRun, ShardShared};
use crate::sync::Arc;
use crate::sync::registry;
use crate::task::Task;
use std::any::Any;
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

/// Calls user code (running or dropping it: see [Containing user code](self#containing-user-code)).
/// A panic is caught, counted in `shard`'s `panicked` counter, and its payload dropped inside a
/// second guard; returns `None` then.
pub(crate) fn contain<R>(shard: &ShardShared, user_code: impl FnOnce() -> R) -> Option<R> {
    match catch_unwind(AssertUnwindSafe(user_code)) {
        Ok(value) => Some(value),
        Err(payload) => {
            shard.counters.panicked.fetch_add(1, Ordering::Relaxed);
            drop_payload(payload);
            None
        }
    }
}

/// Drops user code's `value` (a task, a message holding one) with [`contain`].
pub(crate) fn drop_contained<T>(shard: &ShardShared, value: T) {
    contain(shard, move || drop(value));
}

/// Drops `value` under the same guards as [`contain`], counting nothing: for a `Handoff`
/// dropped with tasks still in it (no shard at hand; only when the engine itself failed
/// mid-turn), and for the payload of an engine panic.
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
pub(crate) fn run_task(task: Task, shard: &ShardShared) {
    contain(shard, || task.run());
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
    let outcome = contain(shard, || task.run_repeating(clock.now_nanos(), &now));
    match outcome {
        Some(Some(next_nanos)) => {
            ShardShared::rearm(shard, index, clock.tick_at_nanos(next_nanos), Some(task));
        }
        // Stopped, or panicked (counted): the task is dropped here, before the shard hears.
        Some(None) | None => {
            drop_contained(shard, task);
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
            pool.spawn(move || {
                contain(&shard, || run_batch(tasks, &shard));
            });
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
                    contain(&shard, || {
                        run_batch(expired, &shard);
                        repeating
                            .into_par_iter()
                            .for_each(|run| run_repeating(run, &shard));
                    });
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
        for task in handoff.dropped.drain(..) {
            drop_contained(shard, task);
        }
    }
}
