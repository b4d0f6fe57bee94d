//! A shard: the state other threads share with it ([`ShardShared`]) and the state only its
//! owner touches ([`ShardOwner`]: the wheel, the tasks, local counters).

use super::executor::{drop_contained, drop_uncounted};
use super::handle::TimerHandle;
use super::inbox::{Inbox, PushOutcome};
use super::message::Message;
use super::slot::{FireOutcome, RELEASE_ABOVE, Release, RunEnd, Slot, SlotTable};
use crate::clock::TickClock;
use crate::error::ScheduleError;
use crate::stats::{LocalLateness, ShardCounters};
use crate::sync::{Arc, AtomicUsize, Ordering};
use crate::task::Task;
use crate::wheel::raw::{LinkStore, Links, RawWheel};
use crossbeam_utils::CachePadded;
use std::time::{Duration, Instant};

/// Messages drained per round before the shard looks at the wheel again, so a flood of
/// submissions cannot delay expiry.
pub(crate) const DRAIN_BATCH: usize = 16 * 1024;
/// How long a shard's entry table and slot table stay allocated after its last timer left (see
/// [`ShardOwner::reclaim_idle_memory`]); also the first wait before trying the slot table again.
pub(crate) const RECLAIM_DELAY: Duration = Duration::from_millis(20);
/// The longest wait between tries to release a slot table whose slots are still held.
pub(crate) const RECLAIM_RETRY_MAX: Duration = Duration::from_secs(1);

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
    pub(crate) fn give_back(&self, count: usize) {
        let old = self.pending.fetch_sub(count, Ordering::AcqRel);
        debug_assert!(old >= count, "pending limit gave back {count} of {old}");
    }

    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }
}

/// The part of a shard any thread may touch: the slot table, the inbox, counters.
#[derive(Debug)]
pub(crate) struct ShardShared {
    /// Cache-line aligned, which also keeps the `Arc`'s reference counts (bumped by every new
    /// handle) off the line of the page table that every slot access reads.
    pub(crate) slots: CachePadded<SlotTable>,
    pub(crate) inbox: Inbox,
    pub(crate) clock: TickClock,
    pub(crate) counters: ShardCounters,
    pub(crate) limit: Option<Arc<PendingLimit>>,
    /// Test-only fault: the worker thread panics at its next turn (see
    /// `Timer::kill_shard_thread_for_tests`).
    #[cfg(debug_assertions)]
    pub(crate) fault: crate::sync::statistics::AtomicBool,
}

impl ShardShared {
    pub(crate) fn new(clock: TickClock, limit: Option<Arc<PendingLimit>>) -> ShardShared {
        ShardShared {
            slots: CachePadded::new(SlotTable::new()),
            inbox: Inbox::new(),
            clock,
            counters: ShardCounters::new(),
            limit,
            #[cfg(debug_assertions)]
            fault: crate::sync::statistics::AtomicBool::new(false),
        }
    }

