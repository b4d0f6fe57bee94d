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
//! far more than the read itself. The unordered `rdtsc` is cheaper still and waits for nothing.
//!
//! # Contract
//!
//! [`now_nanos`] answers a time that is **never before `Instant::now()` at the call** (it may
//! be later by up to about [`MARGIN_NANOS`]), or `None` (read `Instant::now()` instead): a
//! deadline computed from it is never early. Reading later than the true time is always safe.
//!
//! # How
//!
//! Each thread keeps a *base*: the counter `c0`, then `Instant::now()` as `t0` (nanoseconds since
//! a process-wide origin). A reading at count `c` is `t0 + (c - c0) x rate + MARGIN_NANOS`, where
//! `rate` (nanoseconds per count, 32.32 fixed point) is an *upper bound* of the counter's true
//! period. It is used only if `c` is at or after every count this thread read since the base
//! (the counter did not go back) and less than [`REFRESH_NANOS`] of counts after `c0` (the base
//! is fresh); otherwise the reading is a *refresh*: a new base whose `Instant::now()` is
//! returned as it is. So every extrapolation starts from an instant at most 1 ms of counts old,
//! and a base is not used across a suspend through which the counter ran, a counter reset, or
//! a jump back larger than the counts since the thread's previous reading.
//!
//! The rate comes from *samples*: at a refresh at least [`SAMPLE_NANOS`] (and at most
//! [`SAMPLE_MAX_NANOS`]) after the thread's previous sample point, the sample is the elapsed
//! `Instant` nanoseconds over the counts between the two points, taking the counts that make it
//! largest (the count read after the earlier instant, before the later one). A sample enters the
//! process-wide rate (a running maximum) only when it agrees within 1/512 with the same
//! thread's previous sample, an interval that does not overlap it. A suspend during which the
//! counter ran but the monotonic clock did not makes a sample *low*, a counter reset makes it
//! wild: neither agrees with its neighbour, so neither counts. The rate used is the maximum plus
//! 1/512 (NTP may slew the monotonic clock by 500 ppm either way). Until some thread has
//! produced two agreeing samples (at least 10 ms into the process) every reading is a refresh.
//!
//! # Why never early
//!
//! A base's counter is read *before* its instant (whose own ordered counter read waits for it),
//! so `t0` is at or after the true time at `c0`. The true time elapsed since then is at most
//! `(c - c0) x rate` as long as the counter does not run slower than the rate says; the kernel
//! guarantees that while its clock source is `tsc`, since the monotonic clock is then itself
//! computed from this counter (with a period that NTP moves by at most 500 ppm). What remains is
//! the time by which an unordered `rdtsc` runs ahead of the instructions before it (well under a
//! microsecond) and the kernel-checked synchronization of the counters of different cores:
//! [`MARGIN_NANOS`] covers both with room to spare. Faults, and what stops them:
//!
//! | fault | effect on a reading | what catches it |
//! |-------|---------------------|-----------------|
//! | counter jumps forward, or runs through a suspend (the monotonic clock does not) | later (safe) | the base expires (too many counts); the sample across it is low: it disagrees, and the maximum ignores it |
//! | counter jumps back or resets, or the thread moves to a core whose counter is behind, by more than the counts since the thread's previous reading | would be earlier | the "not before the last count" check: a refresh, whose base starts from the fresh instant |
//! | the same, by less than that (the thread had not read the clock for a while) | earlier by up to the jump, until the next refresh | the margin covers 50 µs; the next refresh (at most 1 ms of counts later) checks the old base's extrapolation against the fresh instant and switches the fast path off if a reading could have been early |
//! | the counter slows down relative to the monotonic clock (by a fraction `s`) | earlier by up to `s` x 1 ms, until the next refresh | the margin absorbs `s` up to ~4 %; beyond, the next refresh's check switches the fast path off |
//! | the kernel gives up the `tsc` clock source (marks it unstable) | as above | the clock source is read again every [`SOURCE_CHECK_NANOS`] (on a refresh); anything but `tsc` switches the fast path off |
//!
//! Switched off means for the rest of the process: every reading is then `None` (also after a
//! counter reset that climbs back past an old base: conservative). Not caught before the next
//! refresh, so early by up to the fault over at most one base: a counter that slows by more than
//! the margin allows, or goes back by more than the margin but less than the time since the
//! thread's previous reading, while the kernel still calls it `tsc`; the kernel's own
//! `Instant::now()`, computed from the same counter, is then wrong in the same way.
//!
//! # Where it is used
//!
//! Only where it is known to be sound: x86-64 Linux whose kernel clock source is `tsc` (the kernel
//! itself then derives the monotonic clock from the counter, and has checked that it is
//! synchronized across cores) on a processor with an invariant counter (CPUID 8000_0007h,
//! EDX bit 8). Everywhere else, and under loom, [`now_nanos`] always answers `None` and callers use
//! `Instant::now()`.

