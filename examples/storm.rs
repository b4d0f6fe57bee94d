//! Storm probe: one thread schedules 1,000,000 timers due uniformly over [0.5 s, 1.5 s]; each
//! task records when it ran. Prints the lateness percentiles and the engine's own lateness.
//!
//! `cargo run --release --example storm` (pinned shards with short time slices, the defaults),
//! `cargo run --release --example storm -- --unpinned`, or `-- --long-slices` (the threads keep
//! the scheduler's default slice: `Builder::short_time_slices(false)`).
use shardwheel::Timer;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let unpinned = std::env::args().any(|arg| arg == "--unpinned");
    let count = 1_000_000usize;
    let long_slices = std::env::args().any(|arg| arg == "--long-slices");
    let timer = Timer::builder()
        .pin_threads(!unpinned)
        .short_time_slices(!long_slices)
        .build()?;
    let fired: &'static [AtomicU64] = Box::leak((0..count).map(|_| AtomicU64::new(0)).collect());
    // Fault the records in now, not while the storm fires.
    for record in fired {
        record.store(0, Ordering::Relaxed);
    }
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let deadlines: Vec<u64> = (0..count)
        .map(|_| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            500_000_000 + rng % 1_000_000_000
        })
        .collect();
    let start = Instant::now();
    let mut handles = Vec::with_capacity(count);
    for (id, &deadline) in deadlines.iter().enumerate() {
        handles.push(
            timer.schedule_at(start + Duration::from_nanos(deadline), move || {
                fired[id].store(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
            })?,
        );
    }
    std::thread::sleep(Duration::from_millis(1_700));
    let stats = timer.stats();
    drop(timer.shutdown());
    let mut late: Vec<i64> = (0..count)
        .map(|id| fired[id].load(Ordering::Relaxed) as i64 - deadlines[id] as i64)
        .collect();
    late.sort_unstable();
    let at = |quantile: f64| late[((count - 1) as f64 * quantile) as usize] as f64 / 1000.0;
    println!(
        "{}{}: early {}, late p50 {:.0} us, p99 {:.0} us, p99.9 {:.0} us, max {:.0} us; \
         engine (tick to expiry) max {:?}",
        if unpinned { "unpinned" } else { "pinned" },
        if long_slices { ", long slices" } else { "" },
        late.iter().filter(|&&lateness| lateness < 0).count(),
        at(0.5),
        at(0.99),
        at(0.999),
        at(1.0),
        stats.lateness_max,
    );
    Ok(())
}
