//! The same futures under three executors (tokio current-thread, tokio multi-thread,
//! `futures::executor::block_on`), waker changes (a `Sleep` moved between tasks wakes the
//! latest one), and wake-ups that run inline on the shard thread, not on the executor pool.

mod support;

use shardwheel::{Executor, Sleep, Timer};
use std::future::{Future, pending};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::task::Poll;
use std::time::{Duration, Instant};
use support::{Rng, counting_waker, poll_once, timer, wait_until};

/// Sleeps, sleeps until, timeouts that elapse and timeouts that do not; every completion is
/// checked against an instant taken before the future was created.
async fn scenario(timer: Timer, seed: u64) {
    for round in 0..4u64 {
        let delay = Duration::from_micros(700 * ((seed * 5 + round * 3) % 13));
        let before = Instant::now();
        timer.sleep(delay).await;
        let took = before.elapsed();
        assert!(took >= delay, "sleep({delay:?}) completed after {took:?}");
    }
    let deadline = Instant::now() + Duration::from_millis(3 + seed % 5);
    timer.sleep_until(deadline).await;
    assert!(Instant::now() >= deadline);

    let before = Instant::now();
    let delay = Duration::from_millis(4);
    assert!(timer.timeout(delay, pending::<()>()).await.is_err());
    assert!(before.elapsed() >= delay);

    let inner = timer.sleep(Duration::from_millis(2));
    assert_eq!(timer.timeout(Duration::from_secs(10), inner).await, Ok(()));

    let deadline = Instant::now() + Duration::from_millis(5);
    assert!(timer.timeout_at(deadline, pending::<()>()).await.is_err());
    assert!(Instant::now() >= deadline);
}

const TASKS: u64 = 24;

#[test]
fn futures_run_under_tokio_current_thread_runtime() {
    let timer = timer(2);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let started = Instant::now();
    runtime.block_on(async {
        let tasks: Vec<_> = (0..TASKS)
            .map(|seed| tokio::spawn(scenario(timer.clone(), seed)))
            .collect();
        for task in tasks {
            task.await.expect("scenario task");
        }
    });
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(wait_until(Duration::from_secs(1), || timer.pending() == 0));
}

#[test]
fn futures_run_under_tokio_multi_thread_runtime() {
    let timer = timer(2);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let started = Instant::now();
    runtime.block_on(async {
        let tasks: Vec<_> = (0..TASKS)
            .map(|seed| tokio::spawn(scenario(timer.clone(), seed)))
            .collect();
        for task in tasks {
            task.await.expect("scenario task");
        }
    });
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(wait_until(Duration::from_secs(1), || timer.pending() == 0));
}

