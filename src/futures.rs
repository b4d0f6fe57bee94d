//! Futures on top of the engine: [`Sleep`], [`Timeout`] and [`Interval`], for any executor,
//! with tokio's semantics (`tokio::time`'s types of the same names): switching from tokio is a
//! change of imports. [`Sleep`]'s documentation says how they differ (the engine's tick, and what
//! a sleep does when the engine cannot keep a timer).
//!
//! Always compiled in: the only dependency they add is `futures-core` (for the `Stream` trait),
//! and they cost nothing when unused.
//!
//! A `Sleep` is a timer whose task only wakes a `Waker`: it runs inline on the shard thread, not
//! through the executor. Registration is lazy: the timer is scheduled at the first poll that
//! does not find the deadline passed, never before. Polling registers the waker, then checks
//! the timer's state (register-then-recheck), so a deadline that passes between the two is
//! never missed; see the `sleep_wakes_the_latest_waker` model in `loom-tests/`.

use crate::TimerState;
use crate::engine::Engine;
use crate::engine::handle::TimerHandle;
use crate::error::ScheduleError;
use crate::periodic::MissedTickBehavior;
use crate::sync::{Arc, AtomicUsize, Ordering, UnsafeCell};
use crate::task::Task;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

const WAITING: usize = 0;
const REGISTERING: usize = 0b01;
const WAKING: usize = 0b10;

/// A waker slot that one task registers into and another thread wakes, without a lock:
///
/// | state          | who may touch the waker cell                         |
/// |----------------|------------------------------------------------------|
/// | WAITING        | nobody; `register` or `wake` may claim it            |
/// | REGISTERING    | the registering poll                                 |
/// | WAKING         | the waking thread                                    |
/// | REGISTERING \| WAKING | the registering poll, which then wakes the waker |
pub(crate) struct AtomicWaker {
    state: AtomicUsize,
    waker: UnsafeCell<Option<Waker>>,
}

// SAFETY: the waker cell is only accessed by the one thread that claimed it through `state`
// (see the table above), and `Waker` is itself `Send + Sync`.
unsafe impl Sync for AtomicWaker {}

impl AtomicWaker {
    pub(crate) fn new() -> AtomicWaker {
        AtomicWaker {
            state: AtomicUsize::new(WAITING),
            waker: UnsafeCell::new(None),
        }
    }

    /// Registers `waker` to be woken by the next [`wake`](Self::wake). Only one thread may
    /// register at a time (it is called from `poll`, which takes `&mut self`).
    pub(crate) fn register(&self, waker: &Waker) {
        match self.state.compare_exchange(
            WAITING,
            REGISTERING,
            Ordering::Acquire,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                // SAFETY: REGISTERING gives this thread the cell: `wake` claims it only from WAITING.
                self.waker.with_mut(|cell| unsafe {
                    match &*cell {
                        Some(current) if current.will_wake(waker) => {}
                        _ => *cell = Some(waker.clone()),
                    }
                });
                if let Err(actual) = self.state.compare_exchange(
                    REGISTERING,
                    WAITING,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    // A wake came while we registered: it left the waking to us.
                    debug_assert_eq!(actual, REGISTERING | WAKING, "concurrent register");
                    // SAFETY: still ours: the waker saw REGISTERING and did not touch the cell.
                    let woken = self.waker.with_mut(|cell| unsafe { (*cell).take() });
                    self.state.swap(WAITING, Ordering::AcqRel);
                    if let Some(woken) = woken {
                        woken.wake();
                    }
                }
            }
            // A wake is in progress and may have taken the old waker: wake this one now.
            Err(WAKING) => waker.wake_by_ref(),
            Err(state) => debug_assert!(state & REGISTERING != 0, "unexpected waker state {state}"),
        }
    }

    /// Wakes the registered waker, if any.
    pub(crate) fn wake(&self) {
        if self.state.fetch_or(WAKING, Ordering::AcqRel) == WAITING {
            // SAFETY: moving from WAITING to WAKING gave this thread the cell.
            let woken = self.waker.with_mut(|cell| unsafe { (*cell).take() });
            self.state.fetch_and(!WAKING, Ordering::Release);
            if let Some(woken) = woken {
                woken.wake();
            }
        }
    }
}

