//! A shard's owner ([`ShardOwner`]): the state only one thread touches at a time (its worker
//! thread, or whoever drives it by hand): the raw wheel, the entries holding each timer's task,
//! local counters. It applies messages, expires timers and closes the shard at shutdown; one
//! [`turn`](ShardOwner::turn) strings the steps together for both drivers.

use super::executor::{Dispatch, drop_contained};
use super::handoff::{self, Handoff, RepeatingRun, UnfiredTimer};
use super::message::Message;
use super::reclaim::{IdleReclaim, KEPT_ENTRIES};
use super::shared::ShardShared;
use super::slot::{Adoption, FireOutcome, Freed, RunEnd, Slot, SlotTable};
use super::stage::{Meta, StageList};
use crate::stats::LocalLateness;
use crate::sync::Arc;
use crate::task::Task;
use crate::wheel::raw::{LinkStore, Links, RawWheel};
use compaction::Compaction;
use entries::Entries;

mod compaction;
mod entries;

/// Messages drained per turn before the shard looks at the wheel again, so a flood of
/// submissions cannot delay expiry.
pub(crate) const DRAIN_BATCH: usize = 16 * 1024;

/// What the wheel works on: the owner's entries (links, and tasks for expiry) and the slots
/// (deadlines).
struct Store<'a> {
    entries: &'a mut Entries,
    slots: &'a SlotTable,
}

impl<'a> Store<'a> {
    fn new(entries: &'a mut Entries, slots: &'a SlotTable) -> Store<'a> {
        Store { entries, slots }
    }
}

impl LinkStore for Store<'_> {
    #[inline]
    fn prefetch(&self, index: u32) {
        if self.entries.holds(index) {
            self.entries.prefetch(index);
            crate::prefetch::for_read::<Slot>(self.slots.slot(index));
        }
    }
    fn links(&self, index: u32) -> &Links {
        self.entries.links(index)
    }
    fn links_mut(&mut self, index: u32) -> &mut Links {
        self.entries.links_mut(index)
    }
    fn deadline(&self, index: u32) -> u64 {
        self.slots.deadline(index)
    }
}

/// Where a shard's owner is kept while it turns, and how it is let go of while user code
/// runs: by its worker thread (`worker.rs`) or by the manual clock's driver (`Engine::drive`).
pub(crate) trait OwnerHold {
    /// The owner, unless shutdown took it.
    fn owner(&mut self) -> Option<&mut ShardOwner>;
    /// Hands out `handoff` (user code runs) with the owner let go of, so that user code may shut
    /// the engine down and close it; takes it back afterwards if it is still there.
    fn hand_off(&mut self, handoff: &mut Handoff);
}

/// What one [`ShardOwner::turn`] did.
pub(crate) struct Turn {
    /// Messages applied or staged timers taken, whichever were more (each at most
    /// [`DRAIN_BATCH`]).
    pub(crate) drained: usize,
    /// Whether any task was handed out to run.
    pub(crate) ran: bool,
    /// The clock's tick at the end of the turn.
    pub(crate) now: u64,
    /// A compaction is under way: turn again soon (see [`ShardOwner::compact_if_sparse`]).
    pub(crate) compacting: bool,
}

/// Owner-only state of a shard: touched by exactly one thread at a time (its worker thread, or
/// whoever drives it by hand), so no locks or atomics inside.
pub(crate) struct ShardOwner {
    pub(crate) shared: Arc<ShardShared>,
    wheel: RawWheel,
    entries: Entries,
    /// Entries holding a timer (its task, or the place of a repeating task out running).
    live: usize,
    /// When to give idle memory back.
    reclaim: IdleReclaim,
    /// Compacting the tables of a shard that holds few timers in many slots.
    compaction: Compaction,
    /// The shard's stages, as far as the owner has seen them register.
    stages: StageList,
    /// Slots the drain's cancels freed, pushed onto the free list at its end (empty between
    /// drains).
    freed: Freed,
    fired: u64,
    reset: u64,
    lateness: LocalLateness,
}

impl ShardOwner {
    pub(crate) fn new(shared: Arc<ShardShared>, levels: usize) -> ShardOwner {
        ShardOwner {
            shared,
            wheel: RawWheel::new(levels),
            entries: Entries::default(),
            live: 0,
            reclaim: IdleReclaim::new(),
            compaction: Compaction::default(),
            stages: StageList::default(),
            freed: Freed::default(),
            fired: 0,
            reset: 0,
            lateness: LocalLateness::new(),
        }
    }

    /// Applies up to [`DRAIN_BATCH`] messages; returns how many there were.
    pub(crate) fn drain_inbox(&mut self, handoff: &mut Handoff) -> usize {
        self.drain_inbox_through(handoff, 0)
    }

