//! What the engine counts: totals and per shard, read with [`Timer::stats`](crate::Timer::stats).
//!
//! Counters are local to whoever does the work and summed on demand: submitters count
//! schedules, cancellers count cancels, handles count in-place resets, each in a
//! [`StripedCounter`] (striped by thread, [`counter_stripe`]); each shard counts fires, resets
//! and lateness in plain fields and flushes them once per turn with `Relaxed` stores.

#[cfg(not(shardwheel_loom))]
use crate::sync::process::Mutex;
#[cfg(not(shardwheel_loom))]
use crate::sync::statistics::AtomicUsize;
use crate::sync::statistics::{AtomicBool, AtomicU64};
use crate::sync::thread_local;
use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Marks an unset stripe ordinal.
const UNSET: usize = usize::MAX;

/// Gives its thread's stripe ordinal ([`counter_stripe`]) back when the thread exits, for the
/// next thread to take. Separate from [`STRIPE`], which has no destructor so that counting
/// reads it with a plain thread-local access, to the thread's very end.
#[cfg(not(shardwheel_loom))]
struct StripeHold;

#[cfg(not(shardwheel_loom))]
impl Drop for StripeHold {
    fn drop(&mut self) {
        // Any later count of this thread (from another thread-local's destructor) takes the
        // shared stripe; the next thread to take this one, through the lock, sees every count
        // made on it.
        let ordinal = STRIPE
            .try_with(|stripe| stripe.replace(SHARED_STRIPE))
            .unwrap_or(UNSET);
        if ordinal < SHARED_STRIPE {
            free_stripes().push(ordinal);
        }
    }
}

#[cfg(not(shardwheel_loom))]
thread_local! {
    /// This thread's stripe of striped counters; [`UNSET`] until its first count.
    static STRIPE: Cell<usize> = const { Cell::new(UNSET) };
    static STRIPE_HOLD: StripeHold = const { StripeHold };
}

// Loom's thread-locals take no `const` initializers. No ordinal is given back (see the loom
// `first_stripe`).
#[cfg(shardwheel_loom)]
thread_local! {
    static STRIPE: Cell<usize> = Cell::new(UNSET);
}

/// The ordinals of stripes whose threads exited.
#[cfg(not(shardwheel_loom))]
fn free_stripes() -> std::sync::MutexGuard<'static, Vec<usize>> {
    static FREE: Mutex<Vec<usize>> = Mutex::new(Vec::new());
    FREE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// This thread's stripe ordinal, for [`StripedCounter`]s: taken at the thread's first count,
/// one that no other living thread holds (an exited thread's, or a new one), or, when all
/// `STRIPES - 1` own stripes are held, [`SHARED_STRIPE`]. Not the home-shard ordinal (see
/// `engine/placement.rs`): taking one would pick a home shard for a thread that only resets
/// timers.
#[inline]
pub(crate) fn counter_stripe() -> usize {
    let ordinal = STRIPE.with(Cell::get);
    if ordinal != UNSET {
        return ordinal;
    }
    first_stripe()
}

/// Takes a stripe ordinal for a thread's first count.
#[cold]
#[cfg(not(shardwheel_loom))]
fn first_stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    // Registers the hold's destructor; a thread whose thread-locals are being destroyed
    // shares.
    let ordinal = if STRIPE_HOLD.try_with(|_| ()).is_err() {
        SHARED_STRIPE
    } else if let Some(ordinal) = free_stripes().pop() {
        ordinal
    } else {
        // Past the own stripes, the count stops growing.
        NEXT.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |next| {
            (next < SHARED_STRIPE).then_some(next + 1)
        })
        .unwrap_or(SHARED_STRIPE)
    };
    STRIPE.with(|stripe| stripe.set(ordinal));
    ordinal
}

