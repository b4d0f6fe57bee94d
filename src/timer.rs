//! The public face: [`Timer`] and its [`Builder`].

use crate::TimerHandle;
use crate::clock::{Clock, Driven, TickClock};
use crate::engine::executor::{Dispatch, Executor};
use crate::engine::shard::{PendingLimit, ShardCore, ShardShared, UnfiredTimer};
use crate::engine::{Drive, Engine, worker};
use crate::error::{BuildError, ScheduleError};
use crate::stats::Stats;
use crate::sync::{Arc, Mutex, registry, thread};
use crate::task::Task;
use crate::wheel::{DEFAULT_LEVELS, MAX_LEVELS};
use std::time::{Duration, Instant};

/// A sharded timer engine: schedule, cancel and reset millions of timeouts from any thread.
///
/// # How it works
///
/// * **Shards.** One shard per core by default. Each owns a hierarchical timing wheel
///   ([`crate::wheel`]) and a worker thread pinned to its core (best effort). Only that thread
///   touches the wheel: no locks inside.
/// * **Submission.** `schedule` takes a slot in the calling thread's home shard (threads are
///   spread over shards round-robin; a shard's own thread uses its shard), marks it pending in
///   the slot's atomic state word, and sends the task to the shard through its lock-free inbox.
///   The handle names its shard and slot, so `cancel` and `reset` always reach the owner.
/// * **Exactly once.** Firing, cancelling and resetting are compare-and-swaps on the timer's
///   state word: a task runs iff no `cancel()` returned true for it, and never twice. See
///   [`design`](crate::design) for the state machine and why no memory is ever read after free.
/// * **Sleeping.** A shard sleeps until its next deadline, or until a submission needs it
///   earlier; an idle engine uses no CPU.
/// * **Expiry.** Expired tasks go in batches to a rayon pool (or run inline on the shard thread,
///   for tasks that only wake something); a panicking task is caught and counted.
///
/// Deadlines round up to the tick (default 1 ms): a task never runs before its deadline.
///
/// ```
/// use shardwheel::Timer;
/// use std::time::Duration;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let timer = Timer::builder().shards(2).build()?;
/// let handle = timer.schedule(Duration::from_secs(30), || println!("request timed out"))?;
/// assert!(handle.cancel()); // the request finished in time
/// let (sender, receiver) = std::sync::mpsc::channel();
/// timer.schedule(Duration::from_millis(5), move || sender.send("fired").unwrap())?;
/// assert_eq!(receiver.recv()?, "fired");
/// timer.shutdown();
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Timer {
    inner: Arc<TimerInner>,
}

/// Shared by a timer's clones; dropping the last one shuts the engine down.
struct TimerInner {
    engine: Arc<Engine>,
    /// Keeps the manual clock's weak reference to this engine alive.
    _driver: Option<registry::Arc<dyn Driven>>,
}

impl Drop for TimerInner {
    fn drop(&mut self) {
        drop(self.engine.shutdown());
    }
}

struct ManualDriver(Arc<Engine>);

impl Driven for ManualDriver {
    fn drive(&self) {
        self.0.drive();
    }
}

impl std::fmt::Debug for Timer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timer")
            .field("engine", &self.inner.engine)
            .finish()
    }
}

impl Timer {
    /// A timer with every default: one shard per core, 1 ms tick, pinned threads, no limit.
    pub fn new() -> Result<Timer, BuildError> {
        Timer::builder().build()
    }

    /// Starts configuring a timer.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// Runs `task` once `delay` has passed (rounded up to the tick), on the executor.
    pub fn schedule<F>(&self, delay: Duration, task: F) -> Result<TimerHandle, ScheduleError>
    where
        F: FnOnce() + Send + 'static,
    {
        let engine = &self.inner.engine;
        engine.submit(engine.clock.tick_after(delay), Task::new(task))
    }

