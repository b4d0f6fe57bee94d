//! Command-line flags, parsed by hand: any mistake is a clear message and exit code 2.

use std::path::PathBuf;

pub(crate) const USAGE: &str = "\
shardwheel-load: runs the workloads of WORKLOADS.md against shardwheel (and baselines)

usage: shardwheel-load [FLAGS]

  --workloads LIST   which workloads, comma-separated: churn,storm,memory,idle,reset,
                     timeouts,shrink (or W1..W7, or all; default all)
  --threads T|LIST   submitting threads: a maximum (runs 1..=T) or a list like 1,2,4
                     (default 1..=cores)
  --timers N         timers per workload, overriding P (churn), N (storm, memory,
                     shrink), the idle count and C (reset); accepts 1000000, 1_000_000,
                     1M, 500k, at most 100M (timeouts has no timer count: 1,000 tasks
                     per worker)
  --seconds S        length of the timed loops (churn, idle, reset, timeouts; default 5;
                     0.01 to 3600)
  --compare LIST     also run baselines: tokio, heap, or tokio,heap; the report then
                     shows each metric's ratio shardwheel/baseline (sw/tokio, sw/heap);
                     heap has no futures API, so timeouts runs without it
  --repeat N         run each (workload, threads) N times, the systems alternating
                     within each repetition (sw, tokio, sw, tokio, ...), and report
                     min / median / max of each metric and of the per-repetition
                     ratios (default 1)
  --json FILE        write one JSON object per line per metric to FILE:
                     {\"system\",\"workload\",\"threads\",\"metric\",\"value\",\"unit\"}.
                     With --repeat N > 1: one line per run (N lines per key, in run
                     order), then summary lines of the same shape whose metric is
                     METRIC.min, METRIC.median or METRIC.max, and, with --compare, ratio
                     lines with system \"shardwheel/BASELINE\" and unit \"ratio\"
  --plot FILE.svg    draw throughput by thread count for each workload (medians)
  --quick            tiny sizes and short loops (CI smoke run, under ~40 s)
  --no-probes        skip the limit probes (handoff, local_insert)
  --no-progress      no progress bars
  -h, --help         this text
";

/// A workload of WORKLOADS.md.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Workload {
    Churn,
    Storm,
    Memory,
    Idle,
    Reset,
    Timeouts,
    Shrink,
}

impl Workload {
    pub(crate) const ALL: [Workload; 7] = [
        Workload::Churn,
        Workload::Storm,
        Workload::Memory,
        Workload::Idle,
        Workload::Reset,
        Workload::Timeouts,
        Workload::Shrink,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Workload::Churn => "churn",
            Workload::Storm => "storm",
            Workload::Memory => "memory",
            Workload::Idle => "idle",
            Workload::Reset => "reset",
            Workload::Timeouts => "timeouts",
            Workload::Shrink => "shrink",
        }
    }

    pub(crate) fn id(self) -> &'static str {
        match self {
            Workload::Churn => "W1",
            Workload::Storm => "W2",
            Workload::Memory => "W3",
            Workload::Idle => "W4",
            Workload::Reset => "W5",
            Workload::Timeouts => "W6",
            Workload::Shrink => "W7",
        }
    }

    fn parse(word: &str) -> Option<Workload> {
        Workload::ALL
            .into_iter()
            .find(|w| w.name().eq_ignore_ascii_case(word) || w.id().eq_ignore_ascii_case(word))
    }
}

/// A baseline of `--compare`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Baseline {
    Tokio,
    Heap,
}

/// Everything a run needs to know.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) workloads: Vec<Workload>,
    pub(crate) threads: Vec<usize>,
    pub(crate) compare: Vec<Baseline>,
    pub(crate) json: Option<PathBuf>,
    pub(crate) plot: Option<PathBuf>,
    pub(crate) quick: bool,
    pub(crate) probes: bool,
    pub(crate) progress: bool,
    /// Runs of each (workload, threads, system): `--repeat`.
    pub(crate) repeat: usize,
    /// The timed loops (churn, idle, reset), seconds.
    pub(crate) seconds: f64,
    /// The loop of each task of the timeouts workload (W6), seconds.
    pub(crate) timeouts_seconds: f64,
    /// Tasks per runtime worker thread in the timeouts workload (W6).
    pub(crate) timeout_tasks_per_worker: usize,
    /// P of the churn.
    pub(crate) churn_timers: usize,
    /// N of the storm.
    pub(crate) storm_timers: usize,
    /// The N values of the memory workload.
    pub(crate) memory_timers: Vec<usize>,
    /// Pending timers of the idle workload.
    pub(crate) idle_timers: usize,
    /// C of the reset workload.
    pub(crate) reset_timers: usize,
    /// N of the shrink workload (W7).
    pub(crate) shrink_timers: usize,
    /// Messages per producer in the handoff probe.
    pub(crate) probe_messages: usize,
    /// Length of the local_insert probe, seconds.
    pub(crate) probe_seconds: f64,
}

