//! The workloads of `load/WORKLOADS.md`, generic over the system under test. Each run
//! builds a fresh engine (default configuration) and shuts it down afterwards. W6 (timeouts)
//! lives in `timeouts.rs`; W3 (memory) and W7 (shrink) run in a child process each.

use crate::args::{Config, Workload};
use crate::job::{Job, StormSink, plain_fires};
use crate::measure::{process_cpu_time, rss_bytes, settled_rss, trim_allocator};
use crate::progress::{Bar, Counters, watch_counts, watch_time};
use crate::report::{Histogram, Report, anomaly};
use crate::rng::{Rng, for_thread as rng_for, uniform};
use crate::system::System;
use std::sync::Barrier;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

const SECOND: u64 = 1_000_000_000;
/// How often timed loops look at the clock.
const CHECK_EVERY: usize = 64;
/// How long churn and reset measure the cross-CPU round trip before and after each run
/// ([`crate::probes::cross_cpu_round_trip_ns`]).
const CROSS_CPU_PROBE_SECONDS: f64 = 0.1;
/// How often workers publish their progress.
const PUBLISH_EVERY: usize = 4096;

/// "1M", "10M", "250k", or the plain count: the suffix of the memory workload's name.
pub(crate) fn size_label(n: usize) -> String {
    if n.is_multiple_of(1_000_000) {
        format!("{}M", n / 1_000_000)
    } else if n.is_multiple_of(1_000) {
        format!("{}k", n / 1_000)
    } else {
        n.to_string()
    }
}

/// The sizes `workload` runs at: the N values of the memory workload, else one (unused) 0.
pub(crate) fn sizes(config: &Config, workload: Workload) -> Vec<usize> {
    match workload {
        Workload::Memory => config.memory_timers.clone(),
        Workload::Shrink => vec![config.shrink_timers],
        _ => vec![0],
    }
}

/// How many segments (runs) the bar of `workload` has: one per size, thread count and
/// repetition.
pub(crate) fn segments(config: &Config, workload: Workload) -> usize {
    config.threads.len() * sizes(config, workload).len() * config.repeat
}

/// Runs `workload` once on system `S` with `threads` threads (and size `n`, see [`sizes`]),
/// adding its metrics to `report`.
pub(crate) fn run<S: System>(
    workload: Workload,
    config: &Config,
    n: usize,
    threads: usize,
    report: &mut Report,
    bar: &mut Bar,
) {
    let fires_before = plain_fires();
    match workload {
        Workload::Churn => churn::<S>(config, threads, report, bar),
        Workload::Storm => storm::<S>(config, threads, report, bar),
        Workload::Memory => in_child::<S>(Child::Memory, config, n, threads, report, bar),
        Workload::Idle => idle::<S>(config, threads, report, bar),
        Workload::Reset => reset::<S>(config, threads, report, bar),
        Workload::Timeouts => crate::timeouts::run::<S>(config, threads, report, bar),
        Workload::Shrink => in_child::<S>(Child::Shrink, config, n, threads, report, bar),
    }
    // Hand the garbage of this run back to the OS now (glibc consolidates its free lists
    // here), so that the next run does not pay for it: millions of freed small chunks
    // otherwise make some later malloc walk them all, stalling whichever thread (e.g. a
    // shard's) makes it.
    trim_allocator();
    let unexpected = plain_fires() - fires_before;
    if unexpected != 0 {
        anomaly(format!(
            "{}: {} {unexpected} timers fired long before their deadline (delays >= 10 s)",
            S::NAME,
            workload.name()
        ));
    }
}

/// The `index`-th of `parts` contiguous chunks of `0..total`.
fn chunk(total: usize, parts: usize, index: usize) -> std::ops::Range<usize> {
    let base = total / parts;
    let extra = total % parts;
    let start = index * base + index.min(extra);
    start..start + base + usize::from(index < extra)
}

/// Fills `slots` with timers from `threads` threads, slot `i` with `schedule(sys, rng, i)`.
/// Returns when the first thread started and when the last one finished.
fn fill<S: System>(
    sys: &S,
    slots: &mut [Option<S::Handle>],
    threads: usize,
    bar: &Bar,
    span: (f64, f64),
    label: &str,
    schedule: impl Fn(&S, &mut Rng, usize) -> Option<S::Handle> + Sync,
) -> (Instant, Instant) {
    let total = slots.len();
    let counters = Counters::new(threads);
    let barrier = Barrier::new(threads + 1);
    let mut rest = slots;
    let mut chunks = Vec::with_capacity(threads);
    for index in 0..threads {
        let range = chunk(total, threads, index);
        let (head, tail) = rest.split_at_mut(range.len());
        chunks.push((range.start, head));
        rest = tail;
    }
    let spans: Vec<(Instant, Instant)> = thread::scope(|scope| {
        let workers: Vec<_> = chunks
            .into_iter()
            .enumerate()
            .map(|(index, (first, slots))| {
                let (counters, barrier, schedule) = (&counters, &barrier, &schedule);
                scope.spawn(move || {
                    sys.on_thread(|| {
                        let mut rng = rng_for(index);
                        barrier.wait();
                        let start = Instant::now();
                        for (offset, slot) in slots.iter_mut().enumerate() {
                            *slot = schedule(sys, &mut rng, first + offset);
                            if offset % PUBLISH_EVERY == PUBLISH_EVERY - 1 {
                                counters.set(index, offset as u64 + 1);
                            }
                        }
                        let end = Instant::now();
                        counters.finish(index, slots.len() as u64);
                        (start, end)
                    })
                })
            })
            .collect();
        barrier.wait();
        watch_counts(bar, &counters, threads, total as u64, span, label);
        workers
            .into_iter()
            .map(|worker| worker.join().expect("a scheduling thread panicked"))
            .collect()
    });
    let first = spans
        .iter()
        .map(|s| s.0)
        .min()
        .expect("at least one thread");
    let last = spans
        .iter()
        .map(|s| s.1)
        .max()
        .expect("at least one thread");
    (first, last)
}

