//! Quick churn probe: P pending timers, then T threads cancel their oldest and schedule anew.
use shardwheel::Timer;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let threads: usize = std::env::args().nth(1).map_or(1, |a| a.parse().unwrap());
    let pending = std::env::var("PENDING").map_or(1_000_000, |p| p.parse().unwrap()) / threads;
    let timer = Timer::new()?;
    let barrier = std::sync::Barrier::new(threads);
    let total: u64 = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let timer = &timer;
                let barrier = &barrier;
                scope.spawn(move || {
                    let mut rng = 0x9E3779B97F4A7C15u64 ^ t as u64;
                    let mut next = || {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        Duration::from_millis(10_000 + rng % 50_000)
                    };
                    let mut handles = VecDeque::with_capacity(pending);
                    for id in 0..pending as u64 {
                        handles.push_back(
                            timer
                                .schedule(next(), move || {
                                    std::hint::black_box(id);
                                })
                                .unwrap(),
                        );
                    }
                    barrier.wait();
                    let start = Instant::now();
                    let mut pairs = 0u64;
                    while start.elapsed()
                        < Duration::from_secs(
                            std::env::var("SECS").map_or(3, |s| s.parse().unwrap()),
                        )
                    {
                        for _ in 0..1000 {
                            handles.pop_front().unwrap().cancel();
                            handles.push_back(
                                timer
                                    .schedule(next(), move || {
                                        std::hint::black_box(pairs);
                                    })
                                    .unwrap(),
                            );
                        }
                        pairs += 1000;
                    }
                    pairs
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    println!(
        "threads {threads}: {:.2} M pairs/s",
        total as f64 / 3.0 / 1e6
    );
    let stats = timer.stats();
    let per_shard: Vec<u64> = stats.shards.iter().map(|shard| shard.scheduled).collect();
    println!(
        "pending {}, scheduled per shard {per_shard:?}",
        stats.pending
    );
    Ok(())
}