    /// Whether this shard's thread died (see `worker::run`): its inbox is closed for good.
    pub(crate) fn has_failed(&self) -> bool {
        self.counters
            .failed
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Marks the shard failed, then closes its inbox: a submitter that finds the inbox closed
    /// then also finds it failed (the close orders the two), and says so.
    #[cfg_attr(loom, allow(dead_code))] // Under loom the worker lets a panic through.
    pub(crate) fn fail(&self) {
        self.counters
            .failed
            .store(true, std::sync::atomic::Ordering::Release);
        self.inbox.close();
    }

    /// Why a schedule found the inbox closed: the engine was shut down, or the shard failed.
    fn closed_error(&self) -> ScheduleError {
        if self.has_failed() {
            ScheduleError::ShardFailed
        } else {
            ScheduleError::Shutdown
        }
    }

    /// A timer of this shard left PENDING other than by firing (cancel or shutdown).
    pub(crate) fn count_cancelled(&self, count: u64) {
        self.counters
            .cancelled
            .fetch_add(count, std::sync::atomic::Ordering::Relaxed);
        if let Some(limit) = &self.limit {
            limit.give_back(count as usize);
        }
    }

    /// Schedules `task` at tick `deadline` on `shard`.
    pub(crate) fn submit(
        shard: &Arc<ShardShared>,
        deadline: u64,
        task: Task,
    ) -> Result<TimerHandle, ScheduleError> {
        // A refused task is user code: dropped contained.
        let refuse = |task: Task, error: ScheduleError| {
            drop_contained(shard, task);
            Err(error)
        };
        if shard.inbox.is_closed() {
            return refuse(task, shard.closed_error());
        }
        if let Some(limit) = &shard.limit
            && !limit.try_reserve()
        {
            return refuse(task, ScheduleError::Full);
        }
        let Some((index, generation)) = shard.slots.allocate() else {
            if let Some(limit) = &shard.limit {
                limit.give_back(1);
            }
            return refuse(task, ScheduleError::Full);
        };
        shard
            .slots
            .begin(index, generation, deadline, task.is_repeating());
        shard
            .counters
            .scheduled
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let handle = TimerHandle {
            shard: shard.clone(),
            index,
            generation,
        };
        match shard.inbox.push(
            Message::Schedule {
                index,
                deadline,
                task,
            },
            deadline,
        ) {
            PushOutcome::Delivered => Ok(handle),
            PushOutcome::Closed { drained } => {
                // Shutdown raced us. Whoever moves the timer out of PENDING first decides:
                // us (the schedule is rejected, undone, its task dropped unrun) or the
                // shard's last sweep (the timer is among those `shutdown()` returns).
                if !shard.slots.cancel(index, generation) {
                    return Ok(handle);
                }
                shard
                    .counters
                    .scheduled
                    .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                if let Some(limit) = &shard.limit {
                    limit.give_back(1);
                }
                if drained {
                    shard.discard_late_messages();
                }
                Err(shard.closed_error())
            }
        }
    }

    /// Gives back `count` places of the `max_pending` limit, if there is one.
    pub(crate) fn give_back_places(&self, count: usize) {
        if let (Some(limit), true) = (&self.limit, count > 0) {
            limit.give_back(count);
        }
    }

    /// Hands a repeating timer back to the shard after a run, with its task and the deadline
    /// of its next run (`task: None`: it stopped). Called by whoever ran it.
    pub(crate) fn rearm(shard: &ShardShared, index: u32, deadline: u64, task: Option<Task>) {
        if let PushOutcome::Closed { drained: true } = shard.inbox.push(
            Message::Rearm {
                index,
                deadline,
                task,
            },
            deadline,
        ) {
            // The shard is gone: the discard below ends this timer (see there).
            shard.discard_late_messages();
        }
    }

    /// After shutdown's last drain: drops whatever late submitters left in the queue (all of
    /// it belongs to rejected schedules or to timers shutdown already settled). The tasks in
    /// them are dropped contained.
    pub(crate) fn discard_late_messages(&self) {
        while let Some(message) = self.inbox.pop() {
            // The shard will never apply these: end the repeating timers they hand back.
            if let Message::Rearm { index, .. } = message
                && self.slots.end_run_after_shutdown(index)
            {
                self.count_cancelled(1);
            }
            drop_contained(self, message);
        }
    }
}

impl Drop for ShardShared {
    /// Messages still queued (only when a failed shard's core could not be closed) hold tasks:
    /// user code, dropped contained.
    fn drop(&mut self) {
        while let Some(message) = self.inbox.pop() {
            drop_contained(self, message);
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

/// What the wheel works on: the owner's entries (links) and the slots (deadlines).
struct Store<'a> {
    entries: &'a mut Vec<Entry>,
    slots: &'a SlotTable,
}

impl LinkStore for Store<'_> {
    #[inline]
    fn prefetch(&self, index: u32) {
        #[cfg(target_arch = "x86_64")]
        if let Some(entry) = self.entries.get(index as usize) {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            let slot = self.slots.slot(index);
            // SAFETY: SSE is part of the x86_64 baseline, so the instruction exists; a
            // prefetch only hints the cache and never faults, and both addresses are live.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>((entry as *const Entry).cast::<i8>());
                _mm_prefetch::<_MM_HINT_T0>((slot as *const Slot).cast::<i8>());
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = index;
    }
    fn links(&self, index: u32) -> &Links {
        &self.entries[index as usize].links
    }
    fn links_mut(&mut self, index: u32) -> &mut Links {
        &mut self.entries[index as usize].links
    }
    fn deadline(&self, index: u32) -> u64 {
        self.slots.deadline(index)
    }
}

/// Owner-only state of a shard: touched by exactly one thread at a time (its worker thread, or
/// whoever drives it by hand), so no locks or atomics inside.
pub(crate) struct ShardOwner {
    pub(crate) shared: Arc<ShardShared>,
    wheel: RawWheel,
    entries: Entries,
    /// Entries holding a timer (its task, or the place of a repeating task out running).
    live: usize,
    /// The tick at which the entry table, empty since, is given back, or the slot table's
    /// release is tried (again) (see [`reclaim_idle_memory`](Self::reclaim_idle_memory));
    /// `u64::MAX`: not planned.
    release_at: u64,
    /// One more than the highest slot index a `Schedule` grew the entry table to since the
    /// slot table was last released (so the shard knows, without reading the shared table,
    /// whether a release is worth trying).
    slots_seen: u64,
    /// Ticks to wait after the next failed try to release the slot table (0: none failed yet).
    release_backoff: u64,
    /// The slot table's free-list head at the last failed try: while it has not changed, a
    /// new walk would fail the same way.
    release_failed_head: Option<u64>,
    fired: u64,
    reset: u64,
    lateness: LocalLateness,
}

/// One run of a repeating timer, handed to the executor.
pub(crate) struct RepeatingRun {
    pub(crate) index: u32,
    pub(crate) task: Task,
}

/// What one turn of a shard produced: tasks to run and tasks to drop, all handed off only
/// after the shard's state is no longer borrowed (user code never runs inside a turn).
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

impl ShardOwner {
    pub(crate) fn new(shared: Arc<ShardShared>, levels: usize) -> ShardOwner {
        ShardOwner {
            shared,
            wheel: RawWheel::new(levels),
            entries: Entries(Vec::new()),
            live: 0,
            release_at: u64::MAX,
            slots_seen: 0,
            release_backoff: 0,
            release_failed_head: None,
            fired: 0,
            reset: 0,
            lateness: LocalLateness::new(),
        }
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
                let slot = self.ensure_entry(index);
                let entry = &mut self.entries.0[slot];
                debug_assert!(
                    entry.task.is_none() && !entry.links.is_linked(),
                    "slot {index} scheduled while occupied"
                );
                entry.task = Some(task);
                self.live += 1;
                let mut store = Store {
                    entries: &mut self.entries.0,
                    slots: &self.shared.slots,
                };
                self.wheel.insert(&mut store, index, deadline);
            }
            Message::Cancel { index, generation } => {
                // Checked against the slot as it is now: a repeating timer cancelled during a
                // run may have been ended by its `Rearm` already, and the entry table given
                // back since (see "Who counts a timer's end" in `slot.rs`).
                if !self.shared.slots.cancel_pending_release(index, generation) {
                    return;
                }
                let has_task = self
                    .entries
                    .0
                    .get(index as usize)
                    .is_some_and(|entry| entry.task.is_some());
                debug_assert!(has_task, "cancelled slot {index} held without its task");
                if !has_task {
                    return;
                }
                let mut store = Store {
                    entries: &mut self.entries.0,
                    slots: &self.shared.slots,
                };
                self.wheel.remove(&mut store, index);
                if let Some(task) = self.entries.0[index as usize].task.take() {
                    self.live -= 1;
                    handoff.dropped.push(task);
                    self.shared.slots.release_by_shard(index);
                }
            }
            Message::Relocate { index, generation } => {
                let slots = &self.shared.slots;
                let linked = self
                    .entries
                    .0
                    .get(index as usize)
                    .is_some_and(|entry| entry.links.is_linked());
                if linked && slots.is_pending(index, generation) {
                    let deadline = slots.deadline(index);
                    let mut store = Store {
                        entries: &mut self.entries.0,
                        slots: &self.shared.slots,
                    };
                    self.wheel.remove(&mut store, index);
                    self.wheel.insert(&mut store, index, deadline);
                }
            }
            Message::Reset {
                index,
                generation,
                deadline,
            } => {
                if self.shared.slots.reset_applied(index, generation) == Some(true) {
                    self.reset += 1;
                    self.shared.slots.set_deadline(index, deadline);
                    // Pending and held by the shard: its entry exists (`live` counts it).
                    let slot = self.ensure_entry(index);
                    let entry = &mut self.entries.0[slot];
                    if let Some(task) = &mut entry.task {
                        task.reanchor(self.shared.clock.nanos_of_tick(deadline));
                    }
                    if entry.task.is_none() {
                        // A repeating timer out running: re-armed at this deadline instead.
                        entry.links.set_deferred();
                    } else {
                        let mut store = Store {
                            entries: &mut self.entries.0,
                            slots: &self.shared.slots,
                        };
                        self.wheel.remove(&mut store, index);
                        self.wheel.insert(&mut store, index, deadline);
                    }
                }
            }
            Message::Rearm {
                index,
                deadline,
                mut task,
            } => {
                // The slot decides, in one transition, whether the run ends and who counts
                // the end (see "Who counts a timer's end" in `slot.rs`).
                let end = self.shared.slots.finish_run(index, task.is_some());
                if end == RunEnd::Stale {
                    handoff.dropped.extend(task);
                    return;
                }
                let slot = self.ensure_entry(index);
                let entry = &mut self.entries.0[slot];
                let deferred = entry.links.take_deferred();
                match end {
                    RunEnd::Again => {
                        let deadline = if deferred {
                            let reset_to = self.shared.slots.deadline(index);
                            if let Some(task) = &mut task {
                                task.reanchor(self.shared.clock.nanos_of_tick(reset_to));
                            }
                            reset_to
                        } else {
                            deadline
                        };
                        entry.task = task;
                        self.shared.slots.set_deadline(index, deadline);
                        let mut store = Store {
                            entries: &mut self.entries.0,
                            slots: &self.shared.slots,
                        };
                        self.wheel.insert(&mut store, index, deadline);
                    }
                    RunEnd::Stopped | RunEnd::WasCancelled | RunEnd::Stale => {
                        // Stopped (its task said so, or it panicked): this transition ended
                        // it, so the shard counts it. Cancelled during the run: its canceller
                        // counted it.
                        self.live -= 1;
                        if end == RunEnd::Stopped {
                            self.fired += 1;
                            self.shared.give_back_places(1);
                        }
                        handoff.dropped.extend(task);
                    }
                }
            }
        }
    }

