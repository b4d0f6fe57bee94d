//! Where time comes from: the system's monotonic clock, or a manual clock that only moves when
//! a test says so. The wheel itself never reads a clock; shards read this one and pass ticks in.

use crate::sync::AtomicU64;
use crate::sync::registry::{Arc, Weak};
use crate::sync::{Mutex, lock};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// A source of time for a [`Timer`](crate::Timer).
///
/// [`Clock::system`] (the default) follows [`Instant::now`]. [`Clock::manual`] stands still
/// until [`Clock::advance`] moves it; a timer built on a manual clock has no shard threads,
/// and `advance` itself drives every shard, so when it returns every timer due by the new time
/// has been handed to run. This is also how the loom models drive the engine.
///
/// ```
/// use shardwheel::{Clock, Executor, Timer};
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use std::sync::Arc;
/// use std::time::Duration;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let clock = Clock::manual();
/// // Inline execution: `advance` returns after the due tasks have run, not just been handed off.
/// let timer = Timer::builder().clock(clock.clone()).executor(Executor::Inline).build()?;
/// let fired = Arc::new(AtomicBool::new(false));
/// let flag = fired.clone();
/// timer.schedule(Duration::from_secs(3600), move || flag.store(true, Ordering::SeqCst))?;
/// clock.advance(Duration::from_secs(3599));
/// assert!(!fired.load(Ordering::SeqCst));
/// clock.advance(Duration::from_secs(1));
/// assert!(fired.load(Ordering::SeqCst));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, Default)]
pub struct Clock {
    manual: Option<Arc<ManualTime>>,
}

/// Something a manual clock drives when it moves.
pub(crate) trait Driven: Send + Sync {
    /// Hands every timer due by the clock's current time to run.
    fn drive(&self);
}

pub(crate) struct ManualTime {
    origin: Instant,
    /// Loom-visible: [`Clock::now_ordered`]'s argument (a schedule and an `advance` never miss
    /// each other) rests on the read-modify-writes of this word.
    offset_nanos: AtomicU64,
    driven: Mutex<Vec<Weak<dyn Driven>>>,
}

impl std::fmt::Debug for ManualTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManualTime")
            .field("offset_nanos", &self.offset_nanos.load(Ordering::Relaxed))
            .finish()
    }
}

impl Clock {
    /// The system's monotonic clock ([`Instant::now`]).
    pub fn system() -> Clock {
        Clock { manual: None }
    }

    /// A clock that stands still until [`advance`](Self::advance) moves it.
    pub fn manual() -> Clock {
        Clock {
            manual: Some(Arc::new(ManualTime {
                origin: Instant::now(),
                offset_nanos: AtomicU64::new(0),
                driven: Mutex::new(Vec::new()),
            })),
        }
    }

    /// Whether this is a manual clock.
    #[inline]
    pub fn is_manual(&self) -> bool {
        self.manual.is_some()
    }

    /// The current time.
    pub fn now(&self) -> Instant {
        match &self.manual {
            None => Instant::now(),
            Some(manual) => {
                manual.origin + Duration::from_nanos(manual.offset_nanos.load(Ordering::Acquire))
            }
        }
    }

    /// [`now`](Self::now), ordered after the calling thread's earlier read-modify-writes: a
    /// manual clock's time is read with one. So a thread that handed a timer to a shard (an
    /// atomic read-modify-write on the inbox) and then reads the time either sees an
    /// [`advance`](Self::advance) that moved it, or that advance's drive (after its own
    /// read-modify-write of the time) sees the timer: never neither. The system clock's `now`.
    pub(crate) fn now_ordered(&self) -> Instant {
        match &self.manual {
            None => Instant::now(),
            Some(manual) => {
                manual.origin
                    + Duration::from_nanos(manual.offset_nanos.fetch_add(0, Ordering::AcqRel))
            }
        }
    }

