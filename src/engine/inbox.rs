//! A shard's inbox: the lock-free message queue plus the signal word that decides when a
//! sleeping shard must be woken, and that closes the inbox at shutdown.
//!
//! # The signal word
//!
//! ```text
//!  63                                   4      3        2       1      0
//! +--------------------------------------+---------+--------+------+--------+
//! | messages counted, not yet consumed   | DRAINED | CLOSED | LONG | PARKED |
//! +--------------------------------------+---------+--------+------+--------+
//! ```
//!
//! A submitter pushes its message, **then** adds one to the count (one read-modify-write that
//! also returns the flags). The shard subtracts what it popped, and parks only with a
//! compare-and-swap that expects the count to be zero. So either the shard's
//! park fails (it drains again) or the submitter's add sees PARKED and decides whether to wake:
//! no wake-up is lost, and no lock or fence is needed. See `loom-tests/` for the model.
//!
//! | shard parked with | a message wakes it when                          | a staged timer wakes it when |
//! |-------------------|--------------------------------------------------|------------------------------|
//! | `LONG`            | always (the shard will not look again for long)  | its deadline is before the shard's wake-up tick, or its stage is filling up |
//! | not `LONG`        | its deadline is before the shard's wake-up tick  | the same |
//!
//! A shard parks "short" (at most [`DRAIN_INTERVAL`]) right after it processed messages, so a
//! busy inbox costs one wake-up per interval, not one per message, and an idle engine none.
//!
//! The timers of `Sleep`s come through [stages](super::stage) instead, which add nothing to the
//! count: their producers read this word after publishing (see [`Inbox::staged`]), and the
//! shard looks at the stages after setting PARKED.
//!
//! At shutdown the shard sets CLOSED and drains; a submitter whose add sees CLOSED settles the
//! race on the timer's own state word (see `ShardShared::submit`). A submitter whose add did
//! not see CLOSED took its queue position before the close: that drain waits for every such
//! position to be written ([`positions_taken`](Inbox::positions_taken)), so no delivered message
//! is left behind one still being written. After its last drain the shard sets DRAINED; from
//! then on late submitters empty the queue themselves.

use super::message::Message;
use super::queue::{Consumer, Queue};
use crate::sync::{AtomicU64, OnceLock, Ordering, thread};
use crossbeam_utils::CachePadded;
use std::time::Duration;

const PARKED: u64 = 1;
const LONG: u64 = 1 << 1;
const CLOSED: u64 = 1 << 2;
const DRAINED: u64 = 1 << 3;
const FLAGS: u64 = (1 << 4) - 1;
const MESSAGE_SHIFT: u32 = 4;
const MESSAGE_ONE: u64 = 1 << MESSAGE_SHIFT;
/// Undrained messages past which submitters yield to the shard.
const BACKLOG_LIMIT: u64 = 64 * 1024;

/// How long a shard that just processed messages sleeps at most before looking again: also
/// how long a timer may wait in a [stage](super::stage) (and be cancelled there for free).
pub(crate) const DRAIN_INTERVAL: Duration = Duration::from_millis(10);

/// What a push found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PushOutcome {
    /// The shard will see the message.
    Delivered,
    /// The inbox was closed; `drained` says the shard has finished its last drain.
    Closed {
        /// The shard's last drain is over: the pusher must clean up after itself.
        drained: bool,
    },
}

/// What the shard's attempt to park found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ParkOutcome {
    /// Parked and woke up again (by a message, by timeout, or spuriously).
    Woke,
    /// Messages arrived: drain again instead.
    MessagesWaiting,
    /// The inbox is closed: shut down.
    Closed,
}

/// Where the shard's thread parks; loom has no timeouts, so there a timed park is a plain park.
pub(crate) struct Parker {
    thread: OnceLock<ThreadHandle>,
}

#[cfg(not(shardwheel_loom))]
type ThreadHandle = std::thread::Thread;
#[cfg(shardwheel_loom)]
type ThreadHandle = loom::thread::Thread;

impl Parker {
    fn new() -> Parker {
        Parker {
            thread: OnceLock::new(),
        }
    }

    fn unpark(&self) {
        if let Some(thread) = self.thread.get() {
            thread.unpark();
        }
    }

    fn park(&self, timeout: Option<Duration>) {
        #[cfg(not(shardwheel_loom))]
        match timeout {
            Some(timeout) => thread::park_timeout(timeout),
            None => thread::park(),
        }
        #[cfg(shardwheel_loom)]
        {
            let _ = timeout;
            thread::park();
        }
    }
}

/// A shard's inbox. See the [module documentation](self).
pub(crate) struct Inbox {
    queue: Queue<Message>,
    signal: CachePadded<AtomicU64>,
    /// When PARKED: the tick at which the shard wakes by itself.
    wake_tick: AtomicU64,
    parker: Parker,
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("signal", &self.signal.load(Ordering::Relaxed))
            .finish()
    }
}

impl Inbox {
    pub(crate) fn new() -> Inbox {
        Inbox {
            queue: Queue::new(),
            signal: CachePadded::new(AtomicU64::new(0)),
            wake_tick: AtomicU64::new(u64::MAX),
            parker: Parker::new(),
        }
    }

    /// Called once by the thread that will drain this inbox, before it first parks.
    pub(crate) fn register_current_thread(&self) {
        let _ = self.parker.thread.set(thread::current());
    }

