//! User code that panics anywhere the engine calls it (a task's run, its destructor, a
//! repeating task dropped after a panicking run, a panic payload whose own destructor panics,
//! a waker) is contained: counted in `Stats::panicked`, and the engine keeps working. A shard
//! thread that dies anyway (an engine bug, simulated by a test-only hook) is reported, never
//! silent (issue 11, findings 2 and 5).
//!
//! Scenarios that aborted the process before the fix run in a child process (this test binary
//! run again with `CHILD_SCENARIO` set), whose exit status the parent checks.

mod support;

#[cfg(feature = "test-hooks")]
use shardwheel::ScheduleError;
use shardwheel::{Executor, MissedTickBehavior, Timer};
use std::sync::Arc;
use std::sync::mpsc;
use std::task::{Context, Wake, Waker};
use std::time::Duration;
use support::{counter, get, manual_timer, quiet_intentional_panics, wait_until};

/// Panics when dropped.
struct PanicOnDrop;

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        panic!("drop panics on purpose");
    }
}

fn executors() -> [Executor; 2] {
    [Executor::DefaultPool, Executor::Inline]
}

fn one_shard(executor: &Executor) -> Timer {
    Timer::builder()
        .shards(1)
        .pin_threads(false)
        .executor(executor.clone())
        .build()
        .unwrap()
}

/// Schedules 20 timers and checks that all of them run: the engine still works.
fn twenty_timers_run(timer: &Timer, what: &str) {
    let (sender, receiver) = mpsc::channel();
    for i in 0..20 {
        let sender = sender.clone();
        timer
            .schedule(Duration::from_millis(1), move || sender.send(i).unwrap())
            .unwrap_or_else(|error| panic!("{what}: schedule {i} failed: {error}"));
    }
    for i in 0..20 {
        receiver
            .recv_timeout(Duration::from_secs(3))
            .unwrap_or_else(|_| panic!("{what}: only {i} of 20 timers ran"));
    }
}

