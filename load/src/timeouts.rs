//! W6 `timeouts`: an async server that wraps every request in a timeout (WORKLOADS.md).
//!
//! A multi-thread tokio runtime with T worker threads runs 1,000 tasks per worker. Each task
//! loops until told to stop: `timeout(30 s, yield_now()).await` (a future that completes at
//! its second poll, so the timeout's timer is armed, then disarmed), and every 64th iteration
//! `timeout(30 s, ready(()))` (complete at its first poll). The code is the same for every
//! system; only [`Flavor::timeout`] differs:
//!
//! | system | `timeout` | runtime |
//! |---|---|---|
//! | shardwheel | `shardwheel::timeout`, on the process's default timer (`Timer::new()`'s configuration) | no time driver (`enable_time` off) |
//! | tokio | `tokio::time::timeout` | `enable_time` |
//!
//! so each pays only for its own timer. The heap baseline has no futures API and does not
//! run W6. The timed window spans from spawning the tasks to joining them all; the process
//! CPU time (all threads: runtime workers, shard threads, the main thread) is read around it.
//!
//! Right after each system's run, the same loop runs once more with no timer at all (the
//! futures awaited bare, on a runtime without a time driver): `floor_cpu_ns_per_timeout`, what
//! every system pays for the runtime, the tasks and the futures; `timer_cpu_ns_per_timeout` is
//! the difference, what the timer itself costs.

use crate::args::Config;
use crate::measure::process_cpu_time;
use crate::progress::{Bar, watch_time};
use crate::report::{Report, anomaly};
use crate::system::System;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The deadline of every timeout: far beyond the run, so none may elapse.
const TIMEOUT: Duration = Duration::from_secs(30);
/// Every this many iterations, the wrapped future is ready at its first poll.
const READY_EVERY: u64 = 64;

/// A system's `timeout`, as W6 calls it.
trait Flavor: Clone + Send + Sync + 'static {
    /// A runtime with `workers` worker threads (and the time driver iff this flavor needs it).
    fn runtime(workers: usize) -> std::io::Result<tokio::runtime::Runtime>;

    /// `future` with a deadline of `delay`: `Ok` iff it completed in time. The system's own
    /// timeout future, returned as it is, so that the loop awaits it as WORKLOADS.md and a
    /// server's code write it (`timeout(30 s, fut).await`): each further `async` block around
    /// it would be one more copy of the whole future per timeout.
    fn timeout<F: Future + Send>(
        &self,
        delay: Duration,
        future: F,
    ) -> impl Future<Output = Result<F::Output, impl Sized>> + Send;
}

/// A multi-thread runtime with `workers` workers and no time driver: for the flavors that do
/// not use tokio's timer.
fn runtime_without_time_driver(workers: usize) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .build()
}

/// `shardwheel::timeout`: the default timer's, as a server moved from `tokio::time` calls it
/// (its sleeps keep their timers for their task's next timeout: see `shardwheel::Sleep`).
#[derive(Clone)]
struct ShardwheelFlavor;

impl Flavor for ShardwheelFlavor {
    fn runtime(workers: usize) -> std::io::Result<tokio::runtime::Runtime> {
        runtime_without_time_driver(workers)
    }

    #[inline]
    fn timeout<F: Future + Send>(
        &self,
        delay: Duration,
        future: F,
    ) -> impl Future<Output = Result<F::Output, impl Sized>> + Send {
        shardwheel::timeout(delay, future)
    }
}

/// `tokio::time::timeout`.
#[derive(Clone)]
struct TokioFlavor;

impl Flavor for TokioFlavor {
    fn runtime(workers: usize) -> std::io::Result<tokio::runtime::Runtime> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_time()
            .build()
    }

    #[inline]
    fn timeout<F: Future + Send>(
        &self,
        delay: Duration,
        future: F,
    ) -> impl Future<Output = Result<F::Output, impl Sized>> + Send {
        tokio::time::timeout(delay, future)
    }
}

/// No timer at all: the same tasks awaiting the same futures, for the floor every system's
/// figure includes (runtime, tasks, the futures themselves).
#[derive(Clone)]
struct NoTimerFlavor;

impl Flavor for NoTimerFlavor {
    fn runtime(workers: usize) -> std::io::Result<tokio::runtime::Runtime> {
        runtime_without_time_driver(workers)
    }

    #[inline]
    async fn timeout<F: Future + Send>(
        &self,
        _delay: Duration,
        future: F,
    ) -> Result<F::Output, impl Sized> {
        Ok::<_, std::convert::Infallible>(future.await)
    }
}

