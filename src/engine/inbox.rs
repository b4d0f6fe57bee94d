//! A shard's inbox: the lock-free message queue, whose tail word also carries the flags that
//! decide when a sleeping shard must be woken and that close the inbox at shutdown.
//!
//! # The flags
//!
//! ```text
//!  63                                   4      3        2       1      0
//! +--------------------------------------+---------+--------+------+--------+
//! | positions taken (the queue's)        | DRAINED | CLOSED | LONG | PARKED |
//! +--------------------------------------+---------+--------+------+--------+
//! ```
//!
//! They live in the queue's tail word (see "The tail word" in `queue.rs`), so the one
//! read-modify-write that takes a message's position also reads them: a push costs no second
//! shared line and no second locked instruction. Both sides decide on that one word:
//!
//! * a submitter takes its position and the flags in one read-modify-write, writes its
//!   message, then wakes the shard if the flags said PARKED and the message is *urgent*;
//! * the shard sets PARKED in one read-modify-write, which also returns how many positions were
//!   taken before it. Those it has not read yet were pushed by submitters who saw no PARKED
//!   and will not wake it: it looks at them in the queue, without taking them
//!   ([`Consumer::any_through`](super::queue::Consumer::any_through)), and parks only if none
//!   is urgent. One still being written (its submitter mid-push) it waits for a few spins,
//!   then stays up for (yielding: the submitter may have been preempted).
//!
//! The two read-modify-writes are ordered: either the submitter's came first, and the shard
//! counts its position and looks at its message, or it came second and saw PARKED. Either way
//! the same rule decides, on the same wake-up tick (stored before PARKED is set). No wake-up is
//! lost; see `loom-tests/` for the models.
//!
//! | shard parked with | a message is urgent                              | a staged timer wakes it when |
//! |-------------------|--------------------------------------------------|------------------------------|
//! | `LONG`            | always (the shard will not look again for long)  | its deadline is before the shard's wake-up tick, or its stage is filling up |
//! | not `LONG`        | when its [deadline](Message::deadline_tick) is before the shard's wake-up tick | the same |
//!
//! A shard parks "short" right after it processed messages or staged timers, so a busy inbox
//! costs one wake-up per interval, not one per message, and an idle engine none: at most
//! [`DRAIN_INTERVAL`] after taking [`BUSY_TAKE`] or more since it last parked, at most
//! [`TRICKLE_INTERVAL`] after taking fewer. A short park may leave messages that are not urgent
//! in the queue (a cancel never is): the shard applies them when it wakes, in a batch, instead
//! of reading each one right behind the submitter writing the next.
//!
//! The timers of `Sleep`s come through [stages](super::stage) instead: their producers read the
//! flags after publishing, with a fence (see [`Inbox::staged`]), and the shard looks at the
//! stages after setting PARKED.
//!
//! At shutdown the shard sets CLOSED and drains. A submitter whose take read no CLOSED took
//! its position before the close, and is delivered: the shard, once CLOSED is set, reads how
//! many positions were taken ([`positions_taken`](Inbox::positions_taken)), a count that
//! includes it, and its drain waits for every one of those to be written, so no delivered
//! message is left behind one still being written. A submitter whose take read CLOSED settles the race on the timer's own
//! state word (see `ShardShared::submit`). After its last drain the shard sets DRAINED; from
//! then on late submitters, who read the flags again after writing (with a read-modify-write:
//! see [`Queue::flags_after_push`](super::queue::Queue::flags_after_push)), empty the queue
//! themselves.

use super::message::Message;
use super::queue::{Consumer, FLAGS, Queue};
use crate::sync::{AtomicU64, OnceLock, Ordering, thread};
use std::time::Duration;

const PARKED: u64 = 1;
const LONG: u64 = 1 << 1;
const CLOSED: u64 = 1 << 2;
const DRAINED: u64 = 1 << 3;
const _: () = assert!((PARKED | LONG | CLOSED | DRAINED) & !FLAGS == 0);
/// Undrained messages past which submitters yield to the shard.
const BACKLOG_LIMIT: u64 = 64 * 1024;
/// Messages a parking shard looks through for one it must not sleep past (more: it drains).
const LOOK_LIMIT: u64 = 256;
/// How many times a parking shard looks again at a message still being written before it
/// stays up for it instead (its submitter may have been preempted).
#[cfg(not(shardwheel_loom))]
const WRITE_WAIT_SPINS: u32 = 32;
#[cfg(shardwheel_loom)]
const WRITE_WAIT_SPINS: u32 = 1;