/// Runs `scenario` in a child process (this test binary, running only `test_name`), and checks
/// that the child exited normally. In the child, runs the scenario.
fn in_child_process(test_name: &str, scenario: impl FnOnce()) {
    if std::env::var("CHILD_SCENARIO").as_deref() == Ok(test_name) {
        scenario();
        return;
    }
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
        .env("CHILD_SCENARIO", test_name)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{test_name}: the child process failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Finding 2: a cancelled one-shot task whose destructor panics. Before the fix the shard
/// thread died on the drop, and every timer scheduled afterwards was lost.
#[test]
fn cancelled_task_whose_drop_panics() {
    quiet_intentional_panics();
    for executor in executors() {
        let timer = one_shard(&executor);
        let guard = PanicOnDrop;
        let handle = timer
            .schedule(Duration::from_secs(60), move || drop(guard))
            .unwrap();
        assert!(handle.cancel(), "{executor:?}: cancel returns normally");
        twenty_timers_run(&timer, &format!("{executor:?}"));
        assert!(
            wait_until(Duration::from_secs(2), || timer.stats().panicked == 1),
            "{executor:?}: panicked {}",
            timer.stats().panicked
        );
        assert!(timer.shutdown().is_empty());
        assert_eq!(timer.stats().failed_shards, 0);
    }
}

/// Finding 2: a cancelled repeating task whose captured value panics when dropped.
#[test]
fn cancelled_repeating_task_whose_drop_panics() {
    quiet_intentional_panics();
    for executor in executors() {
        let timer = one_shard(&executor);
        let guard = PanicOnDrop;
        let handle = timer
            .schedule_repeating(
                Duration::from_secs(60),
                MissedTickBehavior::Skip,
                move || {
                    let _ = &guard;
                },
            )
            .unwrap();
        assert!(handle.cancel(), "{executor:?}: cancel returns normally");
        twenty_timers_run(&timer, &format!("{executor:?}"));
        assert!(
            wait_until(Duration::from_secs(2), || timer.stats().panicked == 1),
            "{executor:?}: panicked {}",
            timer.stats().panicked
        );
        assert!(timer.shutdown().is_empty());
    }
}

/// Finding 2: a repeating task cancelled while it runs, whose destructor panics: the shard
/// drops it when the run hands it back.
#[test]
fn repeating_task_cancelled_while_running_whose_drop_panics() {
    quiet_intentional_panics();
    for executor in executors() {
        let timer = one_shard(&executor);
        let (started, started_rx) = mpsc::channel();
        let (release, release_rx) = mpsc::channel::<()>();
        let release_rx = std::sync::Mutex::new(release_rx);
        let guard = PanicOnDrop;
        let handle = timer
            .schedule_repeating(
                Duration::from_millis(1),
                MissedTickBehavior::Skip,
                move || {
                    let _ = &guard;
                    started.send(()).unwrap();
                    let _ = release_rx
                        .lock()
                        .unwrap()
                        .recv_timeout(Duration::from_secs(5));
                },
            )
            .unwrap();
        started_rx.recv_timeout(Duration::from_secs(3)).unwrap();
        assert!(handle.cancel(), "{executor:?}: cancel returns normally");
        release.send(()).unwrap();
        twenty_timers_run(&timer, &format!("{executor:?}"));
        assert!(
            wait_until(Duration::from_secs(2), || timer.stats().panicked == 1),
            "{executor:?}: panicked {}",
            timer.stats().panicked
        );
        assert!(timer.shutdown().is_empty());
    }
}

/// Finding 2 on a manual clock: the task is dropped by `advance` (on the caller's thread) or
/// by `shutdown`; neither panics, and the engine keeps working.
#[test]
fn manual_clock_drops_panicking_tasks_contained() {
    quiet_intentional_panics();
    let (clock, timer) = manual_timer(1, Duration::from_millis(1));
    let guard = PanicOnDrop;
    let handle = timer
        .schedule(Duration::from_secs(60), move || drop(guard))
        .unwrap();
    assert!(handle.cancel());
    clock.advance(Duration::from_millis(1)); // the shard drops the task here
    let ran = counter();
    for _ in 0..20 {
        let ran = ran.clone();
        timer
            .schedule(Duration::from_millis(1), move || {
                ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            })
            .unwrap();
    }
    clock.advance(Duration::from_millis(2));
    assert_eq!(get(&ran), 20);
    // Cancelled just before shutdown: `shutdown` drops it.
    let guard = PanicOnDrop;
    let handle = timer
        .schedule(Duration::from_secs(60), move || drop(guard))
        .unwrap();
    assert!(handle.cancel());
    assert!(timer.shutdown().is_empty());
    assert_eq!(timer.stats().panicked, 2);
}

/// Finding 2: a repeating task whose run panics and whose destructor panics too. Before the
/// fix the pool dropped it outside any guard and rayon aborted the process.
#[test]
fn panicking_repeating_task_whose_drop_panics() {
    in_child_process("panicking_repeating_task_whose_drop_panics", || {
        quiet_intentional_panics();
        for executor in executors() {
            let timer = one_shard(&executor);
            let guard = PanicOnDrop;
            timer
                .schedule_repeating(
                    Duration::from_millis(1),
                    MissedTickBehavior::Skip,
                    move || {
                        let _ = &guard;
                        panic!("run panics on purpose");
                    },
                )
                .unwrap();
            assert!(
                wait_until(Duration::from_secs(3), || timer.stats().panicked == 2),
                "{executor:?}: panicked {}",
                timer.stats().panicked
            );
            twenty_timers_run(&timer, &format!("{executor:?}"));
            assert!(timer.shutdown().is_empty());
        }
    });
}

/// Finding 2: a task panics with a payload whose destructor panics. Before the fix the pool
/// aborted the process (and an inline run killed the shard thread).
#[test]
fn panic_payload_whose_drop_panics() {
    in_child_process("panic_payload_whose_drop_panics", || {
        quiet_intentional_panics();
        for executor in executors() {
            let timer = one_shard(&executor);
            timer
                .schedule(Duration::from_millis(1), || {
                    std::panic::panic_any(PanicOnDrop)
                })
                .unwrap();
            assert!(
                wait_until(Duration::from_secs(3), || timer.stats().panicked >= 1),
                "{executor:?}: panicked {}",
                timer.stats().panicked
            );
            twenty_timers_run(&timer, &format!("{executor:?}"));
            assert!(timer.shutdown().is_empty());
        }
    });
}

/// Wakes by panicking with a payload whose destructor panics.
struct PanickingWaker;

impl Wake for PanickingWaker {
    fn wake(self: Arc<Self>) {
        std::panic::panic_any(PanicOnDrop);
    }
}

/// Finding 2: a `Sleep`'s waker is user code, woken inline on the shard thread. Before the fix
/// its panic payload's destructor killed the shard thread.
#[test]
fn sleep_waker_whose_panic_payload_panics_on_drop() {
    in_child_process("sleep_waker_whose_panic_payload_panics_on_drop", || {
        quiet_intentional_panics();
        let timer = one_shard(&Executor::DefaultPool);
        let mut sleep = timer.sleep(Duration::from_millis(1));
        let waker = Waker::from(Arc::new(PanickingWaker));
        assert!(
            std::pin::Pin::new(&mut sleep)
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );
        drop(waker);
        assert!(
            wait_until(Duration::from_secs(3), || timer.stats().panicked == 1),
            "panicked {}",
            timer.stats().panicked
        );
        twenty_timers_run(&timer, "after the waker");
        drop(sleep);
        assert!(timer.shutdown().is_empty());
    });
}

/// A waker whose `clone` panics, built by hand (`Wake` cannot make one).
fn waker_whose_clone_panics() -> Waker {
    use std::task::{RawWaker, RawWakerVTable};
    fn clone(_: *const ()) -> RawWaker {
        panic!("intentional: this waker cannot be cloned")
    }
    fn nothing(_: *const ()) {}
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, nothing, nothing, nothing);
    // SAFETY: the vtable's functions ignore the data pointer, and none of them is unsound.
    unsafe { Waker::from_raw(RawWaker::new(std::ptr::null(), &VTABLE)) }
}

