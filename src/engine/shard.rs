//! A shard: the state other threads share with it ([`ShardShared`]) and the state only its
//! owner touches ([`ShardCore`]: the wheel, the tasks, local counters).

use super::inbox::Inbox;
use super::message::Message;
use super::slot::{FireOutcome, SlotTable};
use crate::clock::TickClock;
use crate::stats::{LocalLateness, ShardCounters};
use crate::sync::{Arc, AtomicUsize, Ordering};
use crate::task::Task;
use crate::wheel::core::{LinkStore, Links, WheelCore};
use crossbeam_utils::CachePadded;
use std::time::Instant;

/// Messages drained per round before the shard looks at the wheel again, so a flood of
/// submissions cannot delay expiry.
pub(crate) const DRAIN_BATCH: usize = 16 * 1024;

/// The engine-wide `max_pending` limit: an exact count of pending timers.
#[derive(Debug)]
pub(crate) struct PendingLimit {
    max: usize,
    pending: CachePadded<AtomicUsize>,
}

impl PendingLimit {
    pub(crate) fn new(max: usize) -> PendingLimit {
        PendingLimit {
            max,
            pending: CachePadded::new(AtomicUsize::new(0)),
        }
    }

    /// Takes a place; false when `max` timers are pending.
    pub(crate) fn try_reserve(&self) -> bool {
        self.pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |pending| {
                (pending < self.max).then_some(pending + 1)
            })
            .is_ok()
    }

    /// Gives back `count` places.
    pub(crate) fn release(&self, count: usize) {
        let old = self.pending.fetch_sub(count, Ordering::AcqRel);
        debug_assert!(old >= count, "pending limit released {count} of {old}");
    }

    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }
}

/// The part of a shard any thread may touch: the slot table, the inbox, counters.
#[derive(Debug)]
pub(crate) struct ShardShared {
    pub(crate) slots: SlotTable,
    pub(crate) inbox: Inbox,
    pub(crate) clock: TickClock,
    pub(crate) counters: ShardCounters,
    pub(crate) limit: Option<Arc<PendingLimit>>,
}

impl ShardShared {
    pub(crate) fn new(clock: TickClock, limit: Option<Arc<PendingLimit>>) -> ShardShared {
        ShardShared {
            slots: SlotTable::new(),
            inbox: Inbox::new(),
            clock,
            counters: ShardCounters::new(),
            limit,
        }
    }

    /// A timer of this shard left PENDING other than by firing (cancel or shutdown).
    pub(crate) fn count_cancelled(&self, count: u64) {
        self.counters
            .cancelled
            .fetch_add(count, std::sync::atomic::Ordering::Relaxed);
        if let Some(limit) = &self.limit {
            limit.release(count as usize);
        }
    }

    /// After shutdown's last drain: drops whatever late submitters left in the queue (all of
    /// it belongs to rejected schedules or to timers shutdown already settled).
    pub(crate) fn discard_late_messages(&self) {
        while let Some(message) = self.inbox.pop() {
            drop(message);
        }
    }
}

/// A timer that was still pending when the engine shut down: its task, returned unrun.
#[derive(Debug)]
pub struct UnfiredTimer {
    task: Task,
    deadline: Option<Instant>,
}

impl UnfiredTimer {
    /// When the timer would have fired (`None` if beyond representable time).
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Runs the task now, on the calling thread.
    pub fn run(self) {
        self.task.run();
    }
}

/// The owner's record of one timer, under the same index as its slot.
struct Entry {
    links: Links,
    task: Option<Task>,
}

const VACANT: Entry = Entry {
    links: Links::UNLINKED,
    task: None,
};

/// The owner's table of entries, indexed like the slot table.
struct Entries(Vec<Entry>);

impl LinkStore for Entries {
    fn links(&self, index: u32) -> &Links {
        &self.0[index as usize].links
    }
    fn links_mut(&mut self, index: u32) -> &mut Links {
        &mut self.0[index as usize].links
    }
}

/// Owner-only state of a shard: touched by exactly one thread at a time (its worker thread, or
/// whoever drives it by hand), so no locks or atomics inside.
pub(crate) struct ShardCore {
    pub(crate) shared: Arc<ShardShared>,
    wheel: WheelCore,
    entries: Entries,
    fired: u64,
    reset: u64,
    lateness: LocalLateness,
}

/// What one turn of a shard produced: tasks to run and tasks to drop, both handed off only
/// after the shard's state is no longer borrowed (user code never runs inside a turn).
#[derive(Default)]
pub(crate) struct Handoff {
    pub(crate) expired: Vec<Task>,
    pub(crate) dropped: Vec<Task>,
}

impl Handoff {
    pub(crate) fn is_empty(&self) -> bool {
        self.expired.is_empty() && self.dropped.is_empty()
    }
}

impl ShardCore {
    pub(crate) fn new(shared: Arc<ShardShared>, levels: usize) -> ShardCore {
        ShardCore {
            shared,
            wheel: WheelCore::new(levels),
            entries: Entries(Vec::new()),
            fired: 0,
            reset: 0,
            lateness: LocalLateness::new(),
        }
    }