    /// [`drain_inbox`](Self::drain_inbox), waiting for messages at queue positions below
    /// `delivered` that their submitters are still writing (see [`close`](Self::close)).
    pub(crate) fn drain_inbox_through(&mut self, handoff: &mut Handoff, delivered: u64) -> usize {
        let shared = self.shared.clone();
        let mut messages = shared.inbox.messages();
        let mut drained = 0;
        while drained < DRAIN_BATCH {
            let Some(message) = messages.pop_through(delivered) else {
                break;
            };
            drained += 1;
            self.apply(message, handoff);
        }
        drop(messages);
        shared.slots.push_freed(&mut self.freed);
        drained
    }

    /// Adopts up to [`DRAIN_BATCH`] staged timers (see [`stage`](super::stage)); returns how
    /// many there were. `wait`: wait for a stage whose consumer role is held elsewhere, rather
    /// than leave it to its holder.
    pub(crate) fn drain_stages(&mut self, handoff: &mut Handoff, wait: bool) -> usize {
        let shared = self.shared.clone();
        let mut stages = std::mem::take(&mut self.stages);
        let drained = stages.drain(
            &shared.stages,
            &shared.slots,
            DRAIN_BATCH,
            wait,
            |meta, adoption, task| match adoption {
                Adoption::Pending => self.adopt(meta, task),
                _ => handoff.discard(task),
            },
        );
        self.stages = stages;
        drained
    }

    /// Whether a staged timer is due before tick `tick` (asked before the worker sleeps).
    pub(crate) fn staged_due_before(&mut self, tick: u64) -> bool {
        let shared = self.shared.clone();
        self.stages.due_before(&shared.stages, &shared.slots, tick)
    }

    /// Stores a timer just adopted from a stage (see [`stage`](super::stage)).
    fn adopt(&mut self, meta: Meta, task: Task) {
        let index = meta.index;
        self.ensure_entry(index);
        debug_assert!(
            self.entries.is_vacant(index),
            "slot {index} adopted while occupied"
        );
        *self.entries.task(index) = Some(task);
        self.live += 1;
        // Read after the adoption: a handle may have moved it since the cell was written
        // (earlier: its `Relocate` finds the entry linked, or was applied before and ignored;
        // either way this read sees the new deadline).
        let deadline = self.shared.slots.deadline(index);
        let mut store = Store::new(&mut self.entries, &self.shared.slots);
        self.wheel.insert(&mut store, index, deadline);
    }

    fn apply(&mut self, message: Message, handoff: &mut Handoff) {
        match message {
            Message::Schedule {
                index,
                deadline,
                task,
            } => {
                // A compaction may have moved it before its shard saw it.
                let index = self.current(index);
                self.ensure_entry(index);
                debug_assert!(
                    self.entries.is_vacant(index),
                    "slot {index} scheduled while occupied"
                );
                *self.entries.task(index) = Some(task);
                self.live += 1;
                let mut store = Store::new(&mut self.entries, &self.shared.slots);
                self.wheel.insert(&mut store, index, deadline);
            }
            Message::Cancel { index, generation } => {
                let index = self.current(index);
                // Checked against the slot as it is now: a repeating timer cancelled during a
                // run may have been ended by its `Rearm` already, and the entry table given
                // back since (see "Who counts a timer's end" in `engine/slot/mod.rs`).
                if !self.shared.slots.cancel_awaits_let_go(index, generation) {
                    return;
                }
                let has_task = self.entries.has_task(index);
                debug_assert!(has_task, "cancelled slot {index} held without its task");
                if !has_task {
                    return;
                }
                let mut store = Store::new(&mut self.entries, &self.shared.slots);
                self.wheel.remove(&mut store, index);
                if let Some(task) = self.entries.task(index).take() {
                    self.live -= 1;
                    handoff.discard(task);
                    let compacting = self.compaction.is_on();
                    self.shared
                        .slots
                        .let_go_into(index, &mut self.freed, compacting);
                }
            }
            Message::Relocate {
                index, generation, ..
            } => {
                let index = self.current(index);
                let slots = &self.shared.slots;
                if self.entries.is_linked(index) && slots.is_pending(index, generation) {
                    let deadline = slots.deadline(index);
                    let mut store = Store::new(&mut self.entries, &self.shared.slots);
                    self.wheel.remove(&mut store, index);
                    self.wheel.insert(&mut store, index, deadline);
                }
            }
            Message::Reset {
                index,
                generation,
                deadline,
            } => {
                let index = self.current(index);
                if self.shared.slots.reset_applied(index, generation) == Some(true) {
                    self.reset += 1;
                    self.shared.slots.set_deadline(index, deadline);
                    // Pending and held by the shard: its entry exists (`live` counts it).
                    self.ensure_entry(index);
                    if let Some(task) = self.entries.task(index) {
                        task.reanchor(self.shared.clock.nanos_of_tick(deadline));
                    }
                    if self.entries.task(index).is_none() {
                        // A repeating timer out running: re-armed at this deadline instead.
                        self.entries.links_mut(index).set_deferred();
                    } else {
                        let mut store = Store::new(&mut self.entries, &self.shared.slots);
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
                let index = self.current(index);
                // The slot decides, in one transition, whether the run ends and who counts
                // the end (see "Who counts a timer's end" in `engine/slot/mod.rs`).
                let end = self.shared.slots.finish_run(index, task.is_some());
                if end == RunEnd::Stale {
                    if let Some(task) = task {
                        handoff.discard(task);
                    }
                    return;
                }
                self.ensure_entry(index);
                let deferred = self.entries.links_mut(index).take_deferred();
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
                        *self.entries.task(index) = task;
                        self.shared.slots.set_deadline(index, deadline);
                        let mut store = Store::new(&mut self.entries, &self.shared.slots);
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
                        if let Some(task) = task {
                            handoff.discard(task);
                        }
                    }
                }
            }
        }
    }

