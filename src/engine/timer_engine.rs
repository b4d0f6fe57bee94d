//! [`Engine`]: the shards, their threads (or their manual driver), submission and shutdown.

use super::executor::Dispatch;
use super::handle::TimerHandle;
use super::shard::{Handoff, PendingLimit, ShardOwner, ShardShared, UnfiredTimer};
use super::worker;
use crate::clock::TickClock;
use crate::error::ScheduleError;
use crate::stats::{self, Stats};
use crate::sync::{Arc, AtomicBool, Mutex, Ordering, lock, thread};
use crate::task::Task;

/// How the shards' cores are driven.
pub(crate) enum Drive {
    /// Each core lives on its own worker thread (the default).
    Threads(Mutex<Vec<thread::JoinHandle<Option<ShardOwner>>>>),
    /// No threads: a manual clock's `advance` drives each core in turn.
    ByHand(Box<[Mutex<Option<ShardOwner>>]>),
}

/// Everything a [`Timer`](crate::Timer) is: shared by its clones, its workers and its driver.
pub(crate) struct Engine {
    pub(crate) shards: Box<[Arc<ShardShared>]>,
    pub(crate) clock: TickClock,
    pub(crate) dispatch: Dispatch,
    pub(crate) limit: Option<Arc<PendingLimit>>,
    pub(crate) drive: Drive,
    /// For each CPU, the shards whose threads are pinned to it (empty where none is, or
    /// without pinning): a thread schedules on a shard of the CPU it runs on.
    shards_by_cpu: Box<[Box<[usize]>]>,
    /// Threads that took each shard as their home by CPU (never decremented: a placement hint).
    homed: Box<[crate::sync::statistics::AtomicUsize]>,
    closed: AtomicBool,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("shards", &self.shards.len())
            .field("clock", &self.clock)
            .finish()
    }
}

impl Engine {
    pub(crate) fn new(
        shards: Box<[Arc<ShardShared>]>,
        clock: TickClock,
        dispatch: Dispatch,
        limit: Option<Arc<PendingLimit>>,
        drive: Drive,
        shards_by_cpu: Box<[Box<[usize]>]>,
    ) -> Engine {
        let homed = (0..shards.len())
            .map(|_| crate::sync::statistics::AtomicUsize::new(0))
            .collect();
        Engine {
            shards,
            clock,
            dispatch,
            limit,
            drive,
            homed,
            shards_by_cpu,
            closed: AtomicBool::new(false),
        }
    }

    /// This thread's home shard, chosen at its first schedule and kept.
    ///
    /// A shard pinned to the CPU the thread runs on then, where there is one: the messages and
    /// the shard's entries stay in that core's caches (a submitter and its shard time-share the
    /// core), which doubled cancel+schedule throughput on the 2-core development machine
    /// compared with a round-robin shard on the other core. Kept, not chosen again at each
    /// schedule: a thread's timers stay on one shard, so a thread that moves between CPUs does
    /// not shift its timers from one shard's tables to another's (which grew memory). Among
    /// several shards on one CPU, and where no CPU is known (no pinning, other systems, loom),
    /// the thread's round-robin ordinal chooses; a shard's own worker uses its own shard.
    pub(crate) fn home_shard(&self) -> &Arc<ShardShared> {
        let ordinal = worker::home_ordinal(|| {
            let on_cpu = self.shards_by_cpu.get(current_cpu()?)?;
            // The CPU's least-homed shard, unless another shard has fewer threads homed: new
            // threads often first run on the CPU that spawned them.
            let homed =
                |shard: &usize| self.homed[*shard].load(std::sync::atomic::Ordering::Relaxed);
            let local = on_cpu.iter().copied().min_by_key(homed)?;
            let fewest = (0..self.shards.len()).min_by_key(homed)?;
            let chosen = if homed(&local) <= homed(&fewest) {
                local
            } else {
                fewest
            };
            self.homed[chosen].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Some(chosen)
        });
        &self.shards[ordinal % self.shards.len()]
    }

    /// Schedules `task` at `deadline` (a tick) on this thread's home shard.
    pub(crate) fn submit(&self, deadline: u64, task: Task) -> Result<TimerHandle, ScheduleError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(ScheduleError::Shutdown);
        }
        ShardShared::submit(self.home_shard(), deadline, task)
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
                    let core = match worker::take_parked_owner(shard) {
                        // We are this shard's worker, inside user code: close it here; the
                        // thread ends when that code returns.
                        Some(core) => Some(core),
                        None => worker.join().ok().flatten(),
                    };
                    if let Some(core) = core {
                        unfired.extend(close(core));
                    }
                }
            }
            Drive::ByHand(cores) => {
                for core in cores.iter() {
                    let core = lock(core).take();
                    if let Some(core) = core {
                        unfired.extend(close(core));
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

    /// Manual clock: runs every shard until nothing is due by the clock's current time. Tasks
    /// run (inline) or are handed to the pool outside the shard's lock.
    pub(crate) fn drive(&self) {
        let Drive::ByHand(cores) = &self.drive else {
            return;
        };
        loop {
            let mut progressed = false;
            for (shard, slot) in self.shards.iter().zip(cores.iter()) {
                let mut handoff = Handoff::default();
                {
                    let mut guard = lock(slot);
                    let Some(core) = guard.as_mut() else { continue };
                    loop {
                        let drained = core.drain_inbox(&mut handoff);
                        shard.inbox.consumed(drained);
                        if drained == 0 {
                            break;
                        }
                    }
                    let now = self.clock.now_tick();
                    core.expire(now, &mut handoff, usize::MAX, |_| {});
                    core.cascade_ahead();
                    // Housekeeping as on a worker thread: an idle shard gives memory back
                    // once the clock has moved past its release delay.
                    core.reclaim_idle_memory(now);
                    core.flush_counters();
                }
                progressed |= handoff.ran_anything();
                self.dispatch.hand_off(&mut handoff, shard);
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

/// Closes a shard's core for shutdown ([`ShardOwner::close`]). The core of a failed shard
/// (whose thread died of an engine bug, maybe mid-change) is closed under a guard: if that
/// fails too, its timers are lost, but not silently (`Stats::failed_shards`), and the tasks it
/// held are dropped contained (`ShardOwner`'s `Drop`).
fn close(core: ShardOwner) -> Vec<super::shard::UnfiredTimer> {
    if !core.shared.has_failed() {
        return core.close();
    }
    use std::panic::{AssertUnwindSafe, catch_unwind};
    match catch_unwind(AssertUnwindSafe(|| core.close())) {
        Ok(unfired) => unfired,
        Err(payload) => {
            super::executor::drop_uncounted(payload);
            Vec::new()
        }
    }
}

/// The CPU this thread runs on now (it may move at any time: only a placement hint).
#[cfg(all(target_os = "linux", not(loom)))]
fn current_cpu() -> Option<usize> {
    // SAFETY: `sched_getcpu` has no preconditions; it returns -1 on error.
    usize::try_from(unsafe { libc::sched_getcpu() }).ok()
}

/// The CPU this thread runs on: not known on this system (or under loom).
#[cfg(not(all(target_os = "linux", not(loom))))]
fn current_cpu() -> Option<usize> {
    None
}