    /// The tick of the wheel's next work (`None`: nothing stored).
    pub(crate) fn next_expiration(&self) -> Option<u64> {
        self.wheel.next_expiration()
    }

    /// Applies up to [`DRAIN_BATCH`] messages; returns how many there were.
    pub(crate) fn drain_inbox(&mut self, handoff: &mut Handoff) -> usize {
        let shared = self.shared.clone();
        let mut drained = 0;
        while drained < DRAIN_BATCH {
            let Some(message) = shared.inbox.pop() else {
                break;
            };
            drained += 1;
            self.apply(message, handoff);
        }
        drained
    }

    fn apply(&mut self, message: Message, handoff: &mut Handoff) {
        match message {
            Message::Schedule {
                index,
                deadline,
                task,
            } => {
                let slot = index as usize;
                if slot >= self.entries.0.len() {
                    self.entries.0.resize_with(slot + 1, || VACANT);
                }
                let entry = &mut self.entries.0[slot];
                debug_assert!(
                    entry.task.is_none() && !entry.links.is_linked(),
                    "slot {index} scheduled while occupied"
                );
                entry.task = Some(task);
                self.wheel.insert(&mut self.entries, index, deadline);
            }
            Message::Cancel { index } => {
                self.wheel.remove(&mut self.entries, index);
                if let Some(task) = self.entries.0[index as usize].task.take() {
                    handoff.dropped.push(task);
                    self.shared.slots.release_by_shard(index);
                }
            }
            Message::Reset {
                index,
                generation,
                deadline,
            } => {
                if self.shared.slots.reset_applied(index, generation) == Some(true) {
                    self.reset += 1;
                    self.wheel.remove(&mut self.entries, index);
                    self.wheel.insert(&mut self.entries, index, deadline);
                }
            }
        }
    }

    /// Advances the wheel to `now_tick` and collects the tasks of timers that fired.
    pub(crate) fn expire(&mut self, now_tick: u64, handoff: &mut Handoff) -> usize {
        let shared = &*self.shared;
        let now_nanos = shared.clock.now_nanos();
        let lateness = &mut self.lateness;
        let mut fired = 0u64;
        self.wheel
            .advance_to(&mut self.entries, now_tick, |entries, index| {
                match shared.slots.fire(index) {
                    FireOutcome::Fire { free } => {
                        let entry = &mut entries.0[index as usize];
                        let task = entry.task.take().expect("a stored timer has a task");
                        lateness
                            .record(now_nanos.saturating_sub(
                                shared.clock.nanos_of_tick(entry.links.deadline()),
                            ));
                        handoff.expired.push(task);
                        fired += 1;
                        if free {
                            shared.slots.free_fired(index);
                        }
                    }
                    // The entry stays out of the wheel, task kept: the pending reset message
                    // re-inserts it, the pending cancel message drops it.
                    FireOutcome::ResetInFlight | FireOutcome::Cancelled => {}
                }
            });
        self.fired += fired;
        if let Some(limit) = &self.shared.limit {
            if fired > 0 {
                limit.release(fired as usize);
            }
        }
        fired as usize
    }

    /// Publishes local counters (`Relaxed`: they order nothing).
    pub(crate) fn flush_counters(&mut self) {
        let counters = &self.shared.counters;
        counters
            .fired
            .store(self.fired, std::sync::atomic::Ordering::Relaxed);
        counters
            .reset
            .store(self.reset, std::sync::atomic::Ordering::Relaxed);
        counters.flush_lateness(&mut self.lateness);
    }

    /// Shutdown of this shard, after its inbox was closed and no thread drives it any more:
    /// applies every message that was delivered, then cancels every timer still pending and
    /// returns their tasks. Tasks of timers cancelled meanwhile are dropped.
    pub(crate) fn close(mut self) -> Vec<UnfiredTimer> {
        debug_assert!(
            self.shared.inbox.is_closed(),
            "closing a shard whose inbox is open"
        );
        let mut handoff = Handoff::default();
        while self.drain_inbox(&mut handoff) > 0 {}
        self.shared.inbox.mark_drained();
        while self.drain_inbox(&mut handoff) > 0 {}
        let shared = self.shared.clone();
        let mut unfired = Vec::new();
        for (index, entry) in self.entries.0.iter_mut().enumerate() {
            let Some(task) = entry.task.take() else {
                continue;
            };
            let index = index as u32;
            let deadline = entry.links.deadline();
            if shared.slots.cancel_for_shutdown(index) {
                let deadline = shared.clock.instant_of_tick(deadline);
                unfired.push(UnfiredTimer { task, deadline });
                shared.count_cancelled(1);
            } else {
                handoff.dropped.push(task);
            }
            *entry = VACANT;
            shared.slots.release_by_shard(index);
        }
        self.wheel = WheelCore::new(1);
        self.flush_counters();
        drop(handoff);
        unfired
    }
}
