//! Benchmarks of the whole engine (threads, inboxes, executor) against two other timer designs,
//! with T submitting threads (`1..=cores`) and, for shardwheel, S shards (`1..=cores`).
//!
//! Groups (the operations of `load/WORKLOADS.md`, at bench scale), each with
//! `BenchmarkId::new(implementation, threads)`:
//!
//! * `churn` (W1): each thread owns a pool of [`CHURN_POOL`] pending timers (delays uniform in
//!   [10 s, 60 s]) and, per element, cancels its oldest timer and schedules a new one.
//! * `storm` (W2 in miniature): T threads schedule [`STORM_TIMERS`] timers in total, due
//!   uniformly in [20 ms, 50 ms] after the threads start; one iteration is one storm, timed
//!   from the start until the last task has run (its throughput is `STORM_TIMERS` elements, so
//!   it is bounded by `STORM_TIMERS / 50 ms` however fast the engine).
//! * `reset` (W5): each thread owns [`RESET_POOL`] pending timers (30 s delays) and, per
//!   element, pushes a random one of them back to now + 30 s.
//!
//! Implementations: the load generator's systems under test ([`System`], in `load/src`), with
//! every timer's task a [`Job::plain`] (it captures its u64 id):
//!
//! * `shardwheel-1shard`, `shardwheel-2shards`, ...: [`Timer`] with that many shards and every
//!   other option at its default (1 ms tick, pinned shard threads, a rayon executor).
//! * `tokio`: [`TokioTimer`], tokio's timer on a multi-thread runtime.
//! * `heap`: [`HeapTimerSystem`], the JDK `ScheduledThreadPoolExecutor` design (lazy deletion:
//!   cancelled and reset entries stay in the heap until their deadline).
//!
//! Timing: `iter_custom` spawns the T threads, which meet at a `Barrier`; the measured time runs
//! from the first thread leaving the barrier to the last one finishing its share of the
//! `iters` elements. shardwheel's schedule, cancel and reset only queue a message for the
//! owning shard (up to 64 Ki undrained messages per shard before submitters yield), so for
//! shardwheel the measured time runs on until every shard has applied everything submitted:
//! one sentinel timer per shard is reset to a past deadline, which each shard applies after
//! the earlier messages in its FIFO inbox and then fires; the time stops when the last
//! sentinel's task has run. tokio and the heap do their work synchronously.
//!
//! Engines and pools are built once per benchmark (outside the measured time) and checked
//! afterwards: shardwheel's [`Stats`](shardwheel::Stats) and shutdown must agree with what the
//! benchmark did, no cancel or reset of a pending timer may fail, and every storm task must run
//! exactly once (the storm counts [`plain_fires`]). Each benchmark prints an `audit` line to stderr, starting `ANOMALY` when a
//! check failed.
//!
//! Settings are modest (10 samples, 0.5 s warm-up, 2 s measurement) so that
//! `cargo bench --bench engine` takes a few minutes on a 2-core machine, and
//! `cargo bench --bench engine -- --test` (one iteration of each) well under a minute.

// `criterion_group!` defines an undocumented `pub fn`.
#![allow(missing_docs)]

use std::collections::VecDeque;
use std::num::NonZero;
use std::ops::AddAssign;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{
    BenchmarkGroup, BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group,
    criterion_main,
};
use shardwheel::{Timer, TimerHandle};
use shardwheel_load::heap::HeapTimerSystem;
use shardwheel_load::job::{Job, plain_fires};
use shardwheel_load::rng::{self, Rng};
use shardwheel_load::system::{self, System};
use shardwheel_load::tokio_timer::TokioTimer;

