//! The public face: [`Timer`] and its [`Builder`].

use crate::TimerHandle;
use crate::clock::{Clock, Deadline, Driven};
use crate::engine::executor::Executor;
use crate::engine::handoff::UnfiredTimer;
use crate::engine::lease::{Forever, Lease, Owner};
use crate::engine::{Engine, Settings};
use crate::error::{BuildError, ScheduleError};
use crate::futures::{EngineRef, Interval, Sleep, Timeout};
use crate::periodic::{Cadence, MissedTickBehavior, Repeating};
use crate::stats::Stats;
use crate::sync::{Arc, registry};
use crate::task::Task;
use crate::wheel::DEFAULT_LEVELS;
use std::future::IntoFuture;
use std::time::{Duration, Instant};

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// A sharded timer engine: schedule, cancel and reset millions of timeouts from any thread.
///
/// # How it works
///
/// * **Shards.** One shard per core by default. Each owns a hierarchical timing wheel
///   ([`crate::wheel`]) and a worker thread pinned to its core (best effort). Only that thread
///   touches the wheel: no locks inside.
/// * **Submission.** `schedule` takes a slot in the calling thread's home shard (chosen at its
///   first schedule, moved only when the thread stays on another core; see
///   `engine/placement.rs`), marks it pending in the slot's atomic
///   state word, and sends the task to the shard through its lock-free inbox.
///   The handle names its shard and slot, so `cancel` and `reset` always reach the owner.
/// * **Exactly once.** Firing, cancelling and resetting are compare-and-swaps on the timer's
///   state word: a task runs iff no `cancel()` returned true for it, and never twice. See
///   [`design`](crate::design) for the state machine and why no memory is ever read after free.
/// * **Sleeping.** A shard sleeps until its next deadline, or until a submission needs it
///   earlier; an idle engine uses no CPU.
/// * **Expiry.** Expired tasks go in batches to a rayon pool (or run inline on the shard thread,
///   for tasks that only wake something). User code that panics (a task, its destructor, a
///   waker) is caught and counted: see [user code](crate::design#user-code).
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
/// timer.schedule(Duration::from_millis(5), move || {
///     let _ = sender.send("fired");
/// })?;
/// assert_eq!(receiver.recv()?, "fired");
/// timer.shutdown();
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Timer {
    inner: Arc<TimerInner>,
}

/// Shared by a timer's clones; dropping the last one shuts the engine down (and leaves its
/// memory to the sleeps still leasing it: see [`lease`](crate::engine::lease)).
struct TimerInner {
    engine: Owner<Engine>,
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
            .field("engine", &**self.inner.engine)
            .finish()
    }
}

impl Timer {
    /// A timer with every default: one shard per CPU this process may use, 1 ms tick, pinned
    /// threads, no limit.
    ///
    /// # Errors
    ///
    /// [`BuildError::Spawn`] if a shard thread cannot be started.
    pub fn new() -> Result<Timer, BuildError> {
        Timer::builder().build()
    }

    /// Starts configuring a timer.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// Runs `task` once `delay` has passed (rounded up to the tick), on the executor.
    ///
    /// # Errors
    ///
    /// [`ScheduleError::Shutdown`] after [`shutdown`](Self::shutdown), [`ScheduleError::Full`]
    /// at the [`max_pending`](Builder::max_pending) limit, [`ScheduleError::ShardFailed`] if
    /// the shard's thread died (an engine bug), [`ScheduleError::ExecutorUnavailable`] if the
    /// default executor pool cannot be started; the task is then dropped, not run.
    pub fn schedule<F>(&self, delay: Duration, task: F) -> Result<TimerHandle, ScheduleError>
    where
        F: FnOnce() + Send + 'static,
    {
        let engine = &self.inner.engine;
        engine.dispatch.ready_for_closures()?;
        engine.submit(engine.clock.tick_after(delay), Task::new(task))
    }

    /// Runs `task` at `deadline` (rounded up to the tick). A deadline in the past fires at the
    /// shard's first turn once its rounded-up tick has come: within one tick from now.
    ///
    /// # Errors
    ///
    /// As [`schedule`](Self::schedule).
    pub fn schedule_at<F>(&self, deadline: Instant, task: F) -> Result<TimerHandle, ScheduleError>
    where
        F: FnOnce() + Send + 'static,
    {
        let engine = &self.inner.engine;
        engine.dispatch.ready_for_closures()?;
        engine.submit(engine.clock.tick_at(deadline), Task::new(task))
    }