    /// Grows the entry table to hold slot `index` (it may have been given back while the
    /// shard was idle); returns the index into it.
    fn ensure_entry(&mut self, index: u32) -> usize {
        let slot = index as usize;
        if slot >= self.entries.0.len() {
            self.entries.0.resize_with(slot + 1, || VACANT);
            self.slots_seen = self.slots_seen.max(slot as u64 + 1);
        }
        slot
    }

    /// Advances the wheel to `now_tick` and collects the tasks of timers that fired. Every
    /// `spill_every` one-shot pool tasks, hands them to `spill` at once, so that the executor
    /// starts on them while the shard collects the rest (`usize::MAX`: never).
    pub(crate) fn expire(
        &mut self,
        now_tick: u64,
        handoff: &mut Handoff,
        spill_every: usize,
        mut spill: impl FnMut(Vec<Task>),
    ) -> usize {
        let shared = &*self.shared;
        let now_nanos = shared.clock.now_nanos();
        let lateness = &mut self.lateness;
        let mut fired = 0u64;
        let mut released = 0u64;
        let mut store = Store {
            entries: &mut self.entries.0,
            slots: &shared.slots,
        };
        self.wheel
            .expire_to(&mut store, now_tick, |store, index, due| {
                let entry = &mut store.entries[index as usize];
                let repeating = entry.task.as_ref().is_some_and(Task::is_repeating);
                match shared.slots.fire(index, due, repeating) {
                    FireOutcome::Fire { free } => {
                        let task = entry.task.take().expect("a stored timer has a task");
                        lateness.record(now_nanos.saturating_sub(shared.clock.nanos_of_tick(due)));
                        if task.runs_inline() {
                            handoff.inline.push(task);
                        } else {
                            handoff.expired.push(task);
                        }
                        fired += 1;
                        if free {
                            shared.slots.free_fired(index);
                        }
                        if handoff.expired.len() >= spill_every {
                            shared.give_back_places((fired - released) as usize);
                            released = fired;
                            spill(std::mem::take(&mut handoff.expired));
                        }
                        None
                    }
                    FireOutcome::Run => {
                        let task = entry.task.take().expect("a stored timer has a task");
                        lateness.record(now_nanos.saturating_sub(shared.clock.nanos_of_tick(due)));
                        handoff.repeating.push(RepeatingRun { index, task });
                        None
                    }
                    // Reset meanwhile: store it again at its new deadline.
                    FireOutcome::Later(tick) => Some(tick),
                    // The entry stays out of the wheel, task kept: the pending reset message
                    // re-inserts it, the pending cancel message drops it.
                    FireOutcome::ResetInFlight | FireOutcome::Cancelled => None,
                }
            });
        self.fired += fired;
        self.live -= fired as usize;
        self.shared.give_back_places((fired - released) as usize);
        fired as usize
    }