fn rate(count: u64, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64().max(1e-9)
}

fn empty_slots<H>(n: usize) -> Vec<Option<H>> {
    let mut slots = Vec::with_capacity(n);
    slots.resize_with(n, || None);
    slots
}

fn count_missing<H>(slots: &[Option<H>]) -> usize {
    slots.iter().filter(|s| s.is_none()).count()
}

/// W1: P pending timers over T threads, then each thread cancels its oldest and schedules a
/// new one for `seconds`.
fn churn<S: System>(config: &Config, threads: usize, report: &mut Report, bar: &Bar) {
    let p = config.churn_timers;
    let length = Duration::from_secs_f64(config.seconds);
    let round_trip_before = crate::probes::cross_cpu_round_trip_ns(CROSS_CPU_PROBE_SECONDS);
    let sys = S::build();
    let counters = Counters::new(threads);
    let barrier = Barrier::new(threads + 1);
    struct Outcome {
        setup: (Instant, Instant),
        churn: (Instant, Instant),
        pairs: u64,
        failed_cancels: u64,
    }
    let outcomes: Vec<Outcome> = thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|index| {
                let (sys, counters, barrier) = (&sys, &counters, &barrier);
                scope.spawn(move || {
                    sys.on_thread(|| {
                        let share = chunk(p, threads, index).len();
                        let mut rng = rng_for(index);
                        let mut id = (index as u64) << 40;
                        // The thread's timers, oldest first, as a ring.
                        let mut ring: Vec<Option<S::Handle>> = empty_slots(share);
                        barrier.wait();
                        let setup_start = Instant::now();
                        for (offset, slot) in ring.iter_mut().enumerate() {
                            *slot = sys.schedule(uniform(&mut rng, 10, 60), Job::plain(id));
                            id += 1;
                            if offset % PUBLISH_EVERY == PUBLISH_EVERY - 1 {
                                counters.set(index, offset as u64 + 1);
                            }
                        }
                        let setup_end = Instant::now();
                        counters.finish(index, share as u64);
                        barrier.wait();
                        let churn_start = Instant::now();
                        let stop = churn_start + length;
                        let mut pairs = 0u64;
                        let mut failed_cancels = 0u64;
                        let mut oldest = 0usize;
                        let mut extra = None; // the single timer of a thread with an empty ring
                        loop {
                            for _ in 0..CHECK_EVERY {
                                let slot = if ring.is_empty() {
                                    &mut extra
                                } else {
                                    &mut ring[oldest]
                                };
                                if let Some(handle) = slot.take()
                                    && !sys.cancel(handle)
                                {
                                    failed_cancels += 1;
                                }
                                *slot = sys.schedule(uniform(&mut rng, 10, 60), Job::plain(id));
                                id += 1;
                                oldest += 1;
                                if oldest >= ring.len() {
                                    oldest = 0;
                                }
                            }
                            pairs += CHECK_EVERY as u64;
                            if Instant::now() >= stop {
                                break;
                            }
                        }
                        let churn_end = Instant::now();
                        drop(ring);
                        drop(extra);
                        Outcome {
                            setup: (setup_start, setup_end),
                            churn: (churn_start, churn_end),
                            pairs,
                            failed_cancels,
                        }
                    })
                })
            })
            .collect();
        barrier.wait();
        let label = format!("T={threads} setup");
        watch_counts(bar, &counters, threads, p as u64, (0.0, 0.15), &label);
        barrier.wait();
        let start = Instant::now();
        watch_time(
            bar,
            start,
            length,
            (0.15, 1.0),
            &format!("T={threads} churn"),
        );
        workers
            .into_iter()
            .map(|worker| worker.join().expect("a churn thread panicked"))
            .collect()
    });
    sys.shutdown();
    report_round_trips(report, S::NAME, "churn", threads, round_trip_before);
    let setup = span(outcomes.iter().map(|o| o.setup));
    let churn = span(outcomes.iter().map(|o| o.churn));
    let pairs: u64 = outcomes.iter().map(|o| o.pairs).sum();
    let failed: u64 = outcomes.iter().map(|o| o.failed_cancels).sum();
    if failed != 0 {
        anomaly(format!(
            "{}: churn T={threads}: {failed} cancels of pending timers returned false",
            S::NAME
        ));
    }
    report.add(
        S::NAME,
        "churn",
        threads,
        "setup_ops_per_s",
        rate(p as u64, setup),
        "ops/s",
    );
    report.add(
        S::NAME,
        "churn",
        threads,
        "churn_pairs_per_s",
        rate(pairs, churn),
        "pairs/s",
    );
}