    /// Moves a manual clock forward by `by` and returns once every timer due by the new time,
    /// on every timer engine built on this clock, has been handed to run (tasks that run
    /// inline have run). Does nothing to the system clock. A timer engine's time stops about
    /// 584 years (2^64 ns) after it was built: a timer due later never fires.
    pub fn advance(&self, by: Duration) {
        let Some(manual) = &self.manual else { return };
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let _ = manual
            .offset_nanos
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                Some(now.saturating_add(by))
            });
        let driven: Vec<Arc<dyn Driven>> = {
            let mut list = lock(&manual.driven);
            list.retain(|weak| weak.strong_count() > 0);
            list.iter().filter_map(Weak::upgrade).collect()
        };
        for engine in driven {
            engine.drive();
        }
    }

    pub(crate) fn register(&self, engine: Weak<dyn Driven>) {
        if let Some(manual) = &self.manual {
            lock(&manual.driven).push(engine);
        }
    }
}

/// Division of nanoseconds by the tick length without a division instruction (every schedule
/// turns its deadline into a tick): a multiplication by a precomputed reciprocal, then one
/// correction step. Exact: the same quotient as the division.
///
/// With `r = floor(2^64 / d)` (`d >= 2`), `floor(n * r / 2^64)` is `floor(n / d)` or one less,
/// for every `n < 2^64`: `r = 2^64 / d - e` with `0 <= e < 1`, so `n * r / 2^64` falls short
/// of `n / d` by `n * e / 2^64 < 1`. The remainder `n - q * d` then tells which (it is below
/// `d` exactly when `q` is the quotient).
#[derive(Clone, Copy, Debug)]
pub(crate) struct TickDivisor {
    /// The divisor `d`, at least 1.
    tick_nanos: u64,
    /// `floor(2^64 / d)`; 0 for `d = 1`, which divides by nothing.
    reciprocal: u64,
}

impl TickDivisor {
    pub(crate) fn new(tick_nanos: u64) -> TickDivisor {
        let tick_nanos = tick_nanos.max(1);
        let reciprocal = if tick_nanos == 1 {
            0
        } else {
            ((1u128 << 64) / tick_nanos as u128) as u64
        };
        TickDivisor {
            tick_nanos,
            reciprocal,
        }
    }

    /// `(nanos / d, nanos % d)`.
    #[inline]
    pub(crate) fn div_rem(self, nanos: u64) -> (u64, u64) {
        if self.tick_nanos == 1 {
            return (nanos, 0);
        }
        let mut quotient = ((nanos as u128 * self.reciprocal as u128) >> 64) as u64;
        // No overflow: `quotient <= nanos / d`.
        let mut remainder = nanos - quotient * self.tick_nanos;
        if remainder >= self.tick_nanos {
            quotient += 1;
            remainder -= self.tick_nanos;
        }
        (quotient, remainder)
    }

    /// `nanos / d`, rounded up.
    #[inline]
    pub(crate) fn div_ceil(self, nanos: u64) -> u64 {
        let (quotient, remainder) = self.div_rem(nanos);
        // No overflow: for `d >= 2` the quotient is below `u64::MAX`; for `d = 1` there is no
        // remainder.
        quotient + u64::from(remainder != 0)
    }
}

/// A deadline as a [`TickClock`] keeps it: an instant, or, where the cycle clock made it (a
/// delay from now, [`TickClock::deadline_after`]), nanoseconds since the clock's origin, which
/// turn into a tick without the instant arithmetic (the same tick: the instant is
/// [`TickClock::instant_of`] it).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Deadline {
    At(Instant),
    Nanos(u64),
}

impl Deadline {
    /// Whether it is at or before `other`, where that is known by one comparison: both of one
    /// form, on one clock. Then its tick is at or before `other`'s (ticks round up), so a timer
    /// due no later than it is due no later than `other` too, with no tick computed (the
    /// instant arithmetic of [`TickClock::tick_of`] is dozens of instructions). False says
    /// nothing.
    #[inline(always)]
    pub(crate) fn surely_no_later_than(self, other: Deadline) -> bool {
        match (self, other) {
            (Deadline::At(this), Deadline::At(other)) => this <= other,
            (Deadline::Nanos(this), Deadline::Nanos(other)) => this <= other,
            _ => false,
        }
    }
}

/// The most nanoseconds since its origin a [`TickClock`] reads (about 584 years: only a manual
/// clock gets there): one short of `u64::MAX`, so that the current tick never reaches
/// `u64::MAX`, the tick of deadlines beyond representable time, which never come. Time stops
/// there: a timer due later never fires.
const LAST_NANOS: u64 = u64::MAX - 1;