/// Under loom, ordinals are handed out afresh in each execution, in the order threads first
/// count (the same in every execution that takes the same path, as loom needs): an execution
/// has fewer threads than own stripes, and none is reused.
#[cold]
#[cfg(shardwheel_loom)]
fn first_stripe() -> usize {
    loom::lazy_static! {
        static ref NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    }
    let ordinal = NEXT.fetch_add(1, Ordering::Relaxed).min(SHARED_STRIPE);
    STRIPE.with(|stripe| stripe.set(ordinal));
    ordinal
}

/// Counters of one shard.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardStats {
    /// Timers accepted by `schedule` (rejected schedules are not counted).
    pub scheduled: u64,
    /// Timers whose task was handed to run.
    pub fired: u64,
    /// Timers cancelled, by a handle or by shutdown.
    pub cancelled: u64,
    /// Successful resets. A [`Sleep`](crate::Sleep)'s resets to a deadline at or after its
    /// timer's, which leave the timer where it is (see the `Sleep` table), are counted when the
    /// sleep lets go of that timer: at the poll that finds it fired, or when the sleep is
    /// dropped or replaces it. Until then they touch no memory but the sleep's.
    pub reset: u64,
    /// Calls into user code that panicked: task runs, and drops of tasks, wakers or panic
    /// payloads (caught; the engine carried on).
    pub panicked: u64,
    /// Timers waiting for their deadline: `scheduled - fired - cancelled`.
    pub pending: u64,
    /// Whether the shard's thread is pinned to its core.
    pub pinned: bool,
    /// Whether the shard's thread runs with short time slices (see
    /// [`Builder::short_time_slices`](crate::Builder::short_time_slices); best effort).
    pub short_time_slice: bool,
    /// Whether the shard's thread died (an engine bug; user code cannot cause it): it runs
    /// nothing more, schedules routed to it fail with
    /// [`ScheduleError::ShardFailed`](crate::ScheduleError::ShardFailed), and `shutdown`
    /// returns the timers it still held.
    pub failed: bool,
    /// Median time from deadline to hand-off to run.
    pub lateness_p50: Duration,
    /// 99th percentile of the same.
    pub lateness_p99: Duration,
    /// Largest lateness seen.
    pub lateness_max: Duration,
}

/// Totals over all shards, and each shard's own counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Timers accepted by `schedule` (rejected schedules are not counted).
    pub scheduled: u64,
    /// Timers whose task was handed to run.
    pub fired: u64,
    /// Timers cancelled, by a handle or by shutdown.
    pub cancelled: u64,
    /// Successful resets (counted as [`ShardStats::reset`] says).
    pub reset: u64,
    /// Calls into user code that panicked: task runs, and drops of tasks, wakers or panic
    /// payloads (caught; the engine carried on).
    pub panicked: u64,
    /// Timers waiting for their deadline: `scheduled - fired - cancelled`.
    pub pending: u64,
    /// How many shard threads are pinned to a core (pinning is best effort).
    pub pinned: usize,
    /// How many shard threads run with short time slices (see
    /// [`ShardStats::short_time_slice`]).
    pub short_time_slices: usize,
    /// How many shard threads died (see [`ShardStats::failed`]); 0 unless the engine has a
    /// bug. Still counted after `shutdown`, which is how a caller of `shutdown` learns of it.
    pub failed_shards: usize,
    /// Whether `schedule(delay)` and `reset(delay)` read the time from the processor's cycle
    /// counter rather than `Instant::now()` (x86-64 Linux with the `tsc` clock source, system
    /// clock only): a cheaper reading, with deadlines about 50 µs later and never earlier.
    pub cycle_clock: bool,
    /// Median lateness over all shards (deadline to hand-off to run).
    pub lateness_p50: Duration,
    /// 99th percentile lateness over all shards.
    pub lateness_p99: Duration,
    /// Largest lateness over all shards.
    pub lateness_max: Duration,
    /// Per shard, in shard order.
    pub shards: Vec<ShardStats>,
}

/// Log-linear histogram buckets: values below 8 exactly, then 8 buckets per power of two
/// (12.5% resolution), in microseconds.
const SUB_BUCKETS: u64 = 8;
const BUCKETS: usize = 8 + 61 * 8;