fn span(spans: impl Iterator<Item = (Instant, Instant)>) -> Duration {
    let (mut first, mut last) = (None::<Instant>, None::<Instant>);
    for (start, end) in spans {
        first = Some(first.map_or(start, |f| f.min(start)));
        last = Some(last.map_or(end, |l| l.max(end)));
    }
    match (first, last) {
        (Some(first), Some(last)) => last - first,
        _ => Duration::ZERO,
    }
}

/// Lateness buckets of the storm histogram: (label, upper bound in ns, exclusive).
const LATENESS_BUCKETS: [(&str, i64); 14] = [
    ("early (< 0)", 0),
    ("0-100 us", 100_000),
    ("100-250 us", 250_000),
    ("250-500 us", 500_000),
    ("0.5-1 ms", 1_000_000),
    ("1-2 ms", 2_000_000),
    ("2-5 ms", 5_000_000),
    ("5-10 ms", 10_000_000),
    ("10-20 ms", 20_000_000),
    ("20-50 ms", 50_000_000),
    ("50-100 ms", 100_000_000),
    ("100-200 ms", 200_000_000),
    ("200-500 ms", 500_000_000),
    (">= 500 ms", i64::MAX),
];

/// W2: N timers due uniformly in [start + 500 ms, start + 1500 ms]; every task records when it
/// ran.
fn storm<S: System>(config: &Config, threads: usize, report: &mut Report, bar: &Bar) {
    let n = config.storm_timers;
    let mut rng = rng_for(usize::MAX);
    let deadlines: Vec<u64> = (0..n)
        .map(|_| rng.u64(SECOND / 2..=SECOND * 3 / 2))
        .collect();
    let sink = StormSink::leak(deadlines);
    let mut slots = empty_slots::<S::Handle>(n);
    let sys = S::build();
    let start = Instant::now();
    sink.start.set(start).expect("a fresh sink");
    let label = format!("T={threads} schedule");
    let (_, scheduled) = fill(
        &sys,
        &mut slots,
        threads,
        bar,
        (0.0, 0.3),
        &label,
        |sys, _, id| {
            let deadline = start + Duration::from_nanos(sink.deadline_ns[id]);
            sys.schedule_at(
                deadline,
                Job {
                    id: id as u64,
                    sink: Some(sink),
                },
            )
        },
    );
    let refused = count_missing(&slots);
    let schedule_done = scheduled - start;

    // Wait for every task: a prefix scan that only moves forward, so O(N) in all.
    let give_up = start
        + Duration::from_millis(1500)
        + if config.quick {
            Duration::from_secs(10)
        } else {
            Duration::from_secs(30)
        };
    let mut cursor = 0;
    loop {
        while cursor < n && sink.fired_ns[cursor].load(Ordering::Relaxed) != 0 {
            cursor += 1;
        }
        let now = Instant::now();
        if cursor == n || now >= give_up {
            break;
        }
        let elapsed = (now - start).as_secs_f64();
        bar.set(
            0.3 + 0.7 * (elapsed / 1.5).min(0.99),
            format!("T={threads} firing {elapsed:.1}/1.5 s"),
        );
        thread::sleep(Duration::from_millis(10));
    }
    drop(slots);
    sys.shutdown();

    let mut lateness = Vec::with_capacity(n);
    let (mut first_fire, mut last_fire) = (u64::MAX, 0u64);
    for (fired, deadline) in sink.fired_ns.iter().zip(&sink.deadline_ns) {
        let fired = fired.load(Ordering::Relaxed);
        if fired == 0 {
            continue;
        }
        let fired = fired - 1;
        first_fire = first_fire.min(fired);
        last_fire = last_fire.max(fired);
        lateness.push(fired as i64 - *deadline as i64);
    }
    lateness.sort_unstable();
    let fired = lateness.len();
    let early = lateness.iter().take_while(|l| **l < 0).count();
    let quantile = |q: f64| -> f64 {
        if lateness.is_empty() {
            return f64::NAN;
        }
        let rank = ((lateness.len() as f64 * q).ceil() as usize).clamp(1, lateness.len());
        lateness[rank - 1] as f64 / 1000.0
    };
    let fire_span = Duration::from_nanos(last_fire.saturating_sub(first_fire));
    let doubles = sink.doubles.load(Ordering::Relaxed);

    if refused != 0 {
        anomaly(format!(
            "{}: storm T={threads}: {refused} schedules refused",
            S::NAME
        ));
    }
    if fired + refused != n {
        anomaly(format!(
            "{}: storm T={threads}: only {fired} of {n} timers fired within {:.1} s of the start",
            S::NAME,
            (give_up - start).as_secs_f64()
        ));
    }
    if early != 0 {
        anomaly(format!(
            "{}: storm T={threads}: {early} timers fired before their deadline (earliest {:.1} us early)",
            S::NAME,
            -lateness[0] as f64 / 1000.0
        ));
    }
    if doubles != 0 {
        anomaly(format!(
            "{}: storm T={threads}: {doubles} tasks ran twice",
            S::NAME
        ));
    }

    let w = "storm";
    report.add(S::NAME, w, threads, "fired", fired as f64, "count");
    report.add(S::NAME, w, threads, "early", early as f64, "count");
    report.add(S::NAME, w, threads, "late_p50_us", quantile(0.5), "us");
    report.add(S::NAME, w, threads, "late_p99_us", quantile(0.99), "us");
    report.add(S::NAME, w, threads, "late_p999_us", quantile(0.999), "us");
    report.add(S::NAME, w, threads, "late_max_us", quantile(1.0), "us");
    report.add(
        S::NAME,
        w,
        threads,
        "fire_per_s",
        rate(fired as u64, fire_span),
        "fires/s",
    );
    report.add(
        S::NAME,
        w,
        threads,
        "schedule_done_ms",
        schedule_done.as_secs_f64() * 1000.0,
        "ms",
    );

    let mut buckets: Vec<(&'static str, u64)> = LATENESS_BUCKETS
        .iter()
        .map(|(label, _)| (*label, 0))
        .collect();
    let mut bucket = 0;
    for late in &lateness {
        while *late >= LATENESS_BUCKETS[bucket].1 {
            bucket += 1;
        }
        buckets[bucket].1 += 1;
    }
    report.histograms.push(Histogram {
        system: S::NAME,
        threads,
        buckets,
    });
}

/// The metrics of W3, with their units.
const MEMORY_METRICS: [(&str, &str); 5] = [
    ("bytes_per_timer", "bytes"),
    ("setup_ops_per_s", "ops/s"),
    ("cancel_ops_per_s", "ops/s"),
    ("bytes_retained_after_cancel_per_timer", "bytes"),
    ("handle_bytes", "bytes"),
];

/// The metrics of W7, with their units.
const SHRINK_METRICS: [(&str, &str); 3] = [
    ("bytes_per_live_timer_after_shrink", "bytes"),
    ("peak_bytes_per_timer", "bytes"),
    ("live_timers", "count"),
];

/// The hidden first argument that makes the binary one W3 run in a fresh process.
pub(crate) const MEMORY_CHILD_FLAG: &str = "--w3-child";

/// The hidden first argument that makes the binary one W7 run in a fresh process.
pub(crate) const SHRINK_CHILD_FLAG: &str = "--w7-child";

/// A workload that measures resident memory, so runs in a fresh process of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Child {
    /// W3.
    Memory,
    /// W7.
    Shrink,
}

