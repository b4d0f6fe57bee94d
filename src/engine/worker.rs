//! A shard's worker thread: one [`ShardOwner::turn`] after another, and in between, sleeping
//! until the next deadline or until a message wakes it.

use super::executor::Dispatch;
use super::handoff::{self, Handoff};
use super::inbox::{BUSY_TAKE, DRAIN_INTERVAL, ParkOutcome, TRICKLE_INTERVAL};
use super::owner::{DRAIN_BATCH, OwnerHold, ShardOwner};
use super::placement;
use super::shared::ShardShared;
use super::time_slice;
use crate::sync::{Arc, thread, thread_local};
use std::cell::RefCell;

#[cfg(not(shardwheel_loom))]
thread_local! {
    /// While a worker thread runs user code (inline tasks, task drops), its owner waits here,
    /// so that a `shutdown()` called from that user code can take and close it.
    static PARKED_OWNER: RefCell<Option<ShardOwner>> = const { RefCell::new(None) };
}

// Loom's thread-locals take no `const` initializers.
#[cfg(shardwheel_loom)]
thread_local! {
    static PARKED_OWNER: RefCell<Option<ShardOwner>> = RefCell::new(None);
}

/// How a shard's worker thread asks the operating system to run it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Placing {
    /// The CPU to pin the thread to, if any.
    pub(crate) pin: Option<core_affinity::CoreId>,
    /// Whether to ask for short time slices ([`time_slice`]).
    pub(crate) short_time_slice: bool,
}

/// Starts shard `ordinal`'s worker thread, placed as `placing` says; it returns the owner
/// when it ends ([`run`]).
pub(crate) fn spawn(
    owner: ShardOwner,
    dispatch: Dispatch,
    ordinal: usize,
    placing: Placing,
) -> std::io::Result<thread::JoinHandle<Option<ShardOwner>>> {
    let run = move || run(owner, dispatch, ordinal, placing);
    #[cfg(not(shardwheel_loom))]
    return thread::Builder::new()
        .name(format!("shardwheel-shard-{ordinal}"))
        .spawn(run);
    #[cfg(shardwheel_loom)]
    return Ok(thread::spawn(run));
}

/// Takes the owner of `shard` if this thread is its worker and is running user code.
pub(crate) fn take_parked_owner(shard: &ShardShared) -> Option<ShardOwner> {
    PARKED_OWNER.with(|parked| {
        let mut parked = parked.borrow_mut();
        match parked.as_ref() {
            Some(owner) if std::ptr::eq(Arc::as_ptr(&owner.shared), shard) => parked.take(),
            _ => None,
        }
    })
}

/// Lets `shard` apply the messages in its inbox, for a thread that must wait until it has (a
/// reset of a repeating timer that found the most resets in flight: see
/// [`ShardShared::reset`]). A manual clock's shards turn only when driven: they are driven
/// here (an advance by zero, which runs the tasks due by then, as any advance would). The
/// shard's own worker, running user code (an inline task, a waker, a task's drop), would wait
/// for itself: it applies the inbox here, with the owner it parked, and drops what that lets go
/// of once the owner is parked again. Any other thread wakes the shard and yields.
pub(crate) fn let_catch_up(shard: &ShardShared) {
    let clock = shard.clock.clock();
    if clock.is_manual() {
        clock.advance(std::time::Duration::ZERO);
        return;
    }
    let Some(owner) = take_parked_owner(shard) else {
        shard.inbox.wake();
        thread::yield_now();
        return;
    };
    let mut handoff = Handoff::default();
    {
        // Parked again however the drain ends (a panic there is an engine bug).
        let mut parked = ParkAgain(Some(owner));
        if let Some(owner) = parked.0.as_mut() {
            owner.drain_inbox(&mut handoff);
        }
    }
    // Messages only end timers: their tasks are dropped, none runs.
    debug_assert!(handoff.expired.is_empty() && handoff.repeating.is_empty());
    handoff::run_here(&mut handoff, shard);
}

/// Parks its owner again when dropped (see [`let_catch_up`]).
struct ParkAgain(Option<ShardOwner>);

impl Drop for ParkAgain {
    fn drop(&mut self) {
        let owner = self.0.take();
        PARKED_OWNER.with(|parked| *parked.borrow_mut() = owner);
    }
}

/// Runs and drops a turn's tasks with the owner parked in [`PARKED_OWNER`]. Returns the
/// owner, or `None` if user code shut the engine down and closed it meanwhile.
fn hand_off(owner: ShardOwner, handoff: &mut Handoff, dispatch: &Dispatch) -> Option<ShardOwner> {
    let shared = owner.shared.clone();
    if let Dispatch::Pool(_) = dispatch
        && handoff.inline.is_empty()
        && handoff.dropped.is_empty()
    {
        // Nothing runs on this thread: no need to park the owner.
        handoff::hand_off(dispatch, handoff, &shared);
        return Some(owner);
    }
    PARKED_OWNER.with(|parked| *parked.borrow_mut() = Some(owner));
    handoff::hand_off(dispatch, handoff, &shared);
    PARKED_OWNER.with(|parked| parked.borrow_mut().take())
}

/// The worker's hold on its owner: in `slot`, or parked in [`PARKED_OWNER`] during a hand-off.
struct WorkerHold<'a> {
    slot: &'a mut Option<ShardOwner>,
    dispatch: &'a Dispatch,
}

impl OwnerHold for WorkerHold<'_> {
    fn owner(&mut self) -> Option<&mut ShardOwner> {
        self.slot.as_mut()
    }

    fn hand_off(&mut self, handoff: &mut Handoff) {
        if let Some(taken) = self.slot.take() {
            *self.slot = hand_off(taken, handoff, self.dispatch);
        }
    }
}