/// What a [`Sleep`]'s timer task wakes.
struct SleepWaker {
    waker: AtomicWaker,
}

fn wake_task(shared: Arc<SleepWaker>) -> Task {
    Task::new_inline(move || shared.waker.wake())
}

/// A future that completes at a deadline: see [`Timer::sleep`](crate::Timer::sleep) and
/// [`sleep`](crate::sleep()). Like `tokio::time::Sleep`.
///
/// # How it works
///
/// A `Sleep` is a deadline and a reference to its engine until its first poll that finds the
/// deadline not yet passed: only then does it schedule a timer (whose task wakes the latest
/// poll's waker, inline on the shard thread). So a `Sleep` that is never polled, or is polled
/// only after its deadline, costs the engine nothing, and dropping it does nothing.
///
/// | state | poll | `reset(when)` | drop |
/// |-------|------|---------------|------|
/// | unarmed | deadline passed: elapsed; else schedules a timer: armed | new deadline | nothing |
/// | armed | timer fired or deadline passed: elapsed (the timer let go); else pending | moves the timer in place; if it already fired: unarmed | cancels the timer |
/// | elapsed | ready | unarmed, with the new deadline | nothing |
///
/// It completes once the deadline has passed, never before (deadlines round up to the engine's
/// tick, 1 ms by default, where tokio's also round up to 1 ms).
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
/// `Err(ScheduleError::Shutdown)`. The process-wide default timer is never shut down.
#[must_use = "a Sleep does nothing unless awaited"]
pub struct Sleep {
    engine: Arc<Engine>,
    deadline: Instant,
    /// The timer, while armed.
    timer: Option<TimerHandle>,
    /// The waker cell its timers wake: made at the first registration, reused by later ones.
    shared: Option<Arc<SleepWaker>>,
    elapsed: bool,
}

impl fmt::Debug for Sleep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sleep")
            .field("deadline", &self.deadline)
            .field("armed", &self.timer.is_some())
            .field("elapsed", &self.elapsed)
            .finish()
    }
}

impl Sleep {
    /// A sleep until `deadline` on `engine`, not scheduled yet.
    pub(crate) fn new(engine: &Arc<Engine>, deadline: Instant) -> Sleep {
        Sleep {
            engine: engine.clone(),
            deadline,
            timer: None,
            shared: None,
            elapsed: false,
        }
    }

    /// A sleep until `deadline` whose timer is scheduled now (unless the deadline has passed).
    pub(crate) fn armed(engine: &Arc<Engine>, deadline: Instant) -> Result<Sleep, ScheduleError> {
        let mut sleep = Sleep::new(engine, deadline);
        if engine.clock.clock().now() >= deadline {
            sleep.elapsed = true;
        } else {
            let shared = Arc::new(SleepWaker {
                waker: AtomicWaker::new(),
            });
            let tick = engine.clock.tick_at(deadline);
            sleep.timer = Some(engine.submit(tick, wake_task(shared.clone()))?);
            sleep.shared = Some(shared);
        }
        Ok(sleep)
    }

    /// The instant this sleep completes at.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Whether the deadline has passed: a poll saw it, or the timer has fired.
    pub fn is_elapsed(&self) -> bool {
        self.elapsed
            || self
                .timer
                .as_ref()
                .is_some_and(|timer| timer.state() == TimerState::Expired)
    }

    /// Moves the deadline (earlier or later), also after completion, in tokio's form:
    /// `sleep.as_mut().reset(when)` on a pinned sleep (or `Pin::new(&mut sleep)`, a `Sleep`
    /// being `Unpin`). An armed sleep's timer is moved in place; otherwise the next poll
    /// schedules one. The waker cell is reused: no allocation.
    pub fn reset(self: Pin<&mut Self>, deadline: Instant) {
        let this = self.get_mut();
        this.deadline = deadline;
        this.elapsed = false;
        if let Some(timer) = &this.timer
            && !timer.reset_at(deadline)
        {
            // It fired (or shutdown cancelled it): the next poll schedules anew.
            this.timer = None;
        }
    }

