//! Futures on top of the engine: [`Sleep`], [`Timeout`] and [`Interval`], for any executor,
//! with tokio's semantics (`tokio::time`'s types of the same names): switching from tokio is a
//! change of imports. [`Sleep`]'s documentation says how they differ (the engine's tick, and what
//! a sleep does when the engine cannot keep a timer).
//!
//! Always compiled in: the only dependency they add is `futures-core` (for the `Stream` trait),
//! and they cost nothing when unused.
//!
//! A `Sleep` is a timer whose task only wakes a `Waker`: it runs inline on the shard thread, not
//! through the executor. [`Sleep`]'s documentation says how it keeps the latest poll's waker
//! and never loses a wake-up; see the `sleep_*` models in `loom-tests/`.
//!
//! The calls a server makes at each request (a sleep's reset after a delay, the poll that takes
//! its task's kept timer, the drop that keeps it) are `#[inline]`, not because they are small:
//! so that the crate that calls them compiles a copy of its own and calls it directly. A call
//! into this crate's compiled code goes through the global offset table, one more data line,
//! which a request finds cold.

use crate::TimerState;
use crate::clock::{ClockLine, Deadline};
use crate::engine::Engine;
use crate::engine::lease::Lease;
use crate::engine::shared::ShardShared;
use crate::engine::stage::StagedAt;
use crate::engine::worker;
use crate::error::ScheduleError;
use crate::periodic::MissedTickBehavior;
use crate::task::Task;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, RawWakerVTable, Waker};
use std::time::{Duration, Instant};

mod kept;
mod whole;

/// The task of a [`Sleep`]'s timer: wakes the waker of the poll that scheduled it. A `Waker` is
/// 16 bytes, so the task stores it inline: no allocation.
fn wake_task(waker: Waker) -> Task {
    Task::new_inline(move || waker.wake())
}

/// How a [`Sleep`] refers to its engine: by a [`Lease`], counted on an owned timer's engine
/// (which it keeps alive without one count that every thread writes), uncounted on the
/// process-wide default timer's, which is never dropped.
pub(crate) type EngineRef = Lease<Engine>;

/// An armed [`Sleep`]'s timer: its shard's ordinal in the engine's `shards` and its slot. Like
/// a [`TimerHandle`](crate::TimerHandle) it owns one of the handles its slot counts, but it
/// holds no `Arc` of the shard (the sleep keeps the engine alive): whoever disarms the sleep
/// lets go of that handle ([`release`](Self::release) or
/// [`cancel_and_release`](Self::cancel_and_release)).
#[derive(Clone, Copy)]
struct TimerSlot {
    shard: u32,
    index: u32,
    generation: u32,
    /// Where the timer was staged (see [`stage`](crate::engine::stage)), if it was.
    staged: Option<StagedAt>,
    /// The tick it is due at, as its slot has it (see [`surely_pending`](Self::surely_pending)).
    tick: u64,
}

impl TimerSlot {
    /// An unarmed sleep's (meaning nothing).
    const NONE: TimerSlot = TimerSlot {
        shard: 0,
        index: 0,
        generation: 0,
        staged: None,
        tick: 0,
    };

    #[inline]
    fn shard(self, engine: &Engine) -> &ShardShared {
        &engine.shards[self.shard as usize]
    }

    /// [`TimerHandle::state`](crate::TimerHandle::state).
    fn state(self, engine: &Engine) -> TimerState {
        self.shard(engine).slots.state(self.index, self.generation)
    }

    /// Whether the timer is certainly pending, known without reading its slot
    /// (a line of the engine's that a server's worker, touching it once per request, finds
    /// cold): no shard has reached its tick, so it has not fired, and no shard of the engine
    /// has swept its timers, the only cancel not made by the timer's own sleep (or its
    /// thread's kept timers); both read on one line
    /// ([`ClockLine::neither_reached_nor_swept`], on the engine's clock's line, which a sleep
    /// on the default timer reads without reading the engine: see `Lease::line`). Either
    /// may have happened unseen just before: then its wake-up of this task comes after this
    /// poll, which polls again. `false` says nothing: read the slot.
    #[inline(always)]
    fn surely_pending(self, line: &ClockLine) -> bool {
        line.neither_reached_nor_swept(self.tick)
    }

    /// The timer's state: pending if [`surely_pending`](Self::surely_pending) says so, else
    /// as its slot has it.
    #[inline]
    fn known_state(self, engine: &Engine) -> TimerState {
        if self.surely_pending(engine.clock.line()) {
            TimerState::Pending
        } else {
            self.state(engine)
        }
    }

    /// [`TimerHandle::cancel`](crate::TimerHandle::cancel); the handle stays.
    fn cancel(self, engine: &Engine) -> bool {
        self.shard(engine).cancel(self.index, self.generation)
    }

    /// [`TimerHandle::reset_at`](crate::TimerHandle::reset_at).
    fn reset_at(&mut self, engine: &Engine, deadline: Instant) -> bool {
        let shard = self.shard(engine);
        let tick = shard.clock.tick_at(deadline);
        // One-shot: never waits for its shard.
        let moved = shard.reset(self.index, self.generation, tick, worker::let_catch_up);
        if moved {
            self.tick = tick;
        }
        moved
    }