/// Pending timers per thread in `churn`.
const CHURN_POOL: usize = 100_000;
/// Delays in `churn` are uniform in `[CHURN_MIN, CHURN_MAX)`.
const CHURN_MIN: Duration = Duration::from_secs(10);
const CHURN_MAX: Duration = Duration::from_secs(60);
/// Pending timers per thread in `reset`.
const RESET_POOL: usize = 100_000;
/// The delay of every timer in `reset`, and what resets push it back to.
const RESET_DELAY: Duration = Duration::from_secs(30);
/// Timers per storm (over all threads).
const STORM_TIMERS: usize = 200_000;
/// Storm deadlines are uniform in `[start + STORM_FROM, start + STORM_TO)`.
const STORM_FROM: Duration = Duration::from_millis(20);
const STORM_TO: Duration = Duration::from_millis(50);
/// How long to wait for a storm's or a flush's last task before declaring timers lost.
const LATCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The delay of shardwheel's flush sentinels (they only fire when reset).
const SENTINEL_DELAY: Duration = Duration::from_secs(3600);

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Counts tasks down to zero and records when the last one ran. Task ids carry the round
/// ("epoch") in their high 32 bits, so that a task of an earlier round is told apart.
struct Latch {
    epoch: AtomicU64,
    remaining: AtomicI64,
    /// Hits after the count reached zero: a task ran twice, or more tasks ran than were armed.
    extra: AtomicU64,
    /// Hits carrying an earlier round's id: a timer fired after its round was over.
    stray: AtomicU64,
    done: Mutex<Option<Instant>>,
    signal: Condvar,
}

/// Storm tasks armed so far (in every round of every storm benchmark): [`plain_fires`] must
/// reach it after each round and never pass it.
static STORM_ARMED: AtomicU64 = AtomicU64::new(0);

/// Starts a storm round of `count` tasks. Returns a problem if more tasks ran than were armed
/// (a task ran twice, or a timer of an earlier round fired late).
fn arm_storm(count: u64) -> Option<String> {
    let armed = STORM_ARMED.fetch_add(count, Ordering::SeqCst);
    let ran = plain_fires();
    (ran != armed).then(|| format!("{ran} storm tasks ran where {armed} were armed"))
}

/// Waits until every armed storm task has run and returns when that was seen (polled every
/// 20 µs), or how many had not run after `timeout`.
fn wait_storm(timeout: Duration) -> Result<Instant, u64> {
    let give_up = Instant::now() + timeout;
    let armed = STORM_ARMED.load(Ordering::SeqCst);
    loop {
        let ran = plain_fires();
        let now = Instant::now();
        if ran >= armed {
            return Ok(now);
        }
        if now >= give_up {
            return Err(armed - ran);
        }
        thread::sleep(Duration::from_micros(20));
    }
}

impl Latch {
    const fn new() -> Latch {
        Latch {
            epoch: AtomicU64::new(0),
            remaining: AtomicI64::new(0),
            extra: AtomicU64::new(0),
            stray: AtomicU64::new(0),
            done: Mutex::new(None),
            signal: Condvar::new(),
        }
    }

    /// Starts a round of `count` tasks; returns its epoch.
    fn arm(&self, count: u64) -> u64 {
        *lock(&self.done) = None;
        let epoch = self.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        self.remaining.store(count as i64, Ordering::SeqCst);
        epoch
    }

    fn id(epoch: u64, index: u64) -> u64 {
        epoch << 32 | index
    }

