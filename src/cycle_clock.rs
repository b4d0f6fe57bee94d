//! A reading of the monotonic clock that does not stall the CPU: the time-stamp counter, read
//! without ordering and extrapolated from a recent [`Instant::now`].
//!
//! # Why
//!
//! `Instant::now()` is `clock_gettime(CLOCK_MONOTONIC)`, which on x86-64 Linux reads the
//! time-stamp counter *in order* (`lfence; rdtsc` or `rdtscp`): it waits until every earlier
//! instruction has finished, including loads that miss the cache. A thread that resets random
//! timers among a million misses the cache twice per reset (its handle, then the timer's slot);
//! the ordered clock read keeps one reset's misses from overlapping the next one's, and so costs
//! far more than its own 25 ns (on the 2-core development machine, 4.7 M resets/s per thread with
//! it, 9.2 M without any clock read). The unordered `rdtsc` costs 10 ns and waits for nothing.
//!
//! # How
//!
//! Each thread keeps a *base*: one `Instant::now()` in nanoseconds since a process-wide origin,
//! and the counter read just after it. A reading is `base nanoseconds + (counter - base counter)
//! x rate`, where the rate (nanoseconds per count, 32.32 fixed point) is measured from the origin
//! to the thread's latest base, so it becomes more precise as the process runs. A base is used
//! for at most [`REFRESH_NANOS`]; then the next reading takes a fresh `Instant::now()` (and
//! returns it). Until [`CALIBRATION_NANOS`] have passed since the origin every reading is a plain
//! `Instant::now()`.
//!
//! # Never early
//!
//! Callers add [`MARGIN_NANOS`] to a deadline computed from this clock. A reading can be behind
//! the true time by the drift of the monotonic clock against the counter since the base (NTP
//! slews the monotonic clock by at most 500 ppm: at most 5 µs over 10 ms) plus the time by which
//! the unordered `rdtsc` runs ahead of the instructions before it (well under a microsecond): far
//! inside the 50 µs margin. A base's counter is read *before* its `Instant::now()` (whose own
//! ordered counter read waits for it), and the origin's just after its instant, so whatever
//! comes between the reads (preemption, an interrupt) makes readings later, never earlier; such
//! pairs are read again, up to four times, to keep that lateness small. At every refresh the old base's extrapolation is
//! checked against the fresh `Instant::now()`: if it fell behind by more than half the margin,
//! the fast path is switched off for the rest of the process.
//!
//! # Where it is used
//!
//! Only where it is known to be sound: x86-64 Linux whose kernel clock source is `tsc` (the kernel
//! itself then derives the monotonic clock from the counter, and has checked that it is
//! synchronized across cores) on a processor with an invariant counter (CPUID 8000_0007h,
//! EDX bit 8). Everywhere else, and under loom, [`now_nanos`] always answers `None` and callers use
//! `Instant::now()`.

use std::time::Instant;

/// A thread reads `Instant::now()` again at least this often (nanoseconds).
const REFRESH_NANOS: u64 = 10_000_000;

/// The counter's rate is measured over at least this long before readings are extrapolated.
const CALIBRATION_NANOS: u64 = 20_000_000;

/// What callers add to a deadline computed from [`now_nanos`], so that it is never early.
pub(crate) const MARGIN_NANOS: u64 = 50_000;

/// The process-wide origin of [`now_nanos`].
pub(crate) fn origin() -> Instant {
    imp::origin()
}

/// Nanoseconds since [`origin`] now, or `None` where this clock is not used (read
/// `Instant::now()` instead). May be behind the true time by up to [`MARGIN_NANOS`].
#[inline]
pub(crate) fn now_nanos() -> Option<u64> {
    imp::now_nanos()
}

#[cfg(all(target_arch = "x86_64", target_os = "linux", not(loom)))]
mod imp {
    use super::{CALIBRATION_NANOS, MARGIN_NANOS, REFRESH_NANOS};
    use crate::sync::OnceLock;
    use crate::sync::statistics::AtomicBool;
    use std::cell::Cell;
    use std::sync::atomic::Ordering;
    use std::time::Instant;

    /// The origin and the counter read just after it.
    struct Origin {
        instant: Instant,
        counter: u64,
        /// Whether the counter may be used at all (see the module documentation).
        usable: bool,
    }

    static ORIGIN: OnceLock<Origin> = OnceLock::new();

    /// Set when an extrapolation was found behind the true time: never extrapolate again.
    static DISABLED: AtomicBool = AtomicBool::new(false);

    /// A thread's base. `valid_counts == 0` means "no base: read `Instant::now()`".
    #[derive(Clone, Copy)]
    struct Base {
        counter: u64,
        nanos: u64,
        /// Nanoseconds per count, 32.32 fixed point.
        rate: u64,
        /// Counts for which this base may be used.
        valid_counts: u64,
    }

    thread_local! {
        static BASE: Cell<Base> = const {
            Cell::new(Base { counter: 0, nanos: 0, rate: 0, valid_counts: 0 })
        };
    }

    #[inline]
    fn counter() -> u64 {
        // SAFETY: `rdtsc` exists on every x86-64 processor and has no preconditions.
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    fn counter_is_usable() -> bool {
        // SAFETY: `cpuid` exists on every x86-64 processor; leaf 0x8000_0000 reports the
        // highest extended leaf, and leaf 0x8000_0007 is only queried if it exists. (Newer
        // compilers consider `__cpuid` safe; the block keeps older ones building.)
        #[allow(unused_unsafe)]
        let invariant = unsafe {
            let highest = core::arch::x86_64::__cpuid(0x8000_0000).eax;
            highest >= 0x8000_0007 && core::arch::x86_64::__cpuid(0x8000_0007).edx & (1 << 8) != 0
        };
        let source = std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .unwrap_or_default();
        invariant && source.trim() == "tsc"
    }

    fn origin_record() -> &'static Origin {
        ORIGIN.get_or_init(|| {
            let usable = counter_is_usable();
            let (instant, _, after) = clock_between_counts();
            // The count read after the instant: the rate comes out high, readings late.
            Origin {
                instant,
                counter: after,
                usable,
            }
        })
    }