impl Config {
    /// WORKLOADS.md's sizes, or the tiny ones of `--quick`.
    pub(crate) fn default_sizes(quick: bool) -> Config {
        let base = Config {
            workloads: Workload::ALL.to_vec(),
            threads: (1..=cores()).collect(),
            compare: Vec::new(),
            json: None,
            plot: None,
            quick,
            probes: true,
            progress: true,
            repeat: 1,
            seconds: 5.0,
            timeouts_seconds: 5.0,
            timeout_tasks_per_worker: 1_000,
            churn_timers: 1_000_000,
            storm_timers: 1_000_000,
            memory_timers: vec![1_000_000, 10_000_000],
            idle_timers: 1_000_000,
            reset_timers: 1_000_000,
            shrink_timers: 10_000_000,
            probe_messages: 2_000_000,
            probe_seconds: 1.0,
        };
        if !quick {
            return base;
        }
        Config {
            seconds: 0.5,
            timeouts_seconds: 1.0,
            churn_timers: 20_000,
            storm_timers: 20_000,
            memory_timers: vec![20_000, 100_000],
            idle_timers: 20_000,
            reset_timers: 20_000,
            shrink_timers: 1_000_000,
            probe_messages: 100_000,
            probe_seconds: 0.1,
            ..base
        }
    }
}

