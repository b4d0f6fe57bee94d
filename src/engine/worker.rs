//! A shard's worker thread: drain the inbox, advance the wheel, hand off, sleep until the next
//! deadline or until woken.

use super::executor::Dispatch;
use super::inbox::{DRAIN_INTERVAL, ParkOutcome};
use super::shard::{DRAIN_BATCH, Handoff, ShardOwner, ShardShared};
use crate::sync::{Arc, thread, thread_local};
use std::cell::{Cell, RefCell};

#[cfg(not(loom))]
thread_local! {
    /// While a worker thread runs user code (inline tasks, task drops), its core waits here,
    /// so that a `shutdown()` called from that user code can take and close it.
    static PARKED_OWNER: RefCell<Option<ShardOwner>> = const { RefCell::new(None) };
    /// This thread's home shard ordinal (taken modulo the shard count); `usize::MAX` = unset.
    static HOME: Cell<usize> = const { Cell::new(usize::MAX) };
    /// This thread's stripe of striped counters; `usize::MAX` = unset.
    static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
}

// Loom's thread-locals take no `const` initializers.
#[cfg(loom)]
thread_local! {
    static PARKED_OWNER: RefCell<Option<ShardOwner>> = RefCell::new(None);
    static HOME: Cell<usize> = Cell::new(usize::MAX);
    static STRIPE: Cell<usize> = Cell::new(usize::MAX);
}

/// The ordinal this thread submits to (modulo the shard count), chosen at its first schedule
/// and kept: worker threads use their own shard; other threads take `first()` (a shard of the
/// CPU they run on, where known), else are spread round-robin in the order they first schedule.
pub(crate) fn home_ordinal(first: impl FnOnce() -> Option<usize>) -> usize {
    static NEXT: crate::sync::statistics::AtomicUsize =
        crate::sync::statistics::AtomicUsize::new(0);
    HOME.with(|home| {
        if home.get() == usize::MAX
            && let Some(ordinal) = first()
        {
            home.set(ordinal);
        }
        numbered(home, &NEXT)
    })
}

/// The number in `cell`, or, the first time (`usize::MAX`), the next one of `next`.
fn numbered(cell: &Cell<usize>, next: &crate::sync::statistics::AtomicUsize) -> usize {
    let value = cell.get();
    if value != usize::MAX {
        return value;
    }
    let value = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    cell.set(value);
    value
}

/// A number that differs between threads, for striped counters. Not the home ordinal: taking
/// one would pick a home shard for a thread that only resets timers.
pub(crate) fn counter_stripe() -> usize {
    static NEXT: crate::sync::statistics::AtomicUsize =
        crate::sync::statistics::AtomicUsize::new(0);
    STRIPE.with(|stripe| numbered(stripe, &NEXT))
}

/// Takes the core of `shard` if this thread is its worker and is running user code.
pub(crate) fn take_parked_owner(shard: &Arc<ShardShared>) -> Option<ShardOwner> {
    PARKED_OWNER.with(|parked| {
        let mut parked = parked.borrow_mut();
        match parked.as_ref() {
            Some(core) if Arc::ptr_eq(&core.shared, shard) => parked.take(),
            _ => None,
        }
    })
}

/// Runs and drops a turn's tasks with the core parked in [`PARKED_OWNER`]. Returns the core,
/// or `None` if user code shut the engine down and closed it meanwhile.
pub(crate) fn hand_off(
    core: ShardOwner,
    handoff: &mut Handoff,
    dispatch: &Dispatch,
) -> Option<ShardOwner> {
    let shared = core.shared.clone();
    if let Dispatch::Pool(_) = dispatch
        && handoff.inline.is_empty()
        && handoff.dropped.is_empty()
    {
        // Nothing runs on this thread: no need to park the core.
        dispatch.hand_off(handoff, &shared);
        return Some(core);
    }
    PARKED_OWNER.with(|parked| *parked.borrow_mut() = Some(core));
    dispatch.hand_off(handoff, &shared);
    PARKED_OWNER.with(|parked| parked.borrow_mut().take())
}