    /// `Instant::now()` with the counter read just before and just after it, retried a few
    /// times if something (preemption, an interrupt) came between the reads.
    fn clock_between_counts() -> (Instant, u64, u64) {
        // About 20 µs at 2.5 GHz: a pair this tight keeps readings late by at most that.
        const TIGHT_COUNTS: u64 = 50_000;
        let mut attempt = 0;
        loop {
            let before = counter();
            // The ordered counter read inside `Instant::now()` waits for `before` to complete.
            let instant = Instant::now();
            let after = counter();
            attempt += 1;
            if after.wrapping_sub(before) <= TIGHT_COUNTS || attempt == 4 {
                return (instant, before, after);
            }
        }
    }

    pub(super) fn origin() -> Instant {
        origin_record().instant
    }

    #[inline]
    pub(super) fn now_nanos() -> Option<u64> {
        let now = counter();
        let base = BASE.with(Cell::get);
        let elapsed = now.wrapping_sub(base.counter);
        if elapsed < base.valid_counts {
            return Some(base.nanos + scale(elapsed, base.rate));
        }
        refresh(now, base)
    }

    /// `counts` x `rate` (32.32 fixed point), in nanoseconds.
    #[inline]
    fn scale(counts: u64, rate: u64) -> u64 {
        ((counts as u128 * rate as u128) >> 32) as u64
    }

    /// Takes a new base for this thread and returns the precise time.
    #[cold]
    fn refresh(stale_counter: u64, stale: Base) -> Option<u64> {
        let origin = origin_record();
        if !origin.usable || DISABLED.load(Ordering::Relaxed) {
            return None;
        }
        let (instant, before, after) = clock_between_counts();
        let nanos = u64::try_from(instant.saturating_duration_since(origin.instant).as_nanos())
            .unwrap_or(u64::MAX);
        // The new base pairs `nanos` with the count read *before* it: whatever came between
        // the two reads makes extrapolations later, never earlier (pairing it with the count
        // read after would make every reading on this thread early by that delay).
        //
        // Check the old base against the true time, if it was used until just now (a base
        // left unused for long may have drifted harmlessly: it is not used again). At `after`,
        // an accurate extrapolation is at or past `nanos`.
        let span = after.wrapping_sub(stale.counter);
        if stale.valid_counts != 0
            && stale_counter.wrapping_sub(stale.counter) <= 2 * stale.valid_counts
            && span <= 2 * stale.valid_counts
            && stale.nanos + scale(span, stale.rate) + MARGIN_NANOS / 2 < nanos
        {
            DISABLED.store(true, Ordering::Relaxed);
            return None;
        }
        // Until the rate is calibrated (or if it came out zero), `valid_counts` stays 0: every
        // reading then takes this path and returns the precise time.
        let (rate, valid_counts) = if nanos >= CALIBRATION_NANOS && before > origin.counter {
            let counts = before - origin.counter;
            let rate = u64::try_from(((nanos as u128) << 32) / counts as u128).unwrap_or(0);
            let valid_counts = match rate {
                0 => 0,
                rate => u64::try_from(((REFRESH_NANOS as u128) << 32) / rate as u128).unwrap_or(0),
            };
            (rate, valid_counts)
        } else {
            (0, 0)
        };
        let base = Base {
            counter: before,
            nanos,
            rate,
            valid_counts,
        };
        BASE.with(|cell| cell.set(base));
        Some(nanos)
    }

    /// Whether readings are extrapolated from the counter: it is usable on this machine, and
    /// no drift check switched extrapolation off.
    pub(super) fn in_use() -> bool {
        origin_record().usable && !DISABLED.load(Ordering::Relaxed)
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux", not(loom))))]
mod imp {
    use crate::sync::OnceLock;
    use std::time::Instant;

    static ORIGIN: OnceLock<Instant> = OnceLock::new();

    pub(super) fn origin() -> Instant {
        *ORIGIN.get_or_init(Instant::now)
    }

    #[inline]
    pub(super) fn now_nanos() -> Option<u64> {
        None
    }

    pub(super) fn in_use() -> bool {
        false
    }
}

/// Whether readings are extrapolated from the counter on this machine (statistics).
pub(crate) fn in_use() -> bool {
    imp::in_use()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Over 150 ms (past the calibration), no reading is behind `Instant::now()` taken before it
    /// by more than the margin, nor ahead of one taken after it by more than a millisecond.
    #[test]
    fn readings_stay_within_the_margin() {
        let origin = origin();
        let start = Instant::now();
        let mut extrapolated = 0u64;
        while start.elapsed() < Duration::from_millis(150) {
            for _ in 0..1000 {
                let before = origin.elapsed().as_nanos() as u64;
                let Some(reading) = now_nanos() else { return };
                let after = origin.elapsed().as_nanos() as u64;
                assert!(
                    reading + MARGIN_NANOS >= before,
                    "reading {reading} ns is behind {before} ns by more than the margin"
                );
                assert!(
                    reading <= after + 1_000_000,
                    "reading {reading} ns is ahead of {after} ns"
                );
                extrapolated += 1;
            }
            std::thread::sleep(Duration::from_micros(300));
        }
        assert!(extrapolated > 0);
    }
}
