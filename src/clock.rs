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
    /// inline have run). Does nothing to the system clock.
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

/// A clock seen in ticks of a fixed length since a fixed origin: how shards and handles turn
/// instants into wheel deadlines.
#[derive(Clone, Debug)]
pub(crate) struct TickClock {
    clock: Clock,
    origin: Instant,
    tick_nanos: u64,
    /// For the system clock: `origin` in nanoseconds since the cycle clock's origin, so that
    /// [`tick_after`](Self::tick_after) can read the cheap cycle clock.
    cycle_offset: Option<u64>,
}

impl TickClock {
    pub(crate) fn new(clock: Clock, tick: Duration) -> TickClock {
        let tick_nanos = u64::try_from(tick.as_nanos()).unwrap_or(u64::MAX).max(1);
        // The cycle clock's origin is taken first, so it is never after `origin`.
        let cycle_origin = crate::cycle_clock::origin();
        let origin = clock.now();
        let cycle_offset = (!clock.is_manual()).then(|| {
            u64::try_from(origin.saturating_duration_since(cycle_origin).as_nanos())
                .unwrap_or(u64::MAX)
        });
        TickClock {
            clock,
            origin,
            tick_nanos,
            cycle_offset,
        }
    }

    /// Whether [`tick_after`](Self::tick_after) reads the cycle clock.
    pub(crate) fn reads_cycle_clock(&self) -> bool {
        self.cycle_offset.is_some() && crate::cycle_clock::in_use()
    }

    pub(crate) fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Nanoseconds since the origin.
    pub(crate) fn now_nanos(&self) -> u64 {
        u64::try_from(
            self.clock
                .now()
                .saturating_duration_since(self.origin)
                .as_nanos(),
        )
        .unwrap_or(u64::MAX)
    }

    /// The current tick: the number of whole ticks since the origin. A timer whose deadline
    /// tick is at or before it is due, and is never early, because deadlines round up.
    pub(crate) fn now_tick(&self) -> u64 {
        self.now_nanos() / self.tick_nanos
    }

    /// The first tick at or after `instant` (0 for an instant before the origin).
    pub(crate) fn tick_at(&self, instant: Instant) -> u64 {
        let nanos = instant.saturating_duration_since(self.origin).as_nanos();
        let ticks = nanos.div_ceil(self.tick_nanos as u128);
        u64::try_from(ticks).unwrap_or(u64::MAX)
    }

    /// The first tick at or after `nanos` nanoseconds since the origin.
    pub(crate) fn tick_at_nanos(&self, nanos: u64) -> u64 {
        nanos.div_ceil(self.tick_nanos)
    }

    /// The deadline tick `delay` from now (`u64::MAX` if that is beyond representable time).
    ///
    /// On the system clock this reads the cycle clock where it is sound (see
    /// [`cycle_clock`](crate::cycle_clock)): never early, a little later than the precise
    /// reading would give, and it does not stall the CPU the way `Instant::now()` does.
    #[inline]
    pub(crate) fn tick_after(&self, delay: Duration) -> u64 {
        if let Some(offset) = self.cycle_offset
            && let Some(nanos) = crate::cycle_clock::now_nanos()
        {
            return u64::try_from(delay.as_nanos())
                .ok()
                .and_then(|delay| nanos.saturating_sub(offset).checked_add(delay))
                .map_or(u64::MAX, |deadline| self.tick_at_nanos(deadline));
        }
        match self.clock.now().checked_add(delay) {
            Some(deadline) => self.tick_at(deadline),
            None => u64::MAX,
        }
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

/// An instant so far ahead that no timer on it fires within any run (about 30 years).
pub(crate) fn far_future(now: Instant) -> Instant {
    let mut ahead = Duration::from_secs(1 << 30);
    loop {
        if let Some(instant) = now.checked_add(ahead) {
            return instant;
        }
        ahead /= 2;
    }
}