    /// Counts `count` resets that moved only the sleep's deadline (see [`Sleep::reset`]), as
    /// the shard's `reset` counts those done in place.
    fn count_resets(self, engine: &Engine, count: u64) {
        self.shard(engine)
            .counters
            .count_resets(crate::stats::counter_stripe(), count);
    }

    /// Lets go of the handle (as dropping a `TimerHandle` does).
    fn release(self, engine: &Engine) {
        self.shard(engine).slots.drop_handle(self.index);
    }

    /// Cancels the timer (if pending) and lets go of the handle: on the thread that staged it,
    /// before its shard adopted it, by taking it back (`ShardShared::retract`: the shard never
    /// sees it); else in one compare-and-swap.
    fn cancel_and_release(self, engine: &Engine) {
        let shard = self.shard(engine);
        if let Some(at) = self.staged
            && shard.retract(at, self.index, self.generation)
        {
            return;
        }
        shard.cancel_and_release(self.index, self.generation);
    }
}

/// Which waker an armed [`Sleep`]'s timer task holds: its data and vtable addresses, compared
/// as [`Waker::will_wake`] compares two wakers. Kept instead of a clone of the waker (which
/// would cost a second clone per arm, and its drop).
///
/// An address alone could be reused by another waker once the one it named is gone. The one
/// named here is the task's own waker, which lives as long as the task: until the task runs
/// (the shard marks the timer FIRED first) or the shard drops it (after the timer left PENDING).
/// So a poll that has just read the timer PENDING compares with a waker that is alive, as is
/// the poll's own: equal addresses are then the same waker, never a reuse. The same holds for
/// a poll that knows the timer pending without reading it ([`TimerSlot::surely_pending`]): for
/// the poll's waker to have the addresses of a dead one, that one's drop, and so the timer's
/// end before it, must have happened before the poll, which would then have seen the end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct WakerIdentity {
    data: usize,
    vtable: usize,
}

impl WakerIdentity {
    /// No waker's (a vtable's address is never 0).
    const NONE: WakerIdentity = WakerIdentity { data: 0, vtable: 0 };

    #[inline]
    fn of(waker: &Waker) -> WakerIdentity {
        WakerIdentity {
            data: waker.data().addr(),
            vtable: std::ptr::from_ref::<RawWakerVTable>(waker.vtable()).addr(),
        }
    }
}