/// A clock seen in ticks of a fixed length since a fixed origin: how shards and handles turn
/// instants into wheel deadlines.
#[derive(Clone, Debug)]
pub(crate) struct TickClock {
    clock: Clock,
    origin: Instant,
    tick_nanos: u64,
    /// Divides by `tick_nanos`.
    divisor: TickDivisor,
    /// For the system clock: `origin` in nanoseconds since the cycle clock's origin, so that
    /// [`tick_after`](Self::tick_after) can read the cheap cycle clock. [`ClockLine`] holds a
    /// copy for sleeps; handles and shards read this one, on the line of the engine or shard
    /// they read anyway.
    cycle_offset: Option<u64>,
    /// What every clone shares (the engine's and its shards'), on a line of its own.
    line: std::sync::Arc<crossbeam_utils::CachePadded<ClockLine>>,
}

/// The line of a [`TickClock`] that every clone shares, and all that a `Sleep`'s calls at each
/// request read of its engine: how far the engine's shards got, as far as a sleep needs to
/// know that its timer has not fired without reading its slot
/// (`futures::TimerSlot::surely_pending`), and copies of the clock's kind, cycle offset, tick
/// length and origin, which never change. A sleep on an engine that is never dropped holds a
/// reference to it (`engine::lease::Lease`), so that its poll, its resets and its take of a
/// kept timer read this line, not the engine's as well. The two progress fields only grow.
#[derive(Debug)]
pub(crate) struct ClockLine {
    /// The latest tick [`now_tick`](TickClock::now_tick) read (by any clone: shards read it at
    /// every turn), a tick known to have passed: see
    /// [`tick_unless_passed`](TickClock::tick_unless_passed).
    tick: crate::sync::statistics::AtomicU64,
    /// Set before a shard cancels timers from outside their owners, which only shutdown's
    /// sweep (`ShardOwner::close`) and the wake-ups after a failure do; never cleared. Until
    /// then a `Sleep` knows its timer pending while no shard has reached its tick. Orders
    /// nothing itself: the sweep wakes the sleeps' tasks after it, so a poll that follows such
    /// a wake-up sees it set. Plain `std` under loom for that reason.
    swept: crate::sync::statistics::AtomicBool,
    /// Whether the clock is manual (a copy of the clock's kind).
    manual: bool,
    /// A copy of [`TickClock::cycle_offset`].
    cycle_offset: Option<u64>,
    /// A copy of the tick's length in nanoseconds.
    tick_nanos: u64,
    /// A copy of the origin.
    origin: Instant,
}

impl ClockLine {
    /// [`TickClock::not_reached`].
    #[inline]
    pub(crate) fn not_reached(&self, tick: u64) -> bool {
        tick > self.tick.load(Ordering::Relaxed)
    }

    /// [`not_reached`](Self::not_reached), and no shard of the engine has swept its timers
    /// ([`TickClock::note_sweep`]): a timer due at `tick` is still pending unless its own
    /// sleep (or its thread's kept timers) cancelled it. One line read for both.
    #[inline]
    pub(crate) fn neither_reached_nor_swept(&self, tick: u64) -> bool {
        self.not_reached(tick) && !self.swept.load(Ordering::Relaxed)
    }

    /// [`TickClock::tick_no_later_than`] where it is known in a few instructions on this line:
    /// always but for an instant beyond about 584 years from the origin (false there says
    /// nothing).
    #[inline(always)]
    pub(crate) fn surely_tick_no_later_than(&self, tick: u64, deadline: Deadline) -> bool {
        match deadline {
            Deadline::Nanos(nanos) => self.tick_no_later_than_nanos(tick, nanos),
            Deadline::At(instant) => nanos_since(self.origin, instant)
                .is_some_and(|nanos| self.tick_no_later_than_nanos(tick, nanos)),
        }
    }

    /// Whether a timer due at `tick`, at or before the tick of `bound` (an armed sleep's
    /// deadline, or the deadline of the sleep that kept the timer), surely fires no later than
    /// one for `deadline` would: `bound` surely no later than `deadline`
    /// ([`Deadline::surely_no_later_than`], no tick computed), else
    /// [`surely_tick_no_later_than`](Self::surely_tick_no_later_than). False says nothing.
    #[inline(always)]
    pub(crate) fn surely_due_by(&self, tick: u64, bound: Deadline, deadline: Deadline) -> bool {
        bound.surely_no_later_than(deadline) || self.surely_tick_no_later_than(tick, deadline)
    }