fn bucket_of(micros: u64) -> usize {
    if micros < SUB_BUCKETS {
        return micros as usize;
    }
    let exponent = 63 - micros.leading_zeros() as u64; // >= 3
    let sub = (micros >> (exponent - 3)) & (SUB_BUCKETS - 1);
    (SUB_BUCKETS + (exponent - 3) * SUB_BUCKETS + sub) as usize
}

/// The largest value in a bucket (so percentiles never understate lateness).
fn bucket_upper(bucket: usize) -> u64 {
    let bucket = bucket as u64;
    if bucket < SUB_BUCKETS {
        return bucket;
    }
    let exponent = (bucket - SUB_BUCKETS) / SUB_BUCKETS + 3;
    let sub = (bucket - SUB_BUCKETS) % SUB_BUCKETS;
    let low = (1u64 << exponent) + (sub << (exponent - 3));
    low.saturating_add((1u64 << (exponent - 3)) - 1)
}

/// A shard's lateness record, local to the shard thread until flushed.
pub(crate) struct LocalLateness {
    counts: Box<[u64; BUCKETS]>,
    touched: bool,
    max_micros: u64,
}

impl LocalLateness {
    pub(crate) fn new() -> LocalLateness {
        LocalLateness {
            counts: Box::new([0; BUCKETS]),
            touched: false,
            max_micros: 0,
        }
    }

    pub(crate) fn record(&mut self, lateness_nanos: u64) {
        let micros = lateness_nanos / 1000;
        self.counts[bucket_of(micros)] += 1;
        self.max_micros = self.max_micros.max(micros);
        self.touched = true;
    }
}

/// Stripes of a [`StripedCounter`].
#[cfg(not(shardwheel_loom))]
const STRIPES: usize = 8;
/// Under loom, one own stripe: the second thread to count shares, so that a model with two
/// threads sees both ways of counting (see `engine/lease.rs`).
#[cfg(shardwheel_loom)]
const STRIPES: usize = 2;
/// The stripe that threads beyond the first `STRIPES - 1` share (counting atomically).
const SHARED_STRIPE: usize = STRIPES - 1;
/// How many threads hold an own stripe ordinal ([`counter_stripe`]) at a time.
pub(crate) const OWN_STRIPES: usize = SHARED_STRIPE;

/// A counter that many threads bump (schedules, cancels, in-place resets of one shard's
/// timers), striped by thread so that they do not all bump one cache line, and summed when
/// read.
///
/// Up to `STRIPES - 1` living threads (by [`counter_stripe`]) each own a stripe and count with
/// a plain load and store (no locked instruction, which would keep the caller's cache misses
/// from overlapping the next operation's); any more share the last stripe and count
/// atomically. A thread's stripe goes to a later thread once it exits. Counts wrap, so a
/// thread may take back what it counted (a schedule undone).
#[derive(Default)]
pub(crate) struct StripedCounter {
    stripes: [crossbeam_utils::CachePadded<AtomicU64>; STRIPES],
}

impl StripedCounter {
    /// Adds `count` for the thread whose stripe ordinal is `ordinal`.
    #[inline]
    pub(crate) fn add_at(&self, ordinal: usize, count: u64) {
        if ordinal < SHARED_STRIPE {
            let stripe = &self.stripes[ordinal];
            stripe.store(
                stripe.load(Ordering::Relaxed).wrapping_add(count),
                Ordering::Relaxed,
            );
        } else {
            self.stripes[SHARED_STRIPE].fetch_add(count, Ordering::Relaxed);
        }
    }

    /// Adds `count` for this thread. Named and called as `AtomicU64::fetch_add` (the ordering
    /// is `Relaxed` whatever is asked: counts order nothing), so counting call sites read as
    /// they did; returns nothing (a stripe's old value means nothing).
    #[inline]
    pub(crate) fn fetch_add(&self, count: u64, _: Ordering) {
        self.add_at(counter_stripe(), count);
    }

