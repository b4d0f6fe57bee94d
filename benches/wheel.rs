//! Benchmarks of the standalone timing wheel against a binary-heap timer queue.
//!
//! Groups `insert`, `remove` and `advance`, each at 1 thousand, 1 million and 10 million stored
//! entries (`BenchmarkId::new(implementation, stored_entries)`), for two implementations:
//!
//! * `shardwheel`: [`shardwheel::wheel::Wheel`].
//! * `binary_heap`: a `BinaryHeap<Reverse<(deadline, seq)>>` with **lazy deletion**, the
//!   `java.util.Timer` / `ScheduledThreadPoolExecutor` (without `removeOnCancel`) approach:
//!   cancelling marks the task in O(1) and leaves its heap entry behind as a tombstone, which is
//!   dropped when it reaches the top; when tombstones outnumber live entries the heap is purged
//!   (`retain` + rebuild), so cancel is amortised O(1) and the heap holds at most about twice
//!   the live entries. The "cancelled set" is a slab of task records indexed by the low half of
//!   `seq` (the high half is a generation), like a `TimerTask`'s own state field, so no hashing.
//!
//! What one measured element is:
//!
//! * `insert`: one insert into a structure already holding N entries (deadlines uniform in
//!   `[1, 2^24]`). Inserts are timed in batches of 64; the 64 entries are then cancelled again
//!   outside the measured region, so the structure keeps holding N (the heap's purges happen in
//!   that unmeasured part).
//! * `remove`: one cancel of a random live entry out of N. Cancels are timed in batches of 64;
//!   64 fresh entries are then inserted outside the measured region. The heap's amortised purges
//!   are inside the measured region: they are part of what its cancel costs.
//! * `advance`: the cost per expired entry of advancing tick by tick through a structure holding
//!   N entries whose deadlines are spread over the next N ticks, exactly one per tick (a shuffled
//!   permutation: the setup starts with deadlines `1..=N`). One iteration times `advance_to(t)`
//!   for the next `C = min(N, 65536)` ticks, which expire exactly C entries (its throughput is
//!   C elements); then, outside the measured region, C new entries are scheduled one per tick
//!   just past the last scheduled tick (shuffled), so the structure holds N again.
//!
//! Settings are modest (10 samples, short warm-up and measurement) so that the whole
//! `cargo bench --bench wheel` stays within a few minutes on a 2-core machine, and
//! `cargo bench --bench wheel -- --test` (one run of each) within a minute.

// `criterion_group!` defines an undocumented `pub fn`.
#![allow(missing_docs)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{
    BenchmarkGroup, BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group,
    criterion_main,
};
use shardwheel::wheel::{EntryKey, Wheel};

/// Stored entries at which every group is measured.
const SIZES: [usize; 3] = [1_000, 1_000_000, 10_000_000];
/// Operations timed together in `insert` and `remove` (amortises reading the clock).
const BATCH: usize = 64;
/// Deadlines of the entries stored for `insert` and `remove` are uniform in `[1, WINDOW]`.
const WINDOW: u64 = 1 << 24;

/// A deterministic pseudo-random sequence (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[1, bound]` (bias negligible here).
    fn deadline(&mut self, bound: u64) -> u64 {
        1 + self.next() % bound
    }

    fn index(&mut self, len: usize) -> usize {
        (self.next() % len as u64) as usize
    }
}

/// What the benchmarks need from a timer structure.
trait Timers {
    type Key: Copy;
    const NAME: &'static str;
    fn new() -> Self;
    fn insert(&mut self, deadline: u64, value: u64) -> Self::Key;
    fn cancel(&mut self, key: Self::Key) -> Option<u64>;
    fn advance_to(&mut self, now: u64, on_expired: impl FnMut(u64)) -> usize;
    fn len(&self) -> usize;
}

impl Timers for Wheel<u64> {
    type Key = EntryKey;
    const NAME: &'static str = "shardwheel";

    fn new() -> Self {
        Wheel::new()
    }
    fn insert(&mut self, deadline: u64, value: u64) -> EntryKey {
        Wheel::insert(self, deadline, value).expect("wheel full")
    }
    fn cancel(&mut self, key: EntryKey) -> Option<u64> {
        self.remove(key)
    }
    fn advance_to(&mut self, now: u64, mut on_expired: impl FnMut(u64)) -> usize {
        Wheel::advance_to(self, now, |_, value| on_expired(value))
    }
    fn len(&self) -> usize {
        Wheel::len(self)
    }
}

/// One task record of the heap baseline: its value while live, `None` once cancelled (while
/// its tombstone is still in the heap) or vacant.
struct Task {
    generation: u32,
    value: Option<u64>,
}

/// The binary-heap baseline with lazy deletion (see the module documentation).
struct HeapTimers {
    /// Min-heap of `(deadline, seq)`; `seq` is `generation << 32 | task index`, which also
    /// breaks deadline ties in insertion order within a generation.
    heap: BinaryHeap<Reverse<(u64, u64)>>,
    tasks: Vec<Task>,
    free: Vec<u32>,
    live: usize,
    tombstones: usize,
}