/// The worker loop. Returns the core when the inbox is closed, for shutdown to close it; `None`
/// if shutdown already took it (from user code running on this thread).
///
/// User code cannot make this thread panic ([`contain`](super::executor::contain) catches
/// it), but an engine bug could: then the shard is marked failed and its inbox closed
/// ([`ShardShared::fail`]), so that schedules routed to it fail with
/// `ScheduleError::ShardFailed` and `Stats` reports it; the turn's collected tasks are still
/// handed off (fired timers run), and the core is returned, so that `shutdown` returns the
/// timers it still holds. No timer is silently lost.
pub(crate) fn run(
    core: ShardOwner,
    dispatch: Dispatch,
    ordinal: usize,
    pin: Option<core_affinity::CoreId>,
) -> Option<ShardOwner> {
    let shared = core.shared.clone();
    shared.inbox.register_current_thread();
    HOME.with(|home| home.set(ordinal));
    if let Some(core_id) = pin {
        let pinned = core_affinity::set_for_current(core_id);
        shared
            .counters
            .pinned
            .store(pinned, std::sync::atomic::Ordering::Relaxed);
    }
    let mut core = Some(core);
    let mut handoff = Handoff::default();
    // Under loom a panic is the model checker's own report: let it through.
    #[cfg(loom)]
    turns(&mut core, &mut handoff, &dispatch);
    #[cfg(not(loom))]
    {
        use std::panic::{AssertUnwindSafe, catch_unwind};
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            turns(&mut core, &mut handoff, &dispatch);
        }));
        if let Err(payload) = outcome {
            super::executor::drop_uncounted(payload);
            shared.fail();
            // Mid-hand-off, the core waits in PARKED_OWNER (unless shutdown took it).
            let parked = core.take().or_else(|| take_parked_owner(&shared));
            core = match parked {
                Some(parked) => hand_off(parked, &mut handoff, &dispatch),
                None => {
                    dispatch.hand_off(&mut handoff, &shared);
                    None
                }
            };
        }
    }
    core
}

/// The shard's turns, until its inbox closes (the core is left in `slot`) or shutdown takes
/// the core from user code running on this thread (`slot` is left empty). The core stays in
/// `slot` (or parked in [`PARKED_OWNER`] during a hand-off) so that [`run`] finds it after a
/// panic.
fn turns(slot: &mut Option<ShardOwner>, handoff: &mut Handoff, dispatch: &Dispatch) {
    let Some(core) = slot.as_ref() else {
        return;
    };
    let shared = core.shared.clone();
    let clock = &shared.clock;
    let drain_ticks = clock.ticks_in(DRAIN_INTERVAL);
    let mut active = false;
    loop {
        #[cfg(debug_assertions)]
        if shared
            .fault
            .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            panic!("shard thread killed on purpose by the test fault hook");
        }
        let Some(core) = slot.as_mut() else {
            return;
        };
        let drained = core.drain_inbox(handoff);
        shared.inbox.consumed(drained);
        active |= drained > 0;
        core.expire(clock.now_tick(), handoff, dispatch.spill_every(), |tasks| {
            dispatch.spill(tasks, &shared)
        });
        core.flush_counters();
        if !handoff.is_empty() {
            let Some(taken) = slot.take() else { return };
            *slot = hand_off(taken, handoff, dispatch);
        }
        let Some(core) = slot.as_mut() else {
            return;
        };
        // Housekeeping after the hand-off, so that expired tasks never wait for it.
        core.cascade_ahead();
        let now = clock.now_tick();
        core.reclaim_idle_memory(now);
        if shared.inbox.is_closed() {
            return;
        }
        if drained == DRAIN_BATCH {
            continue;
        }
        let next = core.next_work().unwrap_or(u64::MAX);
        if next <= now {
            continue;
        }
        // Right after processing messages, look again within DRAIN_INTERVAL and let only
        // urgent messages wake us; when quiet, sleep until the next deadline and let any
        // message wake us.
        let drain_tick = now.saturating_add(drain_ticks);
        let (wake, long) = if active {
            (next.min(drain_tick), false)
        } else {
            (next, next > drain_tick)
        };
        active = false;
        match shared.inbox.park(wake, clock.until_tick(wake), long) {
            ParkOutcome::Closed => return,
            // Counted but not in the queue yet: its pusher is between push and count.
            ParkOutcome::MessagesWaiting if drained == 0 => thread::yield_now(),
            ParkOutcome::MessagesWaiting | ParkOutcome::Woke => {}
        }
    }
}