    /// Moves a bounded slice of the next window's timers down the wheel ahead of time (after
    /// the expired tasks were handed off, so they do not wait for it).
    pub(crate) fn cascade_ahead(&mut self) {
        let mut store = Store {
            entries: &mut self.entries.0,
            slots: &self.shared.slots,
        };
        self.wheel.cascade_ahead(&mut store);
    }

    /// Gives the entry table's and the slot table's memory back once no timer has been left in
    /// them for [`RECLAIM_DELAY`] (after a mass cancel, or the end of a storm): every entry is
    /// vacant then, and a later schedule grows it again. The delay keeps the unmapping
    /// (milliseconds for a large table) off the moment the last timers fire, when their tasks
    /// are still running.
    ///
    /// The slot table can be released only once every slot is free, that is once every handle
    /// of its timers is gone ([`SlotTable::try_release`]). While some are held, the shard tries
    /// again after 20 ms, 40 ms, ... up to [`RECLAIM_RETRY_MAX`], walking the free list again
    /// only if it changed; once it has not changed for a whole longest wait, the shard stops
    /// (an idle engine must not wake forever), until a later turn finds it changed.
    pub(crate) fn reclaim_idle_memory(&mut self, now_tick: u64) {
        /// An entry table this small is kept. No larger than `RELEASE_ABOVE`: `slots_seen`
        /// grows only when a `Schedule` grows the entry table, so after a release, a table
        /// that kept up to `KEEP` entries must still see every index above `RELEASE_ABOVE`.
        /// Under loom none, so that a model sees the table given back (as `KEPT_PAGES` in
        /// `slot.rs`).
        const KEEP: usize = if cfg!(loom) { 0 } else { 4096 };
        const { assert!(KEEP as u64 <= RELEASE_ABOVE) };
        if self.live != 0 {
            self.release_at = u64::MAX;
            self.release_backoff = 0;
            self.release_failed_head = None;
            return;
        }
        let entries_held = self.entries.0.capacity() > KEEP;
        let slots_held = self.slots_seen > RELEASE_ABOVE;
        if !entries_held && !slots_held {
            self.release_at = u64::MAX;
            return;
        }
        debug_assert!(
            self.wheel.len() == 0,
            "wheel holds entries while none is live"
        );
        let slots = &self.shared.slots;
        if self.release_at == u64::MAX {
            if !entries_held && self.release_failed_head == Some(slots.free_head()) {
                // Gave up on the slot table, and nothing was freed since.
                return;
            }
            let delay = self.shared.clock.ticks_in(RECLAIM_DELAY).max(1);
            self.release_at = now_tick.saturating_add(delay);
            return;
        }
        if now_tick < self.release_at {
            return;
        }
        if entries_held {
            self.entries.0 = Vec::new();
            self.wheel.release_memory();
        }
        self.release_at = u64::MAX;
        if !slots_held {
            return;
        }
        // How long the walk took, when there was one (it is O(slots), a cache miss a slot).
        let mut walk_nanos = 0;
        let outcome = match self.release_failed_head {
            Some(head) if head == slots.free_head() => Release::Busy { head },
            _ => {
                let started = self.shared.clock.now_nanos();
                let outcome = slots.try_release();
                walk_nanos = self.shared.clock.now_nanos().saturating_sub(started);
                outcome
            }
        };
        match outcome {
            Release::Released | Release::Nothing => {
                self.slots_seen = 0;
                self.release_backoff = 0;
                self.release_failed_head = None;
            }
            Release::Busy { head } => {
                let unchanged = self.release_failed_head == Some(head);
                self.release_failed_head = Some(head);
                let longest = self.shared.clock.ticks_in(RECLAIM_RETRY_MAX).max(1);
                if unchanged && self.release_backoff >= longest {
                    return; // Give up until a later turn finds the list changed.
                }
                let first = self.shared.clock.ticks_in(RECLAIM_DELAY).max(1);
                // At least 20 times the walk's own time: an application that keeps many
                // handles and drops them slowly costs the idle shard at most 5% of a core.
                let walk_bound = self
                    .shared
                    .clock
                    .ticks_in(Duration::from_nanos(walk_nanos.saturating_mul(20)));
                self.release_backoff = (self.release_backoff * 2)
                    .clamp(first, longest)
                    .max(walk_bound);
                self.release_at = now_tick.saturating_add(self.release_backoff);
            }
        }
    }