impl HeapTimers {
    /// Drops every tombstone and rebuilds the heap: O(heap size), run when tombstones outnumber
    /// live entries, so O(1) amortised per cancel.
    fn purge(&mut self) {
        let HeapTimers {
            heap, tasks, free, ..
        } = self;
        heap.retain(|&Reverse((_, seq))| {
            let index = seq as u32;
            let task = &mut tasks[index as usize];
            if task.value.is_some() {
                true
            } else {
                task.generation = task.generation.wrapping_add(1);
                free.push(index);
                false
            }
        });
        self.tombstones = 0;
    }
}

impl Timers for HeapTimers {
    type Key = u64;
    const NAME: &'static str = "binary_heap";

    fn new() -> Self {
        HeapTimers {
            heap: BinaryHeap::new(),
            tasks: Vec::new(),
            free: Vec::new(),
            live: 0,
            tombstones: 0,
        }
    }

    fn insert(&mut self, deadline: u64, value: u64) -> u64 {
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                self.tasks.push(Task {
                    generation: 0,
                    value: None,
                });
                (self.tasks.len() - 1) as u32
            }
        };
        let task = &mut self.tasks[index as usize];
        task.value = Some(value);
        let seq = u64::from(task.generation) << 32 | u64::from(index);
        self.heap.push(Reverse((deadline, seq)));
        self.live += 1;
        seq
    }

    fn cancel(&mut self, seq: u64) -> Option<u64> {
        let task = self.tasks.get_mut(seq as u32 as usize)?;
        if task.generation != (seq >> 32) as u32 {
            return None;
        }
        let value = task.value.take()?;
        self.live -= 1;
        self.tombstones += 1;
        if self.tombstones > self.live.max(BATCH) {
            self.purge();
        }
        Some(value)
    }

    fn advance_to(&mut self, now: u64, mut on_expired: impl FnMut(u64)) -> usize {
        let mut expired = 0;
        while let Some(&Reverse((deadline, seq))) = self.heap.peek() {
            if deadline > now {
                break;
            }
            self.heap.pop();
            let index = seq as u32;
            let task = &mut self.tasks[index as usize];
            match task.value.take() {
                Some(value) => {
                    self.live -= 1;
                    expired += 1;
                    on_expired(value);
                }
                None => self.tombstones -= 1,
            }
            task.generation = task.generation.wrapping_add(1);
            self.free.push(index);
        }
        expired
    }

    fn len(&self) -> usize {
        self.live
    }
}

/// A structure holding `n` entries with deadlines uniform in `[1, window]`, and their keys.
fn filled<T: Timers>(n: usize, window: u64, rng: &mut Rng) -> (T, Vec<T::Key>) {
    let mut timers = T::new();
    let keys = (0..n)
        .map(|i| timers.insert(rng.deadline(window), i as u64))
        .collect();
    (timers, keys)
}

/// Group settings for a size: short, but longer for the big sizes, whose operations miss the
/// caches more and vary more.
fn configure(group: &mut BenchmarkGroup<'_, WallTime>, n: usize) {
    let (warm_up, measurement) = match n {
        ..=1_000 => (Duration::from_millis(300), Duration::from_secs(1)),
        _ => (Duration::from_millis(500), Duration::from_secs(2)),
    };
    group.warm_up_time(warm_up);
    group.measurement_time(measurement);
}

fn bench_insert<T: Timers>(group: &mut BenchmarkGroup<'_, WallTime>, n: usize) {
    // Built on first use only, so filtered-out benchmarks cost nothing.
    let mut state: Option<(T, Rng)> = None;
    group.bench_with_input(BenchmarkId::new(T::NAME, n), &n, |b, &n| {
        let (timers, rng) = state.get_or_insert_with(|| {
            let mut rng = Rng(n as u64);
            (filled::<T>(n, WINDOW, &mut rng).0, rng)
        });
        b.iter_custom(|iters| {
            let mut measured = Duration::ZERO;
            let mut keys: Vec<T::Key> = Vec::with_capacity(BATCH);
            let mut deadlines = [0u64; BATCH];
            let mut done = 0;
            while done < iters {
                let batch = (iters - done).min(BATCH as u64) as usize;
                for deadline in &mut deadlines[..batch] {
                    *deadline = rng.deadline(WINDOW);
                }
                let started = Instant::now();
                for (i, &deadline) in deadlines[..batch].iter().enumerate() {
                    keys.push(timers.insert(deadline, i as u64));
                }
                measured += started.elapsed();
                for key in keys.drain(..) {
                    black_box(timers.cancel(key));
                }
                done += batch as u64;
            }
            debug_assert_eq!(timers.len(), n);
            measured
        });
    });
}

