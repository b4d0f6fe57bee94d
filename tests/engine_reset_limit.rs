//! A repeating timer takes at most 2^17 - 1 resets its shard has not applied; a further reset
//! waits for the shard. Where the waiting thread is the one that would let the shard apply them
//! (the shard's own thread running user code, or the thread that advances a manual clock), the
//! reset applies them itself: before, it waited for ever, and the shard's other timers stopped.

use shardwheel::{Clock, Executor, MissedTickBehavior, Timer, TimerHandle};
use std::future::Future;
use std::pin::Pin;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Wake, Waker};
use std::time::Duration;

mod support;

/// More resets than may be in flight at once.
const RESETS: usize = 200_000;

const HOUR: Duration = Duration::from_secs(3600);

/// Waits for two messages: the resets done, and another timer of the same shard fired.
fn both_arrive(receiver: &mpsc::Receiver<&'static str>) -> Vec<&'static str> {
    (0..2)
        .map_while(|_| receiver.recv_timeout(Duration::from_secs(20)).ok())
        .collect()
}

fn heartbeat(timer: &Timer) -> TimerHandle {
    timer
        .schedule_repeating(HOUR, MissedTickBehavior::Skip, || {})
        .expect("schedule")
}

#[test]
fn an_inline_task_resets_a_repeating_timer_of_its_shard_many_times() {
    let timer = Timer::builder()
        .shards(1)
        .pin_threads(false)
        .executor(Executor::Inline)
        .build()
        .expect("build");
    let heartbeat = heartbeat(&timer);
    let (sender, receiver) = mpsc::channel();
    let done = sender.clone();
    timer
        .schedule(Duration::from_millis(1), move || {
            for _ in 0..RESETS {
                assert!(heartbeat.reset(HOUR));
            }
            let _ = done.send("resets done");
        })
        .expect("schedule");
    timer
        .schedule(Duration::from_millis(20), move || {
            let _ = sender.send("other timer");
        })
        .expect("schedule");
    let got = both_arrive(&receiver);
    assert_eq!(got.len(), 2, "got {got:?}: the shard is stuck");
    // The shard counts the resets it applies at its turns.
    let counted = support::wait_until(Duration::from_secs(10), || {
        timer.stats().reset == RESETS as u64
    });
    let stats = timer.stats();
    assert!(counted && stats.panicked == 0, "{stats:?}");
}

/// Wakes by running an action, once.
struct OnWake(Mutex<Option<Box<dyn FnOnce() + Send>>>);

impl Wake for OnWake {
    fn wake(self: Arc<Self>) {
        let action = self.0.lock().expect("lock").take();
        if let Some(action) = action {
            action();
        }
    }
}

#[test]
fn a_waker_resets_a_repeating_timer_of_its_shard_many_times() {
    let timer = Timer::builder()
        .shards(1)
        .pin_threads(false)
        .build()
        .expect("build");
    let heartbeat_handle: Arc<OnceLock<TimerHandle>> = Arc::new(OnceLock::new());
    assert!(heartbeat_handle.set(heartbeat(&timer)).is_ok());
    let (sender, receiver) = mpsc::channel();
    let waker = {
        let (heartbeat_handle, sender) = (heartbeat_handle.clone(), sender.clone());
        Waker::from(Arc::new(OnWake(Mutex::new(Some(Box::new(move || {
            let heartbeat = heartbeat_handle.get().expect("set");
            for _ in 0..RESETS {
                assert!(heartbeat.reset(HOUR));
            }
            let _ = sender.send("resets done");
        }))))))
    };
    let mut sleep = timer.sleep(Duration::from_millis(1));
    assert!(
        Pin::new(&mut sleep)
            .poll(&mut Context::from_waker(&waker))
            .is_pending()
    );
    timer
        .schedule(Duration::from_millis(20), move || {
            let _ = sender.send("other timer");
        })
        .expect("schedule");
    let got = both_arrive(&receiver);
    assert_eq!(got.len(), 2, "got {got:?}: the shard is stuck");
}

#[test]
fn resets_of_a_repeating_timer_between_advances_of_a_manual_clock() {
    let clock = Clock::manual();
    let timer = Timer::builder()
        .shards(1)
        .executor(Executor::Inline)
        .clock(clock.clone())
        .build()
        .expect("build");
    let heartbeat = heartbeat(&timer);
    let (sender, receiver) = mpsc::channel();
    // On a thread of its own, so that a hang fails the test instead of hanging it.
    std::thread::spawn(move || {
        for _ in 0..RESETS {
            assert!(heartbeat.reset(HOUR));
        }
        let _ = sender.send(());
    });
    assert!(
        receiver.recv_timeout(Duration::from_secs(20)).is_ok(),
        "the resets did not return"
    );
    clock.advance(Duration::from_millis(1));
    let stats = timer.stats();
    assert_eq!(
        (stats.reset, stats.pending),
        (RESETS as u64, 1),
        "{stats:?}"
    );
}
