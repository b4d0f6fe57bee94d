//! [`Engine`]: starting the shards and their threads (or their manual driver), submission,
//! driving by hand, shutdown and statistics.

use super::executor::{Dispatch, Executor, Pool, drop_uncounted};
use super::handle::TimerHandle;
use super::handoff::{self, Handoff, UnfiredTimer};
use super::lease::{Leasable, Leases};
use super::owner::{DRAIN_BATCH, OwnerHold, ShardOwner};
use super::placement::Placement;
use super::shared::{PendingLimit, ShardShared, Via};
use super::stage::StagedAt;
use super::worker;
use crate::clock::{Clock, ClockLine, TickClock};
use crate::error::{BuildError, ScheduleError};
use crate::stats::{self, Stats};
use crate::sync::{Arc, AtomicBool, Mutex, MutexGuard, Ordering, lock, registry, thread};
use crate::task::Task;
use crate::wheel::MAX_LEVELS;
use std::time::Duration;

/// How the shards' owners are driven.
pub(crate) enum Drive {
    /// Each owner lives on its own worker thread (the default).
    Threads(Mutex<Vec<thread::JoinHandle<Option<ShardOwner>>>>),
    /// No threads: a manual clock's `advance` drives each owner in turn.
    ByHand(Box<[Mutex<Option<ShardOwner>>]>),
}

/// What [`Engine::start`] builds (a [`Builder`](crate::Builder)'s options).
pub(crate) struct Settings {
    /// `None`: one per CPU this process may use.
    pub(crate) shards: Option<usize>,
    pub(crate) tick: Duration,
    pub(crate) pin_threads: bool,
    /// Whether the engine's threads ask for short time slices ([`super::time_slice`]).
    pub(crate) short_time_slices: bool,
    pub(crate) max_pending: Option<usize>,
    pub(crate) levels: usize,
    pub(crate) executor: Executor,
    pub(crate) clock: Clock,
}

/// Everything a [`Timer`](crate::Timer) is: shared by its clones, its workers and its driver.
pub(crate) struct Engine {
    pub(crate) shards: Box<[Arc<ShardShared>]>,
    pub(crate) clock: TickClock,
    pub(crate) dispatch: Dispatch,
    pub(crate) limit: Option<Arc<PendingLimit>>,
    pub(crate) drive: Drive,
    /// Which shard each thread schedules on.
    placement: Placement,
    closed: AtomicBool,
    /// What keeps this engine alive for the sleeps of its timer, one stripe per shard.
    leases: Leases,
}

impl Leasable for Engine {
    type Line = ClockLine;

    fn leases(&self) -> &Leases {
        &self.leases
    }

    fn line(&self) -> &ClockLine {
        self.clock.line()
    }
}

const _: () = {
    // A `Lease` on an engine is two words, as the reference it replaced in a `Sleep` was.
    assert!(size_of::<crate::engine::lease::Lease<Engine>>() == 16);
};

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("shards", &self.shards.len())
            .field("clock", &self.clock)
            .finish()
    }
}

