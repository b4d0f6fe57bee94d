//! Helpers shared by the `async_*`, `periodic_*` and `manual_clock_*` integration tests, which
//! include this file with `#[path = "async_support.rs"] mod support;`. Built as a test target
//! of its own it holds no tests.
#![allow(dead_code)]

#[path = "common_support.rs"]
mod common;
#[allow(unused_imports)] // Not every test that includes this file uses both.
pub use common::{quiet_intentional_panics, wait_until};

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Instant;

/// A waker that counts how often it was woken.
#[derive(Debug, Default)]
pub struct CountingWaker {
    wakes: AtomicUsize,
}

impl CountingWaker {
    /// How often it was woken so far.
    pub fn wakes(&self) -> usize {
        self.wakes.load(Ordering::SeqCst)
    }
}

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
    }
}

/// A counting waker: the counter, and a `Waker` that bumps it.
pub fn counting_waker() -> (Arc<CountingWaker>, Waker) {
    let counter = Arc::new(CountingWaker::default());
    let waker = Waker::from(counter.clone());
    (counter, waker)
}

/// Polls an `Unpin` future once with `waker`.
pub fn poll_once<F: Future + Unpin>(future: &mut F, waker: &Waker) -> Poll<F::Output> {
    Pin::new(future).poll(&mut Context::from_waker(waker))
}

/// Polls an `Unpin` future once with a waker that does nothing.
pub fn poll_noop<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    poll_once(future, Waker::noop())
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

/// A small deterministic pseudo-random generator (splitmix64), so failures reproduce.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator with this seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next_u64() % (high - low + 1)
    }
}