impl Child {
    /// The child of a hidden first argument, if it is one.
    pub(crate) fn from_flag(flag: &str) -> Option<Child> {
        [Child::Memory, Child::Shrink]
            .into_iter()
            .find(|child| child.flag() == flag)
    }

    fn flag(self) -> &'static str {
        match self {
            Child::Memory => MEMORY_CHILD_FLAG,
            Child::Shrink => SHRINK_CHILD_FLAG,
        }
    }

    fn metrics(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Child::Memory => &MEMORY_METRICS,
            Child::Shrink => &SHRINK_METRICS,
        }
    }

    /// The workload's name in the report: `memory_1M`, `shrink`.
    fn workload(self, n: usize) -> String {
        match self {
            Child::Memory => format!("memory_{}", size_label(n)),
            Child::Shrink => "shrink".to_string(),
        }
    }

    fn measure<S: System>(self, config: &Config, n: usize, threads: usize, report: &mut Report) {
        let bar = crate::progress::Ui::new(false).bar(String::new(), 1);
        match self {
            Child::Memory => memory::<S>(config, n, threads, report, &bar),
            Child::Shrink => shrink::<S>(config, n, threads, report, &bar),
        }
    }
}

/// W3 or W7 in a fresh process: resident memory depends on what the allocator kept from
/// earlier workloads (freed but still resident, or reused), so each (system, N, T) run gets
/// its own process, started from this same binary with the child's flag
/// ([`MEMORY_CHILD_FLAG`], [`SHRINK_CHILD_FLAG`]).
fn in_child<S: System>(
    child_kind: Child,
    config: &Config,
    n: usize,
    threads: usize,
    report: &mut Report,
    bar: &Bar,
) {
    let workload = child_kind.workload(n);
    let label = format!("T={threads} N={} (fresh process)", size_label(n));
    let spawned = std::env::current_exe().and_then(|exe| {
        std::process::Command::new(exe)
            .args([
                child_kind.flag().to_string(),
                S::NAME.to_string(),
                n.to_string(),
                threads.to_string(),
                u8::from(config.quick).to_string(),
            ])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
    });
    let mut child = match spawned {
        Ok(child) => child,
        Err(error) => {
            anomaly(format!(
                "{workload}: could not start the measuring process: {error}"
            ));
            return;
        }
    };
    // Read its output on a helper thread so a full pipe never blocks it.
    let mut stdout = child.stdout.take().expect("piped");
    let reader = thread::spawn(move || {
        let mut output = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut output);
        output
    });
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) => {
                let elapsed = started.elapsed().as_secs_f64();
                bar.set(
                    (elapsed / 10.0).min(0.95),
                    format!("{label} {elapsed:.1} s"),
                );
                thread::sleep(Duration::from_millis(50));
            }
            Err(error) => break Err(error),
        }
    };
    let output = reader.join().unwrap_or_default();
    match status {
        Ok(status) if status.success() => {}
        Ok(status) => anomaly(format!(
            "{}: {workload} T={threads}: the measuring process failed ({status})",
            S::NAME
        )),
        Err(error) => anomaly(format!(
            "{}: {workload} T={threads}: lost the measuring process: {error}",
            S::NAME
        )),
    }
    for line in output.lines() {
        let mut fields = line.splitn(3, '\t');
        match (fields.next(), fields.next(), fields.next()) {
            (Some("SAMPLE"), Some(metric), Some(value)) => {
                let known = child_kind
                    .metrics()
                    .iter()
                    .find(|(name, _)| *name == metric);
                match (known, value.parse::<f64>()) {
                    (Some((metric, unit)), Ok(value)) => {
                        report.add(S::NAME, &workload, threads, metric, value, unit);
                    }
                    _ => anomaly(format!(
                        "{workload}: unreadable line from the child: {line}"
                    )),
                }
            }
            (Some("NOTE"), Some(note), rest) => {
                let note = match rest {
                    Some(rest) => format!("{note}\t{rest}"),
                    None => note.to_string(),
                };
                report.note(&workload, note);
            }
            (Some("ANOMALY"), Some(message), _) => anomaly(message.to_string()),
            _ => {}
        }
    }
}