impl Engine {
    /// Starts an engine: its shards, and their worker threads unless the clock is manual (then
    /// the clock's `advance` calls [`drive`](Self::drive)).
    pub(crate) fn start(settings: Settings) -> Result<Arc<Engine>, BuildError> {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        let shard_count = settings
            .shards
            .unwrap_or(cpus.min(crate::Builder::MAX_SHARDS));
        if shard_count == 0 {
            return Err(BuildError::NoShards);
        }
        if shard_count > crate::Builder::MAX_SHARDS {
            return Err(BuildError::TooManyShards {
                shards: shard_count,
            });
        }
        if settings.tick.is_zero() {
            return Err(BuildError::ZeroTick);
        }
        if !(1..=MAX_LEVELS).contains(&settings.levels) {
            return Err(BuildError::InvalidLevels {
                levels: settings.levels,
            });
        }
        let dispatch = if cfg!(shardwheel_loom) {
            Dispatch::Inline
        } else {
            match settings.executor {
                Executor::DefaultPool => Dispatch::Pool(registry::Arc::new(Pool::deferred(
                    cpus,
                    settings.short_time_slices,
                ))),
                Executor::ThreadPool(pool) => Dispatch::Pool(registry::Arc::new(Pool::given(pool))),
                Executor::Inline => Dispatch::Inline,
            }
        };
        let clock = TickClock::new(settings.clock.clone(), settings.tick);
        let limit = settings
            .max_pending
            .map(|max| Arc::new(PendingLimit::new(max)));
        let shards: Box<[Arc<ShardShared>]> = (0..shard_count)
            .map(|_| Arc::new(ShardShared::new(clock.clone(), limit.clone())))
            .collect();
        let owners: Vec<ShardOwner> = shards
            .iter()
            .map(|shard| ShardOwner::new(shard.clone(), settings.levels))
            .collect();
        let engine = |placement, drive| Engine {
            shards,
            clock,
            dispatch: dispatch.clone(),
            limit,
            drive,
            placement,
            closed: AtomicBool::new(false),
            leases: Leases::default(),
        };

        if settings.clock.is_manual() {
            let drive = Drive::ByHand(
                owners
                    .into_iter()
                    .map(|owner| Mutex::new(Some(owner)))
                    .collect(),
            );
            return Ok(Arc::new(engine(Placement::new(shard_count, &[]), drive)));
        }

        // Loom runs every thread on one OS thread: pinning would pin the model checker.
        let core_ids = if settings.pin_threads && !cfg!(shardwheel_loom) {
            core_affinity::get_core_ids().unwrap_or_default()
        } else {
            Vec::new()
        };
        let placement = Placement::new(shard_count, &core_ids);
        let mut workers = Vec::with_capacity(shard_count);
        let mut spawn_error = None;
        for (ordinal, owner) in owners.into_iter().enumerate() {
            let placing = worker::Placing {
                pin: (!core_ids.is_empty()).then(|| core_ids[ordinal % core_ids.len()]),
                short_time_slice: settings.short_time_slices,
            };
            match worker::spawn(owner, dispatch.clone(), ordinal, placing) {
                Ok(handle) => workers.push(handle),
                Err(error) => {
                    spawn_error = Some(error);
                    break;
                }
            }
        }
        let engine = Arc::new(engine(placement, Drive::Threads(Mutex::new(workers))));
        if let Some(error) = spawn_error {
            drop(engine.shutdown());
            return Err(BuildError::Spawn(error));
        }
        Ok(engine)
    }

    /// This thread's home shard (see [`placement`](super::placement)).
    pub(crate) fn home_shard(&self) -> &Arc<ShardShared> {
        &self.shards[self.placement.home()]
    }

    /// Schedules `task` at `deadline` (a tick) on this thread's home shard.
    pub(crate) fn submit(&self, deadline: u64, task: Task) -> Result<TimerHandle, ScheduleError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(ScheduleError::Shutdown);
        }
        TimerHandle::submit(self.home_shard(), deadline, task)
    }

    /// [`submit`](Self::submit) without a [`TimerHandle`]: returns the home shard's ordinal in
    /// [`shards`](Self::shards), the timer's slot index and generation, and where it was staged
    /// (for `ShardShared::retract`), with the one handle
    /// its slot counts, which the caller lets go of with `SlotTable::drop_handle` (or
    /// `ShardShared::cancel_and_release`). For callers that keep the engine alive anyway (a
    /// [`Sleep`](crate::Sleep)) and so need not hold the shard's `Arc`.
    #[inline]
    pub(crate) fn submit_slot(
        &self,
        deadline: u64,
        make: impl FnOnce() -> Task,
    ) -> Result<(usize, u32, u32, Option<StagedAt>), ScheduleError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(ScheduleError::Shutdown);
        }
        let ordinal = self.placement.home();
        let (index, generation, staged) =
            self.shards[ordinal].submit(deadline, make, Via::Stage)?;
        Ok((ordinal, index, generation, staged))
    }

    /// Stops the engine: refuses new schedules, stops and joins the shard threads (except the
    /// calling thread's own), and returns every timer that neither ran nor was cancelled.
    /// Idempotent: later calls return nothing.
    pub(crate) fn shutdown(&self) -> Vec<UnfiredTimer> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Vec::new();
        }
        for shard in self.shards.iter() {
            shard.inbox.close();
        }
        let mut unfired = Vec::new();
        match &self.drive {
            Drive::Threads(workers) => {
                let workers = std::mem::take(&mut *lock(workers));
                for (shard, worker) in self.shards.iter().zip(workers) {
                    let owner = match worker::take_parked_owner(shard) {
                        // We are this shard's worker, inside user code: close it here; the
                        // thread ends when that code returns.
                        Some(owner) => Some(owner),
                        None => worker.join().ok().flatten(),
                    };
                    if let Some(owner) = owner {
                        unfired.extend(close(owner));
                    }
                }
            }
            Drive::ByHand(owners) => {
                for owner in owners.iter() {
                    let owner = lock(owner).take();
                    if let Some(owner) = owner {
                        unfired.extend(close(owner));
                    }
                }
            }
        }
        unfired
    }

    /// Whether [`shutdown`](Self::shutdown) has begun.
    pub(crate) fn is_shut_down(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Manual clock: runs every shard until nothing is due by the clock's current time, one
    /// [`ShardOwner::turn`] at a time. Tasks run (inline) or are handed to the pool outside the
    /// owner's lock.
    pub(crate) fn drive(&self) {
        let Drive::ByHand(owners) = &self.drive else {
            return;
        };
        loop {
            let mut progressed = false;
            for (shard, owner) in self.shards.iter().zip(owners.iter()) {
                let mut handoff = Handoff::default();
                let mut hold = ByHandHold {
                    owner,
                    guard: None,
                    shard,
                    dispatch: &self.dispatch,
                };
                // Never spills: the tasks go out after the turn.
                if let Some(turn) = ShardOwner::turn(&mut hold, &mut handoff, &self.dispatch, false)
                {
                    progressed |= turn.ran || turn.drained == DRAIN_BATCH || turn.compacting;
                }
            }
            if !progressed {
                return;
            }
        }
    }

    /// Timers pending now: exact under `max_pending`, else the sum of the shards' counters.
    pub(crate) fn pending(&self) -> usize {
        match &self.limit {
            Some(limit) => limit.pending(),
            None => self.stats().pending as usize,
        }
    }

    pub(crate) fn stats(&self) -> Stats {
        let mut stats = stats::total(
            self.shards
                .iter()
                .map(|shard| shard.counters.snapshot())
                .collect(),
        );
        stats.cycle_clock = self.clock.reads_cycle_clock();
        stats
    }
}

