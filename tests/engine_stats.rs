//! Statistics (conservation, per-shard sums, pinning, lateness) and build errors.

mod support;

use shardwheel::wheel::MAX_LEVELS;
use shardwheel::{BuildError, Builder, Executor, Stats, Timer, TimerHandle};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{
    Rng, counter, get, run_one_task_from_each_of, schedule_watching_for_early, wait_until,
};

/// Totals equal the sums of the per-shard counters, field by field.
fn assert_shards_sum_to_totals(stats: &Stats) {
    let sum =
        |field: fn(&shardwheel::ShardStats) -> u64| -> u64 { stats.shards.iter().map(field).sum() };
    assert_eq!(sum(|s| s.scheduled), stats.scheduled, "{stats:?}");
    assert_eq!(sum(|s| s.fired), stats.fired, "{stats:?}");
    assert_eq!(sum(|s| s.cancelled), stats.cancelled, "{stats:?}");
    assert_eq!(sum(|s| s.reset), stats.reset, "{stats:?}");
    assert_eq!(sum(|s| s.panicked), stats.panicked, "{stats:?}");
    assert_eq!(sum(|s| s.pending), stats.pending, "{stats:?}");
    assert_eq!(
        stats.shards.iter().filter(|s| s.pinned).count(),
        stats.pinned,
        "{stats:?}"
    );
    assert_eq!(
        stats.shards.iter().filter(|s| s.short_time_slice).count(),
        stats.short_time_slices,
        "{stats:?}"
    );
    let max = stats.shards.iter().map(|s| s.lateness_max).max().unwrap();
    assert_eq!(max, stats.lateness_max);
    for shard in &stats.shards {
        assert_eq!(
            shard.scheduled,
            shard.fired + shard.cancelled + shard.pending,
            "{shard:?}"
        );
    }
}