/// The child side of [`in_child`]: `--w3-child SYSTEM N THREADS QUICK` (or `--w7-child`).
/// Prints `SAMPLE\tmetric\tvalue`, `NOTE\ttext` and `ANOMALY\ttext` lines.
pub(crate) fn child(child_kind: Child, args: &[String]) -> std::process::ExitCode {
    let parsed = match args {
        [system, n, threads, quick] => match (n.parse::<usize>(), threads.parse::<usize>()) {
            (Ok(n), Ok(threads)) if n > 0 && threads > 0 => {
                Some((system.as_str(), n, threads, quick == "1"))
            }
            _ => None,
        },
        _ => None,
    };
    let Some((system, n, threads, quick)) = parsed else {
        eprintln!(
            "error: {} expects SYSTEM N THREADS QUICK",
            child_kind.flag()
        );
        return std::process::ExitCode::from(2);
    };
    let config = crate::args::Config {
        quick,
        ..crate::args::Config::default_sizes(quick)
    };
    let mut report = match Report::new(None) {
        Ok(report) => report,
        Err(_) => return std::process::ExitCode::FAILURE,
    };
    match system {
        "shardwheel" => {
            child_kind.measure::<crate::system::Shardwheel>(&config, n, threads, &mut report)
        }
        "tokio" => {
            child_kind.measure::<crate::tokio_timer::TokioTimer>(&config, n, threads, &mut report)
        }
        "heap" => {
            child_kind.measure::<crate::heap::HeapTimerSystem>(&config, n, threads, &mut report)
        }
        other => {
            eprintln!("error: unknown system '{other}'");
            return std::process::ExitCode::from(2);
        }
    }
    for sample in &report.samples {
        println!("SAMPLE\t{}\t{:?}", sample.metric, sample.value);
    }
    for (_, note) in &report.notes {
        println!("NOTE\t{note}");
    }
    for (message, _) in crate::report::anomalies() {
        println!("ANOMALY\t{message}");
    }
    std::process::ExitCode::SUCCESS
}

