//! `shardwheel-load`: the load generator that reproduces shardwheel's performance numbers, and
//! the baselines it (and the engine bench, `load/benches/engine.rs`) compares shardwheel with.
//!
//! Runs the five workloads of `load/WORKLOADS.md` (churn, storm, memory, idle, reset) on
//! 1..=cores submitting threads, prints a live progress bar per workload and then a
//! report, and optionally writes JSON lines (`--json`), an SVG chart (`--plot`) and the same
//! workloads on baselines (`--compare tokio,heap`). `--help` lists the flags.
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
pub mod system;
pub mod tokio_timer;
mod workloads;

use args::{Baseline, Config, Parsed, Workload};
use heap::HeapTimerSystem;
use progress::Ui;
use report::Report;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Instant;
use system::{Shardwheel, System};
use tokio_timer::TokioTimer;

/// The `shardwheel-load` command: parses the arguments, runs, reports.
pub fn main() -> ExitCode {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    if arguments.first().map(String::as_str) == Some(workloads::MEMORY_CHILD_FLAG) {
        return workloads::memory_child(&arguments[1..]);
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
    run(&config, &mut report)
}

fn run(config: &Config, report: &mut Report) -> ExitCode {
    let started = Instant::now();
    print_header(config);
    let ui = Ui::new(config.progress && std::io::stderr().is_terminal());
    for &workload in &config.workloads {
        run_workload::<Shardwheel>(workload, config, report, &ui);
        for baseline in &config.compare {
            match baseline {
                Baseline::Tokio => run_workload::<TokioTimer>(workload, config, report, &ui),
                Baseline::Heap => run_workload::<HeapTimerSystem>(workload, config, report, &ui),
            }
        }
    }
    if config.probes {
        let mut bar = ui.bar("probes".to_string(), config.threads.len() + 1);
        probes::run(config, report, &mut bar);
        bar.finish();
    }
    print!("{}", report.render());
    if let Some(path) = &config.plot {
        match plot::draw(&report.samples, path) {
            Ok(()) => println!("\nchart written to {}", path.display()),
            Err(error) => eprintln!("\nwarning: could not draw {}: {error}", path.display()),
        }
    }
    if let Some(path) = &config.json {
        println!("JSON lines written to {}", path.display());
    }
    println!("\ntotal run time: {:.1} s", started.elapsed().as_secs_f64());
    let anomalies = report::anomalies();
    if anomalies.is_empty() {
        println!(
            "no engine problem observed (no early, lost or doubled fires; no refused schedules; every cancel/reset of a pending timer succeeded)"
        );
        ExitCode::SUCCESS
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

fn run_workload<S: System>(workload: Workload, config: &Config, report: &mut Report, ui: &Ui) {
    let mut bar = ui.bar(
        format!("{} {}", S::NAME, workload.name()),
        workloads::segments(config, workload),
    );
    workloads::run::<S>(workload, config, report, &mut bar);
    let seconds = bar.finish();
    report.wall.push((S::NAME, workload.name(), seconds));
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
        "shardwheel-load{}: workloads {} | threads {:?} | {} cores | loops {} s",
        if config.quick { " (quick)" } else { "" },
        names.join(","),
        config.threads,
        cores,
        config.seconds
    );
    println!(
        "sizes: churn P={} storm N={} memory N={} idle {} reset C={}{}",
        workloads::size_label(config.churn_timers),
        workloads::size_label(config.storm_timers),
        memory.join(","),
        workloads::size_label(config.idle_timers),
        workloads::size_label(config.reset_timers),
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
        "  W3 reads RSS after malloc_trim(0) once it is stable; W4 lets the engine settle before \
         its window; every timer's task captures its u64 id"
    );
}
