//! The cost of a `Sleep`: create + first poll (pending) + drop, for shardwheel's
//! `timer.sleep(10 s)` (one shard) and `shardwheel::sleep(10 s)` (the default timer) beside
//! tokio's `tokio::time::sleep(10 s)` (a current-thread runtime), all in the same shape (pinned
//! on the stack, as `tokio::time::sleep` is used); and of a `timeout(10 s, f)` whose `f` is
//! ready at the first poll (create + poll + drop: shardwheel schedules no timer for it, tokio
//! neither).
//!
//! Also prints the sizes of both futures and the bytes allocated per sleep (all threads, after
//! a warm-up): shardwheel's `Sleep`, once polled, has a 48-byte slot in the engine's
//! preallocated tables and a cell in the calling thread's stage (its task holds the waker
//! inline); tokio's `Sleep` holds its timer entry inline. Neither allocates per sleep.
//!
//! Run with `cargo bench --bench sleep` (or `-- --test` for a quick check).

// `criterion_group!` defines an undocumented `pub fn`.
#![allow(missing_docs)]

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::future::{Future, ready};
use std::hint::black_box;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Waker};
use std::time::Duration;

/// Counts allocations: on all threads, and on the thread that set [`TRACKED`] only.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static ALLOCATED_BYTES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// (allocations, bytes) of this thread while tracking, or `None` when not tracking.
    static TRACKED: Cell<Option<(u64, u64)>> = const { Cell::new(None) };
}

// SAFETY: forwards to the system allocator; the counters have no effect on allocation.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        ALLOCATED_BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        let _ = TRACKED.try_with(|tracked| {
            if let Some((count, bytes)) = tracked.get() {
                tracked.set(Some((count + 1, bytes + layout.size() as u64)));
            }
        });
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const DELAY: Duration = Duration::from_secs(10);

fn shardwheel_once(timer: &shardwheel::Timer, cx: &mut Context<'_>) {
    let mut sleep = pin!(timer.sleep(DELAY));
    assert!(sleep.as_mut().poll(cx).is_pending());
    black_box(&mut sleep);
}

fn shardwheel_default_once(cx: &mut Context<'_>) {
    let mut sleep = pin!(shardwheel::sleep(DELAY));
    assert!(sleep.as_mut().poll(cx).is_pending());
    black_box(&mut sleep);
}

fn tokio_once(cx: &mut Context<'_>) {
    let mut sleep = pin!(tokio::time::sleep(DELAY));
    assert!(sleep.as_mut().poll(cx).is_pending());
    black_box(&mut sleep);
}

fn shardwheel_timeout_ready(timer: &shardwheel::Timer, cx: &mut Context<'_>) {
    let mut timeout = pin!(timer.timeout(DELAY, ready(black_box(1u32))));
    assert!(timeout.as_mut().poll(cx).is_ready());
    black_box(&mut timeout);
}

fn tokio_timeout_ready(cx: &mut Context<'_>) {
    let mut timeout = pin!(tokio::time::timeout(DELAY, ready(black_box(1u32))));
    assert!(timeout.as_mut().poll(cx).is_ready());
    black_box(&mut timeout);
}

/// Heap use per call of `run`, averaged over many calls after a warm-up: (allocations, bytes)
/// on the calling thread, and bytes on all threads (the shard thread included).
fn heap_per_call(mut run: impl FnMut()) -> (f64, f64, f64) {
    const CALLS: u64 = 10_000;
    for _ in 0..1000 {
        run(); // warm up: tables and queues reach their steady size
    }
    std::thread::sleep(Duration::from_millis(50)); // let the shard catch up
    let all_before = ALLOCATED_BYTES.load(Ordering::Relaxed);
    TRACKED.with(|tracked| tracked.set(Some((0, 0))));
    for _ in 0..CALLS {
        run();
    }
    let (count, bytes) = TRACKED.with(|tracked| tracked.replace(None)).unwrap();
    let all = ALLOCATED_BYTES.load(Ordering::Relaxed) - all_before;
    let per_call = |total: u64| total as f64 / CALLS as f64;
    (per_call(count), per_call(bytes), per_call(all))
}

fn sleep_cost(c: &mut Criterion) {
    let timer = shardwheel::Timer::builder()
        .shards(1)
        .build()
        .expect("build timer");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("tokio runtime");
    let _context = runtime.enter();
    let mut cx = Context::from_waker(Waker::noop());

    let (ours_allocs, ours_bytes, ours_all) = heap_per_call(|| shardwheel_once(&timer, &mut cx));
    let (tokio_allocs, tokio_bytes, tokio_all) = heap_per_call(|| tokio_once(&mut cx));
    eprintln!(
        "size_of::<shardwheel::Sleep>() = {} bytes; heap per sleep on the calling thread: \
         {ours_allocs:.2} allocations, {ours_bytes:.1} bytes ({ours_all:.1} on all threads): \
         the timer's 48-byte engine slot and its stage cell (its task holding the waker \
         inline) sit in preallocated, reused tables",
        std::mem::size_of::<shardwheel::Sleep>()
    );
    eprintln!(
        "size_of::<tokio::time::Sleep>() = {} bytes; heap per sleep on the calling thread: \
         {tokio_allocs:.2} allocations, {tokio_bytes:.1} bytes ({tokio_all:.1} on all threads): \
         the timer entry is inline",
        std::mem::size_of::<tokio::time::Sleep>()
    );

    let mut group = c.benchmark_group("sleep_create_poll_drop");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500));
    group.bench_function(BenchmarkId::new("shardwheel", "1 thread"), |b| {
        b.iter(|| shardwheel_once(&timer, &mut cx));
    });
    group.bench_function(BenchmarkId::new("shardwheel", "default timer"), |b| {
        b.iter(|| shardwheel_default_once(&mut cx));
    });
    group.bench_function(BenchmarkId::new("tokio", "1 thread"), |b| {
        b.iter(|| tokio_once(&mut cx));
    });
    group.bench_function(
        BenchmarkId::new("shardwheel", "timeout ready at first poll"),
        |b| {
            b.iter(|| shardwheel_timeout_ready(&timer, &mut cx));
        },
    );
    group.bench_function(
        BenchmarkId::new("tokio", "timeout ready at first poll"),
        |b| {
            b.iter(|| tokio_timeout_ready(&mut cx));
        },
    );
    group.finish();
    // Ready-at-first-poll timeouts touched the engine not once.
    let before = timer.stats().scheduled;
    for _ in 0..1000 {
        shardwheel_timeout_ready(&timer, &mut cx);
    }
    assert_eq!(timer.stats().scheduled, before);
    // Every shardwheel sleep was cancelled on drop.
    assert_eq!(timer.pending(), 0);
}

criterion_group!(benches, sleep_cost);
criterion_main!(benches);
