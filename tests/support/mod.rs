//! Helpers shared by the integration tests. Each test file that needs them says `mod support;`;
//! Cargo builds no test binary from a folder's `mod.rs`, so there is no empty test target.
//!
//! - here: waiting, quiet intentional panics, counters, a seeded random generator, timers
//!   built the way most tests want them, and small measurements;
//! - [`poll`]: driving a future by hand (counting wakers, polling once);
//! - [`process`]: what `/proc` says about this process (threads, resident memory).
#![allow(dead_code)] // Each test binary uses some of these helpers, none uses all.
#![allow(unused_imports)] // The re-exports below, likewise.

pub mod poll;
pub mod process;

pub use poll::{CountingWaker, counting_waker, poll_noop, poll_once};
pub use process::{EXEC_THREAD, SHARD_THREAD, resident_pages, thread_dirs_named, threads_named};

use shardwheel::{Clock, Executor, Stats, Timer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Polls `condition` every half millisecond until it holds or `timeout` passes; returns
/// whether it held.
pub fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if condition() {
            return true;
        }
        if start.elapsed() > timeout {
            return condition();
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// Installs (once per process) a panic hook that keeps quiet about panics whose message
/// contains "on purpose", and reports every other panic as usual.
pub fn quiet_intentional_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let message = payload
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("");
            if !message.contains("on purpose") {
                default(info);
            }
        }));
    });
}

/// A timer on the system clock with `shards` shards and the default executor.
pub fn timer(shards: usize) -> Timer {
    Timer::builder()
        .shards(shards)
        .build()
        .expect("build timer")
}

/// A timer on the system clock with two shards and `executor`.
pub fn timer_on(executor: &Executor) -> Timer {
    Timer::builder()
        .shards(2)
        .executor(executor.clone())
        .build()
        .expect("build timer")
}

/// A manual clock and a timer on it with `shards` shards, this `tick` and the inline executor:
/// `clock.advance(d)` returns once every timer due by then has run.
pub fn manual_timer(shards: usize, tick: Duration) -> (Clock, Timer) {
    let clock = Clock::manual();
    let timer = Timer::builder()
        .shards(shards)
        .tick(tick)
        .executor(Executor::Inline)
        .clock(clock.clone())
        .build()
        .expect("build timer");
    (clock, timer)
}

/// Schedules on `timer`, `delay` from now, a task that counts itself in `ran`, and in `early`
/// if it runs before `Instant::now()` (read just before the schedule) plus `delay`.
pub fn schedule_watching_for_early(
    timer: &Timer,
    delay: Duration,
    ran: &Arc<AtomicUsize>,
    early: &Arc<AtomicUsize>,
) {
    let (ran, early) = (ran.clone(), early.clone());
    let before = Instant::now();
    timer
        .schedule(delay, move || {
            if Instant::now() < before + delay {
                early.fetch_add(1, Ordering::SeqCst);
            }
            ran.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
}

/// The counters that any use of a timer moves: (scheduled, cancelled, fired, reset). Compare
/// them before and after to show that something never touched the engine.
pub fn use_counters(stats: &Stats) -> (u64, u64, u64, u64) {
    (stats.scheduled, stats.cancelled, stats.fired, stats.reset)
}

/// Counts its own drops: put one in a task to see whether the task was dropped (run or not).
pub struct DropCounter(pub Arc<AtomicUsize>);

impl Drop for DropCounter {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A shared counter, cloned into tasks.
pub fn counter() -> Arc<AtomicUsize> {
    Arc::new(AtomicUsize::new(0))
}

/// Reads a shared counter.
pub fn get(counter: &AtomicUsize) -> usize {
    counter.load(Ordering::SeqCst)
}

/// Schedules a zero-delay closure task from each of `threads` new threads and waits (up to 5 s)
/// until every one ran: the shards those threads chose have started their threads (which pin
/// themselves and ask for their time slices as they start), and the executor pool exists.
pub fn run_one_task_from_each_of(timer: &Timer, threads: usize) {
    let ran = counter();
    for _ in 0..threads {
        let (timer, ran) = (timer.clone(), ran.clone());
        std::thread::spawn(move || {
            timer
                .schedule(Duration::ZERO, move || {
                    ran.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap()
        })
        .join()
        .unwrap();
    }
    assert!(wait_until(Duration::from_secs(5), || get(&ran) == threads));
}

/// A small deterministic pseudo-random generator (xorshift64*), so failures reproduce.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 pseudo-random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..bound` (`bound > 0`).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound
    }

    /// Uniform in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next_u64() % (high - low + 1)
    }
}

/// A list of instants that tasks on other threads append to.
#[derive(Clone, Debug, Default)]
pub struct Record(Arc<Mutex<Vec<Instant>>>);

impl Record {
    /// An empty record.
    pub fn new() -> Record {
        Record::default()
    }

    /// Appends `Instant::now()`.
    pub fn stamp(&self) {
        self.push(Instant::now());
    }

    /// Appends `instant`.
    pub fn push(&self, instant: Instant) {
        self.0.lock().unwrap().push(instant);
    }

    /// How many instants were recorded.
    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// Whether nothing was recorded yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of the instants recorded so far.
    pub fn get(&self) -> Vec<Instant> {
        self.0.lock().unwrap().clone()
    }
}

/// Offsets of `instants` from `origin`, in whole milliseconds (for readable failure messages).
pub fn millis_since(origin: Instant, instants: &[Instant]) -> Vec<f64> {
    instants
        .iter()
        .map(|instant| instant.saturating_duration_since(origin).as_secs_f64() * 1e3)
        .collect()
}

/// The `quantile` (0..=1) of a sorted slice.
pub fn quantile(sorted: &[Duration], quantile: f64) -> Duration {
    assert!(!sorted.is_empty());
    let rank = ((sorted.len() as f64 - 1.0) * quantile).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}