/// How long a shard that just took [`BUSY_TAKE`] or more messages and staged timers sleeps at
/// most before looking again: a busy inbox's backlog is what arrives in this time.
pub(crate) const DRAIN_INTERVAL: Duration = Duration::from_millis(10);

/// How long a shard that just took fewer than [`BUSY_TAKE`] sleeps at most before looking
/// again: also how long a timer may wait in a [stage](super::stage) (and be cancelled there for
/// free) while its stage is not filling up. Each of these wake-ups takes the CPU from the thread
/// that runs there, typically a server's worker whose own timeouts trickle in: waking every
/// [`DRAIN_INTERVAL`] for them would cost it more than the few it takes.
pub(crate) const TRICKLE_INTERVAL: Duration = Duration::from_millis(100);

/// Messages and staged timers taken since the shard last parked from which it parks for
/// [`DRAIN_INTERVAL`] rather than [`TRICKLE_INTERVAL`]: below this, the backlog of a trickle
/// interval is some tens of thousands of messages at most.
pub(crate) const BUSY_TAKE: usize = 4096;

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
    /// The messages, and the flags (see the module documentation).
    queue: Queue<Message>,
    /// When PARKED: the tick at which the shard wakes by itself.
    wake_tick: AtomicU64,
    parker: Parker,
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("flags", &self.queue.flags())
            .finish()
    }
}

impl Inbox {
    pub(crate) fn new() -> Inbox {
        Inbox {
            queue: Queue::new(),
            wake_tick: AtomicU64::new(u64::MAX),
            parker: Parker::new(),
        }
    }

    /// Called once by the thread that will drain this inbox, before it first parks.
    pub(crate) fn register_current_thread(&self) {
        let _ = self.parker.thread.set(thread::current());
    }

    /// Pushes a message whose [deadline](Message::deadline_tick) is `deadline_tick` (passed
    /// in: the caller has it at hand), waking the shard if it sleeps past that deadline or
    /// sleeps long.
    pub(crate) fn push(&self, message: Message, deadline_tick: u64) -> PushOutcome {
        debug_assert_eq!(deadline_tick, message.deadline_tick());
        let taken = self.queue.push(message);
        if taken.flags & CLOSED != 0 {
            // Read once the message is in: either `mark_drained` came first, or the shard's
            // drain after it finds this message.
            return PushOutcome::Closed {
                drained: self.queue.flags_after_push() & DRAINED != 0,
            };
        }
        if self.queue.behind(taken.position) >= BACKLOG_LIMIT {
            // Backpressure: the shard is this far behind (its threads may be starved by the
            // submitters themselves): wake it and give up this thread's time slice, so that
            // undrained messages, and with them memory, stay bounded.
            self.wake();
            thread::yield_now();
            return PushOutcome::Delivered;
        }
        // PARKED as the position was taken: a shard that parks later counts this position,
        // and stays up until it has read it (`park`).
        let flags = taken.flags;
        if flags & PARKED != 0
            && (flags & LONG != 0 || deadline_tick < self.wake_tick.load(Ordering::Relaxed))
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
        let flags = self.queue.flags();
        if flags & CLOSED != 0 {
            return PushOutcome::Closed {
                drained: flags & DRAINED != 0,
            };
        }
        if flags & PARKED != 0
            && (filling || deadline_tick < self.wake_tick.load(Ordering::Relaxed))
        {
            self.wake();
        }
        PushOutcome::Delivered
    }