use std::time::Instant;

/// The clock's parameters (used only where the fast clock exists).
#[cfg_attr(
    not(all(target_arch = "x86_64", target_os = "linux", not(shardwheel_loom))),
    allow(dead_code)
)]
mod parameters {
    /// A base is used for at most this many nanoseconds of counts.
    pub(super) const REFRESH_NANOS: u64 = 1_000_000;

    /// A rate sample spans at least this long.
    pub(super) const SAMPLE_NANOS: u64 = 5_000_000;

    /// A longer rate sample is thrown away (it is more likely to span a suspend).
    pub(super) const SAMPLE_MAX_NANOS: u64 = 100_000_000;

    /// How often the kernel's clock source is read again.
    pub(super) const SOURCE_CHECK_NANOS: u64 = 100_000_000;

    /// What an extrapolated reading adds, so that it is never early (see the module documentation).
    pub(super) const MARGIN_NANOS: u64 = 50_000;
}
#[cfg_attr(
    not(all(target_arch = "x86_64", target_os = "linux", not(shardwheel_loom))),
    allow(unused_imports)
)]
use parameters::*;

/// The process-wide origin of [`now_nanos`].
pub(crate) fn origin() -> Instant {
    imp::origin()
}

/// Nanoseconds since [`origin`], never before `Instant::now()` at the call (at most about
/// [`MARGIN_NANOS`] after it), or `None` where this clock is not used (read `Instant::now()`
/// instead).
#[inline]
pub(crate) fn now_nanos() -> Option<u64> {
    imp::now_nanos()
}

/// [`now_nanos`] where it needs no refresh: `None` also where it would refresh (read
/// [`now_nanos`] then). For fast paths that do without a call (and so without a stack frame),
/// with the full reading out of line.
#[inline(always)]
pub(crate) fn now_nanos_unless_refresh() -> Option<u64> {
    imp::now_nanos_unless_refresh()
}

/// [`now_nanos`] as an instant: never before `Instant::now()` at the call (at most about
/// [`MARGIN_NANOS`] after it), or `None` where this clock is not used. For `HyperTimer::now`.
#[cfg(feature = "hyper")]
#[inline]
pub(crate) fn now_instant() -> Option<Instant> {
    imp::now_instant()
}

#[cfg(all(target_arch = "x86_64", target_os = "linux", not(shardwheel_loom)))]
mod imp {
    use super::{MARGIN_NANOS, REFRESH_NANOS, SAMPLE_MAX_NANOS, SAMPLE_NANOS, SOURCE_CHECK_NANOS};
    use crate::sync::OnceLock;
    use crate::sync::statistics::{AtomicBool, AtomicU64};
    use std::cell::Cell;
    use std::sync::atomic::Ordering;
    use std::time::Instant;

