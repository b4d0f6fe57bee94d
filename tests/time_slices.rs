//! Short time slices (`Builder::short_time_slices`): the engine's threads ask for them, the
//! statistics say what the scheduler granted, and `/proc` agrees. One test in its own binary,
//! so the only engine threads in the process are the ones it looks at.

mod support;

use shardwheel::{Stats, Timer};
use std::time::Duration;
use support::{
    EXEC_THREAD, SHARD_THREAD, run_one_task_from_each_of, thread_dirs_named, wait_until,
};

/// The slice the engine asks for, in nanoseconds (the shortest Linux grants).
const SHORT_SLICE_NANOS: u64 = 100_000;

/// `se.slice` of each thread of this process whose name starts with `prefix`, where `/proc`
/// shows it (Linux 6.6 and later).
fn slices_of(prefix: &str) -> Vec<u64> {
    thread_dirs_named(prefix)
        .into_iter()
        .filter_map(|task| std::fs::read_to_string(task.join("sched")).ok())
        .filter_map(|sched| {
            sched
                .lines()
                .find(|line| line.starts_with("se.slice"))
                .and_then(|line| line.split(':').nth(1))
                .and_then(|value| value.trim().parse().ok())
        })
        .collect()
}

/// Whether this kernel takes a slice request from a thread of the normal policy (Linux 6.12
/// and later).
fn kernel_takes_slice_requests() -> bool {
    let Ok(release) = std::fs::read_to_string("/proc/sys/kernel/osrelease") else {
        return false;
    };
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|part| part.parse::<u32>().ok());
    let (Some(major), Some(minor)) = (numbers.next(), numbers.next()) else {
        return false;
    };
    (major, minor) >= (6, 12)
}

/// Runs a closure task from two threads on `timer` (two shards: see
/// [`run_one_task_from_each_of`]) and returns its statistics.
fn started(timer: &Timer) -> Stats {
    run_one_task_from_each_of(timer, 2);
    timer.stats()
}

#[test]
fn short_time_slices_are_asked_for_and_reported() {
    // On (the default): every shard thread reports the same outcome, and where the kernel
    // takes the request, every shard and pool thread runs with the short slice.
    let timer = Timer::builder().shards(2).build().unwrap();
    let stats = started(&timer);
    let granted = stats.short_time_slices;
    assert_eq!(
        stats.shards.iter().filter(|s| s.short_time_slice).count(),
        granted,
        "{stats:?}"
    );
    let shard_slices = slices_of(SHARD_THREAD);
    let pool_slices = slices_of(EXEC_THREAD);
    println!(
        "short time slices granted to {granted} of 2 shard threads; se.slice of the shard \
         threads {shard_slices:?}, of the pool threads {pool_slices:?}"
    );
    if kernel_takes_slice_requests() && !shard_slices.is_empty() {
        assert_eq!(granted, 2, "{stats:?}");
    }
    if granted == 2 {
        assert_eq!(shard_slices, [SHORT_SLICE_NANOS; 2]);
        // A pool thread asks when it starts, which may be after another one ran the tasks.
        assert!(
            wait_until(Duration::from_secs(5), || slices_of(EXEC_THREAD)
                .iter()
                .all(|slice| *slice == SHORT_SLICE_NANOS)),
            "pool threads: {:?}",
            slices_of(EXEC_THREAD)
        );
    } else {
        assert_eq!(granted, 0, "{stats:?}");
    }
    drop(timer.shutdown());
    assert!(wait_until(Duration::from_secs(5), || slices_of(
        SHARD_THREAD
    )
    .is_empty()));

    // Off: no shard thread asks.
    let timer = Timer::builder()
        .shards(2)
        .short_time_slices(false)
        .build()
        .unwrap();
    let stats = started(&timer);
    assert_eq!(stats.short_time_slices, 0, "{stats:?}");
    assert!(stats.shards.iter().all(|s| !s.short_time_slice));
    let shard_slices = slices_of(SHARD_THREAD);
    println!("off: se.slice of the shard threads {shard_slices:?}");
    for slice in shard_slices {
        assert_ne!(slice, SHORT_SLICE_NANOS);
    }
    drop(timer.shutdown());
}
