//! Baseline: tokio's timer (`tokio::time::Sleep` on a multi-thread runtime with time enabled).
//!
//! A timer is a `Pin<Box<Sleep>>` registered with the runtime's time driver by one poll whose
//! waker runs the task when the driver fires it (the driver's own wake-up path, with no task
//! spawned around it). Cancel drops the `Sleep`, which deregisters it from the driver; reset is
//! `Sleep::reset`. `Sleep::reset` needs `&mut`, so the handle keeps the `Sleep` in a `Mutex`
//! (uncontended: the reset workload picks timers at random among a million).

use crate::job::Job;
use crate::system::System;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Wake, Waker};
use std::time::{Duration, Instant};
use tokio::time::Sleep;

/// tokio's timer on a default multi-thread runtime (one worker per core).
pub struct TokioTimer {
    runtime: tokio::runtime::Runtime,
}

/// A registered `Sleep`.
pub struct TokioHandle {
    sleep: Mutex<Pin<Box<Sleep>>>,
}

/// The waker registered with the driver: runs the task on its first wake.
struct Fire {
    job: Job,
    fired: AtomicBool,
}

impl Wake for Fire {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.fired.swap(true, Ordering::AcqRel) {
            self.job.run();
        }
    }
}

impl TokioTimer {
    fn register(&self, sleep: Sleep, job: Job) -> TokioHandle {
        let mut sleep = Box::pin(sleep);
        let waker = Waker::from(Arc::new(Fire {
            job,
            fired: AtomicBool::new(false),
        }));
        if sleep
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_ready()
        {
            waker.wake_by_ref();
        }
        TokioHandle {
            sleep: Mutex::new(sleep),
        }
    }
}

impl System for TokioTimer {
    type Handle = TokioHandle;
    const NAME: &'static str = "tokio";

    fn describe() -> String {
        format!(
            "multi-thread runtime, enable_time; per timer Box<Sleep> ({} B) registered by one \
             poll + waker Arc ({} B incl. counts) that runs the task; handle Mutex<Pin<Box<Sleep>>> \
             = {} B; cancel = drop (deregisters), reset = Sleep::reset",
            std::mem::size_of::<Sleep>(),
            std::mem::size_of::<Fire>() + 16,
            std::mem::size_of::<TokioHandle>()
        )
    }

    fn build() -> TokioTimer {
        match tokio::runtime::Builder::new_multi_thread()
            .enable_time()
            .build()
        {
            Ok(runtime) => TokioTimer { runtime },
            Err(error) => {
                eprintln!("error: could not start a tokio runtime: {error}");
                std::process::exit(1);
            }
        }
    }

    fn on_thread<R>(&self, body: impl FnOnce() -> R) -> R {
        let _entered = self.runtime.enter();
        body()
    }

    #[inline]
    fn schedule(&self, delay: Duration, job: Job) -> Option<TokioHandle> {
        Some(self.register(tokio::time::sleep(delay), job))
    }

    #[inline]
    fn schedule_at(&self, deadline: Instant, job: Job) -> Option<TokioHandle> {
        Some(self.register(tokio::time::sleep_until(deadline.into()), job))
    }

    #[inline]
    fn cancel(&self, handle: TokioHandle) -> bool {
        let sleep = handle
            .sleep
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        let pending = !sleep.is_elapsed();
        drop(sleep); // deregisters from the driver
        pending
    }

    #[inline]
    fn reset(&self, handle: &TokioHandle, delay: Duration) -> bool {
        let mut sleep = handle.sleep.lock().unwrap_or_else(PoisonError::into_inner);
        if sleep.is_elapsed() {
            return false;
        }
        sleep.as_mut().reset(tokio::time::Instant::now() + delay);
        true
    }

    fn shutdown(self) {
        self.runtime.shutdown_timeout(Duration::from_secs(10));
    }
}
