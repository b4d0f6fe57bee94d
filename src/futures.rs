//! Futures on top of the engine: [`Sleep`], [`Timeout`] and [`Interval`], for any executor.
//!
//! Always compiled in: the only dependency they add is `futures-core` (for the `Stream` trait),
//! and they cost nothing when unused.
//!
//! A `Sleep` is a timer whose task only wakes a `Waker`: it runs inline on the shard thread, not
//! through the executor. Polling registers the waker, then checks the timer's state
//! (register-then-recheck), so a deadline that passes between the two is never missed; see the
//! `async_waker` model in `loom-tests/`.

use crate::TimerState;
use crate::engine::handle::TimerHandle;
use crate::engine::shard::ShardShared;
use crate::error::ScheduleError;
use crate::periodic::MissedTicks;
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

/// The timer behind a [`Sleep`], or why there is none.
enum Registration {
    Armed(TimerHandle),
    Failed {
        shard: Arc<ShardShared>,
        error: ScheduleError,
    },
}

/// A future that completes at a deadline: see [`Timer::sleep`](crate::Timer::sleep).
///
/// Completes with `Ok(())` once the deadline has passed (never before), or with
/// `Err(ScheduleError)` if the engine could not keep a timer for it (it is shut down, or full).
/// Dropping a pending `Sleep` cancels its timer at once.
#[must_use = "a Sleep does nothing unless awaited"]
pub struct Sleep {
    registration: Registration,
    shared: Arc<SleepWaker>,
    deadline: Instant,
    elapsed: bool,
}

impl fmt::Debug for Sleep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sleep")
            .field("deadline", &self.deadline)
            .field("elapsed", &self.elapsed)
            .finish()
    }
}

impl Sleep {
    /// A sleep until `deadline` on `shard`.
    pub(crate) fn new(shard: &Arc<ShardShared>, deadline: Instant) -> Sleep {
        let shared = Arc::new(SleepWaker {
            waker: AtomicWaker::new(),
        });
        let tick = shard.clock.tick_at(deadline);
        let registration = match ShardShared::submit(shard, tick, wake_task(shared.clone())) {
            Ok(handle) => Registration::Armed(handle),
            Err(error) => Registration::Failed {
                shard: shard.clone(),
                error,
            },
        };
        Sleep {
            registration,
            shared,
            deadline,
            elapsed: false,
        }
    }

    fn shard(&self) -> &Arc<ShardShared> {
        match &self.registration {
            Registration::Armed(handle) => &handle.shard,
            Registration::Failed { shard, .. } => shard,
        }
    }

    /// The instant this sleep completes at.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Whether the deadline has passed (as seen by the last poll).
    pub fn is_elapsed(&self) -> bool {
        self.elapsed
    }

    /// Moves the deadline (earlier or later), reusing this sleep's timer when it is still
    /// pending and its waker cell always: no new allocation. Works after completion too.
    pub fn reset(&mut self, deadline: Instant) {
        self.deadline = deadline;
        self.elapsed = false;
        let shard = match &self.registration {
            Registration::Armed(handle) => {
                if handle.reset_at(deadline) {
                    return;
                }
                handle.shard.clone()
            }
            Registration::Failed { shard, .. } => shard.clone(),
        };
        let tick = shard.clock.tick_at(deadline);
        self.registration = match ShardShared::submit(&shard, tick, wake_task(self.shared.clone()))
        {
            Ok(handle) => Registration::Armed(handle),
            Err(error) => Registration::Failed { shard, error },
        };
    }
}