    /// [`TickClock::tick_no_later_than`] of a deadline `nanos` nanoseconds since the origin:
    /// `tick <= ceil(nanos / d)` is `(tick - 1) * d < nanos` (for a tick above 0).
    #[inline(always)]
    fn tick_no_later_than_nanos(&self, tick: u64, nanos: u64) -> bool {
        tick == 0
            || (tick - 1)
                .checked_mul(self.tick_nanos)
                .is_some_and(|start| start < nanos)
    }

    /// Whether the clock is manual ([`Clock::is_manual`]).
    #[inline]
    pub(crate) fn is_manual(&self) -> bool {
        self.manual
    }

    /// [`TickClock::cycle_deadline`] where the reading needs no refresh
    /// ([`now_nanos_unless_refresh`](crate::cycle_clock::now_nanos_unless_refresh)): `None`
    /// also where it would.
    #[inline(always)]
    pub(crate) fn cycle_deadline_unless_refresh(&self, delay: Duration) -> Option<Deadline> {
        self.cycle_offset
            .and_then(|offset| cycle_deadline_after_unless_refresh(offset, delay))
    }
}

impl TickClock {
    pub(crate) fn new(clock: Clock, tick: Duration) -> TickClock {
        let tick_nanos = u64::try_from(tick.as_nanos()).unwrap_or(u64::MAX).max(1);
        // The cycle clock's origin is taken first, so it is never after `origin`.
        let cycle_origin = crate::cycle_clock::origin();
        let origin = clock.now();
        let manual = clock.is_manual();
        let cycle_offset = (!manual).then(|| {
            u64::try_from(origin.saturating_duration_since(cycle_origin).as_nanos())
                .unwrap_or(u64::MAX)
        });
        TickClock {
            clock,
            origin,
            tick_nanos,
            divisor: TickDivisor::new(tick_nanos),
            cycle_offset,
            line: std::sync::Arc::new(crossbeam_utils::CachePadded::new(ClockLine {
                tick: Default::default(),
                swept: Default::default(),
                manual,
                cycle_offset,
                tick_nanos,
                origin,
            })),
        }
    }

    /// Whether [`tick_after`](Self::tick_after) reads the cycle clock.
    pub(crate) fn reads_cycle_clock(&self) -> bool {
        self.cycle_offset.is_some() && crate::cycle_clock::in_use()
    }

    #[inline]
    pub(crate) fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Nanoseconds since the origin.
    pub(crate) fn now_nanos(&self) -> u64 {
        nanos_since(self.origin, self.clock.now()).map_or(LAST_NANOS, |nanos| nanos.min(LAST_NANOS))
    }

    /// The current tick: the number of whole ticks since the origin. A timer whose deadline
    /// tick is at or before it is due, and is never early, because deadlines round up.
    pub(crate) fn now_tick(&self) -> u64 {
        let tick = self.divisor.div_rem(self.now_nanos()).0;
        // The latest of all readings: another shard's older one must not hide it.
        self.line.tick.fetch_max(tick, Ordering::Relaxed);
        tick
    }

    /// The tick of `deadline` ([`tick_at`](Self::tick_at)), or `None` if the deadline is known
    /// to have passed: its tick is at or before the latest [`now_tick`](Self::now_tick) any
    /// shard read, so a shard would fire its timer at once. Reads no clock (but the manual
    /// clock's, which is cheap and turns only by hand: there it is
    /// [`tick_if_ahead`](Self::tick_if_ahead)): a deadline that passed since that reading is
    /// `Some`, and its timer fires at its shard's next turn, as tokio's does.
    #[inline]
    pub(crate) fn tick_unless_passed(&self, deadline: Deadline) -> Option<u64> {
        if self.clock.is_manual() {
            return self.tick_if_ahead(self.instant_of(deadline));
        }
        let tick = self.tick_of(deadline);
        self.not_reached(tick).then_some(tick)
    }

    /// Whether no shard has reached `tick`: it is after the latest tick any shard read
    /// ([`now_tick`](Self::now_tick)). A shard fires a timer only in a turn whose tick, read by
    /// `now_tick` before it fires anything, is at or past the timer's: so a timer due at `tick`
    /// has not fired, as far as any thread that has seen that firing's effects (its wake-up)
    /// can tell. Reads no clock.
    #[inline]
    pub(crate) fn not_reached(&self, tick: u64) -> bool {
        self.line.not_reached(tick)
    }