    /// Pushes a message whose deadline is `deadline_tick` (`u64::MAX` for none), waking the
    /// shard if it sleeps past that deadline or sleeps long.
    pub(crate) fn push(&self, message: Message, deadline_tick: u64) -> PushOutcome {
        self.queue.push(message);
        let old = self.signal.fetch_add(MESSAGE_ONE, Ordering::AcqRel);
        if old & CLOSED != 0 {
            return PushOutcome::Closed {
                drained: old & DRAINED != 0,
            };
        }
        if (old as i64) >> MESSAGE_SHIFT >= BACKLOG_LIMIT as i64 {
            // Backpressure: the shard is this far behind (its threads may be starved by the
            // submitters themselves): wake it and give up this thread's time slice, so that
            // undrained messages, and with them memory, stay bounded.
            self.wake();
            thread::yield_now();
            return PushOutcome::Delivered;
        }
        if old & PARKED != 0
            && (old & LONG != 0 || deadline_tick < self.wake_tick.load(Ordering::Relaxed))
        {
            self.wake();
        }
        PushOutcome::Delivered
    }

    /// After a producer published a cell on a [stage](super::stage) (with a fence: Dekker with
    /// [`park`](Self::park)): wakes the shard if it sleeps past `deadline_tick` or the stage is
    /// `filling` up. Unlike a message, a staged timer does not wake a shard that sleeps long
    /// until its next deadline: it waits in its stage (where a retraction or cancel costs the
    /// shard nothing) until the shard wakes anyway. Reports a closed inbox like
    /// [`push`](Self::push).
    pub(crate) fn staged(&self, deadline_tick: u64, filling: bool) -> PushOutcome {
        let old = self.signal.load(Ordering::Acquire);
        if old & CLOSED != 0 {
            return PushOutcome::Closed {
                drained: old & DRAINED != 0,
            };
        }
        if old & PARKED != 0 && (filling || deadline_tick < self.wake_tick.load(Ordering::Relaxed))
        {
            self.wake();
        }
        PushOutcome::Delivered
    }

    /// Wakes the shard if it is parked.
    pub(crate) fn wake(&self) {
        if self.signal.fetch_and(!(PARKED | LONG), Ordering::AcqRel) & PARKED != 0 {
            self.parker.unpark();
        }
    }

    /// The shard popped `count` messages: take them off the count. The count may dip below
    /// zero for a moment (a message popped before its pusher counted it); it wraps, and the
    /// pusher's add brings it back.
    pub(crate) fn consumed(&self, count: usize) {
        if count > 0 {
            self.signal
                .fetch_sub((count as u64) << MESSAGE_SHIFT, Ordering::AcqRel);
        }
    }

    /// How many messages have been pushed or are being pushed (see
    /// [`ShardOwner::close`](super::owner::ShardOwner::close)): read after this thread saw
    /// CLOSED, it counts every message whose push found the inbox open.
    pub(crate) fn positions_taken(&self) -> u64 {
        self.queue.positions_taken()
    }

    /// The role of the messages' consumer (the shard, or a late submitter after DRAINED),
    /// until dropped: [`Consumer::pop`] pops one.
    pub(crate) fn messages(&self) -> Consumer<'_, Message> {
        self.queue.consumer()
    }

    /// Parks the shard until `wake_tick` (which `timeout` measures from now; `None` = no
    /// deadline), unless messages are counted that the shard has not [`consumed`](Self::consumed),
    /// or `staged_due(wake_tick)`, asked once the shard is marked parked, finds a staged timer
    /// due before then (see [`stage`](super::stage)).
    pub(crate) fn park(
        &self,
        wake_tick: u64,
        timeout: Option<Duration>,
        long: bool,
        staged_due: impl FnOnce(u64) -> bool,
    ) -> ParkOutcome {
        self.wake_tick.store(wake_tick, Ordering::Relaxed);
        let flags = if long { PARKED | LONG } else { PARKED };
        let mut current = self.signal.load(Ordering::Acquire);
        loop {
            if current & CLOSED != 0 {
                return ParkOutcome::Closed;
            }
            if current & !FLAGS != 0 {
                return ParkOutcome::MessagesWaiting;
            }
            // The fence: Dekker with a stage's producer (`staged`).
            match crate::sync::compare_exchange_weak_then_fence(
                &self.signal,
                current,
                current | flags,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(actual) => current = actual,
            }
        }
        if staged_due(wake_tick) {
            self.signal.fetch_and(!(PARKED | LONG), Ordering::AcqRel);
            return ParkOutcome::MessagesWaiting;
        }
        self.parker.park(timeout);
        self.signal.fetch_and(!(PARKED | LONG), Ordering::AcqRel);
        ParkOutcome::Woke
    }

    /// Shutdown step 1: no message pushed from now on counts as delivered. Wakes the shard.
    pub(crate) fn close(&self) {
        self.set_with_fence(CLOSED);
        self.wake();
    }

    /// Sets `flag`, then a fence: Dekker with a stage's producer, which publishes its cell,
    /// fences, then reads the signal ([`staged`](Self::staged)). Either it sees the flag, or
    /// the shard's drain after this sees its cell.
    fn set_with_fence(&self, flag: u64) {
        let mut current = self.signal.load(Ordering::Relaxed);
        while let Err(actual) = crate::sync::compare_exchange_weak_then_fence(
            &self.signal,
            current,
            current | flag,
            Ordering::AcqRel,
            Ordering::Relaxed,
        ) {
            current = actual;
        }
    }

    /// Whether [`close`](Self::close) was called.
    pub(crate) fn is_closed(&self) -> bool {
        self.signal.load(Ordering::Acquire) & CLOSED != 0
    }

    /// Shutdown step 2, after the shard's drain: late pushers clean up after themselves.
    pub(crate) fn mark_drained(&self) {
        self.set_with_fence(DRAINED);
    }
}