/// W3: resident memory of N long timers, then after cancelling them all.
fn memory<S: System>(config: &Config, n: usize, threads: usize, report: &mut Report, bar: &Bar) {
    let run_started = Instant::now();
    let workload = format!("memory_{}", size_label(n));
    let label = format!("T={threads} N={}", size_label(n));
    let sys = S::build();
    // The handles' own storage is allocated and touched before the first reading: it is the
    // caller's memory, not the engine's.
    let mut slots = empty_slots::<S::Handle>(n);
    let handle_bytes = std::mem::size_of::<Option<S::Handle>>();
    let max_wait = Duration::from_secs(if config.quick { 2 } else { 10 });
    let tolerance = 64 * 1024 + n as u64 / 1000;
    bar.set(0.0, format!("{label} baseline"));
    let before = settled_rss(tolerance, max_wait);
    let (first, last) = fill(
        &sys,
        &mut slots,
        threads,
        bar,
        (0.0, 0.4),
        &format!("{label} schedule"),
        |sys, rng, id| sys.schedule(uniform(rng, 3600, 86_400), Job::plain(id as u64)),
    );
    let refused = count_missing(&slots);
    bar.set(0.4, format!("{label} settling"));
    let loaded = settled_rss(tolerance, max_wait);

    // Cancel everything, from the same number of threads.
    let counters = Counters::new(threads);
    let barrier = Barrier::new(threads + 1);
    let mut rest = &mut slots[..];
    let mut chunks = Vec::new();
    for index in 0..threads {
        let (head, tail) = rest.split_at_mut(chunk(n, threads, index).len());
        chunks.push(head);
        rest = tail;
    }
    let outcomes: Vec<(Instant, Instant, u64)> = thread::scope(|scope| {
        let workers: Vec<_> = chunks
            .into_iter()
            .enumerate()
            .map(|(index, slots)| {
                let (sys, counters, barrier) = (&sys, &counters, &barrier);
                scope.spawn(move || {
                    sys.on_thread(|| {
                        barrier.wait();
                        let start = Instant::now();
                        let mut failed = 0u64;
                        for (offset, slot) in slots.iter_mut().enumerate() {
                            if let Some(handle) = slot.take()
                                && !sys.cancel(handle)
                            {
                                failed += 1;
                            }
                            if offset % PUBLISH_EVERY == PUBLISH_EVERY - 1 {
                                counters.set(index, offset as u64 + 1);
                            }
                        }
                        let end = Instant::now();
                        counters.finish(index, slots.len() as u64);
                        (start, end, failed)
                    })
                })
            })
            .collect();
        barrier.wait();
        watch_counts(
            bar,
            &counters,
            threads,
            n as u64,
            (0.5, 0.8),
            &format!("{label} cancel"),
        );
        workers
            .into_iter()
            .map(|worker| worker.join().expect("a cancelling thread panicked"))
            .collect()
    });
    let cancel = span(outcomes.iter().map(|o| (o.0, o.1)));
    let failed: u64 = outcomes.iter().map(|o| o.2).sum();
    bar.set(0.8, format!("{label} settling after cancel"));
    let after_cancel = settled_rss(tolerance, max_wait);
    sys.shutdown();
    drop(slots);
    trim_allocator();

    if refused != 0 {
        anomaly(format!(
            "{}: {workload} T={threads}: {refused} schedules refused",
            S::NAME
        ));
    }
    if failed != 0 {
        anomaly(format!(
            "{}: {workload} T={threads}: {failed} cancels of pending timers returned false",
            S::NAME
        ));
    }
    let per_timer = |bytes: i128| bytes as f64 / n as f64;
    report.add(
        S::NAME,
        &workload,
        threads,
        "bytes_per_timer",
        per_timer(loaded as i128 - before as i128),
        "bytes",
    );
    report.add(
        S::NAME,
        &workload,
        threads,
        "setup_ops_per_s",
        rate(n as u64, last - first),
        "ops/s",
    );
    report.add(
        S::NAME,
        &workload,
        threads,
        "cancel_ops_per_s",
        rate(n as u64, cancel),
        "ops/s",
    );
    report.add(
        S::NAME,
        &workload,
        threads,
        "bytes_retained_after_cancel_per_timer",
        per_timer(after_cancel as i128 - before as i128),
        "bytes",
    );
    report.add(
        S::NAME,
        &workload,
        threads,
        "handle_bytes",
        handle_bytes as f64,
        "bytes",
    );
    report.note(
        &workload,
        format!(
            "{} T={threads}: run took {:.1} s; RSS before {:.1} MiB, loaded {:.1} MiB, after cancel {:.1} MiB; \
             handles (Option<Handle>, {handle_bytes} B each) preallocated and not counted",
            S::NAME,
            run_started.elapsed().as_secs_f64(),
            before as f64 / 1048576.0,
            loaded as f64 / 1048576.0,
            after_cancel as f64 / 1048576.0,
        ),
    );
}

/// W7: N long timers, then each thread cancels a random 90% of its own timers (dropping
/// their handles); resident memory 1 s after the last cancel, against the peak.
fn shrink<S: System>(config: &Config, n: usize, threads: usize, report: &mut Report, bar: &Bar) {
    let run_started = Instant::now();
    let label = format!("T={threads} N={}", size_label(n));
    let sys = S::build();
    // The handles' storage is the caller's memory: allocated and touched before the first
    // reading, as in W3.
    let mut slots = empty_slots::<S::Handle>(n);
    let max_wait = Duration::from_secs(if config.quick { 2 } else { 10 });
    let tolerance = 64 * 1024 + n as u64 / 1000;
    let before = settled_rss(tolerance, max_wait);
    fill(
        &sys,
        &mut slots,
        threads,
        bar,
        (0.0, 0.4),
        &format!("{label} schedule"),
        |sys, rng, id| sys.schedule(uniform(rng, 3600, 86_400), Job::plain(id as u64)),
    );
    let refused = count_missing(&slots);
    let peak = settled_rss(tolerance, max_wait);

    // Each thread cancels a random 90% of its own chunk (each timer with probability 9/10).
    let barrier = Barrier::new(threads + 1);
    let mut rest = &mut slots[..];
    let mut chunks = Vec::new();
    for index in 0..threads {
        let (head, tail) = rest.split_at_mut(chunk(n, threads, index).len());
        chunks.push(head);
        rest = tail;
    }
    let outcomes: Vec<(Instant, u64)> = thread::scope(|scope| {
        let workers: Vec<_> = chunks
            .into_iter()
            .enumerate()
            .map(|(index, slots)| {
                let (sys, barrier) = (&sys, &barrier);
                scope.spawn(move || {
                    sys.on_thread(|| {
                        let mut rng = rng_for(index + 2000);
                        barrier.wait();
                        let mut failed = 0u64;
                        for slot in slots.iter_mut() {
                            if rng.u32(0..10) != 0
                                && let Some(handle) = slot.take()
                                && !sys.cancel(handle)
                            {
                                failed += 1;
                            }
                        }
                        (Instant::now(), failed)
                    })
                })
            })
            .collect();
        barrier.wait();
        bar.set(0.5, format!("{label} cancelling 90%"));
        workers
            .into_iter()
            .map(|worker| worker.join().expect("a cancelling thread panicked"))
            .collect()
    });
    let cancels_done = outcomes
        .iter()
        .map(|o| o.0)
        .max()
        .expect("at least one thread");
    let failed: u64 = outcomes.iter().map(|o| o.1).sum();
    let live = n - count_missing(&slots);
    bar.set(0.7, format!("{label} waiting 1 s"));
    thread::sleep(
        (cancels_done + Duration::from_secs(1)).saturating_duration_since(Instant::now()),
    );
    // One reading, after the same trim as W3's readings (no waiting for it to settle: the
    // engine has had its 1 s).
    trim_allocator();
    let after = rss_bytes();
    let late_by = (Instant::now() - cancels_done).as_secs_f64() - 1.0;
    sys.shutdown();
    drop(slots);

    if refused != 0 {
        anomaly(format!(
            "{}: shrink T={threads}: {refused} schedules refused",
            S::NAME
        ));
    }
    if failed != 0 {
        anomaly(format!(
            "{}: shrink T={threads}: {failed} cancels of pending timers returned false",
            S::NAME
        ));
    }
    report.add(
        S::NAME,
        "shrink",
        threads,
        "bytes_per_live_timer_after_shrink",
        (after as i128 - before as i128) as f64 / live.max(1) as f64,
        "bytes",
    );
    report.add(
        S::NAME,
        "shrink",
        threads,
        "peak_bytes_per_timer",
        (peak as i128 - before as i128) as f64 / n as f64,
        "bytes",
    );
    report.add(
        S::NAME,
        "shrink",
        threads,
        "live_timers",
        live as f64,
        "count",
    );
    report.note(
        "shrink",
        format!(
            "{} T={threads}: run took {:.1} s; RSS before {:.1} MiB, peak {:.1} MiB ({} timers), \
             1 s after the cancels {:.1} MiB ({live} live; read {:.0} ms past the 1 s)",
            S::NAME,
            run_started.elapsed().as_secs_f64(),
            before as f64 / 1048576.0,
            peak as f64 / 1048576.0,
            n - refused,
            after as f64 / 1048576.0,
            late_by * 1000.0,
        ),
    );
}