/// The manual clock's hold on an owner: its lock, taken for the turn and let go of while the
/// turn's tasks run (so that they may shut the engine down).
struct ByHandHold<'a> {
    owner: &'a Mutex<Option<ShardOwner>>,
    guard: Option<MutexGuard<'a, Option<ShardOwner>>>,
    shard: &'a Arc<ShardShared>,
    dispatch: &'a Dispatch,
}

impl OwnerHold for ByHandHold<'_> {
    fn owner(&mut self) -> Option<&mut ShardOwner> {
        let owner = self.owner;
        self.guard.get_or_insert_with(|| lock(owner)).as_mut()
    }

    fn hand_off(&mut self, handoff: &mut Handoff) {
        self.guard = None;
        handoff::hand_off(self.dispatch, handoff, self.shard);
    }
}

/// Closes a shard's owner for shutdown ([`ShardOwner::close`]). The owner of a failed shard
/// (whose thread died of an engine bug, maybe mid-change) is closed under a guard: if that
/// fails too, its timers are lost, but not silently (`Stats::failed_shards`), and the tasks it
/// held are dropped contained (`ShardOwner`'s `Drop`).
fn close(owner: ShardOwner) -> Vec<UnfiredTimer> {
    if !owner.shared.has_failed() {
        return owner.close();
    }
    use std::panic::{AssertUnwindSafe, catch_unwind};
    match catch_unwind(AssertUnwindSafe(|| owner.close())) {
        Ok(unfired) => unfired,
        Err(payload) => {
            drop_uncounted(payload);
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{Clock, Executor, Timer};
    use std::sync::mpsc;
    use std::time::Duration;

    /// Under a manual clock, a task run inline by `advance` may shut the engine down: the turn
    /// lets go of the owner's lock while its tasks run, and the shutdown returns the shard's
    /// other timers.
    #[test]
    fn manual_clock_task_may_shut_the_engine_down() -> Result<(), Box<dyn std::error::Error>> {
        let clock = Clock::manual();
        let timer = Timer::builder()
            .shards(1)
            .clock(clock.clone())
            .executor(Executor::Inline)
            .build()?;
        let (sender, receiver) = mpsc::channel();
        let inside = timer.clone();
        timer.schedule(Duration::from_millis(1), move || {
            sender.send(inside.shutdown().len()).unwrap();
        })?;
        timer.schedule(Duration::from_secs(60), || {})?;
        clock.advance(Duration::from_millis(5));
        assert_eq!(receiver.try_recv()?, 1, "the other timer is returned");
        assert!(timer.is_shut_down());
        Ok(())
    }
}