    /// Where counts come from: the processor, or (in tests) a faulty stand-in.
    pub(super) trait Counter {
        /// The counter, unordered.
        fn read(&self) -> u64;
        /// Whether the processor's counter is invariant (runs at one rate in every state).
        fn is_invariant(&self) -> bool;
        /// Whether the kernel's clock source is the counter.
        fn source_is_tsc(&self) -> bool;
    }

    /// The time-stamp counter.
    pub(super) struct Tsc;

    impl Counter for Tsc {
        #[inline]
        fn read(&self) -> u64 {
            // SAFETY: `rdtsc` exists on every x86-64 processor and has no preconditions.
            unsafe { core::arch::x86_64::_rdtsc() }
        }

        fn is_invariant(&self) -> bool {
            // SAFETY: `cpuid` exists on every x86-64 processor; leaf 0x8000_0000 reports the
            // highest extended leaf, and leaf 0x8000_0007 is only queried if it exists. (Newer
            // compilers consider `__cpuid` safe; the block keeps older ones building.)
            #[allow(unused_unsafe)]
            unsafe {
                let highest = core::arch::x86_64::__cpuid(0x8000_0000).eax;
                highest >= 0x8000_0007
                    && core::arch::x86_64::__cpuid(0x8000_0007).edx & (1 << 8) != 0
            }
        }

        fn source_is_tsc(&self) -> bool {
            std::fs::read_to_string(
                "/sys/devices/system/clocksource/clocksource0/current_clocksource",
            )
            .is_ok_and(|source| source.trim() == "tsc")
        }
    }

    /// What all threads share.
    pub(super) struct Shared {
        pub(super) origin: Instant,
        /// The counter may be used at all (invariant, clock source `tsc` at start).
        usable: bool,
        /// Set when a check failed: never extrapolate again.
        disabled: AtomicBool,
        /// Upper bound of nanoseconds per count (32.32), before the slack; 0 until calibrated.
        rate: AtomicU64,
        /// When (nanoseconds since the origin) the clock source is to be read again.
        next_source_check: AtomicU64,
    }

    impl Shared {
        pub(super) fn new(counter: &impl Counter) -> Shared {
            let usable = counter.is_invariant() && counter.source_is_tsc();
            Shared {
                origin: Instant::now(),
                usable,
                disabled: AtomicBool::new(false),
                rate: AtomicU64::new(0),
                next_source_check: AtomicU64::new(SOURCE_CHECK_NANOS),
            }
        }

        pub(super) fn in_use(&self) -> bool {
            self.usable && !self.disabled.load(Ordering::Relaxed)
        }
    }

    /// A thread's base. `valid_counts == 0` means "no base: refresh".
    #[derive(Clone, Copy)]
    struct Base {
        counter: u64,
        nanos: u64,
        /// Nanoseconds per count (32.32), slack included.
        rate: u64,
        /// Counts after `counter` for which this base may be used.
        valid_counts: u64,
    }

    /// The start of a thread's rate sample, and its previous sample.
    #[derive(Clone, Copy)]
    struct Sample {
        /// The count read just after the start's instant (0: no sample started).
        counter_after: u64,
        nanos: u64,
        /// The previous sample (0: none).
        previous_rate: u64,
    }

    /// One thread's state. A reading reads the first line only: the fields it reads first.
    #[repr(C, align(64))]
    pub(super) struct Thread {
        base: Cell<Base>,
        /// The latest count this thread read.
        last: Cell<u64>,
        /// The origin ([`Shared::origin`]), copied at the first refresh: an instant is read
        /// without a line of the shared state.
        origin: Cell<Option<Instant>>,
        sample: Cell<Sample>,
    }

    impl Thread {
        pub(super) const fn new() -> Thread {
            Thread {
                base: Cell::new(Base {
                    counter: 0,
                    nanos: 0,
                    rate: 0,
                    valid_counts: 0,
                }),
                last: Cell::new(0),
                origin: Cell::new(None),
                sample: Cell::new(Sample {
                    counter_after: 0,
                    nanos: 0,
                    previous_rate: 0,
                }),
            }
        }
    }