impl Future for Sleep {
    type Output = Result<(), ScheduleError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if this.elapsed {
            return Poll::Ready(Ok(()));
        }
        let handle = match &this.registration {
            Registration::Armed(handle) => handle,
            Registration::Failed { error, .. } => return Poll::Ready(Err(*error)),
        };
        // Register first, then look: a fire in between wakes the new waker.
        this.shared.waker.register(cx.waker());
        match handle.state() {
            // The deadline may have passed without the shard having turned yet (a manual clock
            // moves only on `advance`): time, not the shard, decides.
            TimerState::Pending if handle.shard.clock.clock().now() >= this.deadline => {
                this.elapsed = true;
                Poll::Ready(Ok(()))
            }
            TimerState::Pending => Poll::Pending,
            TimerState::Expired => {
                this.elapsed = true;
                Poll::Ready(Ok(()))
            }
            // Only shutdown cancels a sleep's timer from the outside.
            TimerState::Cancelled => Poll::Ready(Err(ScheduleError::Shutdown)),
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Registration::Armed(handle) = &self.registration {
            handle.cancel();
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

/// A future with a deadline: see [`Timer::timeout`](crate::Timer::timeout).
///
/// Resolves to `Ok(output)` if the inner future completes first, `Err(Elapsed)` once the
/// deadline has passed. If the engine is shut down, the deadline can no longer be kept and the
/// inner future simply runs on (it is never cut short early).
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

    /// Gives the inner future back, cancelling the deadline.
    pub fn into_inner(self) -> F {
        self.future
    }
}

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: `future` is structurally pinned: it is never moved out of a pinned Timeout
        // (`into_inner` takes an unpinned `self`), and Timeout has no Drop impl that could
        // move it. `sleep` is `Unpin` and is not pinned.
        let this = unsafe { self.get_unchecked_mut() };
        // SAFETY: see above.
        let future = unsafe { Pin::new_unchecked(&mut this.future) };
        if let Poll::Ready(output) = future.poll(cx) {
            return Poll::Ready(Ok(output));
        }
        match Pin::new(&mut this.sleep).poll(cx) {
            Poll::Ready(Ok(())) => Poll::Ready(Err(Elapsed(()))),
            Poll::Ready(Err(_)) | Poll::Pending => Poll::Pending,
        }
    }
}

/// Ticks on a fixed-rate grid: see [`Timer::interval`](crate::Timer::interval).
///
/// The k-th tick (k = 1, 2, ...) is due `k * period` after the interval was made; a tick is
/// missed when it is observed after the next grid point has already passed, and then the
/// [`MissedTicks`] policy applies. Also a [`Stream`](futures_core::Stream) of tick instants.
#[derive(Debug)]
pub struct Interval {
    sleep: Sleep,
    period: Duration,
    missed: MissedTicks,
}

impl Interval {
    pub(crate) fn new(sleep: Sleep, period: Duration, missed: MissedTicks) -> Interval {
        Interval {
            sleep,
            period,
            missed,
        }
    }

    /// Completes at the next tick with the instant it was due.
    pub fn poll_tick(&mut self, cx: &mut Context<'_>) -> Poll<Result<Instant, ScheduleError>> {
        match Pin::new(&mut self.sleep).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Ready(Ok(())) => {
                let due = self.sleep.deadline();
                let now = self.sleep.shard().clock.clock().now();
                let next_point = due + self.period;
                let next = match self.missed {
                    MissedTicks::Burst => next_point,
                    MissedTicks::Delay if now >= next_point => now + self.period,
                    MissedTicks::Delay => next_point,
                    MissedTicks::Skip if now < next_point => next_point,
                    MissedTicks::Skip => {
                        let periods = (now - due).as_nanos() / self.period.as_nanos() + 1;
                        due + self.period * u32::try_from(periods).unwrap_or(u32::MAX)
                    }
                };
                self.sleep.reset(next);
                Poll::Ready(Ok(due))
            }
        }
    }

    /// Waits for the next tick; returns the instant it was due.
    pub async fn tick(&mut self) -> Result<Instant, ScheduleError> {
        std::future::poll_fn(|cx| self.poll_tick(cx)).await
    }

    /// The period.
    pub fn period(&self) -> Duration {
        self.period
    }
}

impl futures_core::Stream for Interval {
    type Item = Instant;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Instant>> {
        self.get_mut().poll_tick(cx).map(Result::ok)
    }
}