    /// Runs `task` at `deadline` (rounded up to the tick). A deadline in the past fires at the
    /// shard's next turn.
    pub fn schedule_at<F>(&self, deadline: Instant, task: F) -> Result<TimerHandle, ScheduleError>
    where
        F: FnOnce() + Send + 'static,
    {
        let engine = &self.inner.engine;
        engine.submit(engine.clock.tick_at(deadline), Task::new(task))
    }

    /// Timers scheduled and neither fired nor cancelled yet. Exact at every instant when
    /// `max_pending` is set; otherwise a sum of per-shard counters, exact when quiet.
    pub fn pending(&self) -> usize {
        self.inner.engine.pending()
    }

    /// Totals and per-shard counters.
    pub fn stats(&self) -> Stats {
        self.inner.engine.stats()
    }

    /// The clock this timer reads.
    pub fn clock(&self) -> &Clock {
        self.inner.engine.clock.clock()
    }

    /// Stops the engine and returns every timer that neither ran nor was cancelled, with its
    /// task (not run). Their handles then report [`Cancelled`](crate::TimerState::Cancelled).
    /// New schedules fail with [`ScheduleError::Shutdown`]. Joins the shard threads, except the
    /// calling thread's own when called from a task running inline. Idempotent (later calls
    /// return an empty list) and safe from any thread, including from inside a task.
    pub fn shutdown(&self) -> Vec<UnfiredTimer> {
        self.inner.engine.shutdown()
    }

    /// Whether [`shutdown`](Self::shutdown) has been called.
    pub fn is_shut_down(&self) -> bool {
        self.inner.engine.is_shut_down()
    }
}

/// Configures a [`Timer`]. Every option has a default; see [`Timer::builder`].
#[derive(Clone, Debug)]
pub struct Builder {
    shards: Option<usize>,
    tick: Duration,
    pin_threads: bool,
    max_pending: Option<usize>,
    levels: usize,
    executor: Executor,
    clock: Clock,
}

impl Default for Builder {
    fn default() -> Builder {
        Builder {
            shards: None,
            tick: Duration::from_millis(1),
            pin_threads: true,
            max_pending: None,
            levels: DEFAULT_LEVELS,
            executor: Executor::default(),
            clock: Clock::system(),
        }
    }
}

impl Builder {
    /// Number of shards (default: number of cores). Zero is an error.
    pub fn shards(mut self, shards: usize) -> Builder {
        self.shards = Some(shards);
        self
    }

    /// Length of a tick (default 1 ms): deadlines round up to it. Zero is an error.
    pub fn tick(mut self, tick: Duration) -> Builder {
        self.tick = tick;
        self
    }

    /// Whether to pin each shard thread to a core (default true). Best effort: where pinning
    /// fails, the thread runs unpinned and [`Stats::pinned`] says so.
    pub fn pin_threads(mut self, pin: bool) -> Builder {
        self.pin_threads = pin;
        self
    }

    /// At most this many pending timers (default unlimited); further schedules fail with
    /// [`ScheduleError::Full`] until one fires or is cancelled.
    pub fn max_pending(mut self, max: usize) -> Builder {
        self.max_pending = Some(max);
        self
    }

    /// Levels of 64 slots in each shard's wheel (default 6: 2^36 ticks before overflow).
    pub fn levels(mut self, levels: usize) -> Builder {
        self.levels = levels;
        self
    }

    /// Where expired tasks run (default: a rayon pool owned by the engine).
    pub fn executor(mut self, executor: Executor) -> Builder {
        self.executor = executor;
        self
    }

    /// The clock (default: the system clock). A [`Clock::manual`] clock runs no shard threads:
    /// its `advance` drives the shards.
    pub fn clock(mut self, clock: Clock) -> Builder {
        self.clock = clock;
        self
    }