    /// Its shared line ([`ClockLine`]).
    #[inline]
    pub(crate) fn line(&self) -> &ClockLine {
        &self.line
    }

    /// Notes that a shard is about to cancel timers from outside their owners (see
    /// [`ClockLine`]'s `swept`).
    pub(crate) fn note_sweep(&self) {
        self.line.swept.store(true, Ordering::Relaxed);
    }

    /// The deadline `delay` from now: on the cycle clock (see [`tick_after`](Self::tick_after))
    /// in nanoseconds, else (or beyond them) an instant; beyond representable time,
    /// [`far_future`]'s.
    #[inline]
    pub(crate) fn deadline_after(&self, delay: Duration) -> Deadline {
        if let Some(deadline) = self.cycle_deadline(delay) {
            return deadline;
        }
        self.instant_after(delay)
    }

    /// [`deadline_after`](Self::deadline_after)'s cycle-clock case: `None` where it takes an
    /// instant ([`instant_after`](Self::instant_after)). Callers that go on to copy the
    /// deadline take the other case out of line: merged with an out-of-line result, the
    /// deadline would pass through memory in two stores, which a 16-byte load that copies it
    /// cannot take its bytes from (see `futures/whole.rs`).
    #[inline(always)]
    pub(crate) fn cycle_deadline(&self, delay: Duration) -> Option<Deadline> {
        self.cycle_offset
            .and_then(|offset| cycle_deadline_after(offset, delay))
    }

    /// [`deadline_after`](Self::deadline_after) where [`cycle_deadline_after`] gave none (no
    /// cycle clock, or a deadline beyond its nanoseconds): an instant.
    pub(crate) fn instant_after(&self, delay: Duration) -> Deadline {
        let now = match self.cycle_now_nanos() {
            Some(now) => self.instant_of(Deadline::Nanos(now)),
            None => self.clock.now(),
        };
        Deadline::At(now.checked_add(delay).unwrap_or_else(|| far_future(now)))
    }

    /// Its cycle offset (see the field): `Some` for the system clock. The default timer copies
    /// it to each thread, with [`cycle_deadline_after_unless_refresh`], so that its sleeps read
    /// the time without reading the timer.
    pub(crate) fn cycle_offset(&self) -> Option<u64> {
        self.cycle_offset
    }

    /// The instant of `deadline`.
    #[inline]
    pub(crate) fn instant_of(&self, deadline: Deadline) -> Instant {
        match deadline {
            Deadline::At(instant) => instant,
            Deadline::Nanos(nanos) => self
                .origin
                .checked_add(Duration::from_nanos(nanos))
                .unwrap_or_else(|| far_future(self.origin)),
        }
    }

    /// Whether a timer due at `tick` fires no later than one scheduled for `deadline` would: at
    /// or before `deadline`'s tick ([`tick_of`](Self::tick_of)).
    #[inline]
    pub(crate) fn tick_no_later_than(&self, tick: u64, deadline: Deadline) -> bool {
        tick <= self.tick_of(deadline)
    }

    /// The first tick at or after `deadline` ([`tick_at`](Self::tick_at) of its instant).
    #[inline]
    pub(crate) fn tick_of(&self, deadline: Deadline) -> u64 {
        match deadline {
            Deadline::At(instant) => self.tick_at(instant),
            Deadline::Nanos(nanos) => self.tick_at_nanos(nanos),
        }
    }

    /// The first tick at or after `instant` (0 for an instant before the origin).
    #[inline]
    pub(crate) fn tick_at(&self, instant: Instant) -> u64 {
        match nanos_since(self.origin, instant) {
            Some(nanos) => self.tick_at_nanos(nanos),
            None => self.tick_at_far(instant.saturating_duration_since(self.origin)),
        }
    }