    /// Wakes the shard if it is parked.
    pub(crate) fn wake(&self) {
        if self.queue.clear_flags(PARKED | LONG) & PARKED != 0 {
            self.parker.unpark();
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
    /// deadline), unless, once the shard is marked parked, a message it has not read must keep
    /// it up (urgent, or still being written: see the module documentation), or
    /// `staged_due(wake_tick)` finds a staged timer due before then (see
    /// [`stage`](super::stage)). [`ParkOutcome::MessagesWaiting`] then: the caller drains, and
    /// yields if it found nothing (a submitter is still writing).
    pub(crate) fn park(
        &self,
        wake_tick: u64,
        timeout: Option<Duration>,
        long: bool,
        staged_due: impl FnOnce(u64) -> bool,
    ) -> ParkOutcome {
        // Ordered before PARKED by the Release of setting it: a submitter that reads PARKED
        // reads this tick.
        self.wake_tick.store(wake_tick, Ordering::Relaxed);
        let flags = if long { PARKED | LONG } else { PARKED };
        // The fence: Dekker with a stage's producer (`staged`). A submitter's `push` needs none:
        // its take and this `or` are read-modify-writes of one word (module documentation).
        let before = self.queue.set_flags_then_fence(flags);
        if before.flags & CLOSED != 0 {
            self.queue.clear_flags(PARKED | LONG);
            return ParkOutcome::Closed;
        }
        if self.must_stay_up(before.position, wake_tick, long) || staged_due(wake_tick) {
            self.queue.clear_flags(PARKED | LONG);
            return ParkOutcome::MessagesWaiting;
        }
        self.parker.park(timeout);
        self.queue.clear_flags(PARKED | LONG);
        ParkOutcome::Woke
    }

    /// Whether a message pushed before PARKED was set (its position below `taken`, its
    /// submitter not told to wake the shard) keeps the shard from parking until `wake_tick`:
    /// any, when it parks long; else one due before `wake_tick`, or one still being written.
    fn must_stay_up(&self, taken: u64, wake_tick: u64, long: bool) -> bool {
        let consumer = self.queue.consumer();
        let unread = taken.saturating_sub(consumer.position());
        if unread == 0 {
            return false;
        }
        if long || unread > LOOK_LIMIT {
            return true;
        }
        // A submitter still writing is a few instructions from done, unless preempted.
        for _ in 0..WRITE_WAIT_SPINS {
            if let Some(urgent) =
                consumer.any_through(taken, |message| message.deadline_tick() < wake_tick)
            {
                return urgent;
            }
            #[cfg(not(shardwheel_loom))]
            std::hint::spin_loop();
        }
        true
    }

    /// Shutdown step 1: no message pushed from now on counts as delivered. Wakes the shard.
    pub(crate) fn close(&self) {
        self.queue.set_flags_then_fence(CLOSED);
        self.wake();
    }

    /// Whether [`close`](Self::close) was called.
    pub(crate) fn is_closed(&self) -> bool {
        self.queue.flags() & CLOSED != 0
    }

    /// Shutdown step 2, after the shard's drain: late pushers clean up after themselves.
    pub(crate) fn mark_drained(&self) {
        self.queue.set_flags_then_fence(DRAINED);
    }
}

/// An inbox for the loom model of its parking protocol (a consumer that parks, producers that
/// must wake it). Not part of the API.
#[cfg(shardwheel_loom)]
#[doc(hidden)]
#[derive(Debug)]
pub struct InboxHook(Inbox);

#[cfg(shardwheel_loom)]
impl Default for InboxHook {
    fn default() -> InboxHook {
        InboxHook(Inbox::new())
    }
}

#[cfg(shardwheel_loom)]
impl InboxHook {
    /// Consumer, once, before it first parks: [`Inbox::register_current_thread`].
    pub fn register_current_thread(&self) {
        self.0.register_current_thread();
    }

    /// Producer: pushes a message due at tick `deadline_tick` ([`Inbox::push`]); true iff
    /// delivered.
    pub fn push(&self, deadline_tick: u64) -> bool {
        let message = Message::Relocate {
            index: 0,
            generation: 0,
            deadline: deadline_tick,
        };
        self.0.push(message, deadline_tick) == PushOutcome::Delivered
    }

    /// Consumer: pops every message ready; returns how many.
    pub fn drain(&self) -> usize {
        let mut messages = self.0.messages();
        std::iter::from_fn(|| messages.pop()).count()
    }

    /// Consumer: parks until tick `wake_tick` (loom has no timeouts: until woken) unless a
    /// message is waiting ([`Inbox::park`], short); true iff it parked. Yields when it did not
    /// (as the shard's worker does when its drain found nothing).
    pub fn park(&self, wake_tick: u64) -> bool {
        let parked = self.0.park(wake_tick, None, false, |_| false) == ParkOutcome::Woke;
        if !parked {
            thread::yield_now();
        }
        parked
    }
}