    /// Runs `task` every `period`, first one period from now, at fixed rate: the k-th run is
    /// due `k * period` after this call, whatever the runs take. Runs never overlap (the next
    /// is armed when the previous one returns); `missed` says what happens to grid points a
    /// slow run or a busy executor made it miss. The handle's `cancel` stops future runs (a run
    /// in progress finishes); `reset` moves the next run and restarts the grid from it. A
    /// panicking run stops the timer and is counted in [`Stats::panicked`].
    ///
    /// # Errors
    ///
    /// [`ScheduleError::ZeroPeriod`] for a zero `period`; else as [`schedule`](Self::schedule).
    pub fn schedule_repeating<F>(
        &self,
        period: Duration,
        missed: MissedTickBehavior,
        task: F,
    ) -> Result<TimerHandle, ScheduleError>
    where
        F: FnMut() + Send + 'static,
    {
        self.schedule_repeating_after(period, period, missed, task)
    }

    /// Like [`schedule_repeating`](Self::schedule_repeating), with the first run after
    /// `initial_delay` and the grid continuing from it every `period`.
    ///
    /// # Errors
    ///
    /// As [`schedule_repeating`](Self::schedule_repeating).
    pub fn schedule_repeating_after<F>(
        &self,
        initial_delay: Duration,
        period: Duration,
        missed: MissedTickBehavior,
        task: F,
    ) -> Result<TimerHandle, ScheduleError>
    where
        F: FnMut() + Send + 'static,
    {
        let period = nanos(period);
        if period == 0 {
            return Err(ScheduleError::ZeroPeriod);
        }
        self.submit_repeating(initial_delay, Cadence::FixedRate { period, missed }, task)
    }

    /// Runs `task` first after `initial_delay`, then each time `delay` after the previous run
    /// returned (fixed delay). Otherwise as [`schedule_repeating`](Self::schedule_repeating).
    ///
    /// # Errors
    ///
    /// [`ScheduleError::ZeroPeriod`] for a zero `delay`; else as [`schedule`](Self::schedule).
    pub fn schedule_with_fixed_delay<F>(
        &self,
        initial_delay: Duration,
        delay: Duration,
        task: F,
    ) -> Result<TimerHandle, ScheduleError>
    where
        F: FnMut() + Send + 'static,
    {
        let delay = nanos(delay);
        if delay == 0 {
            return Err(ScheduleError::ZeroPeriod);
        }
        self.submit_repeating(initial_delay, Cadence::FixedDelay { delay }, task)
    }

    fn submit_repeating<F>(
        &self,
        initial_delay: Duration,
        cadence: Cadence,
        task: F,
    ) -> Result<TimerHandle, ScheduleError>
    where
        F: FnMut() + Send + 'static,
    {
        let engine = &self.inner.engine;
        engine.dispatch.ready_for_closures()?;
        let first_due = engine
            .clock
            .now_nanos()
            .saturating_add(nanos(initial_delay));
        let repeating = Repeating::new(task, cadence, first_due);
        engine.submit(
            engine.clock.tick_at_nanos(first_due),
            Task::new_repeating(repeating),
        )
    }

    /// A future that completes once `delay` has passed (`tokio::time::sleep`). Its timer is
    /// scheduled at its first poll and wakes the task inline on the shard thread; dropping it
    /// cancels the timer. Panics when polled if this timer is shut down or full: see [`Sleep`].
    ///
    /// Its [`deadline`](Sleep::deadline) is `delay` after the time read here, which on the
    /// system clock may come from the cheaper cycle counter: never before `Instant::now()`, and
    /// at most some tens of microseconds after it (see `src/cycle_clock.rs`). A deadline beyond
    /// what an `Instant` holds (`Duration::MAX`) is 2^30 s (about 34 years) away instead, as a
    /// tokio sleep's is 30 years; the same holds for the deadlines of [`timeout`](Self::timeout)
    /// and of an [`Interval`]'s ticks. A zero `delay` has passed already: the sleep is elapsed.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let timer = shardwheel::Timer::new()?;
    /// futures::executor::block_on(timer.sleep(std::time::Duration::from_millis(5)));
    /// # Ok(())
    /// # }
    /// ```
    pub fn sleep(&self, delay: Duration) -> Sleep {
        let deadline = self.inner.engine.clock.deadline_after(delay);
        Sleep::with(self.engine_ref(), deadline, delay.is_zero(), false)
    }

    /// How this timer's sleeps refer to its engine: by a lease, counted on this thread's stripe.
    fn engine_ref(&self) -> EngineRef {
        self.inner.engine.lease()
    }

    /// How the sleeps of a timer that is never dropped (the default timer) refer to its engine:
    /// by a plain reference, which costs no reference count per sleep.
    pub(crate) fn static_engine_ref(&'static self) -> EngineRef {
        Lease::forever(Forever::new(self.static_engine()))
    }

