//! [`HyperTimer`]: hyper 1.x's timer (`hyper::rt::Timer`) on a shardwheel [`Timer`] (feature
//! `hyper`).

use crate::engine::Engine;
use crate::engine::lease::Forever;
use crate::futures::Sleep;
use crate::timer::Timer;
use std::pin::Pin;
use std::time::{Duration, Instant};

/// Runs hyper's timeouts on shardwheel: give it to hyper's connection builders, e.g.
/// `hyper::server::conn::http1::Builder::timer(HyperTimer::default())`, which
/// `header_read_timeout` needs.
///
/// Its sleeps are [`Sleep`]s (lazy, and panicking if the engine is shut down or full: see
/// [`Sleep`]); [`reset`](hyper::rt::Timer::reset) is [`Sleep::reset`]'s, without a new box.
/// On the default timer ([`HyperTimer::default`]) a sleep dropped with its timer pending may keep
/// that timer for its task's next sleep on the same thread (see [`Sleep`], "Kept timers"):
/// hyper makes and drops a header-read sleep per request, and the connection's next one takes
/// the timer over instead of scheduling one.
///
/// ```
/// use shardwheel::{HyperTimer, Timer};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut builder = hyper::server::conn::http1::Builder::new();
/// builder
///     .timer(HyperTimer::new(Timer::new()?))
///     .header_read_timeout(std::time::Duration::from_secs(5));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct HyperTimer {
    timer: Which,
}

/// The timer a [`HyperTimer`] schedules on, and whether that timer runs on the system clock
/// (`system_clock`, decided once): [`now`](hyper::rt::Timer::now) then reads the clock without
/// following the timer to it (lines a server's worker has rarely read since the last request).
/// The flags sit in the variants, so that a `HyperTimer` is 24 bytes: hyper keeps it in an
/// `Arc`, whose allocation (40 bytes) then holds both in a cache line or two, which `now` and
/// the sleep that follows it read at each request.
#[derive(Clone, Debug)]
enum Which {
    /// The process-wide default timer, which is never dropped, by what its sleeps need of it:
    /// they refer to its engine and its clock's line by plain references (no reference count
    /// bumped on every sleep, on a cache line every worker thread would share), and keep their
    /// timers if it does ([`Timer::keeps_timers`]). Making one then reads no line but the
    /// `HyperTimer`'s (the default timer's own free functions read their thread's copy of the
    /// same).
    Default {
        engine: Forever<Engine>,
        keeps: bool,
        system_clock: bool,
    },
    /// Any other timer.
    Given { timer: Timer, system_clock: bool },
}

const _: () = {
    assert!(size_of::<HyperTimer>() == 24);
};

impl HyperTimer {
    /// Hyper's timeouts on `timer`.
    pub fn new(timer: Timer) -> HyperTimer {
        let system_clock = !timer.clock().is_manual();
        HyperTimer {
            timer: Which::Given {
                timer,
                system_clock,
            },
        }
    }

    /// The timer it schedules on.
    pub fn timer(&self) -> &Timer {
        match &self.timer {
            // A `Which::Default` is made from the built default timer, which stays.
            Which::Default { .. } => crate::default_timer::default(),
            Which::Given { timer, .. } => timer,
        }
    }

    /// Whether its timer runs on the system clock.
    fn system_clock(&self) -> bool {
        match self.timer {
            Which::Default { system_clock, .. } | Which::Given { system_clock, .. } => system_clock,
        }
    }
}

impl Default for HyperTimer {
    /// Hyper's timeouts on the process-wide [`default_timer`](crate::default_timer()).
    ///
    /// # Panics
    ///
    /// If the default timer cannot be built.
    fn default() -> HyperTimer {
        match crate::default_timer() {
            Ok(timer) => HyperTimer {
                timer: Which::Default {
                    engine: Forever::new(timer.static_engine()),
                    keeps: timer.keeps_timers(),
                    system_clock: !timer.clock().is_manual(),
                },
            },
            Err(error) => panic!("shardwheel: could not build the default timer: {error}"),
        }
    }
}

impl hyper::rt::Sleep for Sleep {}

impl hyper::rt::Timer for HyperTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(match &self.timer {
            Which::Default { .. } => crate::sleep(duration),
            Which::Given { timer, .. } => timer.sleep(duration),
        })
    }

    /// On the default timer, the sleep of `sleep_until` (`crate::sleep_until`), made from what
    /// the `HyperTimer` holds.
    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(match self.timer {
            Which::Default { engine, keeps, .. } => {
                crate::default_timer::sleep_until_on(engine, keeps, deadline)
            }
            Which::Given { ref timer, .. } => timer.sleep_until(deadline),
        })
    }

    /// The current time. On the system clock it is read as the engine reads it for
    /// [`sleep`](crate::sleep): from the cycle counter where that is sound
    /// (`src/cycle_clock.rs`), never before `Instant::now()` and at most tens of microseconds
    /// after it, so a deadline hyper adds to it is never early; elsewhere `Instant::now()`.
    fn now(&self) -> Instant {
        if self.system_clock() {
            return crate::cycle_clock::now_instant().unwrap_or_else(Instant::now);
        }
        self.timer().clock().now()
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>, new_deadline: Instant) {
        match sleep.as_mut().downcast_mut_pin::<Sleep>() {
            Some(ours) => ours.reset(new_deadline),
            None => *sleep = self.sleep_until(new_deadline),
        }
    }
}