    /// The tick of `deadline` ([`tick_at`](Self::tick_at)) if it has not passed yet, `None` if
    /// it has. On the system clock the cycle clock answers first where it is sound: it never
    /// reads before `Instant::now()`, so a deadline after its reading is certainly ahead; only
    /// a deadline it cannot vouch for costs an `Instant::now()` (see
    /// [`cycle_clock`](crate::cycle_clock)).
    #[inline]
    pub(crate) fn tick_if_ahead(&self, deadline: Instant) -> Option<u64> {
        if let Some(offset) = self.cycle_offset
            && let Some(now) = crate::cycle_clock::now_nanos()
            && let Some(nanos) = nanos_since(self.origin, deadline)
            && now.saturating_sub(offset) < nanos
        {
            return Some(self.tick_at_nanos(nanos));
        }
        (self.clock.now() < deadline).then(|| self.tick_at(deadline))
    }

    /// [`tick_at`](Self::tick_at) for an instant whose nanoseconds since the origin do not fit
    /// a u64.
    #[cold]
    fn tick_at_far(&self, since: Duration) -> u64 {
        let ticks = since.as_nanos().div_ceil(self.tick_nanos as u128);
        u64::try_from(ticks).unwrap_or(u64::MAX)
    }

    /// The first tick at or after `nanos` nanoseconds since the origin.
    #[inline]
    pub(crate) fn tick_at_nanos(&self, nanos: u64) -> u64 {
        self.divisor.div_ceil(nanos)
    }

    /// The deadline tick `delay` from now (`u64::MAX` if that is beyond representable time).
    ///
    /// On the system clock this reads the cycle clock where it is sound (see
    /// [`cycle_clock`](crate::cycle_clock)): never early, a little later than the precise
    /// reading would give, and it does not stall the CPU the way `Instant::now()` does.
    #[inline]
    pub(crate) fn tick_after(&self, delay: Duration) -> u64 {
        if let Some(now) = self.cycle_now_nanos() {
            return nanos_after(now, delay)
                .map_or(u64::MAX, |deadline| self.tick_at_nanos(deadline));
        }
        match self.clock.now().checked_add(delay) {
            Some(deadline) => self.tick_at(deadline),
            None => u64::MAX,
        }
    }

    /// Nanoseconds since the origin by the cycle clock, where it is read: on the system clock,
    /// when the cycle clock is in use (see [`cycle_clock`](crate::cycle_clock)).
    #[inline]
    fn cycle_now_nanos(&self) -> Option<u64> {
        let offset = self.cycle_offset?;
        Some(crate::cycle_clock::now_nanos()?.saturating_sub(offset))
    }

    /// Nanoseconds since the origin at which tick `tick` starts (saturating).
    pub(crate) fn nanos_of_tick(&self, tick: u64) -> u64 {
        tick.saturating_mul(self.tick_nanos)
    }

    /// The instant at which tick `tick` starts (`None` beyond representable time).
    pub(crate) fn instant_of_tick(&self, tick: u64) -> Option<Instant> {
        let nanos = (tick as u128).checked_mul(self.tick_nanos as u128)?;
        let nanos = u64::try_from(nanos).ok()?;
        self.origin.checked_add(Duration::from_nanos(nanos))
    }

    /// How long from now until tick `tick` starts; `None` if it is beyond any useful sleep.
    pub(crate) fn until_tick(&self, tick: u64) -> Option<Duration> {
        if tick == u64::MAX {
            return None;
        }
        let target = self.nanos_of_tick(tick);
        if target == u64::MAX {
            return None;
        }
        Some(Duration::from_nanos(
            target.saturating_sub(self.now_nanos()),
        ))
    }

    /// Ticks in `duration`, rounded up.
    pub(crate) fn ticks_in(&self, duration: Duration) -> u64 {
        u64::try_from(duration.as_nanos().div_ceil(self.tick_nanos as u128)).unwrap_or(u64::MAX)
    }
}

/// [`TickClock::deadline_after`] on the cycle clock, for a clock whose cycle offset is `offset`:
/// `None` if the cycle clock is not used, or the deadline is beyond its nanoseconds.
#[inline(always)]
pub(crate) fn cycle_deadline_after(offset: u64, delay: Duration) -> Option<Deadline> {
    cycle_deadline_from(crate::cycle_clock::now_nanos()?, offset, delay)
}

/// [`cycle_deadline_after`] where the reading needs no refresh
/// ([`now_nanos_unless_refresh`](crate::cycle_clock::now_nanos_unless_refresh)): `None` also
/// where it would.
#[inline(always)]
pub(crate) fn cycle_deadline_after_unless_refresh(
    offset: u64,
    delay: Duration,
) -> Option<Deadline> {
    cycle_deadline_from(
        crate::cycle_clock::now_nanos_unless_refresh()?,
        offset,
        delay,
    )
}