/// The worker loop. Returns the owner when the inbox is closed, for shutdown to close it;
/// `None` if shutdown already took it (from user code running on this thread).
///
/// User code cannot make this thread panic ([`contain`](super::executor::contain) catches
/// it), but an engine bug could: then the shard is marked failed and its inbox closed
/// ([`ShardShared::fail`]), so that schedules routed to it fail with
/// `ScheduleError::ShardFailed` and `Stats` reports it; the turn's collected tasks are still
/// handed off (fired timers run), and the owner is returned, so that `shutdown` returns the
/// timers it still holds. No timer is silently lost.
fn run(
    owner: ShardOwner,
    dispatch: Dispatch,
    ordinal: usize,
    placing: Placing,
) -> Option<ShardOwner> {
    let shared = owner.shared.clone();
    shared.inbox.register_current_thread();
    placement::set_home(ordinal);
    if let Some(core_id) = placing.pin {
        let pinned = core_affinity::set_for_current(core_id);
        shared
            .counters
            .pinned
            .store(pinned, std::sync::atomic::Ordering::Relaxed);
    }
    time_slice::exact_wake_ups_for_current_thread();
    if placing.short_time_slice {
        let granted = time_slice::request_for_current_thread();
        shared
            .counters
            .short_time_slice
            .store(granted, std::sync::atomic::Ordering::Relaxed);
    }
    let mut owner = Some(owner);
    let mut handoff = Handoff::default();
    // Under loom a panic is the model checker's own report: let it through.
    #[cfg(shardwheel_loom)]
    turns(&mut owner, &mut handoff, &dispatch);
    #[cfg(not(shardwheel_loom))]
    {
        use std::panic::{AssertUnwindSafe, catch_unwind};
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            turns(&mut owner, &mut handoff, &dispatch);
        }));
        if let Err(payload) = outcome {
            super::executor::drop_uncounted(payload);
            shared.fail();
            // Mid-hand-off, the owner waits in PARKED_OWNER (unless shutdown took it).
            let parked = owner.take().or_else(|| take_parked_owner(&shared));
            let parked = parked.map(|mut parked| {
                // Apply what was delivered first (the failure may have come before the turn
                // drained it): a sleep registered just before must be woken too. A second
                // panic here leaves the rest to `shutdown`.
                let drained = catch_unwind(AssertUnwindSafe(|| {
                    // As in `ShardOwner::close`: `fail` closed the inbox on this thread.
                    let delivered = shared.inbox.positions_taken();
                    while parked.drain_inbox_through(&mut handoff, delivered)
                        + parked.drain_stages(&mut handoff, true)
                        > 0
                    {}
                }));
                if let Err(payload) = drained {
                    super::executor::drop_uncounted(payload);
                }
                parked.wake_sleeps_after_failure(&mut handoff);
                parked
            });
            owner = match parked {
                Some(parked) => hand_off(parked, &mut handoff, &dispatch),
                None => {
                    handoff::hand_off(&dispatch, &mut handoff, &shared);
                    None
                }
            };
        }
    }
    owner
}

/// The shard's turns ([`ShardOwner::turn`]) and, between them, parking until the next work,
/// until its inbox closes (the owner is left in `slot`) or shutdown takes the owner from user
/// code running on this thread (`slot` is left empty). The owner stays in `slot` (or parked
/// in [`PARKED_OWNER`] during a hand-off) so that [`run`] finds it after a panic.
fn turns(slot: &mut Option<ShardOwner>, handoff: &mut Handoff, dispatch: &Dispatch) {
    let Some(owner) = slot.as_ref() else {
        return;
    };
    let shared = owner.shared.clone();
    let clock = &shared.clock;
    let drain_ticks = clock.ticks_in(DRAIN_INTERVAL);
    let trickle_ticks = clock.ticks_in(TRICKLE_INTERVAL);
    // Messages and staged timers taken since the last park.
    let mut taken = 0;
    loop {
        #[cfg(feature = "test-hooks")]
        if shared
            .fault
            .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            panic!("shard thread killed on purpose by the test fault hook");
        }
        let mut hold = WorkerHold {
            slot: &mut *slot,
            dispatch,
        };
        let Some(turn) = ShardOwner::turn(&mut hold, handoff, dispatch, true) else {
            return;
        };
        let Some(owner) = slot.as_mut() else {
            return;
        };
        let (drained, now) = (turn.drained, turn.now);
        taken += drained;
        if shared.inbox.is_closed() {
            return;
        }
        if drained == DRAIN_BATCH {
            continue;
        }
        let next = owner.next_work().unwrap_or(u64::MAX);
        if next <= now {
            continue;
        }
        // Right after taking messages or staged timers, look again within DRAIN_INTERVAL (a
        // busy inbox) or TRICKLE_INTERVAL (a trickle), and let only urgent messages wake us;
        // when quiet, sleep until the next deadline and let any message wake us.
        let drain_tick = now.saturating_add(drain_ticks);
        let (wake, long) = match taken {
            0 => (next, next > drain_tick),
            busy if busy >= BUSY_TAKE => (next.min(drain_tick), false),
            _ => (next.min(now.saturating_add(trickle_ticks)), false),
        };
        taken = 0;
        let staged_due = |tick| owner.staged_due_before(tick);
        match shared
            .inbox
            .park(wake, clock.until_tick(wake), long, staged_due)
        {
            ParkOutcome::Closed => return,
            // Nothing drained, yet something waits: a stage whose consumer role its producer
            // holds (reaping), or a message whose submitter is still writing it. Let them go on.
            ParkOutcome::MessagesWaiting if drained == 0 => thread::yield_now(),
            ParkOutcome::MessagesWaiting | ParkOutcome::Woke => {}
        }
    }
}
