//! Helpers shared by the `engine_*` integration tests, which include this file with
//! `#[path = "engine_support.rs"] mod support;`. Built as a test target of its own it holds no
//! tests.
#![allow(dead_code)]

#[path = "common_support.rs"]
mod common;
#[allow(unused_imports)] // Not every test that includes this file uses both.
pub use common::{quiet_intentional_panics, wait_until};

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

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

/// Threads of this process whose name (`comm`, truncated to 15 bytes by Linux) starts with
/// `prefix`.
pub fn threads_named(prefix: &str) -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("comm")).ok())
        .filter(|name| name.trim_end().starts_with(prefix))
        .count()
}

/// Shard threads are named `shardwheel-shard-N`; Linux keeps 15 bytes of a thread's name.
pub const SHARD_THREAD: &str = "shardwheel-shar";
/// Executor pool threads are named `shardwheel-pool-N` (15 bytes: kept whole but the `-N`).
pub const EXEC_THREAD: &str = "shardwheel-pool";

/// Resident set size of this process, in pages (second field of `/proc/self/statm`).
pub fn resident_pages() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
    statm
        .split_whitespace()
        .nth(1)
        .and_then(|field| field.parse().ok())
        .expect("resident field of /proc/self/statm")
}

/// The `quantile` (0..=1) of a sorted slice.
pub fn quantile(sorted: &[Duration], quantile: f64) -> Duration {
    assert!(!sorted.is_empty());
    let rank = ((sorted.len() as f64 - 1.0) * quantile).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
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
}
