//! What tasks may do: schedule, cancel and reset from inside a task (holding a `Timer` clone),
//! and panic (caught, counted, the engine keeps going), with the default pool and inline.

mod support;

use shardwheel::{Executor, Timer, TimerHandle, TimerState};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};
use support::{counter, get, quiet_intentional_panics, timer_on, wait_until};

fn executors() -> [Executor; 2] {
    [Executor::DefaultPool, Executor::Inline]
}

/// A task reschedules itself (a heartbeat) through a `Timer` clone: a chain of 50 runs, each
/// no earlier than its own deadline.
#[test]
fn schedule_from_inside_a_task() {
    fn beat(timer: Timer, left: usize, done: mpsc::Sender<usize>, early: Arc<Mutex<Vec<usize>>>) {
        if left == 0 {
            done.send(0).unwrap();
            return;
        }
        let next = timer.clone();
        let delay = Duration::from_micros(200 * (left as u64 % 5));
        let before = Instant::now();
        timer
            .schedule(delay, move || {
                if Instant::now() < before + delay {
                    early.lock().unwrap().push(left);
                }
                beat(next, left - 1, done, early)
            })
            .expect("schedule from inside a task");
    }
    for executor in executors() {
        let timer = timer_on(&executor);
        let early = Arc::new(Mutex::new(Vec::new()));
        let (sender, receiver) = mpsc::channel();
        // Two chains, so both shards and several threads are involved.
        beat(timer.clone(), 50, sender.clone(), early.clone());
        let from_thread = timer.clone();
        let chain_early = early.clone();
        std::thread::spawn(move || beat(from_thread, 50, sender, chain_early))
            .join()
            .unwrap();
        for _ in 0..2 {
            receiver
                .recv_timeout(Duration::from_secs(5))
                .unwrap_or_else(|_| panic!("{executor:?}: heartbeat chain stalled"));
        }
        assert!(early.lock().unwrap().is_empty(), "{executor:?}: early runs");
        let stats = timer.stats();
        assert_eq!(stats.fired, 100, "{executor:?}");
        assert_eq!(stats.pending, 0, "{executor:?}");
    }
}

/// A task cancels and resets other timers, and cancels itself (false: it already fired).
#[test]
fn cancel_and_reset_from_inside_a_task() {
    for executor in executors() {
        let timer = timer_on(&executor);
        let victim = timer
            .schedule(Duration::from_millis(20), || panic!("victim ran"))
            .unwrap();
        let ran = counter();
        let ran_clone = ran.clone();
        let pushed = timer
            .schedule(Duration::from_secs(3600), move || {
                ran_clone.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
        let own: Arc<Mutex<Option<TimerHandle>>> = Arc::new(Mutex::new(None));
        let (sender, receiver) = mpsc::channel();
        let own_clone = own.clone();
        let (victim_clone, pushed_clone) = (victim.clone(), pushed.clone());
        let mut guard = own.lock().unwrap();
        *guard = Some(
            timer
                .schedule(Duration::from_millis(1), move || {
                    let own = own_clone.lock().unwrap().take().unwrap();
                    let results = (
                        victim_clone.cancel(),
                        pushed_clone.reset(Duration::from_millis(1)),
                        own.cancel(),
                        own.state(),
                    );
                    sender.send(results).unwrap();
                })
                .unwrap(),
        );
        drop(guard);
        let results = receiver.recv_timeout(Duration::from_secs(2)).unwrap();
        assert_eq!(
            results,
            (true, true, false, TimerState::Expired),
            "{executor:?}"
        );
        assert!(wait_until(Duration::from_secs(1), || get(&ran) == 1));
        std::thread::sleep(Duration::from_millis(25));
        assert_eq!(victim.state(), TimerState::Cancelled);
        assert_eq!(timer.stats().panicked, 0, "{executor:?}");
    }
}

/// Panicking tasks are caught and counted; the others still run, before and after, and the
/// engine keeps going.
#[test]
fn panicking_tasks_are_caught_and_counted() {
    quiet_intentional_panics();
    for executor in executors() {
        let timer = timer_on(&executor);
        let ran = counter();
        for i in 0..40u64 {
            let ran = ran.clone();
            let delay = Duration::from_micros(100 * (i % 10));
            if i % 4 == 0 {
                timer
                    .schedule(delay, move || panic!("task {i} panics on purpose"))
                    .unwrap();
            } else {
                timer
                    .schedule(delay, move || {
                        ran.fetch_add(1, Ordering::SeqCst);
                    })
                    .unwrap();
            }
        }
        assert!(
            wait_until(Duration::from_secs(2), || get(&ran) == 30
                && timer.stats().panicked == 10),
            "{executor:?}: ran {}, panicked {}",
            get(&ran),
            timer.stats().panicked
        );
        // Still going, from this thread and from another one.
        let (sender, receiver) = mpsc::channel();
        let other = sender.clone();
        timer
            .schedule(Duration::from_millis(1), move || sender.send(1).unwrap())
            .unwrap();
        let clone = timer.clone();
        std::thread::spawn(move || {
            clone
                .schedule(Duration::ZERO, move || other.send(2).unwrap())
                .unwrap()
        })
        .join()
        .unwrap();
        let mut got: Vec<i32> = (0..2)
            .map(|_| receiver.recv_timeout(Duration::from_secs(2)).unwrap())
            .collect();
        got.sort();
        assert_eq!(got, [1, 2], "{executor:?}");
        let stats = timer.stats();
        assert_eq!(stats.fired, 42, "{executor:?}");
        assert_eq!(stats.panicked, 10, "{executor:?}");
        let per_shard: u64 = stats.shards.iter().map(|shard| shard.panicked).sum();
        assert_eq!(per_shard, 10);
        assert!(timer.shutdown().is_empty());
    }
}

/// A panicking task that holds a `Timer` clone and schedules before panicking: the scheduled
/// task still runs.
#[test]
fn panic_after_scheduling_from_inside() {
    quiet_intentional_panics();
    for executor in executors() {
        let timer = timer_on(&executor);
        let (sender, receiver) = mpsc::channel();
        let clone = timer.clone();
        timer
            .schedule(Duration::ZERO, move || {
                clone
                    .schedule(Duration::from_millis(1), move || sender.send(()).unwrap())
                    .unwrap();
                panic!("after scheduling, on purpose");
            })
            .unwrap();
        receiver
            .recv_timeout(Duration::from_secs(2))
            .unwrap_or_else(|_| panic!("{executor:?}: follow-up task did not run"));
        assert!(wait_until(Duration::from_secs(1), || timer
            .stats()
            .panicked
            == 1));
    }
}
