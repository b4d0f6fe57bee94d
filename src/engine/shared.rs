//! What other threads see of a shard ([`ShardShared`]): its slot table, its inbox and how to
//! [`send`](ShardShared::send) to it, its clock and counters, and the engine-wide
//! [`PendingLimit`]. The owner's side is in [`owner`](super::owner).

use super::executor::drop_contained;
use super::inbox::{Inbox, PushOutcome};
use super::message::Message;
use super::slot::{Adoption, LazyReset, ResetOutcome, SlotTable};
use super::stage::{Meta, StagedAt, Stages};
use crate::clock::TickClock;
use crate::error::ScheduleError;
use crate::stats::ShardCounters;
use crate::stats::counter_stripe;
use crate::sync::{Arc, AtomicUsize, Ordering};
use crate::task::Task;
use crossbeam_utils::CachePadded;

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

/// How a new timer reaches its shard ([`ShardShared::submit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Via {
    /// The calling thread's [stage](super::stage) (one-shot timers only; falls back to the
    /// inbox): for timers likely to end before their shard adopts them, a `Sleep`'s.
    Stage,
    /// A `Schedule` message: for timers likely to live long (closure timers, whose handles
    /// cannot retract them). Adopting a staged timer costs its shard a compare-and-swap on
    /// the slot, which a message does not; staging pays only when the timer ends first.
    Inbox,
}

/// The part of a shard any thread may touch: the slot table, the inbox, counters.
#[derive(Debug)]
pub(crate) struct ShardShared {
    /// Cache-line aligned, which also keeps the `Arc`'s reference counts (bumped by every new
    /// handle) off the line of the page table that every slot access reads.
    pub(crate) slots: CachePadded<SlotTable>,
    pub(crate) inbox: Inbox,
    /// New one-shot timers on their way to the owner, one ring per submitting thread.
    pub(crate) stages: Stages,
    pub(crate) clock: TickClock,
    pub(crate) counters: ShardCounters,
    pub(crate) limit: Option<Arc<PendingLimit>>,
    /// Test-only fault: the worker thread panics at its next turn (see
    /// `test_hooks::kill_shard_thread`).
    #[cfg(feature = "test-hooks")]
    pub(crate) fault: crate::sync::statistics::AtomicBool,
}