/// A future that completes at a deadline: see [`Timer::sleep`](crate::Timer::sleep) and
/// [`sleep`](crate::sleep()). Like `tokio::time::Sleep`.
///
/// # How it works
///
/// A `Sleep` is a deadline and a reference to its engine until its first poll: only then does
/// it schedule a timer, whose task wakes that poll's waker, inline on the shard thread. So a
/// `Sleep` that is never polled costs the engine nothing, and dropping it does nothing. The
/// first poll reads no clock, as tokio's does not: a deadline the engine has seen pass (at or
/// before the tick a shard last read the clock at, see `TickClock::tick_unless_passed`)
/// completes at once, and so does `sleep(Duration::ZERO)`; a deadline that passed since then
/// gets a timer, which fires at its shard's next turn (its shard is woken for it), as tokio's
/// does.
///
/// | state | poll | `reset(when)` | drop |
/// |-------|------|---------------|------|
/// | unarmed | a keeping sleep takes over a timer kept for this poll's task (`futures::kept`): armed; else deadline seen to pass: elapsed; else schedules a timer waking this poll's waker: armed | new deadline | nothing |
/// | armed | timer fired: if the deadline's tick is past the timer's, unarmed, then as unarmed; else (or, on a manual clock, deadline passed) elapsed (the timer let go); a waker that will not wake the same task as the timer's: cancels the timer and schedules one for the new waker; else pending | a tick at or after the timer's: new deadline only, the timer stays; before it: moves the timer to the deadline's tick in place (if it already fired: unarmed) | cancels the timer (a keeping sleep keeps it for its task's next one: see `futures::kept`) |
/// | elapsed | ready | unarmed, with the new deadline | nothing |
///
/// A reset that moves the deadline later, the common case (an idle timeout pushed back at each
/// request), touches no shared memory: the timer stays where it is, and when it fires, the
/// sleep's task is woken once before its deadline; that poll finds the deadline ahead and
/// schedules a timer for it. So a sleep reset at every request costs its engine one timer per
/// stretch of the timer's length, not a deadline swap per reset (tokio's driver, likewise,
/// finds such a timer fired early and stores it again). The early wake-up is one a future must
/// expect anyway; a sleep never completes before its deadline.
///
/// No wake-up is lost: a poll that returns pending either scheduled the timer for its own
/// waker, or found the timer pending with a waker that wakes the same task (the sleep keeps the
/// identity of the waker the timer's task holds, not a clone: see `WakerIdentity`). It finds
/// the timer pending without reading its slot while no shard has reached the timer's tick and
/// none has swept its timers (`TimerSlot::surely_pending`), else in the slot. A timer
/// that fires while a poll replaces it makes that poll's `cancel` fail, and the poll completes
/// instead. On a manual clock, a poll that
/// schedules looks at the time again afterwards, since the shard turns only in `advance`.
///
/// It completes once the deadline has passed, never before (deadlines round up to the engine's
/// tick, 1 ms by default, where tokio's also round up to 1 ms).
///
/// # Kept timers
///
/// A sleep of the default timer's free functions ([`sleep`](crate::sleep()),
/// [`sleep_until`](crate::sleep_until()), and the sleeps of [`timeout`](crate::timeout()) and
/// [`timeout_at`](crate::timeout_at())), or of `HyperTimer::default()` (feature `hyper`),
/// that is dropped while its timer is pending may leave that timer on its thread for its
/// task's next such sleep, which then takes it over instead of scheduling one. A task that
/// loops over timeouts (a connection's requests) so costs its engine about one timer per
/// timeout's length, not one per timeout. The timer is due at a tick no later than the next
/// sleep's deadline's; if it fires before that, the task is woken once early, and that sleep
/// schedules a timer for its own deadline (it never completes early). Beyond the thread's
/// latest such drop, a timer is kept only for a task that has dropped such a sleep on that
/// thread before; a bounded number per thread, each until it is taken over, displaced, fired
/// or the thread exits. A kept timer counts as pending in the timer's
/// [`stats`](crate::Timer::stats), and holds its task's waker (so the task's memory) as a
/// pending timer does. A default timer built with a
/// [`max_pending`](crate::Builder::max_pending) limit keeps none (a kept timer would hold a
/// place of the limit that no sleep holds). The mechanism is described in
/// `src/futures/kept.rs`.
///
/// # When the engine cannot keep a timer
///
/// If the engine is shut down (or is shut down while the sleep waits), or holds its
/// [`max_pending`](crate::Builder::max_pending) timers, a poll of the sleep **panics** with the
/// [`ScheduleError`] in the message, as a tokio sleep panics once its runtime is gone: it must
/// not complete (a `loop { sleep(d).await }` would spin) and must not wait forever (a task would
/// hang unnoticed). Callers who need the error instead use
/// [`Timer::try_sleep_until`](crate::Timer::try_sleep_until), which schedules at once and
/// returns it, and [`poll_sleep`](Sleep::poll_sleep), which reports a later shutdown as
/// `Err(ScheduleError::Shutdown)`. The process-wide default timer is shut down only if its
/// user calls [`Timer::shutdown`](crate::Timer::shutdown) on it.
#[must_use = "a Sleep does nothing unless awaited"]
pub struct Sleep {
    engine: EngineRef,
    deadline: Deadline,
    /// Whether a timer is scheduled: `timer` and `waker` mean something only then.
    armed: bool,
    /// The armed sleep's timer. Its tick is at or before the deadline's: before it if a reset
    /// has moved the deadline later without the timer, or the timer is a kept one (see
    /// [`timer_before_deadline`](Self::timer_before_deadline)).
    timer: TimerSlot,
    /// The waker its task wakes.
    waker: WakerIdentity,
    elapsed: bool,
    /// Dropped with a pending timer, it keeps the timer for its task's next sleep (see
    /// [`kept`]).
    keep: bool,
    /// Resets that moved only `deadline` while the armed timer stayed, not yet counted in the
    /// engine's stats: counted when the sleep lets go of that timer (`count_resets`), so
    /// that such a reset touches no line but the sleep's.
    uncounted_resets: u32,
}

impl fmt::Debug for Sleep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sleep")
            .field("deadline", &self.deadline())
            .field("armed", &self.armed)
            .field("elapsed", &self.elapsed)
            .finish()
    }
}

impl Sleep {
    /// A sleep until `deadline` on `engine`, not scheduled yet.
    #[inline]
    pub(crate) fn new(engine: EngineRef, deadline: Deadline) -> Sleep {
        Sleep::with(engine, deadline, false, false)
    }

    /// A sleep until `deadline` on `engine`, not scheduled yet: elapsed if `elapsed` (its
    /// deadline is known to have passed), and keeping its timer for its task's next sleep when
    /// dropped (see [`kept`]) if `keep`, which only a sleep whose engine is never dropped (the
    /// default timer's) acts on: the take and the keep each find that engine first. Built in
    /// place: a sleep is large enough that each move is a copy.
    #[inline]
    pub(crate) fn with(engine: EngineRef, deadline: Deadline, elapsed: bool, keep: bool) -> Sleep {
        Sleep {
            engine,
            deadline,
            armed: false,
            timer: TimerSlot::NONE,
            waker: WakerIdentity::NONE,
            elapsed,
            keep,
            uncounted_resets: 0,
        }
    }

    /// A keeping sleep's first poll: takes over the timer kept for `waker`'s task on this
    /// thread (see [`kept`]), if one is due at a tick at or before the deadline's and still
    /// pending.
    fn take_kept(&mut self, waker: &Waker) -> bool {
        let Some(engine) = self.engine.as_forever() else {
            return false;
        };
        kept::take(engine, WakerIdentity::of(waker), self)
    }

