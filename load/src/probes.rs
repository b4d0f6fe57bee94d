//! The limit probes of `load/WORKLOADS.md`: what any cross-thread design pays at least.

use crate::args::Config;
use crate::progress::Bar;
use crate::report::Report;
use crossbeam_queue::SegQueue;
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

/// `handoff`: T producers push 16-byte messages into a `SegQueue`, one consumer pops them.
fn handoff(threads: usize, per_producer: usize) -> f64 {
    let queue: SegQueue<[u64; 2]> = SegQueue::new();
    let barrier = Barrier::new(threads + 1);
    let total = threads * per_producer;
    let elapsed = thread::scope(|scope| {
        for producer in 0..threads {
            let (queue, barrier) = (&queue, &barrier);
            scope.spawn(move || {
                barrier.wait();
                for sequence in 0..per_producer {
                    queue.push([producer as u64, sequence as u64]);
                }
            });
        }
        barrier.wait();
        let start = Instant::now();
        let mut received = 0;
        let mut checksum = 0u64;
        while received < total {
            match queue.pop() {
                Some(message) => {
                    checksum = checksum.wrapping_add(message[1]);
                    received += 1;
                }
                None => std::hint::spin_loop(),
            }
        }
        std::hint::black_box(checksum);
        start.elapsed()
    });
    total as f64 / elapsed.as_secs_f64()
}

/// `local_insert`: one thread appends u64s into 4096 `Vec` slots chosen by a random deadline,
/// then clears them; repeated for about `seconds`.
fn local_insert(seconds: f64) -> f64 {
    const SLOTS: usize = 4096;
    const ROUND: usize = 1 << 20;
    let mut slots: Vec<Vec<u64>> = (0..SLOTS).map(|_| Vec::new()).collect();
    let mut rng = crate::rng::Rng::with_seed(7);
    let length = Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut inserts = 0u64;
    loop {
        for value in 0..ROUND as u64 {
            let deadline = rng.u64(..);
            slots[deadline as usize % SLOTS].push(value);
        }
        for slot in &mut slots {
            std::hint::black_box(slot.as_slice());
            slot.clear();
        }
        inserts += ROUND as u64;
        if start.elapsed() >= length {
            break;
        }
    }
    inserts as f64 / start.elapsed().as_secs_f64()
}

/// Runs both probes; `handoff` for every thread count.
pub(crate) fn run(config: &Config, report: &mut Report, bar: &mut Bar) {
    let steps = config.threads.len() + 1;
    for (step, &threads) in config.threads.iter().enumerate() {
        bar.segment(step);
        bar.set(0.0, format!("handoff T={threads}"));
        let rate = handoff(threads, config.probe_messages);
        report.add(
            "probe",
            "handoff",
            threads,
            "messages_per_s",
            rate,
            "messages/s",
        );
    }
    bar.segment(steps - 1);
    bar.set(0.0, "local_insert".to_string());
    let rate = local_insert(config.probe_seconds);
    report.add(
        "probe",
        "local_insert",
        1,
        "inserts_per_s",
        rate,
        "inserts/s",
    );
}

/// The metrics of [`cross_cpu_round_trip_ns`] as workloads report it, before and after a run:
/// readings of the machine, not of a system (the report gives them no ratio).
pub(crate) const ROUND_TRIP_METRICS: [&str; 2] = [
    "cross_cpu_round_trip_before_ns",
    "cross_cpu_round_trip_after_ns",
];

/// Nanoseconds per round trip of one cache line between two CPUs of this process's affinity
/// mask (the first two), over about `seconds`: two pinned threads take turns storing to one
/// word. `None` with fewer than two CPUs or where pinning fails.
///
/// On a virtual machine this moves with where the host runs the virtual CPUs (siblings of one
/// core, or two cores), so churn and reset measure it before and after each run: a message a
/// submitting thread sends to a shard on the other CPU, and a reset of a slot last touched on
/// the other CPU, pay such transfers.
pub(crate) fn cross_cpu_round_trip_ns(seconds: f64) -> Option<f64> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let cores = core_affinity::get_core_ids()?;
    let (first, second) = (*cores.first()?, *cores.get(1)?);
    const BATCH: u64 = 10_000;
    let word = crossbeam_utils::CachePadded::new(AtomicU64::new(0));
    let stop = AtomicBool::new(false);
    let pinned = AtomicU64::new(0);
    let length = Duration::from_secs_f64(seconds);
    let (trips, elapsed) = thread::scope(|scope| {
        let (word, stop, pinned) = (&word, &stop, &pinned);
        // The answering side: turns each odd value into the next even one.
        scope.spawn(move || {
            pinned.fetch_add(
                u64::from(core_affinity::set_for_current(second)),
                Ordering::SeqCst,
            );
            loop {
                let value = word.load(Ordering::Acquire);
                if value % 2 == 1 {
                    word.store(value + 1, Ordering::Release);
                } else if stop.load(Ordering::Relaxed) {
                    return;
                } else {
                    std::hint::spin_loop();
                }
            }
        });
        scope
            .spawn(move || {
                pinned.fetch_add(
                    u64::from(core_affinity::set_for_current(first)),
                    Ordering::SeqCst,
                );
                let start = Instant::now();
                let mut trips = 0u64;
                let mut value = 0u64;
                while start.elapsed() < length {
                    for _ in 0..BATCH {
                        word.store(value + 1, Ordering::Release);
                        value += 2;
                        while word.load(Ordering::Acquire) != value {
                            std::hint::spin_loop();
                        }
                    }
                    trips += BATCH;
                }
                let elapsed = start.elapsed();
                stop.store(true, Ordering::Relaxed);
                (trips, elapsed)
            })
            .join()
            .expect("the probe thread does not panic")
    });
    (pinned.load(Ordering::SeqCst) == 2).then(|| elapsed.as_nanos() as f64 / trips as f64)
}