/// What the command line asks for.
#[derive(Debug)]
pub(crate) enum Parsed {
    Run(Box<Config>),
    Help,
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The most timers `--timers` takes: W3 and W7 hold that many at once (48 bytes each in
/// shardwheel, several times that in tokio).
const MAX_TIMERS: usize = 100_000_000;

/// The shortest timed loop `--seconds` takes: shorter loops measure the clock, not the timer.
const MIN_SECONDS: f64 = 0.01;

/// Parses a count: digits with optional `_` separators, and an optional k/M/G suffix.
fn parse_count(flag: &str, text: &str) -> Result<usize, String> {
    let cleaned: String = text.chars().filter(|c| *c != '_').collect();
    let (digits, factor) = match cleaned.chars().last() {
        Some('k' | 'K') => (&cleaned[..cleaned.len() - 1], 1_000),
        Some('m' | 'M') => (&cleaned[..cleaned.len() - 1], 1_000_000),
        Some('g' | 'G') => (&cleaned[..cleaned.len() - 1], 1_000_000_000),
        _ => (cleaned.as_str(), 1),
    };
    let value: usize = digits
        .parse()
        .map_err(|_| format!("{flag} expects a count like 1000000 or 1M, not '{text}'"))?;
    value
        .checked_mul(factor)
        .filter(|v| *v > 0)
        .ok_or_else(|| format!("{flag} expects a positive count that fits, not '{text}'"))
}

fn parse_threads(text: &str) -> Result<Vec<usize>, String> {
    let parts: Vec<&str> = text.split(',').map(str::trim).collect();
    let mut counts = Vec::new();
    for part in &parts {
        let count: usize = part
            .parse()
            .map_err(|_| format!("--threads expects a count or a list like 1,2,4, not '{text}'"))?;
        if !(1..=1024).contains(&count) {
            return Err(format!(
                "--threads: thread counts must be 1 to 1024, not {count}"
            ));
        }
        counts.push(count);
    }
    if parts.len() == 1 {
        counts = (1..=counts[0]).collect();
    }
    counts.sort_unstable();
    counts.dedup();
    Ok(counts)
}

fn parse_list<T>(
    flag: &str,
    text: &str,
    parse: impl Fn(&str) -> Option<Vec<T>>,
    expected: &str,
) -> Result<Vec<T>, String>
where
    T: PartialEq,
{
    let mut items = Vec::new();
    for word in text.split(',').map(str::trim) {
        let parsed = parse(word)
            .ok_or_else(|| format!("{flag}: unknown name '{word}' (expected {expected})"))?;
        for item in parsed {
            if !items.contains(&item) {
                items.push(item);
            }
        }
    }
    Ok(items)
}

/// Parses the arguments (without the program name).
pub(crate) fn parse(args: impl IntoIterator<Item = String>) -> Result<Parsed, String> {
    let mut args = args.into_iter();
    let mut workloads = None;
    let mut threads = None;
    let mut compare = Vec::new();
    let mut json = None;
    let mut plot = None;
    let mut quick = false;
    let mut probes = true;
    let mut progress = true;
    let mut timers = None;
    let mut seconds = None;
    let mut repeat = None;
    let mut seen = std::collections::HashSet::new();

    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                (flag.to_string(), Some(value.to_string()))
            }
            _ => (arg.clone(), None),
        };
        let takes_value = matches!(
            flag.as_str(),
            "--workloads"
                | "--threads"
                | "--timers"
                | "--seconds"
                | "--repeat"
                | "--compare"
                | "--json"
                | "--plot"
        );
        if takes_value && !seen.insert(flag.clone()) {
            return Err(format!("{flag} given twice"));
        }
        let value = if takes_value {
            match inline {
                Some(value) => value,
                None => args.next().ok_or_else(|| format!("{flag} needs a value"))?,
            }
        } else {
            if inline.is_some() {
                return Err(format!("{flag} takes no value"));
            }
            String::new()
        };
        if takes_value && value.trim().is_empty() {
            return Err(format!("{flag} needs a non-empty value"));
        }
        if takes_value && value.starts_with("--") {
            return Err(format!("{flag} needs a value, not the flag '{value}'"));
        }
        match flag.as_str() {
            "-h" | "--help" => return Ok(Parsed::Help),
            "--quick" => quick = true,
            "--no-probes" => probes = false,
            "--no-progress" => progress = false,
            "--workloads" => {
                workloads = Some(parse_list(
                    "--workloads",
                    &value,
                    |word| {
                        if word.eq_ignore_ascii_case("all") {
                            Some(Workload::ALL.to_vec())
                        } else {
                            Workload::parse(word).map(|w| vec![w])
                        }
                    },
                    "churn, storm, memory, idle, reset, timeouts, shrink, W1..W7 or all",
                )?);
            }
            "--compare" => {
                compare = parse_list(
                    "--compare",
                    &value,
                    |word| match word.to_ascii_lowercase().as_str() {
                        "tokio" => Some(vec![Baseline::Tokio]),
                        "heap" => Some(vec![Baseline::Heap]),
                        _ => None,
                    },
                    "tokio or heap",
                )?;
            }
            "--threads" => threads = Some(parse_threads(&value)?),
            "--timers" => {
                let count = parse_count("--timers", &value)?;
                if count > MAX_TIMERS {
                    return Err(format!(
                        "--timers is at most {MAX_TIMERS} (about 5 GB of timers), not {count}"
                    ));
                }
                timers = Some(count);
            }
            "--seconds" => {
                let parsed: f64 = value.trim().parse().map_err(|_| {
                    format!("--seconds expects a number of seconds like 5 or 0.5, not '{value}'")
                })?;
                if !(parsed.is_finite() && (MIN_SECONDS..=3600.0).contains(&parsed)) {
                    return Err(format!(
                        "--seconds must be {MIN_SECONDS} to 3600, not {value}"
                    ));
                }
                seconds = Some(parsed);
            }
            "--repeat" => {
                let parsed: usize = value.trim().parse().map_err(|_| {
                    format!("--repeat expects a number of runs like 5, not '{value}'")
                })?;
                if !(1..=1000).contains(&parsed) {
                    return Err(format!("--repeat must be 1 to 1000, not {parsed}"));
                }
                repeat = Some(parsed);
            }
            "--json" => json = Some(PathBuf::from(value)),
            "--plot" => plot = Some(PathBuf::from(value)),
            other if other.starts_with('-') => return Err(format!("unknown flag '{other}'")),
            other => return Err(format!("unexpected argument '{other}'")),
        }
    }

    let mut config = Config::default_sizes(quick);
    config.probes = probes;
    config.progress = progress;
    if let Some(workloads) = workloads {
        config.workloads = workloads;
    }
    if let Some(threads) = threads {
        config.threads = threads;
    }
    config.compare = compare;
    config.json = json;
    config.plot = plot;
    if let Some(n) = timers {
        config.churn_timers = n;
        config.storm_timers = n;
        config.memory_timers = vec![n];
        config.idle_timers = n;
        config.reset_timers = n;
        config.shrink_timers = n;
    }
    if let Some(seconds) = seconds {
        config.seconds = seconds;
        config.timeouts_seconds = seconds;
    }
    if let Some(repeat) = repeat {
        config.repeat = repeat;
    }
    Ok(Parsed::Run(Box::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Config, String> {
        match parse(args.iter().map(|s| s.to_string()))? {
            Parsed::Run(config) => Ok(*config),
            Parsed::Help => Err("help".into()),
        }
    }

    #[test]
    fn defaults_follow_workloads_md() {
        let config = run(&[]).unwrap();
        assert_eq!(config.churn_timers, 1_000_000);
        assert_eq!(config.memory_timers, vec![1_000_000, 10_000_000]);
        assert_eq!(config.seconds, 5.0);
        assert_eq!(config.workloads, Workload::ALL.to_vec());
        assert_eq!(config.workloads.len(), 7);
        assert_eq!(config.timeouts_seconds, 5.0);
        assert_eq!(config.timeout_tasks_per_worker, 1_000);
        assert_eq!(config.shrink_timers, 10_000_000);
        assert_eq!(config.repeat, 1);
    }

    #[test]
    fn quick_keeps_w6_and_w7_small() {
        let config = run(&["--quick"]).unwrap();
        assert_eq!(config.timeouts_seconds, 1.0);
        assert_eq!(config.shrink_timers, 1_000_000);
        assert_eq!(config.repeat, 1);
    }

    #[test]
    fn w6_and_w7_parse_by_name_and_id() {
        let config = run(&["--workloads", "timeouts,W7"]).unwrap();
        assert_eq!(config.workloads, vec![Workload::Timeouts, Workload::Shrink]);
        let config = run(&["--workloads=W6,shrink,timeouts"]).unwrap();
        assert_eq!(config.workloads, vec![Workload::Timeouts, Workload::Shrink]);
        let config = run(&["--workloads", "all"]).unwrap();
        assert!(config.workloads.contains(&Workload::Timeouts));
        assert!(config.workloads.contains(&Workload::Shrink));
    }

    #[test]
    fn repeat_seconds_and_timers_reach_w6_and_w7() {
        let config = run(&["--repeat", "5", "--seconds=2", "--timers", "2M"]).unwrap();
        assert_eq!(config.repeat, 5);
        assert_eq!(config.timeouts_seconds, 2.0);
        assert_eq!(config.shrink_timers, 2_000_000);
        assert_eq!(run(&["--repeat=1"]).unwrap().repeat, 1);
        assert_eq!(run(&["--quick", "--repeat", "3"]).unwrap().repeat, 3);
    }

    #[test]
    fn help_mentions_the_new_flags() {
        assert!(matches!(parse(["--help".to_string()]), Ok(Parsed::Help)));
        for word in [
            "--repeat", "timeouts", "shrink", "W1..W7", ".median", "ratio",
        ] {
            assert!(USAGE.contains(word), "--help lacks {word}");
        }
    }

    #[test]
    fn flags_parse() {
        let config = run(&[
            "--timers=10k",
            "--threads",
            "1,4,2",
            "--workloads",
            "W2,churn",
            "--compare",
            "tokio,heap",
            "--seconds",
            "0.25",
        ])
        .unwrap();
        assert_eq!(config.storm_timers, 10_000);
        assert_eq!(config.memory_timers, vec![10_000]);
        assert_eq!(config.threads, vec![1, 2, 4]);
        assert_eq!(config.workloads, vec![Workload::Storm, Workload::Churn]);
        assert_eq!(config.compare, vec![Baseline::Tokio, Baseline::Heap]);
        assert_eq!(config.seconds, 0.25);
        assert_eq!(run(&["--threads", "3"]).unwrap().threads, vec![1, 2, 3]);
    }

    #[test]
    fn bad_flags_are_errors() {
        for bad in [
            &["--bogus"][..],
            &["--timers"],
            &["--timers", "0"],
            &["--timers", "lots"],
            &["--threads", "0"],
            &["--threads", "1,x"],
            &["--seconds", "-1"],
            &["--seconds", "nan"],
            &["--compare", "java"],
            &["--workloads", "churn,nope"],
            &["--quick=yes"],
            &["stray"],
            &["--json", ""],
            &["--repeat"],
            &["--repeat", "0"],
            &["--repeat", "-2"],
            &["--repeat", "2.5"],
            &["--repeat", "1001"],
            &["--workloads", "W8"],
            &["--timers", "100000001"],
            &["--timers", "18446744073709551615"],
            &["--seconds", "1e-9"],
            &["--json", "--quick"],
            &["--plot", "--quick"],
            &["--compare", "tokio", "--compare", "heap"],
            &["--workloads", "churn", "--workloads=storm"],
        ] {
            assert!(run(bad).is_err(), "{bad:?} accepted");
        }
    }
}