    /// Starts the engine.
    pub fn build(self) -> Result<Timer, BuildError> {
        let shard_count = self.shards.unwrap_or_else(num_cpus::get);
        if shard_count == 0 {
            return Err(BuildError::NoShards);
        }
        if self.tick.is_zero() {
            return Err(BuildError::ZeroTick);
        }
        if !(1..=MAX_LEVELS).contains(&self.levels) {
            return Err(BuildError::InvalidLevels {
                levels: self.levels,
            });
        }
        let dispatch = if cfg!(loom) {
            Dispatch::Inline
        } else {
            match self.executor {
                Executor::DefaultPool => {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(num_cpus::get())
                        .thread_name(|index| format!("shardwheel-exec-{index}"))
                        .build()
                        .map_err(|error| BuildError::ThreadPool(error.to_string()))?;
                    Dispatch::Pool(registry::Arc::new(pool))
                }
                Executor::ThreadPool(pool) => Dispatch::Pool(pool),
                Executor::Inline => Dispatch::Inline,
            }
        };
        let clock = TickClock::new(self.clock.clone(), self.tick);
        let limit = self.max_pending.map(|max| Arc::new(PendingLimit::new(max)));
        let shards: Box<[Arc<ShardShared>]> = (0..shard_count)
            .map(|_| Arc::new(ShardShared::new(clock.clone(), limit.clone())))
            .collect();
        let cores: Vec<ShardCore> = shards
            .iter()
            .map(|shard| ShardCore::new(shard.clone(), self.levels))
            .collect();

        if self.clock.is_manual() {
            let drive = Drive::ByHand(
                cores
                    .into_iter()
                    .map(|core| Mutex::new(Some(core)))
                    .collect(),
            );
            let engine = Arc::new(Engine::new(shards, clock, dispatch, limit, drive));
            let driver: registry::Arc<dyn Driven> =
                registry::Arc::new(ManualDriver(engine.clone()));
            self.clock.register(registry::Arc::downgrade(&driver));
            return Ok(Timer {
                inner: Arc::new(TimerInner {
                    engine,
                    _driver: Some(driver),
                }),
            });
        }

        // Loom runs every thread on one OS thread: pinning would pin the model checker.
        let core_ids = if self.pin_threads && !cfg!(loom) {
            core_affinity::get_core_ids().unwrap_or_default()
        } else {
            Vec::new()
        };
        let mut workers = Vec::with_capacity(shard_count);
        let mut spawn_error = None;
        for (ordinal, core) in cores.into_iter().enumerate() {
            let dispatch = dispatch.clone();
            let pin = (!core_ids.is_empty()).then(|| core_ids[ordinal % core_ids.len()]);
            let spawned = spawn_worker(ordinal, move || worker::run(core, dispatch, ordinal, pin));
            match spawned {
                Ok(handle) => workers.push(handle),
                Err(error) => {
                    spawn_error = Some(error);
                    break;
                }
            }
        }
        let engine = Arc::new(Engine::new(
            shards,
            clock,
            dispatch,
            limit,
            Drive::Threads(Mutex::new(workers)),
        ));
        if let Some(error) = spawn_error {
            drop(engine.shutdown());
            return Err(BuildError::Spawn(error));
        }
        Ok(Timer {
            inner: Arc::new(TimerInner {
                engine,
                _driver: None,
            }),
        })
    }
}

#[cfg(not(loom))]
fn spawn_worker(
    ordinal: usize,
    run: impl FnOnce() -> Option<ShardCore> + Send + 'static,
) -> std::io::Result<thread::JoinHandle<Option<ShardCore>>> {
    thread::Builder::new()
        .name(format!("shardwheel-shard-{ordinal}"))
        .spawn(run)
}

#[cfg(loom)]
fn spawn_worker(
    _ordinal: usize,
    run: impl FnOnce() -> Option<ShardCore> + Send + 'static,
) -> std::io::Result<thread::JoinHandle<Option<ShardCore>>> {
    Ok(thread::spawn(run))
}