/// [`cycle_deadline_after`] of the cycle clock's reading `now`.
#[inline(always)]
fn cycle_deadline_from(now: u64, offset: u64, delay: Duration) -> Option<Deadline> {
    nanos_after(now.saturating_sub(offset), delay).map(Deadline::Nanos)
}

/// `instant` in nanoseconds since `origin` (0 before it); `None` beyond a u64 of them (about
/// 584 years).
#[inline(always)]
fn nanos_since(origin: Instant, instant: Instant) -> Option<u64> {
    let since = instant.saturating_duration_since(origin);
    since
        .as_secs()
        .checked_mul(1_000_000_000)?
        .checked_add(u64::from(since.subsec_nanos()))
}

/// `delay` after `now`, both in nanoseconds since an origin; `None` beyond a u64 of them.
#[inline]
fn nanos_after(now: u64, delay: Duration) -> Option<u64> {
    now.checked_add(u64::try_from(delay.as_nanos()).ok()?)
}

/// An instant so far ahead that no timer on it fires within any run: 2^30 s (about 34 years)
/// after `now`, or as far as an `Instant` goes. Where a sleep's deadline is beyond
/// representable time, as tokio's sleeps (30 years).
pub(crate) fn far_future(now: Instant) -> Instant {
    let mut ahead = Duration::from_secs(1 << 30);
    loop {
        if let Some(instant) = now.checked_add(ahead) {
            return instant;
        }
        ahead /= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Divisors at the edges: 1, small, the 1 ms tick, powers of two and their neighbours, the
    /// largest.
    const EDGE_DIVISORS: [u64; 12] = [
        1,
        2,
        3,
        7,
        1_000,
        1_000_000,
        1_000_000_007,
        1 << 32,
        (1 << 63) - 1,
        1 << 63,
        (1 << 63) + 1,
        u64::MAX,
    ];

    /// Dividends at the edges for divisor `d`: 0, around `d` and its multiples, the largest.
    fn edge_dividends(d: u64) -> Vec<u64> {
        let mut dividends = vec![0, 1, 2, u64::MAX, u64::MAX - 1, u64::MAX / 2];
        for multiple in [1, 2, 3, 1000, u64::MAX / d, u64::MAX / d - 1] {
            if let Some(n) = d.checked_mul(multiple) {
                dividends.extend([n.saturating_sub(1), n, n.saturating_add(1)]);
            }
        }
        dividends
    }

    fn check_divisor(d: u64, n: u64) {
        let divisor = TickDivisor::new(d);
        assert_eq!(divisor.div_rem(n), (n / d, n % d), "{n} / {d}");
        assert_eq!(divisor.div_ceil(n), n.div_ceil(d), "{n} / {d} rounded up");
    }

    #[test]
    fn tick_divisor_is_exact_at_the_edges() {
        for d in EDGE_DIVISORS {
            for n in edge_dividends(d) {
                check_divisor(d, n);
            }
        }
    }

    /// `tick_at` against the exact u128 division, at `origin + since`.
    fn check_tick_at(tick_nanos: u64, since: Duration) {
        let clock = TickClock::new(Clock::system(), Duration::from_nanos(tick_nanos));
        let Some(instant) = clock.origin.checked_add(since) else {
            return;
        };
        let exact = u64::try_from(since.as_nanos().div_ceil(u128::from(clock.tick_nanos)))
            .unwrap_or(u64::MAX);
        assert_eq!(
            clock.tick_at(instant),
            exact,
            "{since:?} in ticks of {tick_nanos} ns"
        );
    }

    #[test]
    fn tick_at_rounds_up_exactly_at_the_edges() {
        for d in EDGE_DIVISORS {
            for n in edge_dividends(d) {
                check_tick_at(d, Duration::from_nanos(n));
            }
            // Beyond u64 nanoseconds (the far path), and an instant before the origin.
            check_tick_at(d, Duration::new(u64::MAX / 1_000_000_000 + 1, 0));
            check_tick_at(d, Duration::new(u64::MAX / 1_000_000_000, 999_999_999));
            check_tick_at(d, Duration::new(u64::MAX >> 2, 5));
        }
        let clock = TickClock::new(Clock::system(), Duration::from_millis(1));
        if let Some(before) = clock.origin.checked_sub(Duration::from_secs(1)) {
            assert_eq!(clock.tick_at(before), 0);
        }
    }

    /// A deadline kept in nanoseconds means the instant [`TickClock::instant_of`] gives, and
    /// the same tick, never before `delay` from the call.
    fn check_deadline_after(tick_nanos: u64, delay: Duration) {
        let clock = TickClock::new(Clock::system(), Duration::from_nanos(tick_nanos));
        let before = Instant::now();
        let deadline = clock.deadline_after(delay);
        let instant = clock.instant_of(deadline);
        assert_eq!(
            clock.tick_of(deadline),
            clock.tick_at(instant),
            "{deadline:?}"
        );
        if let Some(earliest) = before.checked_add(delay) {
            assert!(
                instant >= earliest,
                "{deadline:?}: {instant:?} before {earliest:?}"
            );
        }
    }

    /// The line's `surely_tick_no_later_than` agrees with `tick_no_later_than`, of a deadline
    /// in either form (an instant where its nanoseconds fit a u64).
    fn check_tick_no_later_than(d: u64, tick: u64, nanos: u64) {
        let clock = TickClock::new(Clock::system(), Duration::from_nanos(d));
        // The same deadline as an instant, where its nanoseconds fit.
        let instant = clock.instant_of(Deadline::Nanos(nanos));
        let as_instant = nanos_since(clock.origin, instant).map(|_| Deadline::At(instant));
        for deadline in std::iter::once(Deadline::Nanos(nanos)).chain(as_instant) {
            assert_eq!(
                clock.line().surely_tick_no_later_than(tick, deadline),
                clock.tick_no_later_than(tick, deadline),
                "d {d} tick {tick} {deadline:?}"
            );
        }
    }

    proptest! {
        #[test]
        fn the_lines_tick_comparison_agrees(
            d in prop_oneof![Just(1u64), Just(1_000_000u64), 1u64..2_000_000, any::<u64>()],
            nanos in prop_oneof![0u64..1 << 62, any::<u64>(), Just(0u64), Just(u64::MAX)],
            near in -2i64..3,
            tick in any::<u64>(),
        ) {
            let d = d.max(1);
            check_tick_no_later_than(d, (nanos / d).saturating_add_signed(near), nanos);
            check_tick_no_later_than(d, tick, nanos);
            check_tick_no_later_than(d, 0, nanos);
        }

        #[test]
        fn deadline_after_is_its_instant_and_never_early(
            d in prop_oneof![Just(1_000_000u64), 1u64..2_000_000],
            delay in prop_oneof![0u64..10_000_000_000, any::<u64>()],
            subsec in 0u32..1_000_000_000,
        ) {
            check_deadline_after(d, Duration::from_nanos(delay));
            check_deadline_after(d, Duration::new(delay, subsec));
        }

        #[test]
        fn tick_divisor_is_exact(d in 1u64.., n in any::<u64>()) {
            check_divisor(d, n);
        }

        #[test]
        fn tick_divisor_is_exact_for_small_divisors(d in 1u64..10_000_000, n in any::<u64>()) {
            check_divisor(d, n);
            // Exact multiples, and their neighbours.
            let multiple = (n / d) * d;
            check_divisor(d, multiple);
            check_divisor(d, multiple.saturating_sub(1));
            check_divisor(d, multiple.saturating_add(1));
        }

        #[test]
        fn tick_at_matches_the_exact_division(
            d in prop_oneof![Just(1_000_000u64), 1u64..2_000_000, 1u64..],
            secs in prop_oneof![0u64..1_000_000, any::<u64>()],
            subsec in 0u32..1_000_000_000,
            ticks in prop_oneof![0u64..1_000_000_000_000, any::<u64>()],
            offset in prop_oneof![Just(0i64), Just(-1), Just(1), -1_000_000_000i64..1_000_000_000],
        ) {
            check_tick_at(d, Duration::new(secs, subsec));
            // Near an exact multiple of the tick.
            if let Some(multiple) = ticks.checked_mul(d) {
                check_tick_at(d, Duration::from_nanos(multiple.saturating_add_signed(offset)));
            }
        }
    }
}