/// A `Sleep` clones its poll's waker for its timer's task: a clone that panics reaches the
/// poll's caller, and leaves the engine as it was (no timer scheduled, no place taken).
#[test]
fn sleep_whose_waker_clone_panics() {
    quiet_intentional_panics();
    let timer = Timer::builder().shards(1).max_pending(1).build().unwrap();
    let mut sleep = timer.sleep(Duration::from_secs(60));
    let waker = waker_whose_clone_panics();
    let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = std::pin::Pin::new(&mut sleep).poll(&mut Context::from_waker(&waker));
    }));
    assert!(polled.is_err(), "the clone's panic reaches the caller");
    let stats = timer.stats();
    assert_eq!((stats.scheduled, stats.pending), (0, 0), "{stats:?}");
    drop(sleep);
    // The one place max_pending allows is still free.
    let mut again = timer.try_sleep_until(std::time::Instant::now() + Duration::from_millis(1));
    assert!(again.is_ok(), "{:?}", again.as_ref().err());
    futures::executor::block_on(again.as_mut().unwrap());
}

use std::future::Future;

/// Finding 5: a shard thread that dies (killed by the test-only fault hook) is reported by
/// `Stats`, schedules routed to it fail with `ScheduleError::ShardFailed`, and `shutdown`
/// still returns its pending timers: none is silently lost.
#[cfg(feature = "test-hooks")]
#[test]
fn a_dead_shard_is_reported() {
    quiet_intentional_panics();
    let timer = one_shard(&Executor::DefaultPool);
    let ran = counter();
    let pending = {
        let ran = ran.clone();
        timer
            .schedule(Duration::from_secs(60), move || {
                ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            })
            .unwrap()
    };
    // A task awaiting an hour-long sleep on that shard: woken by the failure, with the error.
    let (sleep_tx, sleep_rx) = mpsc::channel();
    let awaiting = {
        let sleep = timer.sleep(Duration::from_secs(3600));
        std::thread::spawn(move || {
            let mut sleep = std::pin::pin!(sleep);
            let outcome = futures::executor::block_on(std::future::poll_fn(|cx| {
                sleep.as_mut().poll_sleep(cx)
            }));
            sleep_tx.send(outcome).unwrap();
        })
    };
    assert!(
        wait_until(Duration::from_secs(3), || timer.stats().pending == 2),
        "the sleep did not register"
    );
    shardwheel::test_hooks::kill_shard_thread(&timer, 0);
    assert!(
        wait_until(Duration::from_secs(3), || timer.stats().failed_shards == 1),
        "the dead shard is not reported"
    );
    assert_eq!(
        sleep_rx.recv_timeout(Duration::from_secs(3)),
        Ok(Err(ScheduleError::ShardFailed)),
        "a sleep on the dead shard is not woken with the error"
    );
    awaiting.join().unwrap();
    let stats = timer.stats();
    assert!(stats.shards[0].failed);
    assert!(!timer.is_shut_down());
    assert_eq!(
        timer.schedule(Duration::from_millis(1), || {}).unwrap_err(),
        ScheduleError::ShardFailed
    );
    let sleep = timer.try_sleep_until(std::time::Instant::now() + Duration::from_millis(1));
    assert_eq!(sleep.err(), Some(ScheduleError::ShardFailed));
    let unfired = timer.shutdown();
    assert_eq!(
        unfired.len(),
        1,
        "the dead shard's pending timer is returned"
    );
    assert_eq!(pending.state(), shardwheel::TimerState::Cancelled);
    for timer in unfired {
        timer.run();
    }
    assert_eq!(get(&ran), 1);
    assert_eq!(
        timer.stats().failed_shards,
        1,
        "still reported after shutdown"
    );
}

