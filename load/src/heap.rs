//! Baseline: the JDK `ScheduledThreadPoolExecutor` design, one worker thread.
//!
//! A `Mutex<BinaryHeap>` ordered by (deadline, sequence) and a `Condvar`: the worker sleeps
//! until the head's deadline, or until a schedule puts a new head in front (then it is
//! signalled), pops one due entry under the lock and runs its task outside it. Cancel only
//! flips the timer's state (lazy deletion, as with the JDK's default
//! `setRemoveOnCancelPolicy(false)`): the entry leaves the heap when its deadline comes.
//! Reset (which the JDK lacks) bumps the timer's generation and pushes a new entry; entries of
//! an older generation are skipped when popped.

use crate::job::Job;
use crate::system::System;
use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const PENDING: u64 = 0;
const CANCELLED: u64 = 1;
const FIRED: u64 = 2;
const STATUS: u64 = 3;

/// One timer: its task and a state word `generation << 2 | status`.
pub struct HeapTimer {
    state: AtomicU64,
    job: Job,
}

struct Entry {
    deadline: Instant,
    sequence: u64,
    generation: u64,
    timer: Arc<HeapTimer>,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Entry) -> bool {
        self.cmp(other) == CmpOrdering::Equal
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Entry) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    /// Reversed: `BinaryHeap` is a max-heap, the earliest deadline must come out first.
    fn cmp(&self, other: &Entry) -> CmpOrdering {
        (other.deadline, other.sequence).cmp(&(self.deadline, self.sequence))
    }
}

struct Queue {
    heap: BinaryHeap<Entry>,
    sequence: u64,
    shutdown: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    available: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, deadline: Instant, generation: u64, timer: Arc<HeapTimer>) {
        let mut queue = self.lock();
        queue.sequence += 1;
        let sequence = queue.sequence;
        queue.heap.push(Entry {
            deadline,
            sequence,
            generation,
            timer,
        });
        let new_head = queue
            .heap
            .peek()
            .is_some_and(|head| head.sequence == sequence);
        drop(queue);
        if new_head {
            self.available.notify_one();
        }
    }
}

/// A `Mutex<BinaryHeap>` timer with one worker thread.
pub struct HeapTimerSystem {
    shared: Arc<Shared>,
    worker: Option<JoinHandle<()>>,
}

fn run_worker(shared: &Shared) {
    let mut queue = shared.lock();
    loop {
        if queue.shutdown {
            return;
        }
        let Some(head) = queue.heap.peek() else {
            queue = shared
                .available
                .wait(queue)
                .unwrap_or_else(PoisonError::into_inner);
            continue;
        };
        let now = Instant::now();
        if head.deadline > now {
            let wait = head.deadline - now;
            queue = shared
                .available
                .wait_timeout(queue, wait)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            continue;
        }
        let entry = queue.heap.pop().expect("peeked");
        drop(queue);
        let expected = entry.generation << 2 | PENDING;
        if entry
            .timer
            .state
            .compare_exchange(
                expected,
                entry.generation << 2 | FIRED,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            entry.timer.job.run();
        }
        drop(entry);
        queue = shared.lock();
    }
}

impl System for HeapTimerSystem {
    type Handle = Arc<HeapTimer>;
    const NAME: &'static str = "heap";

    fn describe() -> String {
        format!(
            "Mutex<BinaryHeap> + Condvar, 1 worker thread (JDK ScheduledThreadPoolExecutor \
             design); per timer Arc<HeapTimer> ({} B incl. counts) + heap entry ({} B); cancel \
             = flag (lazy deletion), reset = new entry + generation",
            std::mem::size_of::<HeapTimer>() + 16,
            std::mem::size_of::<Entry>()
        )
    }

    fn build() -> HeapTimerSystem {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                heap: BinaryHeap::new(),
                sequence: 0,
                shutdown: false,
            }),
            available: Condvar::new(),
        });
        let worker_shared = shared.clone();
        let worker = std::thread::Builder::new()
            .name("heap-timer".into())
            .spawn(move || run_worker(&worker_shared));
        match worker {
            Ok(worker) => HeapTimerSystem {
                shared,
                worker: Some(worker),
            },
            Err(error) => {
                eprintln!("error: could not start the heap timer's thread: {error}");
                std::process::exit(1);
            }
        }
    }

    #[inline]
    fn schedule(&self, delay: Duration, job: Job) -> Option<Arc<HeapTimer>> {
        self.schedule_at(Instant::now() + delay, job)
    }

    #[inline]
    fn schedule_at(&self, deadline: Instant, job: Job) -> Option<Arc<HeapTimer>> {
        let timer = Arc::new(HeapTimer {
            state: AtomicU64::new(PENDING),
            job,
        });
        self.shared.push(deadline, 0, timer.clone());
        Some(timer)
    }

    #[inline]
    fn cancel(&self, handle: Arc<HeapTimer>) -> bool {
        let mut state = handle.state.load(Ordering::Acquire);
        loop {
            if state & STATUS != PENDING {
                return false;
            }
            match handle.state.compare_exchange_weak(
                state,
                state | CANCELLED,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(actual) => state = actual,
            }
        }
    }

    #[inline]
    fn reset(&self, handle: &Arc<HeapTimer>, delay: Duration) -> bool {
        let deadline = Instant::now() + delay;
        let mut state = handle.state.load(Ordering::Acquire);
        loop {
            if state & STATUS != PENDING {
                return false;
            }
            let generation = (state >> 2) + 1;
            match handle.state.compare_exchange_weak(
                state,
                generation << 2 | PENDING,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.shared.push(deadline, generation, handle.clone());
                    return true;
                }
                Err(actual) => state = actual,
            }
        }
    }

    fn shutdown(mut self) {
        self.stop();
    }
}

impl HeapTimerSystem {
    fn stop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.available.notify_all();
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
        // Drop the entries (lazily deleted ones included) now, not when the last Arc goes.
        let entries = std::mem::take(&mut self.shared.lock().heap);
        drop(entries);
    }
}

impl Drop for HeapTimerSystem {
    fn drop(&mut self) {
        self.stop();
    }
}