    /// The engine of a timer that is never dropped (the default timer).
    pub(crate) fn static_engine(&'static self) -> &'static Engine {
        &self.inner.engine
    }

    /// Whether the sleeps of this timer, if it is never dropped (the default timer), keep their
    /// timers when dropped (see `futures::kept`): not under a `max_pending` limit, where a kept
    /// timer would hold a place of the limit that no sleep holds, so that a schedule on another
    /// thread (whose kept timers this one cannot let go of) could fail as full while no timer
    /// is in use.
    pub(crate) fn keeps_timers(&self) -> bool {
        self.inner.engine.limit.is_none()
    }

    /// A future that completes at `deadline`, as `tokio::time::sleep_until` (a deadline that has
    /// passed: see [`Sleep`] on its first poll). Otherwise as [`sleep`](Self::sleep).
    pub fn sleep_until(&self, deadline: Instant) -> Sleep {
        Sleep::new(self.engine_ref(), Deadline::At(deadline))
    }

    /// Like [`sleep_until`](Self::sleep_until), but schedules the timer now (unless `deadline`
    /// has passed) and returns the error if the engine cannot keep it. A later shutdown still
    /// makes the sleep's poll panic; [`Sleep::poll_sleep`] reports it instead.
    ///
    /// ```
    /// use shardwheel::{ScheduleError, Timer};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let timer = Timer::builder().max_pending(1).build()?;
    /// let soon = std::time::Instant::now() + std::time::Duration::from_millis(5);
    /// let first = timer.try_sleep_until(soon)?;
    /// assert!(matches!(timer.try_sleep_until(soon), Err(ScheduleError::Full)));
    /// futures::executor::block_on(first);
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_sleep_until(&self, deadline: Instant) -> Result<Sleep, ScheduleError> {
        Sleep::armed(self.engine_ref(), deadline)
    }

    /// Runs `future` with a deadline `delay` from now (`tokio::time::timeout`): `Ok(output)` if
    /// it completes first, else `Err(Elapsed)` (it is dropped with the `Timeout`). No timer is
    /// scheduled unless the future is pending when polled. Panics when polled if this timer
    /// is shut down or full: see [`Sleep`].
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let timer = shardwheel::Timer::new()?;
    /// let never = std::future::pending::<()>();
    /// let result = futures::executor::block_on(timer.timeout(std::time::Duration::from_millis(5), never));
    /// assert!(result.is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn timeout<F: IntoFuture>(&self, delay: Duration, future: F) -> Timeout<F::IntoFuture> {
        Timeout::new(future.into_future(), self.sleep(delay))
    }

    /// Runs `future` with a deadline at `deadline` (`tokio::time::timeout_at`).
    pub fn timeout_at<F: IntoFuture>(
        &self,
        deadline: Instant,
        future: F,
    ) -> Timeout<F::IntoFuture> {
        Timeout::new(future.into_future(), self.sleep_until(deadline))
    }

    /// Like [`timeout_at`](Self::timeout_at), but schedules the deadline's timer now and
    /// returns the error if the engine cannot keep it (see
    /// [`try_sleep_until`](Self::try_sleep_until)).
    pub fn try_timeout_at<F: IntoFuture>(
        &self,
        deadline: Instant,
        future: F,
    ) -> Result<Timeout<F::IntoFuture>, ScheduleError> {
        Ok(Timeout::new(
            future.into_future(),
            self.try_sleep_until(deadline)?,
        ))
    }

    /// An [`Interval`] ticking every `period`, the first tick at once
    /// (`tokio::time::interval`); missed ticks [`Burst`](MissedTickBehavior::Burst) by default.
    ///
    /// # Panics
    ///
    /// If `period` is zero, as tokio's does; [`try_interval_at`](Self::try_interval_at) returns
    /// [`ScheduleError::ZeroPeriod`] instead.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let timer = shardwheel::Timer::new()?;
    /// let mut interval = timer.interval(std::time::Duration::from_millis(5));
    /// futures::executor::block_on(async {
    ///     let first = interval.tick().await; // at once
    ///     assert_eq!(interval.tick().await, first + interval.period());
    /// });
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn interval(&self, period: Duration) -> Interval {
        self.interval_at(self.clock().now(), period)
    }

    /// An [`Interval`] whose first tick is at `start`, then every `period`
    /// (`tokio::time::interval_at`).
    ///
    /// # Panics
    ///
    /// If `period` is zero, as tokio's does.
    #[track_caller]
    pub fn interval_at(&self, start: Instant, period: Duration) -> Interval {
        Interval::new(self.sleep_until(start), period)
    }