    static SHARED: OnceLock<Shared> = OnceLock::new();

    thread_local! {
        static THREAD: Thread = const { Thread::new() };
    }

    #[inline]
    fn shared() -> &'static Shared {
        SHARED.get_or_init(|| Shared::new(&Tsc))
    }

    pub(super) fn origin() -> Instant {
        shared().origin
    }

    #[inline]
    pub(super) fn now_nanos() -> Option<u64> {
        THREAD.with(|thread| read(shared_for_refresh, thread, &Tsc))
    }

    #[inline(always)]
    pub(super) fn now_nanos_unless_refresh() -> Option<u64> {
        THREAD.with(|thread| read_from_base(thread, &Tsc))
    }

    /// [`shared`] for a refresh (out of line, so that a reading's fast path stays small).
    #[cold]
    #[inline(never)]
    fn shared_for_refresh() -> &'static Shared {
        shared()
    }

    #[cfg(feature = "hyper")]
    #[inline]
    pub(super) fn now_instant() -> Option<Instant> {
        let nanos = now_nanos()?;
        // A reading comes from a base, which a refresh made after copying the origin.
        let origin = THREAD
            .with(|thread| thread.origin.get())
            .unwrap_or_else(origin);
        origin.checked_add(std::time::Duration::from_nanos(nanos))
    }

    pub(super) fn in_use() -> bool {
        shared().in_use()
    }

    /// A reading (see the module documentation), from `thread`'s base or a refresh. Only a
    /// refresh looks at what threads share (`shared`): a base exists only after one.
    #[inline]
    pub(super) fn read<'a>(
        shared: impl FnOnce() -> &'a Shared,
        thread: &Thread,
        counter: &impl Counter,
    ) -> Option<u64> {
        match read_from_base(thread, counter) {
            Some(nanos) => Some(nanos),
            None => refresh(shared(), thread, counter),
        }
    }

    /// [`read`] from `thread`'s base; `None` where it takes a refresh.
    #[inline(always)]
    pub(super) fn read_from_base(thread: &Thread, counter: &impl Counter) -> Option<u64> {
        let now = counter.read();
        let base = thread.base.get();
        let elapsed = now.wrapping_sub(base.counter);
        // `now` is at or after the last count (else the difference wraps past `elapsed`) and
        // the base is fresh.
        if now.wrapping_sub(thread.last.get()) <= elapsed && elapsed < base.valid_counts {
            thread.last.set(now);
            return Some(base.nanos + scale_wide(elapsed, base.rate) as u64 + MARGIN_NANOS);
        }
        None
    }

    /// `counts` x `rate` (32.32 fixed point), in nanoseconds, rounded up (saturating).
    #[inline]
    fn scale(counts: u64, rate: u64) -> u64 {
        u64::try_from(scale_wide(counts, rate)).unwrap_or(u64::MAX)
    }

    /// [`scale`] without saturation, for the fast path (whose counts are below a base's
    /// `valid_counts`, so the product is at most about [`REFRESH_NANOS`]).
    #[inline]
    fn scale_wide(counts: u64, rate: u64) -> u128 {
        (counts as u128 * rate as u128).div_ceil(1 << 32)
    }

    /// `nanos` / `counts` in 32.32 fixed point (`u64::MAX` if it does not fit).
    fn rate_of(nanos: u64, counts: u64) -> u64 {
        u64::try_from(((nanos as u128) << 32).div_ceil(counts.max(1) as u128)).unwrap_or(u64::MAX)
    }

    /// `Instant::now()` with the counter read just before and just after it, retried a few
    /// times if something (preemption, an interrupt) came between the reads.
    fn clock_between_counts(counter: &impl Counter) -> (Instant, u64, u64) {
        // About 20 µs at 2.5 GHz.
        const TIGHT_COUNTS: u64 = 50_000;
        let mut attempt = 0;
        loop {
            let before = counter.read();
            // The ordered counter read inside `Instant::now()` waits for `before` to complete.
            let instant = Instant::now();
            let after = counter.read();
            attempt += 1;
            if after.wrapping_sub(before) <= TIGHT_COUNTS || attempt == 4 {
                return (instant, before, after);
            }
        }
    }

    /// Takes a new base for `thread` and returns the fresh instant (or `None` if the fast
    /// path is off). Checks the old base, the clock source and the rate on the way.
    #[cold]
    #[inline(never)]
    fn refresh(shared: &Shared, thread: &Thread, counter: &impl Counter) -> Option<u64> {
        if !shared.in_use() {
            return None;
        }
        thread.origin.set(Some(shared.origin));
        let (instant, before, after) = clock_between_counts(counter);
        let nanos = u64::try_from(instant.saturating_duration_since(shared.origin).as_nanos())
            .unwrap_or(u64::MAX);
        let stale = thread.base.get();
        thread.base.set(Base {
            valid_counts: 0,
            ..stale
        });
        thread.last.set(after);
        // The old base, extrapolated to `after` (unless the counter is now below it: reset),
        // must not be before `nanos`, an instant read before `after`. If it is, the counter
        // ran slower than the rate says, or went back by more than the margin: trust it no more.
        let span = after.wrapping_sub(stale.counter);
        if stale.valid_counts != 0
            && span < 1 << 63
            && stale
                .nanos
                .saturating_add(scale(span, stale.rate))
                .saturating_add(MARGIN_NANOS)
                < nanos
        {
            shared.disabled.store(true, Ordering::Relaxed);
            return None;
        }
        // Read the clock source again now and then (one thread does).
        let next_check = shared.next_source_check.load(Ordering::Relaxed);
        if nanos >= next_check
            && shared
                .next_source_check
                .compare_exchange(
                    next_check,
                    nanos.saturating_add(SOURCE_CHECK_NANOS),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
            && !counter.source_is_tsc()
        {
            shared.disabled.store(true, Ordering::Relaxed);
            return None;
        }
        sample(shared, thread, nanos, before, after);
        let rate = shared.rate.load(Ordering::Relaxed);
        if rate != 0 {
            let rate = rate.saturating_add(rate / 512 + 1);
            let valid_counts = ((REFRESH_NANOS as u128) << 32) / rate as u128;
            thread.base.set(Base {
                counter: before,
                nanos,
                rate,
                valid_counts: u64::try_from(valid_counts).unwrap_or(0),
            });
        }
        Some(nanos)
    }

    /// Ends the thread's rate sample at this refresh if it is long enough, and starts the next.
    fn sample(shared: &Shared, thread: &Thread, nanos: u64, before: u64, after: u64) {
        /// A pair of counts this close (2 µs at 2.5 GHz) may bound a sample.
        const SAMPLE_TIGHT_COUNTS: u64 = 5_000;
        if after.wrapping_sub(before) > SAMPLE_TIGHT_COUNTS {
            return;
        }
        let start = thread.sample.get();
        let since = nanos.wrapping_sub(start.nanos);
        if start.counter_after != 0 && since < SAMPLE_NANOS {
            return;
        }
        let counts = before.wrapping_sub(start.counter_after);
        let rate = if start.counter_after != 0
            && since <= SAMPLE_MAX_NANOS
            && counts > 0
            && counts < u64::MAX / 2
        {
            rate_of(since, counts)
        } else {
            0
        };
        let previous = start.previous_rate;
        if rate != 0 && previous != 0 && rate.abs_diff(previous) <= rate.max(previous) / 512 {
            shared.rate.fetch_max(rate.max(previous), Ordering::Relaxed);
        }
        thread.sample.set(Sample {
            counter_after: after,
            nanos,
            previous_rate: rate,
        });
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use std::time::Duration;

        /// The processor's counter with faults: `offset` added, and from count `slow_from` on
        /// it runs at `numerator / 1024` of its speed. The clock source can be switched.
        struct Faulty {
            offset: Cell<u64>,
            slow_from: Cell<u64>,
            numerator: Cell<u64>,
            source_is_tsc: Cell<bool>,
        }

        impl Faulty {
            fn new() -> Faulty {
                Faulty {
                    offset: Cell::new(0),
                    slow_from: Cell::new(u64::MAX),
                    numerator: Cell::new(1024),
                    source_is_tsc: Cell::new(true),
                }
            }

            /// The counter jumps by `counts` (wrapping: a huge value is a jump back).
            fn jump(&self, counts: u64) {
                self.offset.set(self.offset.get().wrapping_add(counts));
            }

            /// From now on the counter runs at `numerator / 1024` of its speed (once per test).
            fn slow_down(&self, numerator: u64) {
                self.slow_from.set(Tsc.read());
                self.numerator.set(numerator);
            }

            fn raw(&self, tsc: u64) -> u64 {
                let from = self.slow_from.get();
                if tsc <= from {
                    tsc
                } else {
                    from + ((tsc - from) as u128 * self.numerator.get() as u128 / 1024) as u64
                }
            }
        }

        impl Counter for Faulty {
            fn read(&self) -> u64 {
                self.raw(Tsc.read()).wrapping_add(self.offset.get())
            }
            fn is_invariant(&self) -> bool {
                Tsc.is_invariant()
            }
            fn source_is_tsc(&self) -> bool {
                self.source_is_tsc.get()
            }
        }

        /// A clock, a thread and a faulty counter of their own, so that faults stay in the test.
        struct Rig {
            shared: Shared,
            thread: Thread,
            counter: Faulty,
            extrapolated: u64,
        }

        impl Rig {
            /// `None` where the processor's counter cannot be used at all.
            fn new() -> Option<Rig> {
                let counter = Faulty::new();
                if !Tsc.is_invariant() || !Tsc.source_is_tsc() {
                    return None;
                }
                Some(Rig {
                    shared: Shared::new(&counter),
                    thread: Thread::new(),
                    counter,
                    extrapolated: 0,
                })
            }

            /// Reads for `millis` ms, asserting that no reading is before `Instant::now()`
            /// taken just before it.
            fn run(&mut self, millis: u64) {
                let start = Instant::now();
                while start.elapsed() < Duration::from_millis(millis) {
                    for _ in 0..200 {
                        self.check();
                    }
                }
            }

            /// One reading, checked.
            fn check(&mut self) {
                let before = self.nanos_now();
                let was_extrapolated = self.thread.base.get().valid_counts != 0;
                if let Some(reading) = read(|| &self.shared, &self.thread, &self.counter) {
                    assert!(
                        reading >= before,
                        "reading {reading} ns is {} ns before Instant::now() ({before} ns)",
                        before - reading
                    );
                    self.extrapolated += u64::from(was_extrapolated);
                }
            }

            fn nanos_now(&self) -> u64 {
                self.shared.origin.elapsed().as_nanos() as u64
            }

            /// Counts in `nanos` nanoseconds, at the calibrated rate.
            fn counts(&self, nanos: u64) -> u64 {
                let rate = self.shared.rate.load(Ordering::Relaxed);
                assert_ne!(rate, 0, "not calibrated");
                (((nanos as u128) << 32) / rate as u128) as u64
            }

            /// Reads until this thread's base is `micros` µs old (by its counts), or 1 s, or the
            /// fast path is off.
            fn wait_for_base_age(&mut self, micros: u64) {
                let start = Instant::now();
                let age = self.counts(micros * 1000);
                while self.shared.in_use() && start.elapsed() < Duration::from_secs(1) {
                    self.check();
                    let base = self.thread.base.get();
                    if base.valid_counts != 0
                        && self.thread.last.get().wrapping_sub(base.counter) >= age
                    {
                        return;
                    }
                }
            }

            /// Runs until calibrated and extrapolating (longer on a loaded machine).
            fn calibrate(&mut self) {
                let start = Instant::now();
                while self.extrapolated < 1000 && start.elapsed() < Duration::from_secs(5) {
                    self.run(10);
                }
                assert_ne!(self.shared.rate.load(Ordering::Relaxed), 0);
                assert!(self.extrapolated > 0, "never extrapolated");
                assert!(self.shared.in_use());
            }
        }

        #[test]
        fn never_early_without_faults() {
            let Some(mut rig) = Rig::new() else { return };
            rig.calibrate();
            rig.run(100);
            assert!(rig.shared.in_use(), "a check fired without a fault");
            // Readings are late by little: the margin, and the rate's slack.
            let before = rig.nanos_now();
            let reading = read(|| &rig.shared, &rig.thread, &rig.counter).unwrap();
            assert!(reading < before + MARGIN_NANOS + 1_000_000);
        }

        #[test]
        fn never_early_with_a_skewed_counter() {
            let Some(mut rig) = Rig::new() else { return };
            // The counter starts far from the processor's, near the wrap.
            rig.counter.jump(u64::MAX - 3_000_000_000);
            rig.calibrate();
            rig.run(100);
            assert!(rig.shared.in_use());
        }

        #[test]
        fn never_early_when_the_counter_jumps_forward() {
            let Some(mut rig) = Rig::new() else { return };
            rig.calibrate();
            for millis in [1, 7, 250, 60_000] {
                rig.counter.jump(rig.counts(millis * 1_000_000));
                rig.run(20);
            }
            assert!(rig.shared.in_use(), "a forward jump is harmless");
        }

        /// A jump back (a counter reset, a jump of a virtual machine's counter) is caught by
        /// the next reading, which takes a new base.
        #[test]
        fn never_early_when_the_counter_jumps_back() {
            for micros in [30, 100, 300, 600, 5_000, 1_000_000] {
                let Some(mut rig) = Rig::new() else { return };
                rig.calibrate();
                rig.wait_for_base_age(micros.min(600) + 200);
                rig.counter.jump(rig.counts(micros * 1000).wrapping_neg());
                rig.run(20);
                // Behind the base (a reset): a new base. Within it, by more than the margin:
                // the refresh check switches the fast path off.
                let behind_base = micros > 1000;
                assert_eq!(
                    rig.shared.in_use(),
                    micros < 50 || behind_base,
                    "{micros} µs"
                );
            }
        }

        /// A simulated suspend: the counter runs on for 3 s while the monotonic clock stands
        /// still (as in suspend-to-idle), then later for 200 ms once more. Samples across a
        /// suspend are low; were they taken, later readings would be early.
        #[test]
        fn never_early_after_a_suspend() {
            let Some(mut rig) = Rig::new() else { return };
            rig.calibrate();
            let rate = rig.shared.rate.load(Ordering::Relaxed);
            for millis in [3_000, 200, 6, 3] {
                rig.counter.jump(rig.counts(millis * 1_000_000));
                rig.run(40);
            }
            assert!(rig.shared.in_use());
            assert!(
                rig.shared.rate.load(Ordering::Relaxed) <= rate + rate / 256,
                "a sample across a suspend set the rate"
            );
        }

        /// A suspend during the first calibration samples.
        #[test]
        fn never_early_after_a_suspend_during_calibration() {
            let Some(mut rig) = Rig::new() else { return };
            for counts in [20_000_000_000, 5_000_000_000, 1_000_000_000] {
                rig.run(6);
                rig.counter.jump(counts);
            }
            rig.run(40);
            assert!(rig.shared.in_use());
        }

        /// The thread moves to a core whose counter is behind (by more than the margin, which
        /// the kernel would not allow for the `tsc` clock source), and back, a few times.
        #[test]
        fn never_early_when_migrating_between_cores_with_different_offsets() {
            for micros in [30, 100, 400, 700] {
                let Some(mut rig) = Rig::new() else { return };
                rig.calibrate();
                let apart = rig.counts(micros * 1000);
                for _ in 0..3 {
                    rig.wait_for_base_age(micros + 200);
                    rig.counter.jump(apart.wrapping_neg());
                    rig.run(3);
                    rig.counter.jump(apart);
                    rig.run(3);
                }
                assert_eq!(rig.shared.in_use(), micros < 50, "cores {micros} µs apart");
            }
        }

        /// The counter slows by up to 4 % (a virtual machine moved to a host whose counter
        /// runs slower, without scaling): the margin covers it, and later samples raise the rate.
        #[test]
        fn never_early_when_the_counter_slows_a_little() {
            let Some(mut rig) = Rig::new() else { return };
            rig.calibrate();
            let rate = rig.shared.rate.load(Ordering::Relaxed);
            rig.counter.slow_down(984);
            rig.run(60);
            // (A preemption of over a base's span can make a refresh see the drift and switch
            // the fast path off: safe, only not what this test is about.)
            if rig.shared.in_use() {
                assert!(rig.shared.rate.load(Ordering::Relaxed) > rate + rate / 64);
            }
        }

        /// The counter runs at half speed: readings may be early until the next refresh (at
        /// most one base's span, 1 ms), which switches the fast path off.
        #[test]
        fn slowed_counter_switches_the_fast_path_off_within_a_refresh() {
            let Some(mut rig) = Rig::new() else { return };
            rig.calibrate();
            rig.counter.slow_down(512);
            let start = Instant::now();
            let mut worst = 0;
            while rig.shared.in_use() && start.elapsed() < Duration::from_millis(100) {
                let before = rig.nanos_now();
                if let Some(reading) = read(|| &rig.shared, &rig.thread, &rig.counter) {
                    worst = worst.max(before.saturating_sub(reading));
                }
            }
            assert!(!rig.shared.in_use(), "not switched off");
            assert!(worst <= REFRESH_NANOS, "{worst} ns early");
            rig.run(10);
        }

        #[test]
        fn never_early_when_the_clock_source_changes() {
            let Some(mut rig) = Rig::new() else { return };
            rig.calibrate();
            rig.counter.source_is_tsc.set(false);
            rig.run(SOURCE_CHECK_NANOS / 1_000_000 + 20);
            assert!(!rig.shared.in_use(), "the clock source was not read again");
        }

        #[test]
        fn not_used_if_the_clock_source_is_not_tsc_at_start() {
            let counter = Faulty::new();
            counter.source_is_tsc.set(false);
            let shared = Shared::new(&counter);
            let thread = Thread::new();
            assert!(!shared.in_use());
            assert_eq!(read(|| &shared, &thread, &counter), None);
        }
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux", not(shardwheel_loom))))]
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

    #[inline(always)]
    pub(super) fn now_nanos_unless_refresh() -> Option<u64> {
        None
    }

    #[cfg(feature = "hyper")]
    #[inline]
    pub(super) fn now_instant() -> Option<Instant> {
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

#[cfg(all(test, not(shardwheel_loom)))]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Over 150 ms (past the calibration), no reading is before `Instant::now()` taken before
    /// it, nor after one taken after it by more than a millisecond.
    #[test]
    fn readings_are_never_early() {
        let origin = origin();
        let start = Instant::now();
        let mut extrapolated = 0u64;
        while start.elapsed() < Duration::from_millis(150) {
            for _ in 0..1000 {
                let before = origin.elapsed().as_nanos() as u64;
                let Some(reading) = now_nanos() else { return };
                let after = origin.elapsed().as_nanos() as u64;
                assert!(
                    reading >= before,
                    "reading {reading} ns is before Instant::now() ({before} ns)"
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