/// W4: timers pending for hours, then `seconds` of no load: CPU the process burns meanwhile.
fn idle<S: System>(config: &Config, threads: usize, report: &mut Report, bar: &Bar) {
    let n = config.idle_timers;
    let sys = S::build();
    let mut slots = empty_slots::<S::Handle>(n);
    let label = format!("T={threads} schedule");
    fill(
        &sys,
        &mut slots,
        threads,
        bar,
        (0.0, 0.1),
        &label,
        |sys, rng, id| sys.schedule(uniform(rng, 3600, 86_400), Job::plain(id as u64)),
    );
    let refused = count_missing(&slots);
    // Let the engine apply the schedules first: the window measures idling, not the backlog.
    bar.set(0.1, format!("T={threads} settling"));
    thread::sleep(Duration::from_millis(if config.quick { 100 } else { 500 }));
    let length = Duration::from_secs_f64(config.seconds);
    // No drawing during the window: the progress bar would be measured too.
    bar.set(
        0.15,
        format!(
            "T={threads} idle {:.1} s (not redrawing)",
            length.as_secs_f64()
        ),
    );
    let cpu_before = process_cpu_time();
    let wall_before = Instant::now();
    thread::sleep(length);
    let cpu = process_cpu_time().saturating_sub(cpu_before);
    let wall = wall_before.elapsed();
    bar.set(1.0, format!("T={threads} done"));
    drop(slots);
    sys.shutdown();
    if refused != 0 {
        anomaly(format!(
            "{}: idle T={threads}: {refused} schedules refused",
            S::NAME
        ));
    }
    report.add(
        S::NAME,
        "idle",
        threads,
        "idle_cpu_ms_per_s",
        cpu.as_secs_f64() * 1000.0 / wall.as_secs_f64(),
        "ms/s",
    );
}

