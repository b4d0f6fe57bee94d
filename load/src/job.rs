//! The task every timer carries: its id (a `u64`), plus, for the storm, a pointer to the
//! per-timer slots where it records when it fired. At most 16 bytes, so shardwheel stores it
//! inline.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Plain tasks that ran. The churn, memory, idle and reset workloads use delays far beyond
/// their run time, so this must stay zero; the runner checks it.
static PLAIN_FIRES: AtomicU64 = AtomicU64::new(0);

/// How many plain (non-storm) tasks ran so far.
pub fn plain_fires() -> u64 {
    PLAIN_FIRES.load(Ordering::Relaxed)
}

/// The body of a plain task.
#[inline]
pub fn fire_plain(id: u64) {
    std::hint::black_box(id);
    PLAIN_FIRES.fetch_add(1, Ordering::Relaxed);
}

/// One timer's task, as handed to each system under test.
#[derive(Clone, Copy, Debug)]
pub struct Job {
    pub(crate) id: u64,
    pub(crate) sink: Option<&'static StormSink>,
}

impl Job {
    /// A task that captures only its id.
    pub fn plain(id: u64) -> Job {
        Job { id, sink: None }
    }

    /// Runs the task.
    #[inline]
    pub fn run(self) {
        match self.sink {
            Some(sink) => sink.record(self.id),
            None => fire_plain(self.id),
        }
    }
}

/// The storm's per-timer records, preallocated before scheduling starts and leaked so that a
/// task can point at them with a plain `&'static` (no reference count touched per timer).
#[derive(Debug)]
pub struct StormSink {
    /// The storm's start; set once, before any timer is scheduled.
    pub(crate) start: OnceLock<Instant>,
    /// Deadline of timer `id`, in nanoseconds after `start`.
    pub(crate) deadline_ns: Vec<u64>,
    /// Fire instant of timer `id`, in nanoseconds after `start`, plus one (0 = not fired).
    pub(crate) fired_ns: Vec<AtomicU64>,
    /// Tasks that ran a second time (must stay zero).
    pub(crate) doubles: AtomicU64,
}

impl StormSink {
    /// Preallocates (and touches) the records of `deadline_ns.len()` timers.
    pub(crate) fn leak(deadline_ns: Vec<u64>) -> &'static StormSink {
        let fired_ns: Vec<AtomicU64> = (0..deadline_ns.len()).map(|_| AtomicU64::new(0)).collect();
        // The allocation may come zeroed and unmapped (calloc): fault every page in now, so
        // that the storm does not pay for it while firing.
        for record in fired_ns.iter() {
            record.store(0, Ordering::Relaxed);
        }
        Box::leak(Box::new(StormSink {
            start: OnceLock::new(),
            deadline_ns,
            fired_ns,
            doubles: AtomicU64::new(0),
        }))
    }

    #[inline]
    fn record(&self, id: u64) {
        let now = Instant::now();
        let start = *self
            .start
            .get()
            .expect("the storm's start is set before scheduling");
        let nanos = now.saturating_duration_since(start).as_nanos() as u64;
        if self.fired_ns[id as usize].swap(nanos + 1, Ordering::Relaxed) != 0 {
            self.doubles.fetch_add(1, Ordering::Relaxed);
        }
    }
}