/// Schedules `count` timers due in a minute whose tasks' destructors panic.
fn pending_tasks_whose_drop_panics(timer: &Timer, count: usize) {
    for _ in 0..count {
        let guard = PanicOnDrop;
        timer
            .schedule(Duration::from_secs(60), move || drop(guard))
            .unwrap();
    }
}

/// Dropping the last `Timer` with pending tasks whose destructors panic: the drop shuts the
/// engine down and drops the unfired tasks. Before the fix the first panic escaped the drop,
/// and a second one aborted the process ("panic in a destructor during cleanup"), also when the
/// last clone was dropped inside a task. Run in a child process, since the failure aborts.
#[test]
fn timer_dropped_with_pending_tasks_whose_drop_panics() {
    in_child_process("timer_dropped_with_pending_tasks_whose_drop_panics", || {
        quiet_intentional_panics();
        for executor in executors() {
            let timer = one_shard(&executor);
            pending_tasks_whose_drop_panics(&timer, 2);
            drop(timer);
            // The last clone dropped by a task, on the engine's own thread.
            let timer = one_shard(&executor);
            pending_tasks_whose_drop_panics(&timer, 2);
            let (sender, receiver) = mpsc::channel();
            let last = timer.clone();
            timer
                .schedule(Duration::from_millis(1), move || {
                    drop(last);
                    sender.send(()).unwrap();
                })
                .unwrap();
            drop(timer);
            receiver.recv_timeout(Duration::from_secs(10)).unwrap();
        }
        // The unfired timers `shutdown` returns drop quietly too.
        let timer = one_shard(&Executor::Inline);
        pending_tasks_whose_drop_panics(&timer, 1);
        let unfired = timer.shutdown();
        assert_eq!(unfired.len(), 1);
        drop(unfired);
    });
}