    /// Takes back `count` this thread added (see [`fetch_add`](Self::fetch_add)).
    #[inline]
    pub(crate) fn fetch_sub(&self, count: u64, _: Ordering) {
        self.add_at(counter_stripe(), count.wrapping_neg());
    }

    /// The count: the sum of the stripes (exact when no thread is counting).
    pub(crate) fn sum(&self) -> u64 {
        self.stripes.iter().fold(0, |sum, stripe| {
            sum.wrapping_add(stripe.load(Ordering::Relaxed))
        })
    }
}

/// Counters of one shard that other threads read (and some of which they update).
pub(crate) struct ShardCounters {
    /// Updated by submitters.
    pub(crate) scheduled: StripedCounter,
    /// Updated by cancellers and by shutdown.
    pub(crate) cancelled: StripedCounter,
    /// Updated by the executor.
    pub(crate) panicked: AtomicU64,
    /// Flushed by the shard.
    pub(crate) fired: AtomicU64,
    /// Flushed by the shard (resets of repeating timers, applied by the shard).
    pub(crate) reset: AtomicU64,
    /// Resets done in place by handles.
    lazy_resets: StripedCounter,
    pub(crate) pinned: AtomicBool,
    pub(crate) short_time_slice: AtomicBool,
    /// Set by the shard's worker thread when it dies, before it closes the inbox (see
    /// `ShardShared::fail`).
    pub(crate) failed: AtomicBool,
    lateness: Box<[AtomicU64]>,
    lateness_max_micros: AtomicU64,
}

impl std::fmt::Debug for ShardCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardCounters").finish_non_exhaustive()
    }
}

impl ShardCounters {
    pub(crate) fn new() -> ShardCounters {
        ShardCounters {
            scheduled: Default::default(),
            cancelled: Default::default(),
            panicked: AtomicU64::new(0),
            fired: AtomicU64::new(0),
            reset: AtomicU64::new(0),
            lazy_resets: Default::default(),
            pinned: AtomicBool::new(false),
            short_time_slice: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            lateness: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            lateness_max_micros: AtomicU64::new(0),
        }
    }

    /// Counts `count` resets done in place by the thread whose stripe ordinal is `ordinal`.
    #[inline]
    pub(crate) fn count_resets(&self, ordinal: usize, count: u64) {
        self.lazy_resets.add_at(ordinal, count);
    }

    /// Adds a shard's local lateness record and clears it.
    pub(crate) fn flush_lateness(&self, local: &mut LocalLateness) {
        if !local.touched {
            return;
        }
        for (shared, count) in self.lateness.iter().zip(local.counts.iter_mut()) {
            if *count != 0 {
                shared.fetch_add(std::mem::take(count), Ordering::Relaxed);
            }
        }
        self.lateness_max_micros
            .fetch_max(local.max_micros, Ordering::Relaxed);
        local.touched = false;
    }

    pub(crate) fn snapshot(&self) -> (ShardStats, Vec<u64>) {
        let fired = self.fired.load(Ordering::Relaxed);
        let cancelled = self.cancelled.sum();
        let scheduled = self.scheduled.sum();
        let counts: Vec<u64> = self
            .lateness
            .iter()
            .map(|count| count.load(Ordering::Relaxed))
            .collect();
        let max = self.lateness_max_micros.load(Ordering::Relaxed);
        let stats = ShardStats {
            scheduled,
            fired,
            cancelled,
            reset: self.reset.load(Ordering::Relaxed) + self.lazy_resets.sum(),
            panicked: self.panicked.load(Ordering::Relaxed),
            pending: scheduled.saturating_sub(fired + cancelled),
            pinned: self.pinned.load(Ordering::Relaxed),
            short_time_slice: self.short_time_slice.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            lateness_p50: percentile(&counts, 0.50, max),
            lateness_p99: percentile(&counts, 0.99, max),
            lateness_max: Duration::from_micros(max),
        };
        (stats, counts)
    }
}

