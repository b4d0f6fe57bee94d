//! Repeating timers: fixed rate (with a policy for missed ticks) and fixed delay.
//!
//! A repeating timer is one slot whose task runs, then is handed back to its shard and
//! re-armed for its next run: runs never overlap, whatever the executor. Its handle cancels
//! future runs (a run in progress finishes) and [`reset`](crate::TimerHandle::reset) moves the
//! next run, after which the grid restarts from that run.

use crate::task::Repeat;

/// What a fixed-rate repeating timer or an [`Interval`](crate::Interval) does about ticks it
/// missed. The same policies, and the same names and meanings, as tokio's
/// `tokio::time::MissedTickBehavior`.
///
/// The k-th tick (k = 0, 1, ...) of a grid that starts at `start` with period `p` is due at
/// `start + k * p`. A tick is *missed* when it is observed after the next grid point has already
/// passed (the executor was busy, the task was slow, the machine slept). Below, "now" is when
/// the late tick is observed: when an [`Interval`](crate::Interval)'s `tick()` completes (an
/// interval treats a tick up to 5 ms late as on time, as tokio does), and for closure timers
/// ([`Timer::schedule_repeating`](crate::Timer::schedule_repeating)) when the late run
/// started (`Delay`) or ended (`Skip`).
///
/// | policy | next tick after a late one | ticks returned |
/// |--------|----------------------------|----------------|
/// | `Burst` (default) | the next grid point, even if it has passed | every grid point, the missed ones back to back |
/// | `Delay` | `now + p`: the grid restarts from the late tick | one per period from then on |
/// | `Skip` | the first grid point after `now` | on the original grid, the passed points dropped |
///
/// Like tokio's, it is not `#[non_exhaustive]`: a `match` over the three policies compiles
/// after a switch from tokio.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum MissedTickBehavior {
    /// Tick for every missed grid point, back to back, then continue on the grid (the default,
    /// as in tokio).
    #[default]
    Burst,
    /// Restart the grid from the late tick: the next tick is one period after it.
    Delay,
    /// Drop the missed grid points and return to the original grid.
    Skip,
}

/// The name of [`MissedTickBehavior`] before it became shared with [`Interval`](crate::Interval).
#[deprecated(note = "renamed `MissedTickBehavior` (the same type)")]
pub type MissedTicks = MissedTickBehavior;

/// When the next run of a repeating timer is due.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Cadence {
    /// Grid points `anchor + k * period`, with a missed-tick policy.
    FixedRate {
        period: u64,
        missed: MissedTickBehavior,
    },
    /// `delay` after the end of the previous run.
    FixedDelay { delay: u64 },
}

/// A repeating task: the user's closure plus where it stands on its grid (all times in
/// nanoseconds since the engine clock's origin).
pub(crate) struct Repeating<F> {
    function: F,
    cadence: Cadence,
    /// Grid origin: the due time of grid point 0.
    anchor: u64,
    /// Index of the grid point of the run that is armed.
    point: u64,
}

impl<F: FnMut() + Send + 'static> Repeating<F> {
    /// A repeating task whose first run is due at `first_due` (grid point 0).
    pub(crate) fn new(function: F, cadence: Cadence, first_due: u64) -> Repeating<F> {
        Repeating {
            function,
            cadence,
            anchor: first_due,
            point: 0,
        }
    }

    fn grid(&self, point: u64, period: u64) -> u64 {
        self.anchor.saturating_add(point.saturating_mul(period))
    }
}

impl<F: FnMut() + Send + 'static> Repeat for Repeating<F> {
    fn reanchor(&mut self, due: u64) {
        self.anchor = due;
        self.point = 0;
    }

    fn run(&mut self, start: u64, now: &dyn Fn() -> u64) -> Option<u64> {
        // A panic unwinds to the executor, which counts it and ends this timer.
        (self.function)();
        let end = now();
        let next = match self.cadence {
            Cadence::FixedDelay { delay } => end.saturating_add(delay),
            Cadence::FixedRate { period, missed } => {
                let next_point = self.point + 1;
                let next = self.grid(next_point, period);
                let late = start >= next;
                match missed {
                    MissedTickBehavior::Burst => {
                        self.point = next_point;
                        next
                    }
                    MissedTickBehavior::Skip => {
                        // The first grid point after the run ended.
                        let point = if next > end {
                            next_point
                        } else {
                            (end - self.anchor) / period + 1
                        };
                        self.point = point;
                        self.grid(point, period)
                    }
                    MissedTickBehavior::Delay if late => {
                        self.anchor = start;
                        self.point = 1;
                        start.saturating_add(period)
                    }
                    MissedTickBehavior::Delay => {
                        self.point = next_point;
                        next
                    }
                }
            }
        };
        Some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ran(cadence: Cadence, runs: &[(u64, u64, u64)]) -> Vec<u64> {
        let mut repeating = Repeating::new(|| {}, cadence, 100);
        runs.iter()
            .map(|&(_due, start, end)| repeating.run(start, &|| end).unwrap())
            .collect()
    }

    #[test]
    fn fixed_rate_on_time_follows_the_grid() {
        let cadence = Cadence::FixedRate {
            period: 100,
            missed: MissedTickBehavior::Skip,
        };
        assert_eq!(
            ran(cadence, &[(100, 100, 110), (200, 200, 210)]),
            [200, 300]
        );
    }

    #[test]
    fn missed_ticks_policies() {
        // The first run (due 100) starts at 350: grid points 200 and 300 were missed.
        let burst = Cadence::FixedRate {
            period: 100,
            missed: MissedTickBehavior::Burst,
        };
        assert_eq!(
            ran(burst, &[(100, 350, 360), (200, 360, 361), (300, 361, 362)]),
            [200, 300, 400]
        );
        let skip = Cadence::FixedRate {
            period: 100,
            missed: MissedTickBehavior::Skip,
        };
        assert_eq!(ran(skip, &[(100, 350, 360)]), [400]);
        let delay = Cadence::FixedRate {
            period: 100,
            missed: MissedTickBehavior::Delay,
        };
        assert_eq!(ran(delay, &[(100, 350, 360), (450, 450, 455)]), [450, 550]);
    }

    #[test]
    fn fixed_delay_measures_from_the_end() {
        assert_eq!(
            ran(
                Cadence::FixedDelay { delay: 50 },
                &[(100, 100, 130), (180, 185, 200)]
            ),
            [180, 250]
        );
    }

    #[test]
    fn a_reset_restarts_the_grid() {
        let cadence = Cadence::FixedRate {
            period: 100,
            missed: MissedTickBehavior::Skip,
        };
        let mut repeating = Repeating::new(|| {}, cadence, 100);
        assert_eq!(repeating.run(100, &|| 101), Some(200));
        // Armed for 200, but a reset moved the run to 250.
        repeating.reanchor(250);
        assert_eq!(repeating.run(250, &|| 251), Some(350));
    }
}