    /// Whether the clock is manual and shows the deadline passed (see `poll_sleep`).
    fn passed_on_manual_clock(&self) -> bool {
        let clock = &self.engine.clock;
        clock.clock().is_manual() && clock.tick_unless_passed(self.deadline).is_none()
    }

    /// [`reset`](Self::reset) by a caller that has just read the time, `now`: a deadline at or
    /// before it is elapsed at once, without a timer.
    fn reset_knowing(&mut self, deadline: Instant, now: Instant) {
        Pin::new(&mut *self).reset(deadline);
        self.elapsed = deadline <= now;
    }

    /// A sleep until `deadline` whose timer is scheduled now (unless the deadline has passed),
    /// with no waker yet: its first pending poll replaces the timer with one for its waker.
    pub(crate) fn armed(engine: EngineRef, deadline: Instant) -> Result<Sleep, ScheduleError> {
        let mut sleep = Sleep::new(engine, Deadline::At(deadline));
        let Some(tick) = sleep.engine.clock.tick_if_ahead(deadline) else {
            sleep.elapsed = true;
            return Ok(sleep);
        };
        match sleep.arm(tick, Waker::noop()) {
            Poll::Ready(Err(error)) => Err(error),
            Poll::Ready(Ok(())) | Poll::Pending => Ok(sleep),
        }
    }

    /// The instant this sleep completes at.
    pub fn deadline(&self) -> Instant {
        self.engine.clock.instant_of(self.deadline)
    }

    /// Whether the deadline has passed: a poll saw it, or the timer has fired. Two cases differ
    /// from tokio's: a `sleep(Duration::ZERO)` is elapsed before its first poll (tokio's from
    /// its first poll), and after a [`reset`](Self::reset) to a deadline that has passed, it
    /// is false until the next poll, which completes (tokio's reset fires its timer, so it is
    /// true at once).
    pub fn is_elapsed(&self) -> bool {
        self.elapsed
            || (self.armed
                && self.timer.state(&self.engine) == TimerState::Expired
                && (!self.timer_before_deadline()
                    || self
                        .engine
                        .clock
                        .tick_unless_passed(self.deadline)
                        .is_none()))
    }

    /// Moves the deadline (earlier or later), also after completion, in tokio's form:
    /// `sleep.as_mut().reset(when)` on a pinned sleep (or `Pin::new(&mut sleep)`, a `Sleep`
    /// being `Unpin`). An armed sleep's timer is moved in place if the deadline moves earlier
    /// than it; a later deadline leaves the timer where it is, and the sleep schedules a new one
    /// when it fires (see "How it works": one early wake-up of the task, never an early
    /// completion). An unarmed sleep's next poll schedules one.
    pub fn reset(self: Pin<&mut Self>, deadline: Instant) {
        self.get_mut().reset_to(Deadline::At(deadline));
    }

    /// [`reset`](Self::reset) to `deadline` in either form. The new deadline is stored first,
    /// from registers, and the cold case reads it from there (why: see
    /// `TickClock::cycle_deadline`).
    #[inline(always)]
    fn reset_to(&mut self, deadline: Deadline) {
        if self.reset_to_in_line(deadline) {
            return;
        }
        self.elapsed = false;
        self.deadline = deadline;
        self.reset_armed_past_in_line();
    }

    /// [`reset_to`](Self::reset_to)'s cases that need no call: an unarmed sleep, and a
    /// deadline whose tick is at or after the timer's ([`ClockLine::surely_due_by`], the
    /// current deadline the bound), with room in the count of resets. The timer then stays:
    /// the poll after it fires schedules one for the new deadline (see "How it works").
    /// Whether it reset; if not, nothing changed.
    #[inline(always)]
    fn reset_to_in_line(&mut self, deadline: Deadline) -> bool {
        if self.armed {
            let Some(uncounted) = self.uncounted_resets.checked_add(1) else {
                return false;
            };
            // The timer's tick is at or before the current deadline's (see `timer`).
            if !self
                .engine
                .line()
                .surely_due_by(self.timer.tick, self.deadline, deadline)
            {
                return false;
            }
            self.uncounted_resets = uncounted;
        }
        self.elapsed = false;
        self.deadline = deadline;
        true
    }

    /// [`reset_to`](Self::reset_to) of an armed sleep past its in-line case (the count full,
    /// a deadline whose tick is before the timer's, or an instant beyond representable time),
    /// the new deadline stored: the timer stays if its tick is at or before the deadline's,
    /// else it moves.
    #[inline(never)]
    fn reset_armed_past_in_line(&mut self) {
        if self
            .engine
            .clock
            .tick_no_later_than(self.timer.tick, self.deadline)
        {
            match self.uncounted_resets.checked_add(1) {
                Some(uncounted) => self.uncounted_resets = uncounted,
                None => self.count_resets_now(1),
            }
        } else {
            self.move_timer_to_deadline();
        }
    }