impl ShardShared {
    pub(crate) fn new(clock: TickClock, limit: Option<Arc<PendingLimit>>) -> ShardShared {
        ShardShared {
            slots: CachePadded::new(SlotTable::new()),
            inbox: Inbox::new(),
            stages: Stages::new(),
            clock,
            counters: ShardCounters::new(),
            limit,
            #[cfg(feature = "test-hooks")]
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
    #[cfg_attr(shardwheel_loom, allow(dead_code))] // Under loom the worker lets a panic through.
    pub(crate) fn fail(&self) {
        self.counters
            .failed
            .store(true, std::sync::atomic::Ordering::Release);
        self.inbox.close();
    }

    /// Notes that this shard is about to cancel timers from outside their owners (see
    /// [`TickClock::note_sweep`]).
    pub(crate) fn note_sweep(&self) {
        self.clock.note_sweep();
    }

    /// Why a schedule found the inbox closed (or a sleep found its timer cancelled from
    /// outside): the engine was shut down, or the shard failed.
    pub(crate) fn closed_error(&self) -> ScheduleError {
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
        self.give_back_places(count as usize);
    }

    /// Schedules the task `make` makes at tick `deadline` on this shard: returns the timer's
    /// slot index and generation, with the one handle its slot counts, for the caller to wrap
    /// in a [`TimerHandle`](super::handle::TimerHandle), and where it was staged, if it was
    /// (for [`retract`](Self::retract)). `make` is called once the timer has a place, and the
    /// task it makes is written where the timer waits (a stage's cell: no copy of the task on
    /// the way); it must not run user code (a panic there would leave the place taken). A
    /// refused `make` is dropped uncalled (contained: it holds the task's user code).
    #[inline]
    pub(crate) fn submit<M: FnOnce() -> Task>(
        &self,
        deadline: u64,
        make: M,
        via: Via,
    ) -> Result<(u32, u32, Option<StagedAt>), ScheduleError> {
        // A refused task is user code (or holds some): dropped contained.
        let refuse = |make: M, error: ScheduleError| {
            drop_contained(&self.counters, make);
            Err(error)
        };
        if self.inbox.is_closed() {
            return refuse(make, self.closed_error());
        }
        if let Some(limit) = &self.limit
            && !limit.try_reserve()
        {
            return refuse(make, ScheduleError::Full);
        }
        // A sleep's timer first takes a slot this thread retracted (see `Stages::take_spare`).
        let spare = match via {
            Via::Stage => self.stages.take_spare(&self.slots),
            Via::Inbox => None,
        };
        let Some((index, generation)) = spare.or_else(|| self.slots.allocate()) else {
            self.give_back_places(1);
            return refuse(make, ScheduleError::Full);
        };
        self.counters
            .scheduled
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let staged = match via {
            Via::Stage => self.stage(index, generation, deadline, make),
            Via::Inbox => Err(make),
        };
        let (outcome, staged_at) = match staged {
            Ok((outcome, at)) => (outcome, Some(at)),
            Err(make) => {
                let task = make();
                self.slots
                    .begin(index, generation, deadline, task.is_repeating());
                // Not `send`: a schedule that finds the inbox closed settles the race first.
                let message = Message::Schedule {
                    index,
                    deadline,
                    task,
                };
                (self.inbox.push(message, deadline), None)
            }
        };
        let PushOutcome::Closed { drained } = outcome else {
            return Ok((index, generation, staged_at));
        };
        // Shutdown raced us. Whoever moves the timer out of PENDING first decides: us (the
        // schedule is rejected, undone, its task dropped unrun) or the shard's last sweep (the
        // timer is among those `shutdown()` returns).
        if !self.slots.cancel(index, generation) {
            return Ok((index, generation, staged_at));
        }
        self.counters
            .scheduled
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        self.give_back_places(1);
        let error = self.closed_error();
        // No handle is made: let go of the one the slot counts.
        self.slots.drop_handle(index);
        if drained {
            self.discard_late_messages();
        }
        Err(error)
    }

    /// Hands a new one-shot timer to the owner through this thread's
    /// [stage](super::stage): the slot is published STAGED, then the cell. Gives `make` back,
    /// uncalled, if the timer must take the inbox instead (the stage is full or out of reach).
    #[inline]
    fn stage<M: FnOnce() -> Task>(
        &self,
        index: u32,
        generation: u32,
        deadline: u64,
        make: M,
    ) -> Result<(PushOutcome, StagedAt), M> {
        self.slots.begin_staged(index, generation, deadline);
        let meta = Meta {
            index,
            generation,
            deadline,
        };
        let (at, filling) = self.stages.push(meta, make, &self.slots)?;
        Ok((self.inbox.staged(deadline, filling), at))
    }

    /// Takes back timer `(index, generation)`, staged at `at` by this thread, whose one handle
    /// the caller holds: true iff done (cancelled and counted, the handle let go of, the slot
    /// freed, the task dropped here); else the caller cancels it the ordinary way. See
    /// [`Stages::retract`].
    pub(crate) fn retract(&self, at: StagedAt, index: u32, generation: u32) -> bool {
        if !self
            .stages
            .retract(at, index, generation, &self.slots, |task| {
                drop_contained(&self.counters, task);
            })
        {
            return false;
        }
        self.count_cancelled(1);
        true
    }

    /// Cancels timer `(index, generation)` of this shard: true iff this call prevented its task
    /// from running ([`TimerHandle::cancel`](super::handle::TimerHandle::cancel) documents it).
    pub(crate) fn cancel(&self, index: u32, generation: u32) -> bool {
        let Some(staged) = self.slots.cancel_staged(index, generation) else {
            return false;
        };
        self.after_cancel(index, generation, staged);
        true
    }

    /// [`cancel`](Self::cancel), and lets go of the caller's handle of the timer in the same
    /// compare-and-swap ([`SlotTable::cancel_and_release`]): for a `Sleep` done with its timer.
    /// True iff this call prevented the task from running.
    pub(crate) fn cancel_and_release(&self, index: u32, generation: u32) -> bool {
        let Some(staged) = self.slots.cancel_and_release(index, generation) else {
            return false;
        };
        self.after_cancel(index, generation, staged);
        true
    }

    /// What follows a handle's transition of timer `(index, generation)` out of PENDING into
    /// CANCELLED ([`cancel`](Self::cancel), [`cancel_and_release`](Self::cancel_and_release)):
    /// count it and tell the shard, unless the timer was still `staged` (its shard finds out
    /// when it adopts it). Touches no slot (after `cancel_and_release` the caller holds no
    /// handle keeping it).
    fn after_cancel(&self, index: u32, generation: u32, staged: bool) {
        self.count_cancelled(1);
        #[cfg(feature = "test-hooks")]
        super::handle::cancel_hook::after_cancel_transition();
        if !staged {
            self.send(Message::Cancel { index, generation }, u64::MAX);
        }
    }

    /// Moves timer `(index, generation)` to tick `deadline`: true iff it was still pending
    /// ([`TimerHandle::reset`](super::handle::TimerHandle::reset) documents it). A repeating
    /// timer's reset that finds the most resets in flight (2^17 - 1) calls `catch_up` until the
    /// shard has applied some ([`worker::let_catch_up`](super::worker::let_catch_up): this
    /// module cannot name the shard's owner).
    pub(crate) fn reset(
        &self,
        index: u32,
        generation: u32,
        deadline: u64,
        catch_up: fn(&ShardShared),
    ) -> bool {
        match self.slots.reset_lazy(index, generation, deadline) {
            LazyReset::NotPending => return false,
            LazyReset::Done { earlier } => {
                self.counters.count_resets(counter_stripe(), 1);
                if earlier {
                    let message = Message::Relocate {
                        index,
                        generation,
                        deadline,
                    };
                    self.send(message, deadline);
                }
                return true;
            }
            // Its task must learn of the reset: the shard applies it.
            LazyReset::Repeating => {}
        }
        loop {
            match self.slots.reset(index, generation) {
                ResetOutcome::Accepted => break,
                ResetOutcome::NotPending => return false,
                ResetOutcome::Busy => {
                    // 2^17 - 1 resets of this timer are in flight: let the shard catch up.
                    if self.inbox.is_closed() {
                        return false;
                    }
                    catch_up(self);
                }
            }
        }
        let message = Message::Reset {
            index,
            generation,
            deadline,
        };
        self.send(message, deadline);
        true
    }

    /// Gives back `count` places of the `max_pending` limit, if there is one.
    pub(crate) fn give_back_places(&self, count: usize) {
        if let (Some(limit), true) = (&self.limit, count > 0) {
            limit.give_back(count);
        }
    }

    /// Sends `message` (whose [deadline](Message::deadline_tick) is `deadline`) to the owner.
    /// If the inbox is closed and the owner's last drain is over, no one will apply it: it is
    /// discarded, with every other late message
    /// ([`discard_late_messages`](Self::discard_late_messages)).
    pub(crate) fn send(&self, message: Message, deadline: u64) {
        if let PushOutcome::Closed { drained: true } = self.inbox.push(message, deadline) {
            self.discard_late_messages();
        }
    }

    /// Hands a repeating timer back to the shard after a run, with its task and the deadline
    /// of its next run (`task: None`: it stopped). Called by whoever ran it. If the shard is
    /// gone, the discard ends this timer (see there).
    pub(crate) fn rearm(&self, index: u32, deadline: u64, task: Option<Task>) {
        let message = Message::Rearm {
            index,
            deadline,
            task,
        };
        self.send(message, deadline);
    }

    /// Pops every message the queue holds, out of the consumer's role before their tasks (user
    /// code) are dropped: a task's drop may submit, and so discard late messages, itself.
    fn take_messages(&self) -> Vec<Message> {
        let mut messages = self.inbox.messages();
        std::iter::from_fn(|| messages.pop()).collect()
    }

    /// After shutdown's last drain: drops whatever late submitters left in the queue (all of
    /// it belongs to rejected schedules or to timers shutdown already settled). The tasks in
    /// them are dropped contained.
    pub(crate) fn discard_late_messages(&self) {
        // This thread's stage, which the shard no longer drains: its timers were all settled
        // by this thread (cancelled: the shard's last sweep is over).
        self.stages.drain_own(&self.slots, |adoption, task| {
            debug_assert_eq!(
                adoption,
                Adoption::Cancelled,
                "a timer staged after the last drain is pending"
            );
            drop_contained(&self.counters, task);
        });
        for message in self.take_messages() {
            // The shard will never apply these: end the repeating timers they hand back.
            if let Message::Rearm { index, .. } = message
                && self.slots.end_run_after_shutdown(index)
            {
                self.count_cancelled(1);
            }
            drop_contained(&self.counters, message);
        }
    }
}

impl Drop for ShardShared {
    /// Messages and staged timers still queued (only when a failed shard's owner could not be
    /// closed) hold tasks: user code, dropped contained.
    fn drop(&mut self) {
        for message in self.take_messages() {
            drop_contained(&self.counters, message);
        }
        let counters = &self.counters;
        self.stages
            .close(&self.slots, |task| drop_contained(counters, task));
    }
}
