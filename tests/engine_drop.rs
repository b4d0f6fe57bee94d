//! Dropping the last `Timer` clone shuts the engine down: pending tasks are dropped, not run,
//! and no shard thread is left. The tests of this file count the process's threads by name,
//! so they run one at a time.

mod support;

use shardwheel::{Executor, Timer, TimerHandle, TimerState};
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard, mpsc};
use std::time::Duration;
use support::{
    DropCounter, EXEC_THREAD, SHARD_THREAD, counter, get, manual_timer, threads_named, wait_until,
};

static THREADS: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    THREADS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Waits until no shard or pool thread of ours is left, and says how many there were.
fn assert_no_engine_threads(context: &str) {
    assert!(
        wait_until(Duration::from_secs(2), || threads_named(SHARD_THREAD) == 0),
        "{context}: {} shard threads left",
        threads_named(SHARD_THREAD)
    );
    assert!(
        wait_until(Duration::from_secs(2), || threads_named(EXEC_THREAD) == 0),
        "{context}: {} pool threads left",
        threads_named(EXEC_THREAD)
    );
}

/// Pending tasks with drop counters; the last clone dropped (on another thread, or here):
/// every pending task dropped unrun before `drop` returns, fired ones ran, shard threads gone.
#[test]
fn dropping_the_last_clone_shuts_down() {
    let _serial = serial();
    for executor in [Executor::DefaultPool, Executor::Inline] {
        for last_on_other_thread in [false, true] {
            let context =
                format!("{executor:?}, last clone dropped elsewhere: {last_on_other_thread}");
            assert_no_engine_threads("before");
            let timer = Timer::builder()
                .shards(3)
                .executor(executor.clone())
                .build()
                .unwrap();
            // Threads name themselves once started.
            assert!(
                wait_until(Duration::from_secs(2), || threads_named(SHARD_THREAD) == 3),
                "{context}: {} shard threads",
                threads_named(SHARD_THREAD)
            );
            let drops = counter();
            let runs = counter();
            let mut handles: Vec<TimerHandle> = Vec::new();
            for i in 0..100 {
                let guard = DropCounter(drops.clone());
                let runs = runs.clone();
                let delay = if i < 10 {
                    Duration::ZERO
                } else {
                    Duration::from_secs(3600)
                };
                handles.push(
                    timer
                        .schedule(delay, move || {
                            let _guard = guard;
                            runs.fetch_add(1, Ordering::SeqCst);
                        })
                        .unwrap(),
                );
            }
            assert!(wait_until(Duration::from_secs(1), || get(&runs) == 10));
            assert!(wait_until(Duration::from_secs(1), || get(&drops) == 10));
            let clone = timer.clone();
            if last_on_other_thread {
                drop(timer);
                assert!(!clone.is_shut_down(), "{context}: a clone is still alive");
                assert_eq!(get(&drops), 10);
                std::thread::spawn(move || drop(clone)).join().unwrap();
            } else {
                drop(clone);
                assert!(!timer.is_shut_down());
                drop(timer);
            }
            assert_eq!(
                get(&drops),
                100,
                "{context}: pending tasks dropped by the drop"
            );
            assert_eq!(get(&runs), 10, "{context}: pending tasks must not run");
            // The drop joined the shard threads, but a joined thread can still be listed in
            // `/proc/self/task` for a moment: the kernel wakes the joiner before it removes
            // the thread. So wait for the list to empty rather than read it once.
            assert_no_engine_threads(&context);
            for (i, handle) in handles.iter().enumerate() {
                let expected = if i < 10 {
                    TimerState::Expired
                } else {
                    TimerState::Cancelled
                };
                assert_eq!(handle.state(), expected, "{context}: timer {i}");
                assert!(!handle.cancel());
                assert!(!handle.reset(Duration::ZERO));
            }
            drop(handles);
        }
    }
}

/// The last clone is held by tasks: it goes away inside a running task (pool thread or shard
/// thread) or with a cancelled task dropped on its shard thread. No deadlock, no thread left.
#[test]
fn last_clone_dropped_inside_the_engine() {
    let _serial = serial();
    for executor in [Executor::DefaultPool, Executor::Inline] {
        for how in ["run", "cancel"] {
            let context = format!("{executor:?}, last clone dropped by a task's {how}");
            assert_no_engine_threads("before");
            let timer = Timer::builder()
                .shards(2)
                .executor(executor.clone())
                .build()
                .unwrap();
            assert!(wait_until(Duration::from_secs(2), || threads_named(
                SHARD_THREAD
            ) == 2));
            let drops = counter();
            for _ in 0..20 {
                let guard = DropCounter(drops.clone());
                timer
                    .schedule(Duration::from_secs(3600), move || drop(guard))
                    .unwrap();
            }
            let (sender, receiver) = mpsc::channel::<()>();
            let clone = timer.clone();
            let delay = if how == "run" {
                Duration::from_millis(2)
            } else {
                Duration::from_secs(3600)
            };
            let handle = timer
                .schedule(delay, move || {
                    let _sender = sender;
                    drop(clone);
                })
                .unwrap();
            drop(timer);
            if how == "cancel" {
                assert!(handle.cancel());
            }
            // The sender goes away with the task, run or dropped: then the engine is gone.
            assert!(
                receiver.recv_timeout(Duration::from_secs(5)).is_err(),
                "{context}"
            );
            assert!(
                wait_until(Duration::from_secs(5), || get(&drops) == 20),
                "{context}: the 20 pending tasks were not dropped ({} were)",
                get(&drops)
            );
            assert_no_engine_threads(&context);
            assert_ne!(handle.state(), TimerState::Pending);
        }
    }
}

/// An engine on a manual clock runs no threads at all; dropping it drops its pending tasks.
#[test]
fn manual_clock_engine_has_no_threads() {
    let _serial = serial();
    assert_no_engine_threads("before");
    let (clock, timer) = manual_timer(4, Duration::from_millis(1));
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(threads_named(SHARD_THREAD), 0);
    let drops = counter();
    let runs = counter();
    for i in 0..10u64 {
        let guard = DropCounter(drops.clone());
        let runs = runs.clone();
        timer
            .schedule(Duration::from_secs(i * 10), move || {
                let _guard = guard;
                runs.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
    }
    clock.advance(Duration::from_secs(45));
    assert_eq!(get(&runs), 5);
    drop(timer);
    assert_eq!(get(&drops), 10);
    assert_eq!(get(&runs), 5);
    clock.advance(Duration::from_secs(3600)); // nothing left to drive
    assert_eq!(get(&runs), 5);
}