    /// Called by each task.
    fn hit(&self, id: u64) {
        if id >> 32 != self.epoch.load(Ordering::Acquire) {
            self.stray.fetch_add(1, Ordering::Relaxed);
            return;
        }
        match self.remaining.fetch_sub(1, Ordering::AcqRel) {
            1 => {
                let now = Instant::now();
                *lock(&self.done) = Some(now);
                self.signal.notify_all();
            }
            n if n <= 0 => {
                self.extra.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    /// When the round's last task ran, or how many had not run after `timeout`.
    fn wait(&self, timeout: Duration) -> Result<Instant, i64> {
        let give_up = Instant::now() + timeout;
        let mut done = lock(&self.done);
        loop {
            if let Some(at) = *done {
                return Ok(at);
            }
            let now = Instant::now();
            if now >= give_up {
                return Err(self.remaining.load(Ordering::Acquire));
            }
            done = self
                .signal
                .wait_timeout(done, give_up - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Problems seen since the last call.
    fn anomalies(&self) -> Vec<String> {
        let mut found = Vec::new();
        let extra = self.extra.swap(0, Ordering::Relaxed);
        if extra > 0 {
            found.push(format!(
                "{extra} task runs beyond the armed count (ran twice?)"
            ));
        }
        let stray = self.stray.swap(0, Ordering::Relaxed);
        if stray > 0 {
            found.push(format!("{stray} tasks of an earlier round ran late"));
        }
        found
    }
}

/// What a benchmark did, as the API reported it (successful operations only).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Tally {
    scheduled: u64,
    cancelled: u64,
    reset: u64,
    fired: u64,
    /// Cancels or resets of a timer that should have been pending that returned false.
    failed: u64,
}

impl AddAssign for Tally {
    fn add_assign(&mut self, other: Tally) {
        self.scheduled += other.scheduled;
        self.cancelled += other.cancelled;
        self.reset += other.reset;
        self.fired += other.fired;
        self.failed += other.failed;
    }
}

/// What the benchmarks need from a system under test: the load generator's [`System`], and an
/// audit.
trait Engine: Sync {
    /// The system under test.
    type System: System;

    fn system(&self) -> &Self::System;

    /// Waits until the engine has applied every operation submitted so far (by threads that
    /// have been joined) and returns when; `None` if operations are applied synchronously.
    fn settle(&self) -> Option<Instant> {
        None
    }

    /// Checks the engine against what the benchmark did, then shuts it down. Returns the
    /// problems found, and a summary.
    fn finish(self, did: Tally) -> (Vec<String>, String);
}

/// A pending timer of engine `E`, owned by the thread that scheduled it.
type Pending<E> = <<E as Engine>::System as System>::Handle;

/// Schedules a plain task (capturing `id`) `delay` from now.
fn schedule<E: Engine>(engine: &E, delay: Duration, id: u64) -> Pending<E> {
    engine
        .system()
        .schedule(delay, Job::plain(id))
        .expect("schedule refused")
}

/// A baseline, which does its work synchronously and has nothing to audit.
struct Baseline<S>(S);

impl<S: System> Baseline<S> {
    fn new() -> Baseline<S> {
        Baseline(S::build())
    }
}

impl<S: System> Engine for Baseline<S> {
    type System = S;

    fn system(&self) -> &S {
        &self.0
    }

    fn finish(self, _did: Tally) -> (Vec<String>, String) {
        let started = Instant::now();
        self.0.shutdown();
        (
            Vec::new(),
            format!("shut down in {:.1?}", started.elapsed()),
        )
    }
}

// ---------------------------------------------------------------------------------------------
// shardwheel

struct Shardwheel {
    system: system::Shardwheel,
    shards: usize,
    /// One pending timer per shard, which `settle` resets to `past` (see the module docs).
    sentinels: Mutex<Vec<TimerHandle>>,
    flush: Arc<Latch>,
    /// What the sentinels did, to subtract from the engine's counters.
    sentinel_tally: Mutex<Tally>,
    problems: Mutex<Vec<String>>,
    /// An instant before any timer of this engine was scheduled.
    past: Instant,
}

impl Shardwheel {
    fn new(shards: usize) -> Shardwheel {
        let timer = Timer::builder()
            .shards(shards)
            .build()
            .expect("building the timer");
        let engine = Shardwheel {
            system: system::Shardwheel::with_timer(timer),
            shards,
            sentinels: Mutex::new(Vec::new()),
            flush: Arc::new(Latch::new()),
            sentinel_tally: Mutex::new(Tally::default()),
            problems: Mutex::new(Vec::new()),
            past: Instant::now(),
        };
        let sentinels = engine.arm_sentinels();
        *lock(&engine.sentinels) = sentinels;
        engine
    }

    fn timer(&self) -> &Timer {
        self.system.timer()
    }

    fn scheduled_per_shard(&self) -> Vec<u64> {
        self.timer()
            .stats()
            .shards
            .iter()
            .map(|shard| shard.scheduled)
            .collect()
    }

    /// One fresh sentinel per shard. A thread's home shard prefers one pinned to the CPU it
    /// first schedules from (the policy: `src/engine/placement.rs`): new threads, each pinned to the next core, schedule
    /// one sentinel each until every shard has one (the per-shard `scheduled` counters say where
    /// each went).
    fn arm_sentinels(&self) -> Vec<TimerHandle> {
        let cores = core_affinity::get_core_ids().unwrap_or_default();
        let epoch = self.flush.arm(self.shards as u64);
        let mut by_shard: Vec<Option<TimerHandle>> = (0..self.shards).map(|_| None).collect();
        let mut tally = Tally::default();
        let mut attempts = 0;
        while by_shard.iter().any(Option::is_none) {
            attempts += 1;
            assert!(
                attempts <= 8 * self.shards,
                "could not place a sentinel timer on every shard"
            );
            let before = self.scheduled_per_shard();
            let latch = self.flush.clone();
            let id = Latch::id(epoch, 0);
            let handle = thread::scope(|scope| {
                scope
                    .spawn(|| {
                        if !cores.is_empty() {
                            // Best effort: where pinning fails, round-robin homes still spread.
                            core_affinity::set_for_current(cores[attempts % cores.len()]);
                        }
                        self.timer()
                            .schedule(SENTINEL_DELAY, move || latch.hit(id))
                            .expect("scheduling a sentinel")
                    })
                    .join()
                    .expect("sentinel thread panicked")
            });
            tally.scheduled += 1;
            let after = self.scheduled_per_shard();
            match (0..self.shards).find(|&shard| after[shard] > before[shard]) {
                Some(shard) if by_shard[shard].is_none() => by_shard[shard] = Some(handle),
                _ => {
                    if handle.cancel() {
                        tally.cancelled += 1;
                    }
                }
            }
        }
        *lock(&self.sentinel_tally) += tally;
        by_shard.into_iter().flatten().collect()
    }

    fn problem(&self, problem: String) {
        lock(&self.problems).push(problem);
    }
}

impl Engine for Shardwheel {
    type System = system::Shardwheel;

    fn system(&self) -> &system::Shardwheel {
        &self.system
    }

    fn settle(&self) -> Option<Instant> {
        let sentinels = std::mem::take(&mut *lock(&self.sentinels));
        let mut reset = 0;
        for sentinel in &sentinels {
            if sentinel.reset_at(self.past) {
                reset += 1;
            } else {
                self.problem(format!(
                    "a sentinel timer was not pending when reset: {sentinel:?}"
                ));
            }
        }
        let done = match self.flush.wait(LATCH_TIMEOUT) {
            Ok(at) => {
                lock(&self.sentinel_tally).fired += self.shards as u64;
                at
            }
            Err(remaining) => {
                self.problem(format!(
                    "{remaining} of {} sentinels reset to a past deadline had not run after {:?}",
                    self.shards, LATCH_TIMEOUT
                ));
                Instant::now()
            }
        };
        lock(&self.sentinel_tally).reset += reset;
        lock(&self.problems).extend(self.flush.anomalies());
        drop(sentinels);
        let fresh = self.arm_sentinels();
        *lock(&self.sentinels) = fresh;
        Some(done)
    }

    fn finish(self, did: Tally) -> (Vec<String>, String) {
        let mut problems = std::mem::take(&mut *lock(&self.problems));
        let mut expected = did;
        expected += *lock(&self.sentinel_tally);
        let stats = self.timer().stats();
        let checks = [
            ("scheduled", stats.scheduled, expected.scheduled),
            ("cancelled", stats.cancelled, expected.cancelled),
            ("reset", stats.reset, expected.reset),
            ("fired", stats.fired, expected.fired),
            ("panicked", stats.panicked, 0),
        ];
        for (counter, actual, wanted) in checks {
            if actual != wanted {
                problems.push(format!("stats().{counter} = {actual}, expected {wanted}"));
            }
        }
        let pending = expected.scheduled - expected.fired - expected.cancelled;
        if stats.pending != pending {
            problems.push(format!(
                "stats().pending = {}, expected {pending}",
                stats.pending
            ));
        }
        drop(std::mem::take(&mut *lock(&self.sentinels)));
        let started = Instant::now();
        let unfired = self.timer().shutdown().len() as u64;
        let shutdown_took = started.elapsed();
        if unfired != pending {
            problems.push(format!(
                "shutdown() returned {unfired} unfired timers, expected {pending}"
            ));
        }
        let summary = format!(
            "scheduled {} cancelled {} reset {} fired {} pending {} (incl. sentinels); \
             shutdown returned {unfired} in {shutdown_took:.1?}; {} of {} shard threads pinned",
            stats.scheduled,
            stats.cancelled,
            stats.reset,
            stats.fired,
            stats.pending,
            stats.pinned,
            self.shards,
        );
        (problems, summary)
    }
}

// ---------------------------------------------------------------------------------------------
// Running threads

/// Thread `index`'s share of `total` operations over `threads` threads.
fn share(total: u64, threads: usize, index: usize) -> u64 {
    let threads = threads as u64;
    total / threads + u64::from((index as u64) < total % threads)
}

/// Runs `work(state, operations, start)` on one thread per state, all starting together at a
/// barrier, `total` operations in all. Returns when the first thread started and when the last
/// one finished.
fn run_parallel<E: Engine, S: Send>(
    engine: &E,
    states: &mut [S],
    total: u64,
    work: impl Fn(&mut S, u64, Instant) + Sync,
) -> (Instant, Instant) {
    let threads = states.len();
    let barrier = Barrier::new(threads);
    let spans: Vec<(Instant, Instant)> = thread::scope(|scope| {
        let workers: Vec<_> = states
            .iter_mut()
            .enumerate()
            .map(|(index, state)| {
                let operations = share(total, threads, index);
                let (barrier, work) = (&barrier, &work);
                scope.spawn(move || {
                    engine.system().on_thread(|| {
                        barrier.wait();
                        let start = Instant::now();
                        work(state, operations, start);
                        (start, Instant::now())
                    })
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| worker.join().expect("benchmark thread panicked"))
            .collect()
    });
    let start = spans.iter().map(|span| span.0).min().expect("no threads");
    let end = spans.iter().map(|span| span.1).max().expect("no threads");
    (start, end)
}

/// A submitting thread's own timers and counters.
struct Submitter<P> {
    pool: VecDeque<P>,
    rng: Rng,
    next_id: u64,
    did: Tally,
}

/// One submitter per thread, each with `pool` timers scheduled by its own thread (so that
/// shardwheel spreads them over its shards).
fn submitters<E: Engine>(
    engine: &E,
    threads: usize,
    pool: usize,
    delay: impl Fn(&mut Rng) -> Duration + Sync,
) -> Vec<Submitter<Pending<E>>> {
    let mut states: Vec<Submitter<Pending<E>>> = (0..threads)
        .map(|index| Submitter {
            pool: VecDeque::with_capacity(pool),
            rng: rng::for_thread(index),
            next_id: (index as u64) << 40,
            did: Tally::default(),
        })
        .collect();
    run_parallel(
        engine,
        &mut states,
        (threads * pool) as u64,
        |state, count, _| {
            for _ in 0..count {
                let delay = delay(&mut state.rng);
                let timer = schedule(engine, delay, state.next_id);
                state.next_id += 1;
                state.pool.push_back(timer);
            }
            state.did.scheduled += count;
        },
    );
    states
}

fn report<E: Engine>(id: &str, engine: E, states: Vec<Submitter<Pending<E>>>, extra: Tally) {
    let mut did = extra;
    for state in &states {
        did += state.did;
    }
    // Handles first (tokio deregisters its sleeps while the runtime still runs).
    drop(states);
    let (mut problems, summary) = engine.finish(did);
    if did.failed > 0 {
        problems.push(format!(
            "{} cancels/resets of pending timers returned false",
            did.failed
        ));
    }
    if problems.is_empty() {
        eprintln!("audit {id}: ok; {summary}");
    } else {
        eprintln!("ANOMALY audit {id}: {}; {summary}", problems.join("; "));
    }
}

// ---------------------------------------------------------------------------------------------
// Benchmarks

/// Benchmarks `work(engine, submitter, count)` on `threads` submitters, each holding a pool of
/// timers that `setup` makes, and reports the tallies under `kind/name/threads`.
fn bench_submitters<E: Engine>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    kind: &str,
    name: &str,
    threads: usize,
    build: impl Fn() -> E,
    setup: impl Fn(&E, usize) -> Vec<Submitter<Pending<E>>>,
    work: impl Fn(&E, &mut Submitter<Pending<E>>, u64) + Sync,
) {
    // Built on first use only, so that filtered-out benchmarks cost nothing.
    let mut state: Option<(E, Vec<Submitter<Pending<E>>>)> = None;
    group.bench_with_input(BenchmarkId::new(name, threads), &threads, |b, &threads| {
        let (engine, states) = state.get_or_insert_with(|| {
            let engine = build();
            let states = setup(&engine, threads);
            (engine, states)
        });
        let engine = &*engine;
        b.iter_custom(|iters| {
            let (start, end) = run_parallel(engine, states, iters, |state, count, _| {
                work(engine, state, count)
            });
            engine.settle().map_or(end, |settled| settled.max(end)) - start
        });
    });
    if let Some((engine, states)) = state {
        report(
            &format!("{kind}/{name}/{threads}"),
            engine,
            states,
            Tally::default(),
        );
    }
}

fn bench_churn<E: Engine>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    threads: usize,
    build: impl Fn() -> E,
) {
    bench_submitters(
        group,
        "churn",
        name,
        threads,
        build,
        |engine, threads| {
            submitters(engine, threads, CHURN_POOL, |rng| {
                rng::between(rng, CHURN_MIN, CHURN_MAX)
            })
        },
        |engine, state, count| {
            for _ in 0..count {
                let oldest = state.pool.pop_front().expect("empty pool");
                if engine.system().cancel(oldest) {
                    state.did.cancelled += 1;
                } else {
                    state.did.failed += 1;
                }
                let delay = rng::between(&mut state.rng, CHURN_MIN, CHURN_MAX);
                state.pool.push_back(schedule(engine, delay, state.next_id));
                state.next_id += 1;
            }
            state.did.scheduled += count;
        },
    );
}

fn bench_reset<E: Engine>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    threads: usize,
    build: impl Fn() -> E,
) {
    bench_submitters(
        group,
        "reset",
        name,
        threads,
        build,
        |engine, threads| {
            let mut states = submitters(engine, threads, RESET_POOL, |_| RESET_DELAY);
            for state in &mut states {
                state.pool.make_contiguous();
            }
            states
        },
        |engine, state, count| {
            let pool = state.pool.as_mut_slices().0;
            for _ in 0..count {
                let timer = &pool[state.rng.usize(..pool.len())];
                if engine.system().reset(timer, RESET_DELAY) {
                    state.did.reset += 1;
                } else {
                    state.did.failed += 1;
                }
            }
        },
    );
}

fn bench_storm<E: Engine>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    threads: usize,
    build: impl Fn() -> E,
) {
    // Each storm thread's generator and the handles of its timers (kept until the round's
    // end: dropping tokio's cancels its timer).
    type StormThread<E> = (Rng, Vec<Pending<E>>);
    let mut state: Option<(E, Vec<StormThread<E>>, Tally)> = None;
    group.bench_with_input(BenchmarkId::new(name, threads), &threads, |b, &threads| {
        let (engine, storm_threads, did) = state.get_or_insert_with(|| {
            let storm_threads = (0..threads).map(|index| (rng::for_thread(index), Vec::new()));
            (build(), storm_threads.collect(), Tally::default())
        });
        let engine = &*engine;
        b.iter_custom(|iters| {
            let mut measured = Duration::ZERO;
            for _ in 0..iters {
                if let Some(problem) = arm_storm(STORM_TIMERS as u64) {
                    eprintln!("ANOMALY storm/{name}/{threads}: {problem}");
                }
                let next = AtomicU64::new(0);
                let (start, _) = run_parallel(
                    engine,
                    storm_threads,
                    STORM_TIMERS as u64,
                    |(rng, handles), count, start| {
                        let first = next.fetch_add(count, Ordering::Relaxed);
                        for id in first..first + count {
                            let deadline = start + rng::between(rng, STORM_FROM, STORM_TO);
                            let handle = engine
                                .system()
                                .schedule_at(deadline, Job::plain(id))
                                .expect("schedule refused");
                            handles.push(handle);
                        }
                    },
                );
                did.scheduled += STORM_TIMERS as u64;
                let waited = wait_storm(LATCH_TIMEOUT);
                for (_, handles) in storm_threads.iter_mut() {
                    handles.clear();
                }
                match waited {
                    Ok(done) => {
                        did.fired += STORM_TIMERS as u64;
                        measured += done - start;
                    }
                    Err(remaining) => {
                        did.fired += STORM_TIMERS as u64 - remaining;
                        eprintln!(
                            "ANOMALY storm/{name}/{threads}: {remaining} of {STORM_TIMERS} \
                             tasks had not run {LATCH_TIMEOUT:?} after their deadlines",
                        );
                        measured += start.elapsed();
                    }
                }
            }
            measured
        });
    });
    if let Some((engine, _, did)) = state {
        report(&format!("storm/{name}/{threads}"), engine, Vec::new(), did);
    }
}

fn cores() -> usize {
    thread::available_parallelism().map_or(1, NonZero::get)
}

fn shardwheel_name(shards: usize) -> String {
    if shards == 1 {
        "shardwheel-1shard".to_owned()
    } else {
        format!("shardwheel-{shards}shards")
    }
}

fn configure<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut group = c.benchmark_group(name);
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(2));
    group
}

fn churn(c: &mut Criterion) {
    let mut group = configure(c, "churn");
    group.throughput(Throughput::Elements(1));
    for threads in 1..=cores() {
        for shards in 1..=cores() {
            bench_churn(&mut group, &shardwheel_name(shards), threads, || {
                Shardwheel::new(shards)
            });
        }
        bench_churn(&mut group, "tokio", threads, Baseline::<TokioTimer>::new);
        bench_churn(
            &mut group,
            "heap",
            threads,
            Baseline::<HeapTimerSystem>::new,
        );
    }
    group.finish();
}

fn storm(c: &mut Criterion) {
    let mut group = configure(c, "storm");
    // One iteration is one storm (at least 50 ms): keep the iteration count per sample flat.
    group.sampling_mode(SamplingMode::Flat);
    group.throughput(Throughput::Elements(STORM_TIMERS as u64));
    for threads in 1..=cores() {
        for shards in 1..=cores() {
            bench_storm(&mut group, &shardwheel_name(shards), threads, || {
                Shardwheel::new(shards)
            });
        }
        bench_storm(&mut group, "tokio", threads, Baseline::<TokioTimer>::new);
        bench_storm(
            &mut group,
            "heap",
            threads,
            Baseline::<HeapTimerSystem>::new,
        );
    }
    group.finish();
}

fn reset(c: &mut Criterion) {
    let mut group = configure(c, "reset");
    group.throughput(Throughput::Elements(1));
    for threads in 1..=cores() {
        for shards in 1..=cores() {
            bench_reset(&mut group, &shardwheel_name(shards), threads, || {
                Shardwheel::new(shards)
            });
        }
        bench_reset(&mut group, "tokio", threads, Baseline::<TokioTimer>::new);
        bench_reset(
            &mut group,
            "heap",
            threads,
            Baseline::<HeapTimerSystem>::new,
        );
    }
    group.finish();
}

criterion_group!(benches, churn, storm, reset);
criterion_main!(benches);
