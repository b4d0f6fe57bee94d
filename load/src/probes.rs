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