    /// Polls the sleep, reporting with an error what [`poll`](Future::poll) panics on: the
    /// engine could not keep a timer for it (it is shut down, or full). After an error the
    /// sleep is unarmed: a later poll tries again.
    pub fn poll_sleep(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), ScheduleError>> {
        let this = self.get_mut();
        if this.elapsed {
            return Poll::Ready(Ok(()));
        }
        let clock = this.engine.clock.clock();
        let Some(timer) = &this.timer else {
            // Lazy registration: the first poll that finds the deadline ahead schedules.
            if clock.now() >= this.deadline {
                this.elapsed = true;
                return Poll::Ready(Ok(()));
            }
            let shared = this.shared.get_or_insert_with(|| {
                Arc::new(SleepWaker {
                    waker: AtomicWaker::new(),
                })
            });
            // Registered before the timer exists: its wake-up cannot be missed.
            shared.waker.register(cx.waker());
            let tick = this.engine.clock.tick_at(this.deadline);
            return match this.engine.submit(tick, wake_task(shared.clone())) {
                Ok(timer) => {
                    this.timer = Some(timer);
                    Poll::Pending
                }
                Err(error) => Poll::Ready(Err(error)),
            };
        };
        // Register first, then look: a fire in between wakes the new waker.
        if let Some(shared) = &this.shared {
            shared.waker.register(cx.waker());
        }
        match timer.state() {
            // The deadline may have passed without the shard having turned yet (a manual clock
            // moves only on `advance`): time, not the shard, decides.
            TimerState::Pending if clock.now() < this.deadline => Poll::Pending,
            state @ (TimerState::Pending | TimerState::Expired) => {
                if state == TimerState::Pending {
                    timer.cancel();
                }
                this.timer = None;
                this.elapsed = true;
                Poll::Ready(Ok(()))
            }
            // Only shutdown cancels a sleep's timer from the outside.
            TimerState::Cancelled => {
                this.timer = None;
                Poll::Ready(Err(ScheduleError::Shutdown))
            }
        }
    }
}

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
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.poll_sleep(cx) {
            Poll::Ready(Ok(())) => Poll::Ready(()),
            Poll::Ready(Err(error)) => cannot_keep_a_timer(error),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(timer) = &self.timer {
            timer.cancel();
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
    future: F,
    sleep: Sleep,
}

impl<F> Timeout<F> {
    pub(crate) fn new(future: F, sleep: Sleep) -> Timeout<F> {
        Timeout { future, sleep }
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

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: `future` is structurally pinned: it is never moved out of a pinned Timeout
        // (`get_mut` and `into_inner` need an unpinned one), and Timeout has no Drop impl that
        // could move it. `sleep` is `Unpin` and is not pinned.
        let this = unsafe { self.get_unchecked_mut() };
        // SAFETY: see above.
        let future = unsafe { Pin::new_unchecked(&mut this.future) };
        if let Poll::Ready(output) = future.poll(cx) {
            return Poll::Ready(Ok(output));
        }
        match Pin::new(&mut this.sleep).poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(Elapsed(()))),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// How late a tick may be observed and still count as on time (tokio's figure).
const TICK_TOLERANCE: Duration = Duration::from_millis(5);

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
    pub(crate) fn new(sleep: Sleep, period: Duration) -> Interval {
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
                let late = due.checked_add(TICK_TOLERANCE).is_none_or(|on_time| now > on_time);
                let next = match self.missed {
                    MissedTickBehavior::Delay if late => now.checked_add(period),
                    MissedTickBehavior::Skip if late => {
                        let behind = (now - due).as_nanos() % period.as_nanos();
                        now.checked_add(period - Duration::from_nanos(behind as u64))
                    }
                    _ => due.checked_add(period),
                };
                let next = next.unwrap_or_else(|| crate::timer::far_future(now));
                // Unarms the fired timer: the next poll schedules one for `next`.
                Pin::new(&mut self.sleep).reset(next);
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
        let now = self.now();
        self.reset_at(now.checked_add(self.period).unwrap_or_else(|| crate::timer::far_future(now)));
    }

    /// The next tick is now, and the grid continues from it.
    pub fn reset_immediately(&mut self) {
        let now = self.now();
        self.reset_at(now);
    }

    /// The next tick is `after` from now, and the grid continues from it.
    pub fn reset_after(&mut self, after: Duration) {
        let now = self.now();
        self.reset_at(now.checked_add(after).unwrap_or_else(|| crate::timer::far_future(now)));
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
