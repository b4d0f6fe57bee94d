//! The threads a timer starts in its user's process: their names, when the executor pool
//! starts, and which CPUs the shard threads are pinned to.
//!
//! One test function: this binary's process must hold no other timer while it counts threads.

use shardwheel::{Executor, Timer};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The kernel names (`comm`, cut to 15 bytes) of this process's threads.
#[cfg(target_os = "linux")]
fn thread_names() -> Vec<String> {
    let tasks = std::fs::read_dir("/proc/self/task").expect("reading /proc/self/task");
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim_end().to_owned())
        .collect()
}

#[cfg(target_os = "linux")]
fn count_named(prefix: &str) -> usize {
    thread_names()
        .iter()
        .filter(|name| name.starts_with(prefix))
        .count()
}

/// The CPUs of `/proc/self/task/*/status`'s `Cpus_allowed_list` of every thread whose kernel
/// name starts with `prefix`.
#[cfg(target_os = "linux")]
fn cpus_allowed(prefix: &str) -> Vec<String> {
    let tasks = std::fs::read_dir("/proc/self/task").expect("reading /proc/self/task");
    tasks
        .filter_map(|task| {
            let path = task.ok()?.path();
            let name = std::fs::read_to_string(path.join("comm")).ok()?;
            if !name.starts_with(prefix) {
                return None;
            }
            let status = std::fs::read_to_string(path.join("status")).ok()?;
            let line = status
                .lines()
                .find(|line| line.starts_with("Cpus_allowed_list:"))?;
            Some(line["Cpus_allowed_list:".len()..].trim().to_owned())
        })
        .collect()
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let give_up = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < give_up, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn run_on_timer(timer: &Timer) -> Option<String> {
    let (sender, receiver) = mpsc::channel();
    timer
        .schedule(Duration::from_millis(1), move || {
            let name = std::thread::current().name().map(str::to_owned);
            sender.send(name).expect("receiver alive");
        })
        .expect("schedule");
    receiver
        .recv_timeout(Duration::from_secs(10))
        .expect("the task ran")
}

#[test]
fn threads_are_named_pool_is_lazy_and_pins_stay_in_the_affinity_mask() {
    // Shard threads carry their names; a futures-only timer starts no pool.
    let shards = 2;
    let timer = Timer::builder()
        .shards(shards)
        .pin_threads(false)
        .build()
        .unwrap();
    futures::executor::block_on(timer.sleep(Duration::from_millis(2)));
    futures::executor::block_on(timer.timeout(Duration::from_millis(2), async {})).unwrap();
    #[cfg(target_os = "linux")]
    {
        // A new thread names itself when it starts.
        wait_for("named shard threads", || {
            count_named("shardwheel-shar") == shards
        });
        // No executor threads yet, whatever their name.
        assert_eq!(count_named("shardwheel"), shards, "{:?}", thread_names());
    }
    // The first closure task starts the pool; its threads are named too.
    let name = run_on_timer(&timer).expect("pool threads are named");
    assert!(name.starts_with("shardwheel-pool-"), "{name}");
    #[cfg(target_os = "linux")]
    {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        wait_for("named pool threads", || {
            count_named("shardwheel-pool") == cpus
        });
    }
    drop(timer);

    // Inline tasks run on the shard thread, `shardwheel-shard-N`.
    let timer = Timer::builder()
        .shards(1)
        .pin_threads(false)
        .executor(Executor::Inline)
        .build()
        .unwrap();
    assert_eq!(run_on_timer(&timer).as_deref(), Some("shardwheel-shard-0"));
    drop(timer);

    // Default shard count: the CPUs this process may use.
    let timer = Timer::builder().pin_threads(false).build().unwrap();
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    assert_eq!(timer.stats().shards.len(), cpus);
    drop(timer);

    // Pinning stays within the building thread's affinity mask: restricted to one CPU, every
    // shard is pinned to that CPU, never to one it may not use.
    #[cfg(target_os = "linux")]
    std::thread::spawn(|| {
        let allowed = core_affinity::get_core_ids().unwrap_or_default();
        let Some(&last) = allowed.last() else {
            return; // affinity unknown here: nothing to check
        };
        assert!(core_affinity::set_for_current(last));
        let timer = Timer::builder().shards(3).build().unwrap();
        wait_for("3 pinned shards", || timer.stats().pinned == 3);
        let masks = cpus_allowed("shardwheel-shar");
        assert_eq!(masks.len(), 3, "{masks:?}");
        for mask in masks {
            assert_eq!(mask, last.id.to_string());
        }
    })
    .join()
    .unwrap();
}