#[test]
fn futures_run_under_futures_block_on() {
    let timer = timer(2);
    let started = Instant::now();
    futures::executor::block_on(futures::future::join_all(
        (0..TASKS).map(|seed| scenario(timer.clone(), seed)),
    ));
    // And one at a time, each on its own blocking executor.
    for seed in 0..4 {
        futures::executor::block_on(scenario(timer.clone(), seed));
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(wait_until(Duration::from_secs(1), || timer.pending() == 0));
}

#[test]
fn a_sleep_wakes_the_waker_of_its_latest_poll() {
    let timer = timer(2);
    let (first, first_waker) = counting_waker();
    let (second, second_waker) = counting_waker();
    let before = Instant::now();
    let mut sleep = timer.sleep(Duration::from_millis(20));
    assert!(poll_once(&mut sleep, &first_waker).is_pending());
    assert!(poll_once(&mut sleep, &second_waker).is_pending());
    assert!(
        wait_until(Duration::from_secs(2), || second.wakes() > 0),
        "the latest waker was not woken"
    );
    assert!(before.elapsed() >= Duration::from_millis(20));
    assert_eq!(first.wakes(), 0, "the replaced waker was woken");
    assert_eq!(poll_once(&mut sleep, &second_waker), Poll::Ready(()));
}

#[test]
fn a_sleep_moved_to_another_thread_wakes_that_thread() {
    let timer = timer(2);
    let (first, first_waker) = counting_waker();
    let mut sleep = timer.sleep(Duration::from_millis(15));
    assert!(poll_once(&mut sleep, &first_waker).is_pending());
    let finished = std::thread::spawn(move || {
        let (second, second_waker) = counting_waker();
        assert!(poll_once(&mut sleep, &second_waker).is_pending());
        assert!(wait_until(Duration::from_secs(2), || second.wakes() > 0));
        poll_once(&mut sleep, &second_waker)
    })
    .join()
    .unwrap();
    assert_eq!(finished, Poll::Ready(()));
    assert_eq!(first.wakes(), 0);
}

/// Task one polls the sleep once (registering its waker), then hands it to task two, which
/// awaits it: only task two's waker can complete it. A lost wake-up shows as a timeout.
fn hand_a_sleep_between_tokio_tasks(runtime: tokio::runtime::Runtime) {
    let timer = timer(2);
    let handed_pending = runtime.block_on(async {
        let mut handed_pending = 0;
        for round in 0..20u64 {
            let before = Instant::now();
            let delay = Duration::from_millis(10 + round % 4);
            let sleep = timer.sleep(delay);
            let (sender, receiver) = tokio::sync::oneshot::channel::<(Sleep, bool)>();
            let first = tokio::spawn(async move {
                let mut sleep = sleep;
                let mut pending = None;
                std::future::poll_fn(|cx| {
                    if pending.is_none() {
                        pending = Some(std::pin::Pin::new(&mut sleep).poll(cx).is_pending());
                    }
                    Poll::Ready(())
                })
                .await;
                sender.send((sleep, pending.unwrap())).expect("send sleep");
                // Keep task one alive, idle: its stale waker must not be the one used.
                std::future::pending::<()>().await;
            });
            let second = tokio::spawn(async move {
                let (sleep, pending) = receiver.await.expect("receive sleep");
                (sleep.await, pending)
            });
            let ((), pending) = tokio::time::timeout(Duration::from_secs(5), second)
                .await
                .expect("the task awaiting the moved sleep was never woken")
                .unwrap();
            assert!(before.elapsed() >= delay);
            handed_pending += usize::from(pending);
            first.abort();
        }
        handed_pending
    });
    // Unless the machine is very slow, task one's poll came before the deadline every time.
    assert!(
        handed_pending >= 5,
        "only {handed_pending} of 20 sleeps were handed over pending"
    );
}

#[test]
fn a_sleep_handed_between_tokio_tasks_wakes_the_new_task_multi_thread() {
    hand_a_sleep_between_tokio_tasks(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .unwrap(),
    );
}

#[test]
fn a_sleep_handed_between_tokio_tasks_wakes_the_new_task_current_thread() {
    hand_a_sleep_between_tokio_tasks(
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap(),
    );
}

/// Changes wakers right around the deadline, so the shard's wake races the re-registration.
/// Whenever the last poll returned Pending, the waker it registered must be woken.
#[test]
fn waker_changes_racing_the_deadline_never_lose_the_wake_up() {
    let timer = timer(2);
    let mut rng = Rng::new(7);
    let mut raced = 0;
    for _ in 0..300 {
        let (first, first_waker) = counting_waker();
        let (second, second_waker) = counting_waker();
        let mut sleep = timer.sleep(Duration::from_millis(1));
        let _ = poll_once(&mut sleep, &first_waker);
        let spin = Duration::from_micros(rng.between(0, 2000));
        let spun = Instant::now();
        while spun.elapsed() < spin {
            std::hint::spin_loop();
        }
        match poll_once(&mut sleep, &second_waker) {
            Poll::Ready(()) => {
                raced += usize::from(first.wakes() > 0);
            }
            Poll::Pending => {
                assert!(
                    wait_until(Duration::from_secs(2), || second.wakes() > 0),
                    "lost wake-up after a waker change (first woken {} times)",
                    first.wakes()
                );
                assert!(poll_once(&mut sleep, &second_waker).is_ready());
            }
        }
    }
    eprintln!("{raced} of 300 sleeps had fired before the waker change");
}

/// The one pool thread is blocked: a plain task cannot run, but sleeps and timeouts complete,
/// because their wake-up runs inline on the shard thread.
#[test]
fn wake_ups_run_inline_even_when_the_executor_pool_is_blocked() {
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap(),
    );
    let timer = Timer::builder()
        .shards(1)
        .executor(Executor::ThreadPool(pool.clone()))
        .build()
        .unwrap();
    let (release, released) = mpsc::channel::<()>();
    let (started, is_started) = mpsc::channel::<()>();
    pool.spawn(move || {
        started.send(()).unwrap();
        // Blocks the pool's only thread until the test says so (or 10 s pass).
        let _ = released.recv_timeout(Duration::from_secs(10));
    });
    is_started.recv().unwrap();

    let plain_ran = Arc::new(AtomicBool::new(false));
    let flag = plain_ran.clone();
    timer
        .schedule(Duration::from_millis(1), move || {
            flag.store(true, Ordering::SeqCst)
        })
        .unwrap();

    let (done, is_done) = mpsc::channel();
    let sleeper = timer.clone();
    std::thread::spawn(move || {
        let before = Instant::now();
        futures::executor::block_on(sleeper.sleep(Duration::from_millis(20)));
        let timed_out = futures::executor::block_on(
            sleeper.timeout(Duration::from_millis(10), pending::<()>()),
        );
        done.send((timed_out.is_err(), before.elapsed())).unwrap();
    });
    let (timed_out, took) = is_done
        .recv_timeout(Duration::from_secs(3))
        .expect("a sleep did not complete while the pool was blocked");
    assert!(timed_out);
    assert!(took >= Duration::from_millis(30));
    assert!(
        !plain_ran.load(Ordering::SeqCst),
        "the pool was supposed to be blocked"
    );

    release.send(()).unwrap();
    assert!(wait_until(Duration::from_secs(2), || plain_ran.load(Ordering::SeqCst)));
}

/// Records the name of the thread that wakes it.
struct NamingWaker(std::sync::Mutex<Option<String>>);

impl std::task::Wake for NamingWaker {
    fn wake(self: Arc<Self>) {
        let name = std::thread::current().name().map(str::to_owned);
        *self.0.lock().unwrap() = Some(name.unwrap_or_default());
    }
}

#[test]
fn the_wake_up_runs_on_the_shard_thread() {
    // Default executor: the engine's own rayon pool, whose threads are named
    // `shardwheel-pool-N`; the sleep's waker must not be woken there.
    let timer = Timer::builder().shards(1).build().unwrap();
    let naming = Arc::new(NamingWaker(std::sync::Mutex::new(None)));
    let waker = std::task::Waker::from(naming.clone());
    let mut sleep = timer.sleep(Duration::from_millis(5));
    assert!(poll_once(&mut sleep, &waker).is_pending());
    assert!(wait_until(Duration::from_secs(2), || naming
        .0
        .lock()
        .unwrap()
        .is_some()));
    let name = naming.0.lock().unwrap().clone().unwrap();
    assert!(
        name.starts_with("shardwheel-shard"),
        "woken on thread {name:?}"
    );
}
