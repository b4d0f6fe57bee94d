//! The process-wide default timer and the free functions on it: [`sleep`], [`sleep_until`],
//! [`timeout`], [`timeout_at`], [`interval`] and [`interval_at`], named and behaving as
//! `tokio::time`'s, so that moving a tokio server to shardwheel is a change of imports.
//!
//! The default timer is built with [`Timer::new`]'s defaults at the first call of any of them
//! (or of [`default_timer`]), unless [`set_default_timer`] built it before from a [`Builder`].
//! It lives as long as the process (it is never dropped; it is shut down only if its user calls
//! [`Timer::shutdown`] on it, and then its sleeps panic as any shut-down timer's do), so its
//! sleeps refer to its engine by a plain `&'static` reference (`Timer::static_engine_ref`), with
//! no reference count to bump per sleep. Nor does it change once built: each thread that makes
//! sleeps keeps a copy of what they need of it (`Local`), so that making one reads no line of
//! the timer's.

use crate::clock::{Deadline, cycle_deadline_after_unless_refresh};
use crate::engine::Engine;
use crate::engine::lease::{Forever, Lease};
use crate::error::{BuildError, DefaultTimerError};
use crate::futures::{Interval, LARGE_FUTURE, Sleep, Timeout};
use crate::sync::process::{Mutex, OnceLock};
use crate::timer::{Builder, Timer};
use std::cell::Cell;
use std::future::IntoFuture;
use std::time::{Duration, Instant};

static DEFAULT: OnceLock<Timer> = OnceLock::new();

/// Held while the default timer is being built, so that it is built once.
static BUILDING: Mutex<()> = Mutex::new(());

/// Builds the default timer with `build` unless it exists; returns it and whether this call
/// built it.
fn get_or_build(
    build: impl FnOnce() -> Result<Timer, BuildError>,
) -> Result<(&'static Timer, bool), BuildError> {
    if let Some(timer) = DEFAULT.get() {
        return Ok((timer, false));
    }
    let _building = BUILDING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(timer) = DEFAULT.get() {
        return Ok((timer, false));
    }
    let timer = build()?;
    Ok((DEFAULT.get_or_init(|| timer), true))
}

/// The process-wide default timer, built with the defaults ([`Timer::new`]) at the first call
/// unless [`set_default_timer`] built it before. A failed build is returned, and the next call
/// tries again.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let timer = shardwheel::default_timer()?;
/// assert!(!timer.is_shut_down());
/// # Ok(())
/// # }
/// ```
pub fn default_timer() -> Result<&'static Timer, BuildError> {
    get_or_build(Timer::new).map(|(timer, _)| timer)
}

/// Builds the process-wide default timer from `builder`. Must come before its first use (any
/// of the free functions, [`default_timer`], `HyperTimer::default()`): afterwards it returns
/// [`DefaultTimerError::AlreadyBuilt`] and changes nothing.
///
/// ```
/// use shardwheel::{DefaultTimerError, Timer};
/// use std::time::Duration;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let timer = shardwheel::set_default_timer(Timer::builder().shards(2))?;
/// assert!(matches!(
///     shardwheel::set_default_timer(Timer::builder()),
///     Err(DefaultTimerError::AlreadyBuilt)
/// ));
/// futures::executor::block_on(shardwheel::sleep(Duration::from_millis(1)));
/// assert_eq!(timer.stats().shards.len(), 2);
/// # Ok(())
/// # }
/// ```
pub fn set_default_timer(builder: Builder) -> Result<&'static Timer, DefaultTimerError> {
    match get_or_build(|| builder.build()) {
        Ok((timer, true)) => Ok(timer),
        Ok((_, false)) => Err(DefaultTimerError::AlreadyBuilt),
        Err(error) => Err(DefaultTimerError::Build(error)),
    }
}

/// The default timer for the free functions; panics (with the reason) if it cannot be built.
#[track_caller]
#[inline]
pub(crate) fn default() -> &'static Timer {
    match DEFAULT.get() {
        Some(timer) => timer,
        None => build_default(),
    }
}

/// [`default`] the first time: builds the default timer.
#[track_caller]
#[cold]
fn build_default() -> &'static Timer {
    match default_timer() {
        Ok(timer) => timer,
        Err(error) => panic!("shardwheel: could not build the default timer: {error}"),
    }
}

/// [`Timer::sleep`] on the default timer (`tokio::time::sleep`). Its timer, if pending when
/// the sleep is dropped, may be kept for its task's next sleep (see [`Sleep`], "Kept timers"),
/// as are those of [`sleep_until`], [`timeout`] and [`timeout_at`].
///
/// # Panics
///
/// If the default timer cannot be built (see [`default_timer`]), and when polled if the
/// default timer is full (see [`Sleep`]).
///
/// ```
/// futures::executor::block_on(shardwheel::sleep(std::time::Duration::from_millis(5)));
/// ```
#[track_caller]
#[inline]
pub fn sleep(delay: Duration) -> Sleep {
    local().sleep_after::<true>(delay)
}

/// What the default timer's sleeps need of it, copied to each thread that makes them: making
/// one then reads this thread's copy, not the lines from the timer to its engine (which a
/// server's worker, touching them once per request among its connections' data, finds cold).
/// The default timer never changes once built, so a copy never goes stale.
#[derive(Clone, Copy)]
struct Local {
    /// The engine and its clock's line.
    engine: Forever<Engine>,
    /// The engine's clock's cycle offset ([`TickClock::cycle_offset`](crate::clock::TickClock::cycle_offset)).
    cycle_offset: Option<u64>,
    /// [`Timer::keeps_timers`].
    keeps: bool,
}

