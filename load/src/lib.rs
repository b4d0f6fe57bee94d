//! `shardwheel-load`: the load generator that reproduces shardwheel's performance numbers, and
//! the baselines it (and the engine bench, `load/benches/engine.rs`) compares shardwheel with.
//!
//! Runs the seven workloads of `load/WORKLOADS.md` (churn, storm, memory, idle, reset,
//! timeouts, shrink) on 1..=cores submitting threads, prints a live progress bar per workload
//! and then a report, and optionally writes JSON lines (`--json`), an SVG chart (`--plot`) and
//! the same workloads on baselines (`--compare tokio,heap`, with each metric's ratio
//! shardwheel/baseline in the report). `--repeat N` runs each (workload, threads) N times, the
//! systems alternating within each repetition, and reports min / median / max of each metric
//! and of the per-repetition ratios. `--help` lists the flags and the JSON format.
//!
//! The systems under test share one trait, [`system::System`]: shardwheel
//! ([`system::Shardwheel`]), tokio's timer ([`tokio_timer::TokioTimer`]) and a JDK-style heap
//! ([`heap::HeapTimerSystem`]); [`rng`] is the random number generator of both.

mod args;
pub mod heap;
pub mod job;
mod measure;
mod plot;
mod probes;
mod progress;
mod report;
pub mod rng;
mod stats;
pub mod system;
mod timeouts;
pub mod tokio_timer;
mod workloads;

use args::{Baseline, Config, Parsed, Workload};
use heap::HeapTimerSystem;
use progress::{Bar, Ui};
use report::Report;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Instant;
use system::{Shardwheel, System};
use tokio_timer::TokioTimer;

/// The `shardwheel-load` command: parses the arguments, runs, reports.
pub fn main() -> ExitCode {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    if let Some(child) = arguments
        .first()
        .and_then(|flag| workloads::Child::from_flag(flag))
    {
        return workloads::child(child, &arguments[1..]);
    }
    let config = match args::parse(arguments) {
        Ok(Parsed::Run(config)) => *config,
        Ok(Parsed::Help) => {
            print!("{}", args::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("error: {message}\n\n{}", args::USAGE);
            return ExitCode::from(2);
        }
    };
    let mut report = match Report::new(config.json.as_deref()) {
        Ok(report) => report,
        Err(error) => {
            let path = config.json.as_deref().unwrap_or_else(|| "".as_ref());
            eprintln!(
                "error: cannot write --json file {}: {error}",
                path.display()
            );
            return ExitCode::from(2);
        }
    };
    // The chart is drawn at the end: find out now whether it can be written.
    if let Some(path) = &config.plot
        && let Err(error) = std::fs::File::create(path)
    {
        eprintln!(
            "error: cannot write --plot file {}: {error}",
            path.display()
        );
        return ExitCode::from(2);
    }
    run(&config, &mut report)
}

fn run(config: &Config, report: &mut Report) -> ExitCode {
    let started = Instant::now();
    print_header(config);
    let ui = Ui::new(config.progress && std::io::stderr().is_terminal());
    for &workload in &config.workloads {
        run_workload(workload, config, report, &ui);
    }
    report.run = 0;
    if config.probes {
        let mut bar = ui.bar("probes".to_string(), config.threads.len() + 1);
        probes::run(config, report, &mut bar);
        bar.finish();
    }
    report.write_summary_json();
    print!("{}", report.render());
    let mut outputs_written = true;
    if let Some(path) = &config.plot {
        match plot::draw(&report.medians(), path) {
            Ok(()) => println!("\nchart written to {}", path.display()),
            Err(error) => {
                eprintln!("\nerror: could not draw {}: {error}", path.display());
                outputs_written = false;
            }
        }
    }
    if let Some(path) = &config.json {
        match report.json_error() {
            None => println!("JSON lines written to {}", path.display()),
            Some(error) => {
                eprintln!(
                    "error: JSON lines not all written to {}: {error}",
                    path.display()
                );
                outputs_written = false;
            }
        }
    }
    println!("\ntotal run time: {:.1} s", started.elapsed().as_secs_f64());
    let anomalies = report::anomalies();
    if anomalies.is_empty() {
        println!(
            "no engine problem observed (no early, lost or doubled fires; no refused schedules; every cancel/reset of a pending timer succeeded)"
        );
        if outputs_written {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        }
    } else {
        println!("\nENGINE PROBLEMS OBSERVED:");
        for (message, count) in anomalies {
            if count > 1 {
                println!("  - {message} (x{count})");
            } else {
                println!("  - {message}");
            }
        }
        ExitCode::FAILURE
    }
}

/// A system under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SystemKind {
    Shardwheel,
    Baseline(Baseline),
}