/// Runs W6 once on system `S` (shardwheel or tokio) with `threads` runtime workers.
pub(crate) fn run<S: System>(config: &Config, threads: usize, report: &mut Report, bar: &Bar) {
    match S::NAME {
        "shardwheel" => {
            // The default timer lives as long as the process: built here at the first run
            // (with `Timer::new()`'s configuration), never shut down.
            if let Err(error) = shardwheel::default_timer() {
                anomaly(format!(
                    "shardwheel: timeouts: could not build the default timer: {error}"
                ));
                return;
            }
            measure(ShardwheelFlavor, S::NAME, config, threads, report, bar);
        }
        "tokio" => measure(TokioFlavor, S::NAME, config, threads, report, bar),
        _ => {} // no futures API: the runner does not ask
    }
}

/// Measures `flavor`, then the same loop with no timer (the floor), and reports both and
/// their difference: what the timer itself costs per timeout.
fn measure<F: Flavor>(
    flavor: F,
    system: &'static str,
    config: &Config,
    threads: usize,
    report: &mut Report,
    bar: &Bar,
) {
    let Some((completed, wall, cpu)) = run_loop(flavor, system, config, threads, bar) else {
        return;
    };
    let per_timeout = |cpu: Duration, completed: u64| {
        if completed == 0 {
            f64::NAN
        } else {
            cpu.as_nanos() as f64 / completed as f64
        }
    };
    let cpu_ns = per_timeout(cpu, completed);
    report.add(
        system,
        "timeouts",
        threads,
        "timeouts_per_s",
        completed as f64 / wall.as_secs_f64().max(1e-9),
        "timeouts/s",
    );
    report.add(
        system,
        "timeouts",
        threads,
        "cpu_ns_per_timeout",
        cpu_ns,
        "ns",
    );
    if let Some((floor_completed, _, floor_cpu)) =
        run_loop(NoTimerFlavor, system, config, threads, bar)
    {
        let floor_ns = per_timeout(floor_cpu, floor_completed);
        report.add(
            system,
            "timeouts",
            threads,
            "floor_cpu_ns_per_timeout",
            floor_ns,
            "ns",
        );
        report.add(
            system,
            "timeouts",
            threads,
            "timer_cpu_ns_per_timeout",
            cpu_ns - floor_ns,
            "ns",
        );
    }
}

/// One timed run of the W6 loop: (timeouts completed, wall time, process CPU time).
fn run_loop<F: Flavor>(
    flavor: F,
    system: &'static str,
    config: &Config,
    threads: usize,
    bar: &Bar,
) -> Option<(u64, Duration, Duration)> {
    let runtime = match F::runtime(threads) {
        Ok(runtime) => runtime,
        Err(error) => {
            anomaly(format!(
                "{system}: timeouts: could not start a tokio runtime: {error}"
            ));
            return None;
        }
    };
    let length = Duration::from_secs_f64(config.timeouts_seconds);
    let tasks = threads * config.timeout_tasks_per_worker;
    let stop = Arc::new(AtomicBool::new(false));
    let cpu_before = process_cpu_time();
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (flavor, stop) = (flavor.clone(), Arc::clone(&stop));
            runtime.spawn(async move {
                let (mut completed, mut elapsed) = (0u64, 0u64);
                let mut iteration = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    iteration += 1;
                    let in_time = if iteration.is_multiple_of(READY_EVERY) {
                        flavor
                            .timeout(TIMEOUT, std::future::ready(()))
                            .await
                            .is_ok()
                    } else {
                        flavor
                            .timeout(TIMEOUT, tokio::task::yield_now())
                            .await
                            .is_ok()
                    };
                    if in_time {
                        completed += 1;
                    } else {
                        elapsed += 1;
                    }
                }
                (completed, elapsed)
            })
        })
        .collect();
    watch_time(
        bar,
        start,
        length,
        (0.0, 0.95),
        &format!("T={threads} {tasks} tasks"),
    );
    stop.store(true, Ordering::Relaxed);
    let outcomes = runtime.block_on(async {
        let mut outcomes = Vec::with_capacity(handles.len());
        for handle in handles {
            outcomes.push(handle.await);
        }
        outcomes
    });
    let wall = start.elapsed();
    let cpu = process_cpu_time().saturating_sub(cpu_before);
    bar.set(1.0, format!("T={threads} done"));
    runtime.shutdown_timeout(Duration::from_secs(10));

    let (mut completed, mut elapsed, mut panicked) = (0u64, 0u64, 0usize);
    for outcome in outcomes {
        match outcome {
            Ok((done, late)) => {
                completed += done;
                elapsed += late;
            }
            Err(_) => panicked += 1,
        }
    }
    if elapsed != 0 {
        anomaly(format!(
            "{system}: timeouts T={threads}: {elapsed} timeouts of 30 s elapsed within a {:.1} s run",
            wall.as_secs_f64()
        ));
    }
    if panicked != 0 {
        anomaly(format!(
            "{system}: timeouts T={threads}: {panicked} tasks panicked"
        ));
    }
    Some((completed, wall, cpu))
}