fn bench_remove<T: Timers>(group: &mut BenchmarkGroup<'_, WallTime>, n: usize) {
    let mut state: Option<(T, Vec<T::Key>, Rng)> = None;
    group.bench_with_input(BenchmarkId::new(T::NAME, n), &n, |b, &n| {
        let (timers, live_keys, rng) = state.get_or_insert_with(|| {
            let mut rng = Rng(n as u64 + 1);
            let (timers, keys) = filled::<T>(n, WINDOW, &mut rng);
            (timers, keys, rng)
        });
        b.iter_custom(|iters| {
            let mut measured = Duration::ZERO;
            let mut victims: Vec<T::Key> = Vec::with_capacity(BATCH);
            let mut done = 0;
            while done < iters {
                let batch = (iters - done).min(BATCH as u64) as usize;
                for _ in 0..batch {
                    let at = rng.index(live_keys.len());
                    victims.push(live_keys.swap_remove(at));
                }
                let started = Instant::now();
                for &key in &victims {
                    black_box(timers.cancel(key));
                }
                measured += started.elapsed();
                victims.clear();
                for i in 0..batch {
                    live_keys.push(timers.insert(rng.deadline(WINDOW), i as u64));
                }
                done += batch as u64;
            }
            debug_assert_eq!(timers.len(), n);
            measured
        });
    });
}

/// The `advance` benchmark's structure in its steady state: it holds `n` entries, exactly one
/// due at each of the next `n` ticks (inserted in shuffled order).
struct Steady<T> {
    timers: T,
    now: u64,
    scheduled_until: u64,
    rng: Rng,
    chunk: Vec<u64>,
}

impl<T: Timers> Steady<T> {
    fn new(n: usize) -> Steady<T> {
        let mut steady = Steady {
            timers: T::new(),
            now: 0,
            scheduled_until: 0,
            rng: Rng(n as u64 + 2),
            chunk: Vec::new(),
        };
        steady.schedule(n);
        steady
    }

    /// Inserts one entry at each of the next `count` unscheduled ticks, in random order.
    fn schedule(&mut self, count: usize) {
        let first = self.scheduled_until + 1;
        self.chunk.clear();
        self.chunk.extend(first..first + count as u64);
        for i in (1..count).rev() {
            let j = self.rng.index(i + 1);
            self.chunk.swap(i, j);
        }
        for &deadline in &self.chunk {
            self.timers.insert(deadline, deadline);
        }
        self.scheduled_until += count as u64;
    }
}

/// Ticks (and so expired entries) per measured iteration of `advance`.
fn advance_chunk(n: usize) -> usize {
    n.min(1 << 16)
}

fn bench_advance<T: Timers>(group: &mut BenchmarkGroup<'_, WallTime>, n: usize) {
    let mut state: Option<Steady<T>> = None;
    group.bench_with_input(BenchmarkId::new(T::NAME, n), &n, |b, &n| {
        let steady = state.get_or_insert_with(|| Steady::new(n));
        let chunk = advance_chunk(n);
        b.iter_custom(|iters| {
            let mut measured = Duration::ZERO;
            for _ in 0..iters {
                let from = steady.now;
                let mut expired = 0;
                let started = Instant::now();
                for now in from + 1..=from + chunk as u64 {
                    expired += steady.timers.advance_to(now, |value| {
                        black_box(value);
                    });
                }
                measured += started.elapsed();
                assert_eq!(expired, chunk, "{} lost entries", T::NAME);
                steady.now += chunk as u64;
                // Back to n stored entries, outside the measured region.
                steady.schedule(chunk);
                debug_assert_eq!(steady.timers.len(), n);
            }
            measured
        });
    });
}

fn insert(c: &mut Criterion) {
    let mut group = c.benchmark_group("insert");
    group.sample_size(10);
    group.throughput(Throughput::Elements(1));
    for n in SIZES {
        configure(&mut group, n);
        bench_insert::<Wheel<u64>>(&mut group, n);
        bench_insert::<HeapTimers>(&mut group, n);
    }
    group.finish();
}

fn remove(c: &mut Criterion) {
    let mut group = c.benchmark_group("remove");
    group.sample_size(10);
    group.throughput(Throughput::Elements(1));
    for n in SIZES {
        configure(&mut group, n);
        bench_remove::<Wheel<u64>>(&mut group, n);
        bench_remove::<HeapTimers>(&mut group, n);
    }
    group.finish();
}

fn advance(c: &mut Criterion) {
    let mut group = c.benchmark_group("advance");
    group.sample_size(10);
    // Iterations are long (up to 65536 ticks): keep the iteration count per sample flat.
    group.sampling_mode(SamplingMode::Flat);
    for n in SIZES {
        configure(&mut group, n);
        group.throughput(Throughput::Elements(advance_chunk(n) as u64));
        bench_advance::<Wheel<u64>>(&mut group, n);
        bench_advance::<HeapTimers>(&mut group, n);
    }
    group.finish();
}

criterion_group!(benches, insert, remove, advance);
criterion_main!(benches);