/// The `quantile` of a histogram, as the upper bound of its bucket (capped by the maximum).
pub(crate) fn percentile(counts: &[u64], quantile: f64, max_micros: u64) -> Duration {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return Duration::ZERO;
    }
    let rank = ((total as f64) * quantile).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (bucket, count) in counts.iter().enumerate() {
        seen += count;
        if seen >= rank {
            return Duration::from_micros(bucket_upper(bucket).min(max_micros));
        }
    }
    Duration::from_micros(max_micros)
}

/// Sums per-shard statistics into totals.
pub(crate) fn total(shards: Vec<(ShardStats, Vec<u64>)>) -> Stats {
    let mut stats = Stats::default();
    let mut counts = vec![0u64; BUCKETS];
    let mut max = Duration::ZERO;
    for (shard, shard_counts) in shards {
        stats.scheduled += shard.scheduled;
        stats.fired += shard.fired;
        stats.cancelled += shard.cancelled;
        stats.reset += shard.reset;
        stats.panicked += shard.panicked;
        stats.pending += shard.pending;
        stats.pinned += usize::from(shard.pinned);
        stats.short_time_slices += usize::from(shard.short_time_slice);
        stats.failed_shards += usize::from(shard.failed);
        max = max.max(shard.lateness_max);
        for (sum, count) in counts.iter_mut().zip(shard_counts) {
            *sum += count;
        }
        stats.shards.push(shard);
    }
    let max_micros = max.as_micros() as u64;
    stats.lateness_p50 = percentile(&counts, 0.50, max_micros);
    stats.lateness_p99 = percentile(&counts, 0.99, max_micros);
    stats.lateness_max = max;
    stats
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn striped_counter_sums_every_thread_s_counts() {
        let counter = StripedCounter::default();
        // More threads than stripes: the owned stripes and the shared one.
        std::thread::scope(|scope| {
            for _ in 0..2 * STRIPES {
                scope.spawn(|| {
                    for _ in 0..100_000 {
                        counter.fetch_add(3, Ordering::Relaxed);
                        counter.fetch_sub(1, Ordering::Relaxed);
                    }
                    counter.fetch_sub(1, Ordering::Relaxed);
                });
            }
        });
        assert_eq!(counter.sum(), (2 * STRIPES * 199_999) as u64);
    }

    #[test]
    fn stripes_of_exited_threads_are_taken_again_and_lose_no_count() {
        static COUNTER: std::sync::LazyLock<StripedCounter> =
            std::sync::LazyLock::new(StripedCounter::default);
        /// Counts once more as its thread's thread-locals are destroyed, before or after the
        /// thread's stripe is given back.
        struct CountsOnExit;
        impl Drop for CountsOnExit {
            fn drop(&mut self) {
                COUNTER.fetch_add(1, Ordering::Relaxed);
            }
        }
        std::thread_local! {
            static COUNTS_ON_EXIT: CountsOnExit = const { CountsOnExit };
        }
        let threads = 4 * STRIPES;
        let mut ordinals = Vec::new();
        // One after another: each may take the stripe the one before gave back.
        for _ in 0..threads {
            let ordinal = std::thread::spawn(|| {
                COUNTS_ON_EXIT.with(|_| ());
                for _ in 0..1000 {
                    COUNTER.fetch_add(1, Ordering::Relaxed);
                }
                counter_stripe()
            })
            .join()
            .unwrap();
            ordinals.push(ordinal);
        }
        assert_eq!(COUNTER.sum(), (threads * 1001) as u64);
        assert!(ordinals.iter().all(|&ordinal| ordinal <= SHARED_STRIPE));
    }

    #[test]
    fn buckets_are_monotonic_and_cover() {
        let mut last = 0;
        for value in (0..100_000u64).chain([u64::MAX / 2, u64::MAX]) {
            let bucket = bucket_of(value);
            assert!(bucket < BUCKETS);
            assert!(bucket >= last || value > 100_000);
            assert!(
                bucket_upper(bucket) >= value,
                "{value} above its bucket {bucket}"
            );
            last = bucket;
        }
    }
}
