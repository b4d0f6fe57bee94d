//! A repeating timer takes at most 2^17 - 1 resets its shard has not applied; a further reset
//! waits for the shard. Where the waiting thread is the one that would let the shard apply them
//! (the shard's own thread running user code, or the thread that advances a manual clock), the
//! reset applies them itself: before, it waited for ever, and the shard's other timers stopped.

use shardwheel::{Executor, MissedTickBehavior, Timer, TimerHandle};
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

/// Schedules another timer of the shard, 20 ms from now, and waits for two messages: the
/// resets done, and that timer fired.
fn assert_the_shard_goes_on(
    timer: &Timer,
    sender: mpsc::Sender<&'static str>,
    receiver: &mpsc::Receiver<&'static str>,
) {
    timer
        .schedule(Duration::from_millis(20), move || {
            let _ = sender.send("other timer");
        })
        .expect("schedule");
    let got: Vec<_> = (0..2)
        .map_while(|_| receiver.recv_timeout(Duration::from_secs(20)).ok())
        .collect();
    assert_eq!(got.len(), 2, "got {got:?}: the shard is stuck");
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
    assert_the_shard_goes_on(&timer, sender, &receiver);
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
    assert_the_shard_goes_on(&timer, sender, &receiver);
}

#[test]
fn resets_of_a_repeating_timer_between_advances_of_a_manual_clock() {
    let (clock, timer) = support::manual_timer(1, Duration::from_millis(1));
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