/// W5: C timers of 30 s; T threads push random ones back to now + 30 s for `seconds`.
fn reset<S: System>(config: &Config, threads: usize, report: &mut Report, bar: &Bar) {
    let c = config.reset_timers;
    let round_trip_before = crate::probes::cross_cpu_round_trip_ns(CROSS_CPU_PROBE_SECONDS);
    let sys = S::build();
    let mut slots = empty_slots::<S::Handle>(c);
    let delay = Duration::from_secs(30);
    let label = format!("T={threads} schedule");
    fill(
        &sys,
        &mut slots,
        threads,
        bar,
        (0.0, 0.15),
        &label,
        |sys, _, id| sys.schedule(delay, Job::plain(id as u64)),
    );
    let refused = count_missing(&slots);
    let length = Duration::from_secs_f64(config.seconds);
    let barrier = Barrier::new(threads + 1);
    let outcomes: Vec<(Instant, Instant, u64, u64)> = thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|index| {
                let (sys, slots, barrier) = (&sys, &slots, &barrier);
                scope.spawn(move || {
                    sys.on_thread(|| {
                        let mut rng = rng_for(index + 1000);
                        barrier.wait();
                        let start = Instant::now();
                        let stop = start + length;
                        let (mut resets, mut failed) = (0u64, 0u64);
                        loop {
                            for _ in 0..CHECK_EVERY {
                                if let Some(handle) = &slots[rng.usize(..c)]
                                    && !sys.reset(handle, delay)
                                {
                                    failed += 1;
                                }
                            }
                            resets += CHECK_EVERY as u64;
                            if Instant::now() >= stop {
                                break;
                            }
                        }
                        (start, Instant::now(), resets, failed)
                    })
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        watch_time(
            bar,
            start,
            length,
            (0.15, 1.0),
            &format!("T={threads} reset"),
        );
        workers
            .into_iter()
            .map(|worker| worker.join().expect("a resetting thread panicked"))
            .collect()
    });
    drop(slots);
    sys.shutdown();
    report_round_trips(report, S::NAME, "reset", threads, round_trip_before);
    let elapsed = span(outcomes.iter().map(|o| (o.0, o.1)));
    let resets: u64 = outcomes.iter().map(|o| o.2).sum();
    let failed: u64 = outcomes.iter().map(|o| o.3).sum();
    if refused != 0 {
        anomaly(format!(
            "{}: reset T={threads}: {refused} schedules refused",
            S::NAME
        ));
    }
    if failed != 0 {
        anomaly(format!(
            "{}: reset T={threads}: {failed} resets of pending timers returned false",
            S::NAME
        ));
    }
    report.add(
        S::NAME,
        "reset",
        threads,
        "resets_per_s",
        rate(resets, elapsed),
        "resets/s",
    );
    for (metric, chase) in [("floor_resets_per_s", false), ("chase_resets_per_s", true)] {
        let steps_per_s = reset_floor(c, threads, length, chase);
        report.add(S::NAME, "reset", threads, metric, steps_per_s, "resets/s");
    }
}

/// Reports the cross-CPU round trip measured before a run (`before`) and now, after it
/// ([`crate::probes::cross_cpu_round_trip_ns`]): churn and reset move cache lines between
/// CPUs, so their figures follow it.
fn report_round_trips(
    report: &mut Report,
    system: &'static str,
    workload: &str,
    threads: usize,
    before: Option<f64>,
) {
    let after = crate::probes::cross_cpu_round_trip_ns(CROSS_CPU_PROBE_SECONDS);
    for (metric, value) in crate::probes::ROUND_TRIP_METRICS
        .into_iter()
        .zip([before, after])
    {
        if let Some(value) = value {
            report.add(system, workload, threads, metric, value, "ns");
        }
    }
}

/// W5's floors, run right after each system's W5, over as much memory as W5's handles and slots
/// (`c` 16-byte records of each). Each step reads a record of the first array (as a reset reads
/// a handle), follows the index it holds to a record of the second (as a handle leads to its
/// timer's slot) and writes it: two dependent cache misses. Not `chase`: the first record is
/// random, as W5's handle is (steps may overlap, as W5's resets may). `chase`: the next step's
/// first record comes from the second record (a pointer chase: no overlap between steps),
/// visiting every record in one cycle (so the walk never settles into a part that fits a cache).
fn reset_floor(c: usize, threads: usize, length: Duration, chase: bool) -> f64 {
    use std::sync::atomic::AtomicU64;
    let mut rng = rng_for(4242);
    // `cycle`: one cycle through all of 0..c (Sattolo's shuffle); `place`: a random bijection.
    let mut cycle: Vec<usize> = (0..c).collect();
    let mut place: Vec<usize> = (0..c).collect();
    for i in (1..c).rev() {
        cycle.swap(i, rng.usize(..i));
        place.swap(i, rng.usize(..=i));
    }
    // Handle `i` leads to slot `place[i]`, which leads to handle `cycle[i]`.
    let handles: Vec<[u64; 2]> = place.iter().map(|&slot| [slot as u64, 0]).collect();
    let slots: Vec<[AtomicU64; 2]> = (0..c)
        .map(|_| [AtomicU64::new(0), AtomicU64::new(0)])
        .collect();
    for i in 0..c {
        slots[place[i]][0].store(cycle[i] as u64, Ordering::Relaxed);
    }
    let barrier = Barrier::new(threads);
    let outcomes: Vec<(Instant, Instant, u64)> = thread::scope(|scope| {
        let walkers: Vec<_> = (0..threads)
            .map(|index| {
                let (handles, slots, barrier) = (&handles, &slots, &barrier);
                scope.spawn(move || {
                    let mut rng = rng_for(index + 1000);
                    let mut next = rng.usize(..c);
                    barrier.wait();
                    let start = Instant::now();
                    let stop = start + length;
                    let mut steps = 0u64;
                    loop {
                        for _ in 0..CHECK_EVERY {
                            let slot = &slots[handles[next][0] as usize];
                            next = if chase {
                                slot[0].load(Ordering::Relaxed) as usize
                            } else {
                                rng.usize(..c)
                            };
                            let deadline = slot[1].load(Ordering::Relaxed);
                            slot[1].store(deadline.wrapping_add(1), Ordering::Relaxed);
                        }
                        steps += CHECK_EVERY as u64;
                        if Instant::now() >= stop {
                            break;
                        }
                    }
                    (start, Instant::now(), steps)
                })
            })
            .collect();
        walkers
            .into_iter()
            .map(|walker| walker.join().expect("a floor thread panicked"))
            .collect()
    });
    let elapsed = span(outcomes.iter().map(|o| (o.0, o.1)));
    rate(outcomes.iter().map(|o| o.2).sum(), elapsed)
}