    /// The tick of the shard's next work: the wheel's, or giving idle memory back.
    pub(crate) fn next_work(&self) -> Option<u64> {
        match self.wheel.next_work() {
            Some(tick) => Some(tick.min(self.release_at)),
            None => (self.release_at != u64::MAX).then_some(self.release_at),
        }
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
    /// returns their tasks. Tasks of timers cancelled meanwhile are dropped. The engine's own
    /// `Sleep` wake-ups are not returned but run, so awaiting tasks see the shutdown.
    pub(crate) fn close(mut self) -> Vec<UnfiredTimer> {
        debug_assert!(
            self.shared.inbox.is_closed(),
            "closing a shard whose inbox is open"
        );
        let mut handoff = Handoff::default();
        while self.drain_inbox(&mut handoff) > 0 {}
        self.shared.inbox.mark_drained();
        while self.drain_inbox(&mut handoff) > 0 {}
        // The count no longer matters: nothing parks on this inbox again.
        let shared = self.shared.clone();
        let mut unfired = Vec::new();
        for (index, entry) in self.entries.0.iter_mut().enumerate() {
            let Some(task) = entry.task.take() else {
                continue;
            };
            let index = index as u32;
            let deadline = shared.slots.deadline(index);
            if shared.slots.cancel_for_shutdown(index) {
                shared.count_cancelled(1);
                if task.runs_inline() {
                    // The engine's own wake-up of a `Sleep`: wake it (after the sweep), so an
                    // awaiting task learns of the shutdown instead of hanging.
                    handoff.inline.push(task);
                } else {
                    let deadline = shared.clock.instant_of_tick(deadline);
                    unfired.push(UnfiredTimer { task, deadline });
                }
            } else {
                handoff.dropped.push(task);
            }
            *entry = VACANT;
            shared.slots.release_by_shard(index);
        }
        self.wheel = RawWheel::new(1);
        self.flush_counters();
        for wake in handoff.inline.drain(..) {
            super::executor::run_task(wake, &shared);
        }
        for task in handoff.dropped.drain(..) {
            drop_contained(&shared, task);
        }
        unfired
    }
}

impl Drop for ShardOwner {
    /// Tasks still stored (only when a failed shard's core goes without `close`, or a test
    /// drops a core) are user code: dropped contained, after the entry table left the core.
    fn drop(&mut self) {
        let entries = std::mem::take(&mut self.entries.0);
        for task in entries.into_iter().filter_map(|entry| entry.task) {
            drop_contained(&self.shared, task);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Clock;
    use std::time::Duration;

    /// A shard driven by hand (ticks of 1 ms), holding `count` cancelled timers whose handles
    /// are all dropped but the last, which is returned.
    fn idle_shard_holding_one_handle(count: usize) -> (ShardOwner, TimerHandle) {
        let clock = TickClock::new(Clock::manual(), Duration::from_millis(1));
        let shared = Arc::new(ShardShared::new(clock, None));
        let mut core = ShardOwner::new(shared.clone(), 2);
        let mut handoff = Handoff::default();
        let mut handles: Vec<TimerHandle> = (0..count)
            .map(|_| ShardShared::submit(&shared, 1_000_000, Task::new(|| {})).unwrap())
            .collect();
        while core.drain_inbox(&mut handoff) > 0 {}
        for handle in &handles {
            assert!(handle.cancel());
        }
        while core.drain_inbox(&mut handoff) > 0 {}
        assert_eq!(core.live, 0);
        let held = handles.pop().unwrap();
        drop(handles);
        (core, held)
    }

    /// Runs the shard's housekeeping at each tick it asks to be woken at, from `now`, until it
    /// asks for nothing; returns the wake-ups and the tick it stopped at.
    fn run_housekeeping(core: &mut ShardOwner, mut now: u64) -> (usize, u64) {
        let mut wakes = 0;
        while let Some(tick) = core.next_work() {
            assert!(tick > now, "housekeeping due at {tick}, now {now}");
            now = tick;
            core.reclaim_idle_memory(now);
            wakes += 1;
            assert!(wakes < 100, "housekeeping never stops");
        }
        (wakes, now)
    }

    #[test]
    fn idle_shard_retries_then_stops_and_resumes_when_a_handle_drops() {
        let (mut core, held) = idle_shard_holding_one_handle(RELEASE_ABOVE as usize + 10);
        core.reclaim_idle_memory(0);
        assert_eq!(
            core.next_work(),
            Some(20),
            "first try after the release delay"
        );
        let (wakes, stopped) = run_housekeeping(&mut core, 0);
        // A try at 20 ms, then after waits of 20, 40, ... 640 ms, and 1000 ms, which saw no
        // change over a whole longest wait: it stops there (7 of the 8 walks were skipped).
        assert_eq!(
            (wakes, stopped),
            (8, 20 + 20 + 40 + 80 + 160 + 320 + 640 + 1000)
        );
        assert!(
            core.entries.0.capacity() == 0,
            "the entry table went at the first try"
        );
        assert_eq!(
            core.shared.slots.try_release(),
            Release::Busy {
                head: core.shared.slots.free_head()
            }
        );
        // A later turn with nothing changed plans nothing.
        core.reclaim_idle_memory(stopped + 5000);
        assert_eq!(core.next_work(), None);
        // The last handle goes: the next turn plans a try, which releases.
        drop(held);
        core.reclaim_idle_memory(stopped + 6000);
        assert_eq!(core.next_work(), Some(stopped + 6020));
        let (wakes, _) = run_housekeeping(&mut core, stopped + 6000);
        assert_eq!(wakes, 1);
        assert_eq!(core.slots_seen, 0);
        assert_eq!(
            core.shared.slots.allocate(),
            Some((0, 2)),
            "fresh slots start over"
        );
    }

    #[test]
    fn idle_shard_releases_everything_in_one_turn() {
        let (mut core, held) = idle_shard_holding_one_handle(RELEASE_ABOVE as usize + 10);
        drop(held);
        core.reclaim_idle_memory(0);
        let (wakes, _) = run_housekeeping(&mut core, 0);
        assert_eq!(wakes, 1);
        assert_eq!(core.entries.0.capacity(), 0);
        assert_eq!(core.slots_seen, 0);
        assert_eq!(core.shared.slots.try_release(), Release::Nothing);
        // Idle with nothing left to give back: no wake-up is planned.
        core.reclaim_idle_memory(1000);
        assert_eq!(core.next_work(), None);
    }

    #[test]
    fn small_idle_shard_plans_nothing() {
        let (mut core, held) = idle_shard_holding_one_handle(100);
        drop(held);
        core.reclaim_idle_memory(0);
        assert_eq!(core.next_work(), None);
    }
}