impl Local {
    /// The sleep of [`sleep`]: its deadline from the copied offset on the cycle clock (as
    /// [`TickClock::cycle_deadline`](crate::clock::TickClock::cycle_deadline), which says why
    /// the other case is out of line), written whole (see `Sleep::whole`) if `WHOLE`. In line
    /// only where the reading needs no refresh: no call, so no stack frame in the caller.
    #[inline(always)]
    fn sleep_after<const WHOLE: bool>(self, delay: Duration) -> Sleep {
        match self
            .cycle_offset
            .and_then(|offset| cycle_deadline_after_unless_refresh(offset, delay))
        {
            Some(deadline) if WHOLE => self.sleep_until(deadline, delay).whole(),
            Some(deadline) => self.sleep_until(deadline, delay),
            None => self.sleep_after_out_of_line(delay),
        }
    }

    /// The sleep of [`sleep`] (`delay`) until `deadline`.
    #[inline(always)]
    fn sleep_until(self, deadline: Deadline, delay: Duration) -> Sleep {
        Sleep::with(
            Lease::forever(self.engine),
            deadline,
            delay.is_zero(),
            self.keeps,
        )
    }

    /// The sleep of [`sleep`] where the reading in line gave no deadline: until the engine's
    /// clock's deadline `delay` from now (on the cycle clock after a refresh, else an instant).
    #[cold]
    #[inline(never)]
    fn sleep_after_out_of_line(self, delay: Duration) -> Sleep {
        self.sleep_until(self.engine.value().clock.deadline_after(delay), delay)
    }
}

/// This thread's [`Local`], aligned to its size so that it never straddles two cache lines
/// (the alignment is the thread-local's, not the copies': a copy on the stack needs none).
#[repr(align(64))]
struct LocalCopy(Cell<Option<Local>>);

const _: () = {
    assert!(size_of::<LocalCopy>() == 64);
};

std::thread_local! {
    static LOCAL: LocalCopy = const { LocalCopy(Cell::new(None)) };
}

/// This thread's copy of the default timer (building the timer if it is not built).
#[track_caller]
#[inline(always)]
fn local() -> Local {
    match LOCAL.with(|copy| copy.0.get()) {
        Some(local) => local,
        None => local_first(),
    }
}

/// [`local`] on this thread's first call.
#[track_caller]
#[cold]
#[inline(never)]
fn local_first() -> Local {
    let timer = default();
    let engine = timer.static_engine();
    let local = Local {
        engine: Forever::new(engine),
        cycle_offset: engine.clock.cycle_offset(),
        keeps: timer.keeps_timers(),
    };
    LOCAL.with(|copy| copy.0.set(Some(local)));
    local
}

/// [`Timer::sleep_until`] on the default timer (`tokio::time::sleep_until`). Panics as
/// [`sleep`] does.
#[track_caller]
pub fn sleep_until(deadline: Instant) -> Sleep {
    let local = local();
    sleep_until_on(local.engine, local.keeps, deadline)
}

/// The default timer's sleep until `deadline`, from its engine and [`Timer::keeps_timers`]
/// however the caller holds them (this thread's [`Local`], a `HyperTimer`).
#[inline(always)]
pub(crate) fn sleep_until_on(engine: Forever<Engine>, keeps: bool, deadline: Instant) -> Sleep {
    Sleep::with(Lease::forever(engine), Deadline::At(deadline), false, keeps)
}

/// [`Timer::timeout`] on the default timer (`tokio::time::timeout`). Panics as [`sleep`] does.
///
/// ```
/// use std::time::Duration;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let answer = futures::executor::block_on(shardwheel::timeout(Duration::from_secs(1), async { 42 }))?;
/// assert_eq!(answer, 42);
/// # Ok(())
/// # }
/// ```
#[track_caller]
#[inline]
pub fn timeout<F: IntoFuture>(delay: Duration, future: F) -> Timeout<F::IntoFuture> {
    // Around a small future (a channel's receive, one read) the sleep is made inline, and the
    // compiler folds it into the caller (a loop over timeouts). Around a large one (a server's
    // response) it then builds the `Timeout` on the stack and copies it, and the caller's
    // future that holds it, more than once; with the sleep made by a call, it builds them in
    // place. Keep the future's argument first: evaluated after the call, it is copied again.
    Timeout::new(
        future.into_future(),
        if size_of::<F::IntoFuture>() > LARGE_FUTURE {
            sleep_out_of_line(delay)
        } else {
            sleep(delay)
        },
    )
}

/// [`sleep`], never inline: see [`timeout`].
#[track_caller]
#[inline(never)]
fn sleep_out_of_line(delay: Duration) -> Sleep {
    local().sleep_after::<false>(delay)
}

/// [`Timer::timeout_at`] on the default timer (`tokio::time::timeout_at`). Panics as [`sleep`]
/// does.
#[track_caller]
pub fn timeout_at<F: IntoFuture>(deadline: Instant, future: F) -> Timeout<F::IntoFuture> {
    Timeout::new(future.into_future(), sleep_until(deadline))
}

/// [`Timer::interval`] on the default timer (`tokio::time::interval`): the first tick at once.
/// Panics as [`sleep`] does, and if `period` is zero.
#[track_caller]
pub fn interval(period: Duration) -> Interval {
    interval_at(default().clock().now(), period)
}

/// [`Timer::interval_at`] on the default timer (`tokio::time::interval_at`). Panics as
/// [`interval`] does.
#[track_caller]
pub fn interval_at(start: Instant, period: Duration) -> Interval {
    Interval::new(
        Sleep::new(default().static_engine_ref(), Deadline::At(start)),
        period,
    )
}