    /// [`reset`](Self::reset) to `delay` from now, reading the clock as [`sleep`](crate::sleep)
    /// does (on the system clock, from the cycle counter where that is sound: never before
    /// `Instant::now()`, at most tens of microseconds after it): never early, and without the
    /// ordered clock read of `reset(Instant::now() + delay)`. A delay beyond representable time
    /// never ends.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let timer = shardwheel::Timer::builder().shards(1).build()?;
    /// use std::time::Duration;
    /// let mut idle = std::pin::pin!(timer.sleep(Duration::from_secs(60)));
    /// // A request came in: the connection's idle timeout starts over.
    /// idle.as_mut().reset_after(Duration::from_secs(60));
    /// assert!(!idle.is_elapsed());
    /// # Ok(())
    /// # }
    /// ```
    // In line: see the module.
    #[inline]
    pub fn reset_after(self: Pin<&mut Self>, delay: Duration) {
        let this = self.get_mut();
        // A timeout pushed back (a connection's idle timeout, after each request) in line,
        // without a call, so without a stack frame: the reading of the clock that needs no
        // refresh, then the reset that needs no call. Past it, the clock is read again, to a
        // deadline no earlier.
        if let Some(deadline) = this.engine.line().cycle_deadline_unless_refresh(delay)
            && this.reset_to_in_line(deadline)
        {
            return;
        }
        this.reset_after_out_of_line(delay);
    }

    /// [`reset_after`](Self::reset_after) past its in-line case.
    #[inline(never)]
    fn reset_after_out_of_line(&mut self, delay: Duration) {
        let deadline = self.engine.clock.deadline_after(delay);
        self.reset_to(deadline);
    }

    /// Whether the armed timer's tick is before the deadline's: it fires early (a reset moved
    /// the deadline later without it, or it was a kept one), and the sleep then schedules one
    /// for its deadline.
    fn timer_before_deadline(&self) -> bool {
        self.timer.tick < self.engine.clock.tick_of(self.deadline)
    }

    /// The drop of an armed sleep: its timer kept for its task's next sleep (see [`kept`]), or
    /// cancelled. The case of a loop, whose previous timer was taken over, is in line
    /// ([`kept::keep_as_latest`]), without a stack frame; the others a call away. (In line: see
    /// the module.)
    #[inline]
    fn disarm(&mut self) {
        if self.uncounted_resets == 0
            && self.keep
            && let Some(engine) = self.engine.as_forever()
            && kept::keep_as_latest(engine, self)
        {
            return;
        }
        self.disarm_past_latest();
    }

    /// [`disarm`](Self::disarm) past its in-line case.
    #[inline(never)]
    fn disarm_past_latest(&mut self) {
        self.count_resets();
        if self.keep
            && let Some(engine) = self.engine.as_forever()
        {
            kept::keep(engine, self);
            return;
        }
        self.timer.cancel_and_release(&self.engine);
    }

    /// Lets go of the armed timer (which has fired, or been cancelled): unarmed.
    fn let_go_of_timer(&mut self) {
        self.count_resets();
        self.timer.release(&self.engine);
        self.armed = false;
    }

    /// Cancels the armed timer (if still pending) and lets go of it: unarmed.
    fn cancel_timer(&mut self) {
        self.count_resets();
        self.timer.cancel_and_release(&self.engine);
        self.armed = false;
    }

    /// Counts the resets not yet counted (see `uncounted_resets`): before the armed timer
    /// goes, since they are counted on its shard.
    #[inline]
    fn count_resets(&mut self) {
        if self.uncounted_resets != 0 {
            self.count_resets_now(0);
        }
    }

    /// [`count_resets`](Self::count_resets), plus `more`.
    #[cold]
    #[inline(never)]
    fn count_resets_now(&mut self, more: u64) {
        let count = u64::from(std::mem::take(&mut self.uncounted_resets)) + more;
        self.timer.count_resets(&self.engine, count);
    }

    /// [`reset`](Self::reset) of an armed sleep to a deadline (already stored) whose tick is
    /// before its timer's: the timer moves to the deadline's tick in place, unless it has fired
    /// (or shutdown cancelled it): then the next poll schedules anew.
    #[cold]
    #[inline(never)]
    fn move_timer_to_deadline(&mut self) {
        let instant = self.engine.clock.instant_of(self.deadline);
        if !self.timer.reset_at(&self.engine, instant) {
            self.let_go_of_timer();
        }
    }