    /// Grows the entry table to hold slot `index` (it may have been given back while the
    /// shard was idle).
    fn ensure_entry(&mut self, index: u32) {
        if !self.entries.holds(index) {
            self.entries.grow_to_hold(index);
            self.reclaim.saw_entries(index as u64 + 1);
        }
    }

    /// The slot that holds the timer a message names as slot `index` (see
    /// [`SlotTable::current`]): the same unless a compaction retired it.
    #[inline]
    fn current(&self, index: u32) -> u32 {
        if index < self.compaction.retired_below() {
            self.shared.slots.current(index)
        } else {
            index
        }
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
        let mut given_back = 0u64;
        let mut store = Store::new(&mut self.entries, &shared.slots);
        self.wheel
            .expire_to(&mut store, now_tick, |store, index, due| {
                let task = store.entries.task(index);
                let repeating = task.as_ref().is_some_and(Task::is_repeating);
                match shared.slots.fire(index, due, repeating) {
                    FireOutcome::Fire { free } => {
                        let task = task.take().expect("a stored timer has a task");
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
                            shared.give_back_places((fired - given_back) as usize);
                            given_back = fired;
                            spill(std::mem::take(&mut handoff.expired));
                        }
                        None
                    }
                    FireOutcome::Run => {
                        let task = task.take().expect("a stored timer has a task");
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
        self.shared.give_back_places((fired - given_back) as usize);
        fired as usize
    }

    /// Moves a bounded slice of the next window's timers down the wheel ahead of time (after
    /// the expired tasks were handed off, so they do not wait for it).
    pub(crate) fn cascade_ahead(&mut self) {
        let mut store = Store::new(&mut self.entries, &self.shared.slots);
        self.wheel.cascade_ahead(&mut store);
    }

    /// Gives idle memory back, when due (see [`reclaim`](super::reclaim)).
    pub(crate) fn reclaim_idle_memory(&mut self, now_tick: u64) {
        if self.compaction.is_under_way() {
            return;
        }
        let entries = &mut self.entries;
        let wheel = &mut self.wheel;
        let stages = &mut self.stages;
        let shared = &*self.shared;
        let entries_held = entries.capacity() > KEPT_ENTRIES;
        self.reclaim.step(
            now_tick,
            self.live,
            &shared.slots,
            &shared.clock,
            entries_held.then_some(|| {
                debug_assert!(wheel.len() == 0, "wheel holds entries while none is live");
                *entries = Entries::from(shared.slots.retired_below());
                wheel.reclaim_memory();
            }),
            || stages.flush_spares(&shared.stages, &shared.slots),
        );
        if self.compaction.retired_below() != 0 && shared.slots.retired_below() == 0 {
            // The slot table was reclaimed, its retirement with it: slots start from 0 again.
            debug_assert!(self.live == 0, "slot table reclaimed while timers are held");
            self.entries = Entries::default();
            self.compaction = Compaction::default();
        }
    }

    /// The tick of the shard's next work: the wheel's, or giving idle memory back.
    pub(crate) fn next_work(&self) -> Option<u64> {
        let memory = self.reclaim.at().min(self.compaction.at());
        match self.wheel.next_work() {
            Some(tick) => Some(tick.min(memory)),
            None => (memory != u64::MAX).then_some(memory),
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

    /// One turn of the shard, the same for its worker thread and for the manual clock's
    /// driver (`Engine::drive`), in this order:
    ///
    /// | step | why there |
    /// |------|-----------|
    /// | drain up to [`DRAIN_BATCH`] messages, then adopt up to as many staged timers | timers scheduled before now fire in this turn |
    /// | expire to the clock's tick | every `spill_every` one-shot tasks go to the pool at once (`spill`) |
    /// | flush counters | `Stats` include the turn before its tasks run |
    /// | hand off, with the owner let go of (`hold`) | user code runs: it may shut down and take the owner |
    /// | cascade ahead | after the hand-off, so that expired tasks never wait for it |
    /// | reclaim idle memory, at the tick read again | it may plan the next wake-up |
    /// | a piece of a compaction, if one is due or under way | last: bounded, and the next turn comes at once while one is under way |
    ///
    /// The worker spills (`spill: true`); the manual clock does not. `handoff` is empty again
    /// after a turn (unless a panic cut it short). Returns `None` when `hold` has no owner (any
    /// more): shutdown took it.
    pub(crate) fn turn(
        hold: &mut impl OwnerHold,
        handoff: &mut Handoff,
        dispatch: &Dispatch,
        spill: bool,
    ) -> Option<Turn> {
        let owner = hold.owner()?;
        let shared = owner.shared.clone();
        let clock = &shared.clock;
        let messages = owner.drain_inbox(handoff);
        let drained = messages.max(owner.drain_stages(handoff, false));
        let spill_every = if spill {
            dispatch.spill_every()
        } else {
            usize::MAX
        };
        owner.expire(clock.now_tick(), handoff, spill_every, |tasks| {
            handoff::spill(dispatch, tasks, &shared)
        });
        owner.flush_counters();
        let ran = handoff.ran_anything();
        if !handoff.is_empty() {
            hold.hand_off(handoff);
        }
        let owner = hold.owner()?;
        owner.cascade_ahead();
        let now = clock.now_tick();
        owner.reclaim_idle_memory(now);
        let compacting = owner.compact_if_sparse(now);
        Some(Turn {
            drained,
            ran,
            now,
            compacting,
        })
    }

    /// After this shard's thread failed: cancels the timers of the engine's own `Sleep`
    /// wake-ups and hands their tasks to `handoff.inline`, so that every awaiting task is woken
    /// and learns of the failure (`ScheduleError::ShardFailed`) instead of hanging until a
    /// `shutdown` that may never come. Other timers stay for `shutdown` to return. Touches only
    /// the entries' tasks and the slots (the wheel may be mid-change).
    #[cfg_attr(shardwheel_loom, allow(dead_code))] // Under loom the worker lets a panic through.
    pub(crate) fn wake_sleeps_after_failure(&mut self, handoff: &mut Handoff) {
        let shared = self.shared.clone();
        shared.note_sweep();
        for (index, task, _) in self.entries.iter_mut() {
            if !task.as_ref().is_some_and(Task::runs_inline) {
                continue;
            }
            if shared.slots.cancel_for_shutdown(index) {
                shared.count_cancelled(1);
                handoff.inline.extend(task.take());
                self.live -= 1;
                shared.slots.let_go(index);
            }
        }
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
        // Every message whose push found the inbox open was delivered and must be applied
        // here. Such a push took its queue position before the close, which this thread has
        // seen, so `delivered` counts it; the drain waits for positions below it that are
        // still being written. (Stopping at such a position, as a running shard's drain may,
        // would leave the delivered messages behind it to a late submitter, who discards
        // what it finds after DRAINED: timers lost.)
        let delivered = self.shared.inbox.positions_taken();
        while self.drain_inbox_through(&mut handoff, delivered)
            + self.drain_stages(&mut handoff, true)
            > 0
        {}
        self.shared.inbox.mark_drained();
        // Stages whose producer saw DRAINED are that producer's to drain (see `stage`).
        while self.drain_inbox(&mut handoff) + self.drain_stages(&mut handoff, false) > 0 {}
        // The count no longer matters: nothing parks on this inbox again.
        let shared = self.shared.clone();
        // A compaction under way ends first (its survey given up or its moves done), so that
        // the sweep finds every entry where its slot's word says.
        while self.compaction.is_under_way() {
            self.compact_if_sparse(u64::MAX);
        }
        shared.note_sweep();
        let mut unfired = Vec::new();
        let entries = &mut self.entries;
        for (index, task, links) in entries.iter_mut() {
            let Some(task) = task.take() else {
                continue;
            };
            let deadline = shared.slots.deadline(index);
            if shared.slots.cancel_for_shutdown(index) {
                shared.count_cancelled(1);
                if task.runs_inline() {
                    // The engine's own wake-up of a `Sleep`: wake it (after the sweep), so an
                    // awaiting task learns of the shutdown instead of hanging.
                    handoff.inline.push(task);
                } else {
                    let deadline = shared.clock.instant_of_tick(deadline);
                    unfired.push(UnfiredTimer::new(task, deadline));
                }
            } else {
                handoff.discard(task);
            }
            *links = Links::UNLINKED;
            shared.slots.let_go(index);
        }
        self.wheel = RawWheel::new(1);
        self.flush_counters();
        // The wake-ups, and the tasks of timers cancelled meanwhile.
        handoff::run_here(&mut handoff, &shared);
        unfired
    }
}

impl Drop for ShardOwner {
    /// Tasks still stored (only when a failed shard's owner goes without `close`, or a test
    /// drops an owner) are user code: dropped contained, after the entry table left the owner.
    fn drop(&mut self) {
        let mut entries = std::mem::take(&mut self.entries);
        for (_, task, _) in entries.iter_mut() {
            if let Some(task) = task.take() {
                drop_contained(&self.shared.counters, task);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TimerState;
    use crate::clock::Clock;
    use crate::clock::TickClock;
    use crate::engine::handle::TimerHandle;
    use crate::engine::slot::{COMPACT_ABOVE, RECLAIM_ABOVE, Reclaim};
    use std::time::Duration;

    /// A shard driven by hand (ticks of 1 ms), holding `count` cancelled timers whose handles
    /// are all dropped but the last, which is returned.
    fn idle_shard_holding_one_handle(count: usize) -> (ShardOwner, TimerHandle) {
        let clock = TickClock::new(Clock::manual(), Duration::from_millis(1));
        let shared = Arc::new(ShardShared::new(clock, None));
        let mut owner = ShardOwner::new(shared.clone(), 2);
        let mut handoff = Handoff::default();
        let mut handles: Vec<TimerHandle> = (0..count)
            .map(|_| TimerHandle::submit(&shared, 1_000_000, Task::new(|| {})).unwrap())
            .collect();
        while owner.drain_inbox(&mut handoff) + owner.drain_stages(&mut handoff, true) > 0 {}
        for handle in &handles {
            assert!(handle.cancel());
        }
        while owner.drain_inbox(&mut handoff) + owner.drain_stages(&mut handoff, true) > 0 {}
        assert_eq!(owner.live, 0);
        let held = handles.pop().unwrap();
        drop(handles);
        (owner, held)
    }

    /// Runs the shard's housekeeping at each tick it asks to be woken at, from `now`, until it
    /// asks for nothing; returns the wake-ups and the tick it stopped at.
    fn run_housekeeping(owner: &mut ShardOwner, mut now: u64) -> (usize, u64) {
        let mut wakes = 0;
        while let Some(tick) = owner.next_work() {
            assert!(tick > now, "housekeeping due at {tick}, now {now}");
            now = tick;
            owner.reclaim_idle_memory(now);
            wakes += 1;
            assert!(wakes < 100, "housekeeping never stops");
        }
        (wakes, now)
    }

    #[test]
    fn idle_shard_retries_then_stops_and_resumes_when_a_handle_drops() {
        let (mut owner, held) = idle_shard_holding_one_handle(RECLAIM_ABOVE as usize + 10);
        owner.reclaim_idle_memory(0);
        assert_eq!(
            owner.next_work(),
            Some(20),
            "first try after the reclaim delay"
        );
        let (wakes, stopped) = run_housekeeping(&mut owner, 0);
        // A try at 20 ms, then after waits of 20, 40, ... 640 ms, and 1000 ms, which saw no
        // change over a whole longest wait: it stops there (7 of the 8 walks were skipped).
        assert_eq!(
            (wakes, stopped),
            (8, 20 + 20 + 40 + 80 + 160 + 320 + 640 + 1000)
        );
        assert!(
            owner.entries.capacity() == 0,
            "the entry table went at the first try"
        );
        assert_eq!(
            owner.shared.slots.try_reclaim(),
            Reclaim::Busy {
                head: owner.shared.slots.free_head()
            }
        );
        // A later turn with nothing changed plans nothing.
        owner.reclaim_idle_memory(stopped + 5000);
        assert_eq!(owner.next_work(), None);
        // The last handle goes: the next turn plans a try, which reclaims.
        drop(held);
        owner.reclaim_idle_memory(stopped + 6000);
        assert_eq!(owner.next_work(), Some(stopped + 6020));
        let (wakes, _) = run_housekeeping(&mut owner, stopped + 6000);
        assert_eq!(wakes, 1);
        assert_eq!(owner.reclaim.slots_seen, 0);
        assert_eq!(
            owner.shared.slots.allocate(),
            Some((0, 2)),
            "fresh slots start over"
        );
    }

    #[test]
    fn idle_shard_reclaims_everything_in_one_turn() {
        let (mut owner, held) = idle_shard_holding_one_handle(RECLAIM_ABOVE as usize + 10);
        drop(held);
        owner.reclaim_idle_memory(0);
        let (wakes, _) = run_housekeeping(&mut owner, 0);
        assert_eq!(wakes, 1);
        assert_eq!(owner.entries.capacity(), 0);
        assert_eq!(owner.reclaim.slots_seen, 0);
        assert_eq!(owner.shared.slots.try_reclaim(), Reclaim::Nothing);
        // Idle with nothing left to give back: no wake-up is planned.
        owner.reclaim_idle_memory(1000);
        assert_eq!(owner.next_work(), None);
    }

    #[test]
    fn small_idle_shard_plans_nothing() {
        let (mut owner, held) = idle_shard_holding_one_handle(100);
        drop(held);
        owner.reclaim_idle_memory(0);
        assert_eq!(owner.next_work(), None);
    }

    /// A shard of six wheel levels, driven by hand (ticks of 1 ms).
    fn manual_shard() -> (Arc<ShardShared>, ShardOwner) {
        let clock = TickClock::new(Clock::manual(), Duration::from_millis(1));
        let shared = Arc::new(ShardShared::new(clock, None));
        let owner = ShardOwner::new(shared.clone(), 6);
        (shared, owner)
    }

    /// One timer per deadline of `due`, each recording (in `ran[i]`) the tick it ran at plus
    /// one, as read from `now` (the test's clock), and failing if it runs twice.
    #[allow(clippy::type_complexity)]
    fn recording_timers(
        shared: &Arc<ShardShared>,
        due: &[u64],
    ) -> (
        Arc<std::sync::atomic::AtomicU64>,
        Arc<Vec<std::sync::atomic::AtomicU64>>,
        Vec<Option<TimerHandle>>,
    ) {
        use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
        let now = Arc::new(AtomicU64::new(0));
        let ran: Arc<Vec<AtomicU64>> = Arc::new(due.iter().map(|_| AtomicU64::new(0)).collect());
        let handles = due
            .iter()
            .enumerate()
            .map(|(i, &deadline)| {
                let (now, ran) = (now.clone(), ran.clone());
                let task = Task::new_inline(move || {
                    assert_eq!(ran[i].swap(now.load(Relaxed) + 1, Relaxed), 0, "ran twice");
                });
                Some(TimerHandle::submit(shared, deadline, task).unwrap())
            })
            .collect();
        (now, ran, handles)
    }

    /// A hand-driven shard that scheduled `COMPACT_ABOVE + 5000` timers due at tick 1000 and
    /// then cancelled all but one in ten (every tenth from the first), applied by tick 5: sparse.
    fn sparse_shard() -> (Arc<ShardShared>, ShardOwner, Vec<TimerHandle>) {
        let (shared, mut owner) = manual_shard();
        let count = COMPACT_ABOVE as usize + 5000;
        let handles: Vec<TimerHandle> = (0..count)
            .map(|_| TimerHandle::submit(&shared, 1000, Task::new(|| {})).unwrap())
            .collect();
        expire_and_run(&mut owner, 0);
        for (i, handle) in handles.iter().enumerate() {
            if !i.is_multiple_of(10) {
                assert!(handle.cancel());
            }
        }
        expire_and_run(&mut owner, 5);
        (shared, owner, handles)
    }

    /// Expires the shard to `tick` and runs what fired (inline tasks only).
    fn expire_and_run(owner: &mut ShardOwner, tick: u64) {
        let mut handoff = Handoff::default();
        while owner.drain_inbox(&mut handoff) + owner.drain_stages(&mut handoff, true) > 0 {}
        owner.expire(tick, &mut handoff, usize::MAX, |_| unreachable!());
        let shared = owner.shared.clone();
        handoff::run_here(&mut handoff, &shared);
    }

    #[test]
    fn a_sparse_shard_compacts_and_every_timer_and_handle_goes_on() {
        use std::sync::atomic::Ordering::Relaxed;
        let (shared, mut owner) = manual_shard();
        let count = COMPACT_ABOVE as usize + 5000;
        // Timer i is due at 1000 + i % 500; each records the tick it ran at (+1).
        let deadline = |i: usize| 1000 + (i % 500) as u64;
        let (now, ran, mut handles) =
            recording_timers(&shared, &(0..count).map(deadline).collect::<Vec<_>>());
        expire_and_run(&mut owner, 0);
        // Keep one in ten (and, fired already, timer 3 with its handle); cancel and drop the rest.
        let kept = |i: usize| i.is_multiple_of(10);
        for (i, handle) in handles.iter_mut().enumerate() {
            if !kept(i) && i != 3 {
                assert!(handle.take().unwrap().cancel());
            }
        }
        handles[3].as_ref().unwrap().reset_to_tick(5);
        now.store(5, Relaxed);
        expire_and_run(&mut owner, 5);
        assert_eq!(ran[3].load(Relaxed), 6);
        assert!(!owner.compact_if_sparse(5), "sparse: waits first");
        let mut pieces = 0;
        while owner.compact_if_sparse(105) {
            pieces += 1;
        }
        assert!(pieces > 3, "compacted in {pieces} pieces");
        let retired = shared.slots.retired_below();
        assert!(retired as usize >= count, "retired below {retired}");
        assert_eq!(owner.entries.base(), retired);
        assert_eq!(owner.live, count.div_ceil(10));
        // The handles follow their timers: state, cancel, reset (later and earlier), clone.
        assert_eq!(handles[3].as_ref().unwrap().state(), TimerState::Expired);
        let clones: Vec<TimerHandle> = (0..count)
            .step_by(70)
            .map(|i| handles[i].clone().unwrap())
            .collect();
        for (i, handle) in handles.iter().enumerate() {
            let Some(handle) = handle else { continue };
            if i == 3 {
                continue;
            }
            assert_eq!(handle.state(), TimerState::Pending, "timer {i}");
            match i % 40 {
                0 => assert!(handle.cancel()),
                10 => assert!(handle.reset_to_tick(3000)),
                20 => assert!(handle.reset_to_tick(800)),
                _ => {}
            }
        }
        drop(clones);
        let due = |i: usize| match i % 40 {
            10 => 3000,
            20 => 800,
            _ => deadline(i),
        };
        for tick in [799, 800, 1200, 1499, 2999, 3000] {
            now.store(tick, Relaxed);
            expire_and_run(&mut owner, tick);
            for i in (0..count).filter(|&i| kept(i) && !i.is_multiple_of(40)) {
                let at = ran[i].load(Relaxed);
                if due(i) <= tick {
                    assert!(at > due(i), "timer {i} due at {} not run by {tick}", due(i));
                } else {
                    assert_eq!(at, 0, "timer {i} due at {} ran early, by {tick}", due(i));
                }
            }
        }
        assert_eq!(owner.live, 0);
        for i in (0..count).filter(|&i| i.is_multiple_of(40)) {
            assert_eq!(ran[i].load(Relaxed), 0, "cancelled timer {i} ran");
        }
        // Every handle gone: the slot table is reclaimed whole, its retirement with it.
        drop(handles);
        owner.reclaim_idle_memory(3000);
        run_housekeeping(&mut owner, 3000);
        assert_eq!(shared.slots.retired_below(), 0);
        assert_eq!(owner.entries.base(), 0);
        assert_eq!(shared.slots.allocate().map(|(index, _)| index), Some(0));
    }

    #[test]
    fn a_compaction_goes_on_between_fires_cancels_resets_and_drops() {
        use std::sync::atomic::Ordering::Relaxed;
        let (shared, mut owner) = manual_shard();
        let count = COMPACT_ABOVE as usize + 20_000;
        // Kept: one in ten, some due while the compaction runs (ticks 105 on).
        let kept = |i: usize| i.is_multiple_of(10);
        let mut due: Vec<u64> = (0..count)
            .map(|i| {
                if i.is_multiple_of(30) {
                    106 + (i % 7) as u64
                } else {
                    1000 + (i % 500) as u64
                }
            })
            .collect();
        let ended = [3, count - 7];
        for &i in &ended {
            due[i] = 5;
        }
        let (now, ran, mut handles) = recording_timers(&shared, &due);
        let mut cancelled = vec![false; count];
        for (i, handle) in handles.iter_mut().enumerate() {
            if !kept(i) && !ended.contains(&i) {
                assert!(handle.take().unwrap().cancel());
                cancelled[i] = true;
            }
        }
        now.store(5, Relaxed);
        expire_and_run(&mut owner, 5);
        assert!(!owner.compact_if_sparse(5));
        let mut tick = 105;
        let mut piece = 0;
        loop {
            now.store(tick, Relaxed);
            expire_and_run(&mut owner, tick);
            let going_on = owner.compact_if_sparse(tick);
            if piece == 3 {
                // Ended timers' handles go: one moved already, one not yet.
                for &i in &ended {
                    handles[i] = None;
                }
            }
            for i in (0..count).filter(|&i| kept(i) && (i / 10) % 13 == piece % 13) {
                let Some(handle) = &handles[i] else { continue };
                if ran[i].load(Relaxed) != 0 || cancelled[i] {
                    continue;
                }
                match i % 4 {
                    0 => {
                        assert!(handle.cancel(), "cancel of timer {i}");
                        cancelled[i] = true;
                    }
                    1 => {
                        due[i] += 2000;
                        assert!(handle.reset_to_tick(due[i]));
                    }
                    2 => {
                        due[i] = tick + 5;
                        assert!(handle.reset_to_tick(due[i]));
                    }
                    _ => drop(handle.clone()),
                }
            }
            piece += 1;
            tick += 1;
            if !going_on && piece > 4 {
                break;
            }
        }
        assert!(shared.slots.retired_below() as usize >= count);
        for tick in [200, 1000, 1600, 2000, 3000, 3600] {
            now.store(tick, Relaxed);
            expire_and_run(&mut owner, tick);
        }
        for i in 0..count {
            let at = ran[i].load(Relaxed);
            if cancelled[i] {
                assert_eq!(at, 0, "cancelled timer {i} ran");
            } else {
                assert!(
                    at > due[i],
                    "timer {i} due at {} ran at {}",
                    due[i],
                    at as i64 - 1
                );
            }
        }
        assert_eq!(owner.live, 0);
        drop(handles);
        owner.reclaim_idle_memory(4000);
        run_housekeeping(&mut owner, 4000);
        assert_eq!(
            shared.slots.retired_below(),
            0,
            "reclaimed, retirement ended"
        );
    }

    /// A lazy reset to an earlier deadline, whose swap the move copied before the timer fired
    /// there: the reset succeeded (the timer ran on its deadline), as without a compaction.
    /// From review.
    #[cfg(feature = "test-hooks")]
    #[test]
    fn a_reset_the_move_copied_then_fired_on_succeeded() {
        use std::cell::RefCell;
        use std::rc::Rc;
        use std::sync::atomic::AtomicU64 as Counter;
        use std::sync::atomic::Ordering::Relaxed;
        let (shared, owner) = manual_shard();
        let owner = Rc::new(RefCell::new(owner));
        let count = COMPACT_ABOVE as usize + 5000;
        let now = Arc::new(Counter::new(0));
        let ran = Arc::new(Counter::new(0));
        let mut handles: Vec<Option<TimerHandle>> = (0..count)
            .map(|i| {
                let (now, ran) = (now.clone(), ran.clone());
                let task = Task::new_inline(move || {
                    if i == 0 {
                        ran.store(now.load(Relaxed) + 1, Relaxed);
                    }
                });
                Some(TimerHandle::submit(&shared, 1000, task).unwrap())
            })
            .collect();
        expire_and_run(&mut owner.borrow_mut(), 0);
        for (i, handle) in handles.iter_mut().enumerate() {
            if !i.is_multiple_of(10) {
                assert!(handle.take().unwrap().cancel());
            }
        }
        now.store(5, Relaxed);
        expire_and_run(&mut owner.borrow_mut(), 5);
        assert!(!owner.borrow_mut().compact_if_sparse(5));
        let (hooked, hooked_now) = (owner.clone(), now.clone());
        let mut once = true;
        crate::test_hooks::set_after_reset_swap(Some(Box::new(move || {
            if !std::mem::take(&mut once) {
                return;
            }
            let mut owner = hooked.borrow_mut();
            // The move copies the deadline just swapped in (150); the timer fires there.
            while owner.compact_if_sparse(105) {}
            hooked_now.store(200, Relaxed);
            expire_and_run(&mut owner, 200);
        })));
        let reset = handles[0].as_ref().unwrap().reset_to_tick(150);
        crate::test_hooks::set_after_reset_swap(None);
        assert!(shared.slots.retired_below() as usize >= count);
        assert_eq!(ran.load(Relaxed), 201);
        assert_eq!(handles[0].as_ref().unwrap().state(), TimerState::Expired);
        assert!(
            reset,
            "ran on the reset's earlier deadline, yet the reset failed"
        );
    }

    /// Shutdown while a compaction is under way: the compaction ends first, and every timer
    /// still pending is returned once.
    #[test]
    fn shutdown_during_a_compaction_returns_every_pending_timer() {
        let (shared, mut owner, handles) = sparse_shard();
        let kept = handles.len().div_ceil(10);
        assert!(!owner.compact_if_sparse(5));
        for _ in 0..4 {
            assert!(owner.compact_if_sparse(105), "a compaction under way");
        }
        shared.inbox.close();
        assert_eq!(owner.close().len(), kept);
        drop(handles);
    }

    /// A shard still losing its timers fast (a storm's tail) waits again instead of compacting.
    #[test]
    fn a_shard_losing_its_timers_fast_does_not_compact() {
        let (shared, mut owner, handles) = sparse_shard();
        let count = handles.len();
        assert!(!owner.compact_if_sparse(5), "sparse: waits first");
        // More than half of the rest go during the wait.
        for handle in handles.iter().step_by(10).take(count / 15) {
            assert!(handle.cancel());
        }
        expire_and_run(&mut owner, 105);
        assert!(!owner.compact_if_sparse(105), "waits again");
        assert_eq!(shared.slots.retired_below(), 0);
        // Then steady for a whole wait: it compacts.
        assert!(owner.compact_if_sparse(205));
        while owner.compact_if_sparse(205) {}
        assert!(shared.slots.retired_below() as usize >= count);
    }
}