impl SystemKind {
    fn name(self) -> &'static str {
        match self {
            SystemKind::Shardwheel => Shardwheel::NAME,
            SystemKind::Baseline(Baseline::Tokio) => TokioTimer::NAME,
            SystemKind::Baseline(Baseline::Heap) => HeapTimerSystem::NAME,
        }
    }

    /// Whether the system can run `workload` (the heap has no futures API for W6).
    fn runs(self, workload: Workload) -> bool {
        !(workload == Workload::Timeouts && self == SystemKind::Baseline(Baseline::Heap))
    }
}

/// Runs `workload` on shardwheel and the baselines: for each size, thread count and
/// repetition, every system once, in turn (sw, tokio, sw, tokio, ...), so that a drift of
/// the machine's load hits all systems alike.
fn run_workload(workload: Workload, config: &Config, report: &mut Report, ui: &Ui) {
    let systems: Vec<SystemKind> = std::iter::once(SystemKind::Shardwheel)
        .chain(config.compare.iter().map(|b| SystemKind::Baseline(*b)))
        .filter(|system| {
            let runs = system.runs(workload);
            if !runs {
                report.note(
                    workload.name(),
                    format!("{}: not run (no futures API)", system.name()),
                );
            }
            runs
        })
        .collect();
    let mut bars: Vec<(Bar, usize, f64)> = systems
        .iter()
        .map(|system| {
            let bar = ui.bar(
                format!("{} {}", system.name(), workload.name()),
                workloads::segments(config, workload),
            );
            (bar, 0, 0.0)
        })
        .collect();
    for n in workloads::sizes(config, workload) {
        for &threads in &config.threads {
            for repetition in 0..config.repeat {
                report.run = repetition;
                for (system, (bar, segment, seconds)) in systems.iter().zip(&mut bars) {
                    bar.segment(*segment);
                    let started = Instant::now();
                    match system {
                        SystemKind::Shardwheel => {
                            workloads::run::<Shardwheel>(workload, config, n, threads, report, bar)
                        }
                        SystemKind::Baseline(Baseline::Tokio) => {
                            workloads::run::<TokioTimer>(workload, config, n, threads, report, bar)
                        }
                        SystemKind::Baseline(Baseline::Heap) => workloads::run::<HeapTimerSystem>(
                            workload, config, n, threads, report, bar,
                        ),
                    }
                    *seconds += started.elapsed().as_secs_f64();
                    *segment += 1;
                }
            }
        }
    }
    for (system, (bar, _, seconds)) in systems.iter().zip(&bars) {
        bar.finish_after(*seconds);
        report.wall.push((system.name(), workload.name(), *seconds));
    }
}

fn print_header(config: &Config) {
    let mut systems = vec![("shardwheel", Shardwheel::describe())];
    for baseline in &config.compare {
        systems.push(match baseline {
            Baseline::Tokio => ("tokio", TokioTimer::describe()),
            Baseline::Heap => ("heap", HeapTimerSystem::describe()),
        });
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let names: Vec<&str> = config.workloads.iter().map(|w| w.name()).collect();
    let memory: Vec<String> = config
        .memory_timers
        .iter()
        .map(|n| workloads::size_label(*n))
        .collect();
    println!(
        "shardwheel-load{}: workloads {} | threads {:?} | {} cores | loops {} s (timeouts {} s){}",
        if config.quick { " (quick)" } else { "" },
        names.join(","),
        config.threads,
        cores,
        config.seconds,
        config.timeouts_seconds,
        if config.repeat > 1 {
            format!(" | repeat {}", config.repeat)
        } else {
            String::new()
        }
    );
    println!(
        "sizes: churn P={} storm N={} memory N={} idle {} reset C={} timeouts {} tasks/worker \
         shrink N={}{}",
        workloads::size_label(config.churn_timers),
        workloads::size_label(config.storm_timers),
        memory.join(","),
        workloads::size_label(config.idle_timers),
        workloads::size_label(config.reset_timers),
        config.timeout_tasks_per_worker,
        workloads::size_label(config.shrink_timers),
        if config.compare.is_empty() {
            String::new()
        } else {
            format!(" | compare {:?}", config.compare)
        }
    );
    for (name, description) in systems {
        println!("  {name}: {description}");
    }
    println!(
        "  W3 reads RSS after malloc_trim(0) once it is stable, W7 once 1 s after its cancels; \
         W4 lets the engine settle before its window; every timer's task captures its u64 id"
    );
}