    /// Schedules a timer due at `tick` (the deadline's) waking `waker` (the deadline is ahead, or
    /// was at the caller's look).
    fn arm(&mut self, tick: u64, waker: &Waker) -> Poll<Result<(), ScheduleError>> {
        let engine = &self.engine;
        let clock = engine.clock.clock();
        // The clone (user code) comes before the engine is touched: a panic in it changes
        // nothing there. The task is made where the timer waits (see `ShardShared::submit`).
        let task_waker = waker.clone();
        let identity = WakerIdentity::of(&task_waker);
        match engine.submit_slot(tick, move || wake_task(task_waker)) {
            Ok((shard, index, generation, staged)) => {
                // An engine cannot have 2^32 shards: each takes far more than a byte.
                debug_assert!(u32::try_from(shard).is_ok());
                let timer = TimerSlot {
                    shard: shard as u32,
                    index,
                    generation,
                    staged,
                    tick,
                };
                // A manual clock's shard turns only in `advance`: one that passed the deadline
                // and drove the shard before the timer reached it would leave the timer to the
                // next advance. Look at the time again (`now_ordered`: either it shows that
                // advance, or that advance's drive saw the timer). The `sleep_first_poll_*` loom
                // model deadlocks without this. The system clock's shard turns by itself.
                if clock.is_manual() && clock.now_ordered() >= self.deadline() {
                    timer.cancel_and_release(engine);
                    self.elapsed = true;
                    return Poll::Ready(Ok(()));
                }
                self.timer = timer;
                self.waker = identity;
                self.armed = true;
                Poll::Pending
            }
            Err(error) => Poll::Ready(Err(error)),
        }
    }

    /// Polls the sleep, reporting with an error what [`poll`](Future::poll) panics on: the
    /// engine could not keep a timer for it (it is shut down, or full). After an error the
    /// sleep is unarmed: a later poll tries again.
    #[inline]
    pub fn poll_sleep(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), ScheduleError>> {
        let this = self.get_mut();
        if this.elapsed {
            return Poll::Ready(Ok(()));
        }
        // The poll of a sleep waiting on the system clock, repeated while it waits (a
        // connection's idle timeout, polled after each request), in line: `poll_armed`'s
        // first case (its timer known pending, so the identities compare live wakers: see
        // `WakerIdentity`), without its call.
        if this.armed
            && this.timer.surely_pending(this.engine.line())
            && this.waker == WakerIdentity::of(cx.waker())
            && !this.engine.line().is_manual()
        {
            return Poll::Pending;
        }
        this.poll_unsure(cx)
    }