    /// Like [`interval_at`](Self::interval_at), but a zero `period` is
    /// [`ScheduleError::ZeroPeriod`] and a shut-down timer [`ScheduleError::Shutdown`].
    pub fn try_interval_at(
        &self,
        start: Instant,
        period: Duration,
    ) -> Result<Interval, ScheduleError> {
        if period.is_zero() {
            return Err(ScheduleError::ZeroPeriod);
        }
        if self.is_shut_down() {
            return Err(ScheduleError::Shutdown);
        }
        Ok(Interval::new(self.sleep_until(start), period))
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
    ///
    /// A shard whose thread died (an engine bug: user code cannot cause it) is reported by
    /// [`Stats::failed_shards`], before and after shutdown; the timers it still held are
    /// returned here like any other.
    pub fn shutdown(&self) -> Vec<UnfiredTimer> {
        self.inner.engine.shutdown()
    }

    /// Makes shard `shard`'s thread panic at its next turn, as an engine bug would (see
    /// [`test_hooks::kill_shard_thread`](crate::test_hooks::kill_shard_thread)).
    #[cfg(feature = "test-hooks")]
    pub(crate) fn kill_shard_thread(&self, shard: usize) {
        let shard = &self.inner.engine.shards[shard];
        shard
            .fault
            .store(true, std::sync::atomic::Ordering::Relaxed);
        // An inline no-op due at once wakes the shard (pushed after the flag: it sees it). It
        // is never returned by `shutdown`: shutdown runs inline tasks.
        let _ = TimerHandle::submit(shard, 0, Task::new_inline(|| {}));
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
    short_time_slices: bool,
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
            short_time_slices: true,
            max_pending: None,
            levels: DEFAULT_LEVELS,
            executor: Executor::default(),
            clock: Clock::system(),
        }
    }
}

impl Builder {
    /// The most shards a timer may have: one per CPU is the design, and each shard is a thread
    /// with its own memory.
    pub const MAX_SHARDS: usize = 1024;

    /// Number of shards (default: [`std::thread::available_parallelism`], the CPUs this
    /// process may use, or 1 if unknown). Zero, or more than [`MAX_SHARDS`](Self::MAX_SHARDS),
    /// is an error.
    pub fn shards(mut self, shards: usize) -> Builder {
        self.shards = Some(shards);
        self
    }

    /// Length of a tick (default 1 ms): deadlines round up to it. Zero is an error.
    pub fn tick(mut self, tick: Duration) -> Builder {
        self.tick = tick;
        self
    }

    /// Whether to pin each shard thread to a CPU (default true): shard `i` to the `i`-th CPU
    /// (modulo their count) of the set the building thread may run on (its affinity mask, which
    /// reflects `taskset` and cgroup cpusets; `sched_getaffinity` on Linux). Best effort: where
    /// pinning fails, the thread runs unpinned and [`Stats::pinned`] says so.
    pub fn pin_threads(mut self, pin: bool) -> Builder {
        self.pin_threads = pin;
        self
    }

    /// Whether the engine's threads (its shard threads and its own expiry pool, not a pool
    /// given as [`Executor::ThreadPool`]) ask the operating system for short time slices
    /// (default true): on Linux 6.12 and later, a woken shard thread then preempts a thread
    /// that has been running, instead of waiting for the end of its turn, so a busy CPU
    /// delays expiry less. Best effort, like pinning: where the system does not grant it,
    /// nothing changes and [`Stats::short_time_slices`] says so. The trade-off is in
    /// `src/engine/time_slice.rs`.
    pub fn short_time_slices(mut self, short: bool) -> Builder {
        self.short_time_slices = short;
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
    ///
    /// # Errors
    ///
    /// [`BuildError::NoShards`], [`BuildError::TooManyShards`], [`BuildError::ZeroTick`] or
    /// [`BuildError::InvalidLevels`] for a configuration out of range; [`BuildError::Spawn`] if
    /// a shard thread cannot be started.
    pub fn build(self) -> Result<Timer, BuildError> {
        let engine = Engine::start(Settings {
            shards: self.shards,
            tick: self.tick,
            pin_threads: self.pin_threads,
            short_time_slices: self.short_time_slices,
            max_pending: self.max_pending,
            levels: self.levels,
            executor: self.executor,
            clock: self.clock.clone(),
        })?;
        // A manual clock's `advance` drives the engine, through a weak reference.
        let driver = self.clock.is_manual().then(|| {
            let driver: registry::Arc<dyn Driven> =
                registry::Arc::new(ManualDriver(engine.clone()));
            self.clock.register(registry::Arc::downgrade(&driver));
            driver
        });
        Ok(Timer {
            inner: Arc::new(TimerInner {
                engine: Owner::new(engine),
                _driver: driver,
            }),
        })
    }
}