/// Four threads schedule, cancel and reset on three shards; after quiescence:
/// scheduled = fired + cancelled + pending, each equal to what the test observed, and the
/// per-shard counters sum to the totals.
#[test]
fn conservation_and_per_shard_sums() {
    // Unpinned: threads then choose shards round-robin (pinned, they schedule on a shard of
    // the CPU they run on, and four short-lived threads may all run on one CPU).
    let timer = Timer::builder()
        .shards(3)
        .pin_threads(false)
        .build()
        .unwrap();
    let ran = counter();
    let observed = Arc::new(Mutex::new((0u64, 0u64, 0u64, 0u64, 0u64))); // scheduled, cancelled, reset, long, short
    let keep: Arc<Mutex<Vec<TimerHandle>>> = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..4)
        .map(|t| {
            let (timer, ran, observed, keep) =
                (timer.clone(), ran.clone(), observed.clone(), keep.clone());
            std::thread::spawn(move || {
                let mut rng = Rng::new(t);
                let (mut scheduled, mut cancelled, mut resets, mut long, mut short) =
                    (0, 0, 0, 0, 0);
                for _ in 0..500 {
                    let long_delay = rng.below(2) == 0;
                    let delay = if long_delay {
                        Duration::from_secs(3600)
                    } else {
                        Duration::from_micros(rng.below(2000))
                    };
                    let ran = ran.clone();
                    let handle = timer
                        .schedule(delay, move || {
                            ran.fetch_add(1, Ordering::SeqCst);
                        })
                        .unwrap();
                    scheduled += 1;
                    match rng.below(4) {
                        0 => cancelled += u64::from(handle.cancel()),
                        1 if long_delay => {
                            assert!(handle.reset(Duration::from_secs(7200)));
                            resets += 1;
                            long += 1;
                            keep.lock().unwrap().push(handle);
                        }
                        _ if long_delay => {
                            long += 1;
                            keep.lock().unwrap().push(handle);
                        }
                        _ => short += 1,
                    }
                }
                let mut totals = observed.lock().unwrap();
                totals.0 += scheduled;
                totals.1 += cancelled;
                totals.2 += resets;
                totals.3 += long;
                totals.4 += short;
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    let (scheduled, cancelled, resets, long, short) = *observed.lock().unwrap();
    let expected_fired = scheduled - cancelled - long;
    assert!(short <= expected_fired);
    assert!(
        wait_until(Duration::from_secs(5), || {
            let stats = timer.stats();
            get(&ran) as u64 == expected_fired
                && stats.fired == expected_fired
                && stats.reset == resets
        }),
        "no quiescence: ran {}, expected {expected_fired}, stats {:?}",
        get(&ran),
        timer.stats()
    );
    let stats = timer.stats();
    assert_eq!(stats.scheduled, scheduled);
    assert_eq!(stats.cancelled, cancelled);
    assert_eq!(stats.pending, long);
    assert_eq!(stats.reset, resets);
    assert_eq!(stats.panicked, 0);
    assert_eq!(
        stats.scheduled,
        stats.fired + stats.cancelled + stats.pending
    );
    assert_eq!(timer.pending() as u64, long);
    assert_eq!(stats.shards.len(), 3);
    assert_shards_sum_to_totals(&stats);
    assert!(
        stats.shards.iter().filter(|s| s.scheduled > 0).count() >= 2,
        "four threads spread over several shards: {stats:?}"
    );
    // Shutdown cancels the rest: everything is accounted as fired or cancelled.
    assert_eq!(timer.shutdown().len() as u64, long);
    let after = timer.stats();
    assert_eq!(after.pending, 0);
    assert_eq!(after.cancelled, cancelled + long);
    assert_eq!(after.scheduled, after.fired + after.cancelled);
    assert_shards_sum_to_totals(&after);
    drop(keep);
}

/// Lateness statistics are ordered and plausible for 1 ms timers.
#[test]
fn lateness_is_reported() {
    let timer = Timer::builder().shards(2).build().unwrap();
    let ran = counter();
    for i in 0..100u64 {
        let ran = ran.clone();
        timer
            .schedule(Duration::from_micros(100 * (i % 20)), move || {
                ran.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
    }
    assert!(wait_until(Duration::from_secs(2), || get(&ran) == 100));
    assert!(wait_until(Duration::from_secs(1), || timer.stats().fired == 100));
    let stats = timer.stats();
    assert!(stats.lateness_p50 <= stats.lateness_p99, "{stats:?}");
    assert!(stats.lateness_p99 <= stats.lateness_max, "{stats:?}");
    assert!(stats.lateness_max < Duration::from_secs(1), "{stats:?}");
    for shard in &stats.shards {
        assert!(
            shard.lateness_p50 <= shard.lateness_p99 && shard.lateness_p99 <= shard.lateness_max
        );
    }
    assert_shards_sum_to_totals(&stats);
    println!(
        "lateness p50 {:?}, p99 {:?}, max {:?}",
        stats.lateness_p50, stats.lateness_p99, stats.lateness_max
    );
}

/// `pinned` counts pinned shard threads: none when pinning is off; with pinning on (best
/// effort), each shard reports and the total is their count.
#[test]
fn pinned_reports() {
    let unpinned = Timer::builder()
        .shards(2)
        .pin_threads(false)
        .build()
        .unwrap();
    let pinned = Timer::builder()
        .shards(2)
        .pin_threads(true)
        .build()
        .unwrap();
    // Shard threads pin themselves when they start: wait until they have run a timer.
    for timer in [&unpinned, &pinned] {
        run_one_task_from_each_of(timer, 2);
    }
    let stats = unpinned.stats();
    assert_eq!(stats.pinned, 0, "{stats:?}");
    assert!(stats.shards.iter().all(|s| !s.pinned));
    let _ = wait_until(Duration::from_millis(200), || pinned.stats().pinned == 2);
    let stats = pinned.stats();
    assert_shards_sum_to_totals(&stats);
    let cores = core_count();
    println!(
        "pinned shard threads: {} of 2 ({cores} cores available)",
        stats.pinned
    );
    if cores >= 1 {
        // Pinning to an allowed core succeeds on Linux.
        assert_eq!(stats.pinned, 2, "{stats:?}");
    }
}

fn core_count() -> usize {
    std::thread::available_parallelism().map_or(0, |n| n.get())
}

/// Invalid configurations are refused with the right error; the limits of `levels` work.
#[test]
fn build_errors() {
    assert!(matches!(
        Timer::builder().shards(0).build(),
        Err(BuildError::NoShards)
    ));
    // Too many shards: a typed error, not a failed allocation (usize::MAX once panicked with
    // "capacity overflow", 2^32 aborted).
    for shards in [Builder::MAX_SHARDS + 1, 1 << 32, usize::MAX] {
        assert!(matches!(
            Timer::builder().shards(shards).build(),
            Err(BuildError::TooManyShards { shards: asked }) if asked == shards
        ));
    }
    assert!(matches!(
        Timer::builder().tick(Duration::ZERO).build(),
        Err(BuildError::ZeroTick)
    ));
    assert!(matches!(
        Timer::builder().levels(0).build(),
        Err(BuildError::InvalidLevels { levels: 0 })
    ));
    assert!(matches!(
        Timer::builder().levels(12).build(),
        Err(BuildError::InvalidLevels { levels: 12 })
    ));
    assert!(matches!(
        Timer::builder().levels(MAX_LEVELS + 1).build(),
        Err(BuildError::InvalidLevels { .. })
    ));
    for error in [
        Timer::builder().shards(0).build().unwrap_err(),
        Timer::builder().tick(Duration::ZERO).build().unwrap_err(),
        Timer::builder().levels(12).build().unwrap_err(),
    ] {
        assert!(!error.to_string().is_empty());
    }
    assert!(
        Timer::builder()
            .levels(12)
            .build()
            .unwrap_err()
            .to_string()
            .contains("12")
    );
    for levels in [1, MAX_LEVELS] {
        let timer = Timer::builder()
            .shards(1)
            .levels(levels)
            .build()
            .unwrap_or_else(|error| panic!("levels({levels}): {error}"));
        assert_eq!(timer.stats().shards.len(), 1);
    }
}

/// A one-level wheel (64 ticks, then the overflow list) and a coarse tick still fire every
/// timer, none early.
#[test]
fn one_level_wheel_and_coarse_tick() {
    for (levels, tick) in [(1, Duration::from_millis(1)), (2, Duration::from_millis(7))] {
        let timer = Timer::builder()
            .shards(2)
            .levels(levels)
            .tick(tick)
            .executor(Executor::Inline)
            .build()
            .unwrap();
        let early = counter();
        let ran = counter();
        for i in 0..60u64 {
            // 1 to 180 ms: well beyond a 64-tick level.
            let delay = Duration::from_millis(1 + 3 * i);
            schedule_watching_for_early(&timer, delay, &ran, &early);
        }
        assert!(
            wait_until(Duration::from_secs(3), || get(&ran) == 60),
            "levels {levels}, tick {tick:?}: {} of 60 ran",
            get(&ran)
        );
        assert_eq!(get(&early), 0, "levels {levels}, tick {tick:?}");
    }
}