    /// [`poll_sleep`](Self::poll_sleep) past its in-line cases. Its own case is the first poll
    /// of a keeping sleep on the system clock that takes over its task's kept timer, the
    /// thread's latest (hyper's header-read sleep at each request, the timeout of a task that
    /// loops: [`kept::take_latest`]): a few lines of code and no stack frame, the other cases
    /// a call away. (In line: see the module.)
    #[inline]
    fn poll_unsure(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ScheduleError>> {
        if !self.armed
            && self.keep
            && !self.engine.line().is_manual()
            && let Some(engine) = self.engine.as_forever()
            && kept::take_latest(engine, WakerIdentity::of(cx.waker()), self)
        {
            return Poll::Pending;
        }
        self.poll_past_take(cx)
    }

    /// [`poll_unsure`](Self::poll_unsure) past its own case.
    #[inline(never)]
    fn poll_past_take(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ScheduleError>> {
        if self.armed
            && let Some(done) = self.poll_armed(cx)
        {
            return done;
        }
        // A kept timer is due at a tick at or before the deadline's: it fires no later than a
        // timer armed now would (at its shard's next turn if that tick has passed, and it is
        // not pending at all if the shard has seen its tick). But a manual clock's shard turns
        // only in `advance`, which may never come: there a passed deadline completes first.
        if self.keep && !self.passed_on_manual_clock() && self.take_kept(cx.waker()) {
            return Poll::Pending;
        }
        // Lazy registration: the first poll that does not know the deadline passed schedules
        // (reading no clock: see `tick_unless_passed`).
        let Some(tick) = self.engine.clock.tick_unless_passed(self.deadline) else {
            self.elapsed = true;
            return Poll::Ready(Ok(()));
        };
        self.arm(tick, cx.waker())
    }

    /// [`poll_sleep`](Self::poll_sleep) of an armed sleep; `None` if it is unarmed now, its
    /// timer having fired for a deadline that a reset has since moved later: the caller
    /// polls it as unarmed.
    fn poll_armed(&mut self, cx: &mut Context<'_>) -> Option<Poll<Result<(), ScheduleError>>> {
        let engine = &self.engine;
        let clock = engine.clock.clock();
        let timer = self.timer;
        let mut state = timer.known_state(engine);
        // A pending timer's shard fires it once its deadline passes, as tokio's driver does: a
        // poll reads no clock. But a manual clock's shard turns only in `advance`, which may
        // have passed the deadline before the timer reached the shard: there time decides.
        if state == TimerState::Pending
            && (!clock.is_manual() || clock.now_ordered() < self.deadline())
        {
            // The timer is pending, so its task's waker is alive: see `WakerIdentity`.
            if self.waker == WakerIdentity::of(cx.waker()) {
                return Some(Poll::Pending);
            }
            // Another task polls: the timer's task would wake the old one. Replace the timer,
            // unless it fired (or shutdown cancelled it) meanwhile.
            if timer.cancel(engine) {
                self.let_go_of_timer();
                let tick = self.engine.clock.tick_of(self.deadline);
                return Some(self.arm(tick, cx.waker()));
            }
            state = timer.state(engine);
        }
        match state {
            // It fired early: for the deadline before a reset moved it later, or it was a kept
            // one, due earlier.
            TimerState::Expired if self.timer_before_deadline() => {
                self.let_go_of_timer();
                None
            }
            TimerState::Pending => {
                self.cancel_timer();
                self.elapsed = true;
                Some(Poll::Ready(Ok(())))
            }
            TimerState::Expired => {
                self.let_go_of_timer();
                self.elapsed = true;
                Some(Poll::Ready(Ok(())))
            }
            // Only shutdown, or the failure of its shard, cancels a sleep's timer from the
            // outside.
            TimerState::Cancelled => {
                let error = timer.shard(engine).closed_error();
                self.let_go_of_timer();
                Some(Poll::Ready(Err(error)))
            }
        }
    }

    /// A [`Timeout`]'s poll of its deadline, once its future is pending.
    #[inline(always)]
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Poll<Elapsed> {
        // `poll_sleep`, not `Sleep::poll`: one call fewer per poll.
        match Pin::new(self).poll_sleep(cx) {
            Poll::Ready(Ok(())) => Poll::Ready(Elapsed(())),
            Poll::Ready(Err(error)) => cannot_keep_a_timer(error),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// The size (bytes) of a [`Timeout`]'s future above which its sleep is made
/// ([`timeout`](crate::timeout())) and the `Timeout` polled out of line: about where copying
/// the future a few times, or carrying the sleep's code in the callers that poll it, costs more
/// than a call. A large future's poll (a server's response, which hyper's dispatcher polls in
/// line) moves its output through each layer of futures around it, the `Timeout`'s `Result`
/// among them, on the stack of the function that polls: out of line, those copies live in a
/// frame of their own, not in the caller's, whose other calls then run on a shallower stack.
pub(crate) const LARGE_FUTURE: usize = 128;

/// The panic of a sleep whose engine cannot keep a timer: see [`Sleep`].
#[cold]
#[track_caller]
fn cannot_keep_a_timer(error: ScheduleError) -> ! {
    panic!(
        "shardwheel: a Sleep, Timeout or Interval cannot wait: {error} \
         (use Timer::try_sleep_until or Sleep::poll_sleep to get this as an error)"
    )
}

impl Future for Sleep {
    type Output = ();

    /// Completes once the deadline has passed. Panics if the engine cannot keep a timer for
    /// this sleep: see [`Sleep`].
    // In line: see the module.
    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.poll_sleep(cx) {
            Poll::Ready(Ok(())) => Poll::Ready(()),
            Poll::Ready(Err(error)) => cannot_keep_a_timer(error),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for Sleep {
    #[inline]
    fn drop(&mut self) {
        // An unarmed sleep (never polled, or done) holds nothing: in line, without a call.
        if self.armed {
            self.disarm();
        }
    }
}

/// The error of a [`Timeout`] whose deadline passed before its future completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Elapsed(());

impl fmt::Display for Elapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("deadline has elapsed")
    }
}

impl std::error::Error for Elapsed {}

/// As tokio's: an [`ErrorKind::TimedOut`](std::io::ErrorKind::TimedOut) error, so that
/// `timeout(d, io).await?` works in a function returning `io::Result`.
impl From<Elapsed> for std::io::Error {
    fn from(elapsed: Elapsed) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::TimedOut, elapsed)
    }
}

/// A future with a deadline: see [`Timer::timeout`](crate::Timer::timeout) and
/// [`timeout`](crate::timeout()). Like `tokio::time::Timeout`.
///
/// Each poll polls the inner future first: `Ok(output)` if it is ready (even when the deadline
/// has passed), else `Err(Elapsed)` once the deadline has passed. The deadline is a lazy
/// [`Sleep`], polled only when the inner future is pending: a future that is ready at its first
/// poll costs no timer at all. Like a [`Sleep`], it panics if the engine cannot keep its timer.
#[must_use = "a Timeout does nothing unless awaited"]
#[derive(Debug)]
pub struct Timeout<F> {
    // `sleep` first: around a large future (a server's response), the compiler then drops and
    // moves a `Timeout` with less code (callgrind on the example server).
    sleep: Sleep,
    future: F,
}

impl<F> Timeout<F> {
    #[inline]
    pub(crate) fn new(future: F, sleep: Sleep) -> Timeout<F> {
        Timeout { sleep, future }
    }

    /// The inner future.
    pub fn get_ref(&self) -> &F {
        &self.future
    }

    /// The inner future, mutably.
    pub fn get_mut(&mut self) -> &mut F {
        &mut self.future
    }

    /// Gives the inner future back, cancelling the deadline.
    pub fn into_inner(self) -> F {
        self.future
    }
}

impl<F: Future> Timeout<F> {
    /// [`poll`](Future::poll) (in line for a small future, see [`LARGE_FUTURE`]).
    #[inline(always)]
    fn poll_in_line(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<F::Output, Elapsed>> {
        // SAFETY: `future` is structurally pinned: it is never moved out of a pinned Timeout
        // (`get_mut` and `into_inner` need an unpinned one), and Timeout has no Drop impl that
        // could move it. `sleep` is `Unpin` and is not pinned.
        let this = unsafe { self.get_unchecked_mut() };
        // SAFETY: see above.
        let future = unsafe { Pin::new_unchecked(&mut this.future) };
        if let Poll::Ready(output) = future.poll(cx) {
            return Poll::Ready(Ok(output));
        }
        this.sleep.poll_deadline(cx).map(Err)
    }

    /// [`poll`](Future::poll) out of line, for a large future (see [`LARGE_FUTURE`]).
    #[inline(never)]
    fn poll_out_of_line(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<F::Output, Elapsed>> {
        self.poll_in_line(cx)
    }
}

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, Elapsed>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if size_of::<F>() > LARGE_FUTURE {
            self.poll_out_of_line(cx)
        } else {
            self.poll_in_line(cx)
        }
    }
}

/// How late a tick may be observed and still count as on time (tokio's figure).
const TICK_TOLERANCE: Duration = Duration::from_millis(5);

const NANOS_PER_SECOND: u128 = 1_000_000_000;

/// Ticks on a grid: see [`Timer::interval`](crate::Timer::interval) and
/// [`interval`](crate::interval()). Like `tokio::time::Interval`.
///
/// The k-th tick (k = 0, 1, ...) is due at `start + k * period`: the first one at `start`
/// (at once, for `interval(period)`). [`tick`](Self::tick) returns the instant the tick was
/// due. A tick observed more than 5 ms after it was due is late, and the
/// [`MissedTickBehavior`] (default [`Burst`](MissedTickBehavior::Burst)) decides the next one.
/// Also a [`Stream`](futures_core::Stream) of those instants, which never ends. Its timer is a
/// lazy [`Sleep`] (and panics as one does if the engine cannot keep it).
#[derive(Debug)]
pub struct Interval {
    sleep: Sleep,
    period: Duration,
    missed: MissedTickBehavior,
}

impl Interval {
    /// Panics if `period` is zero, as tokio's does (callers document it).
    #[track_caller]
    pub(crate) fn new(sleep: Sleep, period: Duration) -> Interval {
        assert!(
            !period.is_zero(),
            "shardwheel: an interval's `period` must be non-zero"
        );
        // The first tick is due at once if its deadline has passed.
        let mut sleep = sleep;
        sleep.elapsed = sleep.deadline() <= sleep.engine.clock.clock().now();
        Interval {
            sleep,
            period,
            missed: MissedTickBehavior::default(),
        }
    }

    fn now(&self) -> Instant {
        self.sleep.engine.clock.clock().now()
    }

    /// Completes at the next tick with the instant it was due.
    pub fn poll_tick(&mut self, cx: &mut Context<'_>) -> Poll<Instant> {
        match Pin::new(&mut self.sleep).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(()) => {
                let due = self.sleep.deadline();
                let now = self.now();
                let period = self.period;
                let late = due
                    .checked_add(TICK_TOLERANCE)
                    .is_none_or(|on_time| now > on_time);
                let next = match self.missed {
                    MissedTickBehavior::Delay if late => now.checked_add(period),
                    MissedTickBehavior::Skip if late => {
                        // How far `now` is past the grid's last point: less than a period, so a
                        // `Duration` (whose seconds are a u64), however long the period.
                        let behind = (now - due).as_nanos() % period.as_nanos();
                        let behind = Duration::new(
                            (behind / NANOS_PER_SECOND) as u64,
                            (behind % NANOS_PER_SECOND) as u32,
                        );
                        now.checked_add(period - behind)
                    }
                    _ => due.checked_add(period),
                };
                let next = next.unwrap_or_else(|| crate::clock::far_future(now));
                // Unarms the fired timer: the next poll schedules one for `next`, or completes
                // at once if `next` has passed (a burst catching up).
                self.sleep.reset_knowing(next, now);
                Poll::Ready(due)
            }
        }
    }

    /// Waits for the next tick; returns the instant it was due.
    pub async fn tick(&mut self) -> Instant {
        std::future::poll_fn(|cx| self.poll_tick(cx)).await
    }

    /// The period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// What the interval does about late ticks.
    pub fn missed_tick_behavior(&self) -> MissedTickBehavior {
        self.missed
    }

    /// Sets what the interval does about late ticks.
    pub fn set_missed_tick_behavior(&mut self, behavior: MissedTickBehavior) {
        self.missed = behavior;
    }

    /// The next tick is one period from now, and the grid continues from it.
    pub fn reset(&mut self) {
        self.reset_after(self.period);
    }

    /// The next tick is now, and the grid continues from it.
    pub fn reset_immediately(&mut self) {
        let now = self.now();
        self.sleep.reset_knowing(now, now);
    }

    /// The next tick is `after` from now, and the grid continues from it.
    pub fn reset_after(&mut self, after: Duration) {
        Pin::new(&mut self.sleep).reset_after(after);
    }

    /// The next tick is at `deadline`, and the grid continues from it.
    pub fn reset_at(&mut self, deadline: Instant) {
        Pin::new(&mut self.sleep).reset(deadline);
    }
}

impl futures_core::Stream for Interval {
    type Item = Instant;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Instant>> {
        self.get_mut().poll_tick(cx).map(Some)
    }
}
