//! Results: the JSON lines, the human tables, the lateness histograms, and the anomaly log
//! (anything an engine did wrong: early fires, lost or doubled tasks, refused schedules).
//!
//! With `--repeat N`, every sample carries its repetition (`run`); the tables then show
//! min / median / max over the runs ([`crate::stats`]), and the ratio shardwheel/baseline is
//! taken per repetition (the two systems ran back to back) before it is summarized.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;

use crate::stats::{Summary, summarize};

/// One measured value.
#[derive(Clone, Debug)]
pub(crate) struct Sample {
    pub(crate) system: &'static str,
    pub(crate) workload: String,
    pub(crate) threads: usize,
    pub(crate) metric: &'static str,
    pub(crate) value: f64,
    pub(crate) unit: &'static str,
    /// The repetition (0-based) of `--repeat` that measured it; not in the JSON line.
    pub(crate) run: usize,
}

/// A storm's lateness distribution, as counts per bucket.
#[derive(Clone, Debug)]
pub(crate) struct Histogram {
    pub(crate) system: &'static str,
    pub(crate) threads: usize,
    pub(crate) buckets: Vec<(&'static str, u64)>,
}

static ANOMALIES: Mutex<Vec<(String, u64)>> = Mutex::new(Vec::new());

/// Records something an engine did wrong (deduplicated, with a count).
pub(crate) fn anomaly(message: String) {
    let mut anomalies = ANOMALIES.lock().unwrap_or_else(|e| e.into_inner());
    match anomalies.iter_mut().find(|(known, _)| *known == message) {
        Some((_, count)) => *count += 1,
        None => anomalies.push((message, 1)),
    }
}

/// Every anomaly so far, with how often it happened.
pub(crate) fn anomalies() -> Vec<(String, u64)> {
    ANOMALIES.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Collects samples, writing each to the JSON file as it comes.
pub(crate) struct Report {
    pub(crate) samples: Vec<Sample>,
    pub(crate) histograms: Vec<Histogram>,
    /// Wall time of each (system, workload) run, seconds.
    pub(crate) wall: Vec<(&'static str, &'static str, f64)>,
    /// Free-form lines printed under a workload's table.
    pub(crate) notes: Vec<(String, String)>,
    /// The repetition now running: stamped on every sample added.
    pub(crate) run: usize,
    json: Option<BufWriter<File>>,
    /// Why writing the JSON file failed, if it did (the file then stops being written).
    json_error: Option<String>,
}

fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_number(value: f64) -> String {
    if !value.is_finite() {
        "null".to_string()
    } else if value == value.trunc() && value.abs() < 1e15 {
        format!("{}", value as i64)
    } else {
        format!("{value}")
    }
}

impl Sample {
    /// The sample as one JSON object (no trailing newline).
    pub(crate) fn to_json(&self) -> String {
        format!(
            "{{\"system\":{},\"workload\":{},\"threads\":{},\"metric\":{},\"value\":{},\"unit\":{}}}",
            json_string(self.system),
            json_string(&self.workload),
            self.threads,
            json_string(self.metric),
            json_number(self.value),
            json_string(self.unit)
        )
    }
}

impl Report {
    /// A report that also writes JSON lines to `json`, if given.
    pub(crate) fn new(json: Option<&Path>) -> std::io::Result<Report> {
        let json = match json {
            Some(path) => Some(BufWriter::new(File::create(path)?)),
            None => None,
        };
        Ok(Report {
            samples: Vec::new(),
            histograms: Vec::new(),
            wall: Vec::new(),
            notes: Vec::new(),
            run: 0,
            json,
            json_error: None,
        })
    }

    /// Why writing the JSON file failed, if it did.
    pub(crate) fn json_error(&self) -> Option<&str> {
        self.json_error.as_deref()
    }

    /// Adds a sample (and writes its JSON line).
    pub(crate) fn add(
        &mut self,
        system: &'static str,
        workload: &str,
        threads: usize,
        metric: &'static str,
        value: f64,
        unit: &'static str,
    ) {
        let sample = Sample {
            system,
            workload: workload.to_string(),
            threads,
            metric,
            value,
            unit,
            run: self.run,
        };
        self.write_json(&sample);
        self.samples.push(sample);
    }

    fn write_json(&mut self, sample: &Sample) {
        if let Some(json) = &mut self.json {
            let written = writeln!(json, "{}", sample.to_json()).and_then(|()| json.flush());
            if let Err(error) = written {
                eprintln!("error: could not write the JSON file: {error}");
                self.json = None;
                self.json_error = Some(error.to_string());
            }
        }
    }

    /// Whether some (system, workload, threads, metric) was measured more than once.
    fn repeated(&self) -> bool {
        self.samples.iter().any(|s| s.run > 0)
    }

    /// The values of one (system, workload, threads, metric), by repetition.
    fn runs(
        &self,
        system: &str,
        workload: &str,
        threads: usize,
        metric: &str,
    ) -> Vec<(usize, f64)> {
        self.samples
            .iter()
            .filter(|s| {
                s.system == system
                    && s.workload == workload
                    && s.threads == threads
                    && s.metric == metric
            })
            .map(|s| (s.run, s.value))
            .collect()
    }

    /// The ratios shardwheel/`baseline` of the repetitions that measured both; none for a
    /// reading of the machine rather than of a system (the cross-CPU round trip).
    fn ratios(&self, baseline: &str, workload: &str, threads: usize, metric: &str) -> Vec<f64> {
        if crate::probes::ROUND_TRIP_METRICS.contains(&metric) {
            return Vec::new();
        }
        let baseline_runs = self.runs(baseline, workload, threads, metric);
        self.runs("shardwheel", workload, threads, metric)
            .into_iter()
            .filter_map(|(run, sw)| {
                let (_, other) = baseline_runs.iter().find(|(r, _)| *r == run)?;
                (*other != 0.0).then(|| sw / other)
            })
            .collect()
    }

    /// The distinct (system, workload, threads, metric, unit) keys, in the order measured.
    fn keys(&self) -> Vec<(&'static str, &str, usize, &'static str, &'static str)> {
        let mut keys = Vec::new();
        for s in &self.samples {
            let key = (s.system, s.workload.as_str(), s.threads, s.metric, s.unit);
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        keys
    }

    /// With `--repeat`: writes the summary lines to the JSON file (`METRIC.min`,
    /// `METRIC.median`, `METRIC.max` per system, and the same of the per-repetition ratios
    /// with system `shardwheel/BASELINE` and unit `ratio`). Nothing without repetitions.
    pub(crate) fn write_summary_json(&mut self) {
        if self.json.is_none() || !self.repeated() {
            return;
        }
        let mut lines = Vec::new();
        let summary_samples = |system: &'static str,
                               workload: &str,
                               threads: usize,
                               metric: &str,
                               unit: &'static str,
                               summary: Summary| {
            [
                ("min", summary.min),
                ("median", summary.median),
                ("max", summary.max),
            ]
            .map(|(statistic, value)| {
                // The metric names are few and live as long as the run: leaking them keeps
                // `Sample::metric` a plain `&'static str`.
                let metric: &'static str =
                    Box::leak(format!("{metric}.{statistic}").into_boxed_str());
                Sample {
                    system,
                    workload: workload.to_string(),
                    threads,
                    metric,
                    value,
                    unit,
                    run: 0,
                }
            })
        };
        let baselines: Vec<&'static str> = self
            .systems()
            .into_iter()
            .filter(|s| *s != "shardwheel")
            .collect();
        for (system, workload, threads, metric, unit) in self.keys() {
            let values: Vec<f64> = self
                .runs(system, workload, threads, metric)
                .into_iter()
                .map(|(_, v)| v)
                .collect();
            if let Some(summary) = summarize(&values) {
                lines.extend(summary_samples(
                    system, workload, threads, metric, unit, summary,
                ));
            }
            if system != "shardwheel" {
                continue;
            }
            for baseline in &baselines {
                let ratio_system: &'static str =
                    Box::leak(format!("shardwheel/{baseline}").into_boxed_str());
                if let Some(summary) = summarize(&self.ratios(baseline, workload, threads, metric))
                {
                    lines.extend(summary_samples(
                        ratio_system,
                        workload,
                        threads,
                        metric,
                        "ratio",
                        summary,
                    ));
                }
            }
        }
        for line in &lines {
            self.write_json(line);
        }
    }

    /// One sample per key: the median over the repetitions (what `--plot` draws).
    pub(crate) fn medians(&self) -> Vec<Sample> {
        self.keys()
            .into_iter()
            .filter_map(|(system, workload, threads, metric, unit)| {
                let values: Vec<f64> = self
                    .runs(system, workload, threads, metric)
                    .into_iter()
                    .map(|(_, v)| v)
                    .collect();
                summarize(&values).map(|summary| Sample {
                    system,
                    workload: workload.to_string(),
                    threads,
                    metric,
                    value: summary.median,
                    unit,
                    run: 0,
                })
            })
            .collect()
    }

    /// A line to print under `workload`'s table.
    pub(crate) fn note(&mut self, workload: &str, line: String) {
        self.notes.push((workload.to_string(), line));
    }

    /// The systems that produced samples, shardwheel first.
    fn systems(&self) -> Vec<&'static str> {
        let mut systems: Vec<&'static str> = Vec::new();
        for sample in &self.samples {
            if sample.system != "probe" && !systems.contains(&sample.system) {
                systems.push(sample.system);
            }
        }
        systems.sort_by_key(|s| system_rank(s));
        systems
    }

    /// The human report: one table per workload, the probes, the histograms.
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        let systems = self.systems();
        let baselines: Vec<&str> = systems
            .iter()
            .copied()
            .filter(|s| *s != "shardwheel")
            .collect();
        let mut workloads: Vec<&str> = Vec::new();
        for sample in &self.samples {
            if sample.system != "probe" && !workloads.contains(&sample.workload.as_str()) {
                workloads.push(&sample.workload);
            }
        }
        let repeated = self.repeated();
        let width = if repeated { 26 } else { 12 };
        if repeated {
            let _ = writeln!(
                out,
                "\n(each cell: min / median / max over the repetitions; sw/BASELINE: of the \
                 per-repetition ratios)"
            );
        }
        for workload in workloads {
            let _ = writeln!(out, "\n== {workload} ==");
            let mut header = format!("{:<50} {:>3}", "metric", "T");
            for system in &systems {
                let _ = write!(header, " {system:>width$}");
            }
            for baseline in &baselines {
                let _ = write!(header, " {:>width$}", format!("sw/{baseline}"));
            }
            let _ = writeln!(out, "{header}");
            let mut metrics: Vec<(&'static str, &'static str)> = Vec::new();
            let mut threads: Vec<usize> = Vec::new();
            for sample in self.samples.iter().filter(|s| s.workload == workload) {
                if !metrics.iter().any(|(m, _)| *m == sample.metric) {
                    metrics.push((sample.metric, sample.unit));
                }
                if !threads.contains(&sample.threads) {
                    threads.push(sample.threads);
                }
            }
            threads.sort_unstable();
            for (metric, unit) in metrics {
                for &t in &threads {
                    let label = format!("{metric} [{unit}] {}", direction(metric));
                    let mut line = format!("{label:<50} {t:>3}");
                    for system in &systems {
                        let values: Vec<f64> = self
                            .runs(system, workload, t, metric)
                            .into_iter()
                            .map(|(_, v)| v)
                            .collect();
                        let cell = summary_cell(&values, |v| format_value(v, unit));
                        let _ = write!(line, " {cell:>width$}");
                    }
                    for baseline in &baselines {
                        let ratios = self.ratios(baseline, workload, t, metric);
                        let cell = summary_cell(&ratios, |r| format!("{r:.2}x"));
                        let _ = write!(line, " {cell:>width$}");
                    }
                    let _ = writeln!(out, "{line}");
                }
            }
            for (_, note) in self.notes.iter().filter(|(w, _)| w == workload) {
                let _ = writeln!(out, "  {note}");
            }
        }
        if !self.wall.is_empty() {
            let _ = writeln!(out, "\n== run times ==");
            for (system, workload, seconds) in &self.wall {
                let _ = writeln!(out, "{system:>12} {workload:<8} {seconds:>7.1} s");
            }
        }
        let probes: Vec<&Sample> = self
            .samples
            .iter()
            .filter(|s| s.system == "probe")
            .collect();
        if !probes.is_empty() {
            let _ = writeln!(
                out,
                "\n== limit probes (the floor any cross-thread design pays) =="
            );
            for probe in probes {
                let _ = writeln!(
                    out,
                    "{:<14} T={:<3} {:>12} {}",
                    probe.workload,
                    probe.threads,
                    format_value(probe.value, probe.unit),
                    probe.unit
                );
            }
        }
        for histogram in &self.histograms {
            out.push_str(&render_histogram(histogram));
        }
        out
    }
}

/// A table cell: "-" for no value, the value, or "min / median / max" of several.
fn summary_cell(values: &[f64], format: impl Fn(f64) -> String) -> String {
    match values {
        [] => "-".to_string(),
        [value] => format(*value),
        _ => match summarize(values) {
            Some(summary) => format!(
                "{} / {} / {}",
                format(summary.min),
                format(summary.median),
                format(summary.max)
            ),
            None => "n/a".to_string(),
        },
    }
}

/// Table and chart order: shardwheel, then the baselines in the order of `--compare tokio,heap`.
pub(crate) fn system_rank(system: &str) -> usize {
    match system {
        "shardwheel" => 0,
        "tokio" => 1,
        "heap" => 2,
        _ => 3,
    }
}

/// Whether a larger value of `metric` is better (↑), worse (↓), or neither.
pub(crate) fn direction(metric: &str) -> &'static str {
    if metric == "idle_cpu_ms_per_s" {
        "↓"
    } else if metric.ends_with("_per_s") || metric == "fired" {
        "↑"
    } else if metric.starts_with("late_")
        || metric.starts_with("bytes_")
        || metric == "early"
        || metric == "schedule_done_ms"
        || metric == "handle_bytes"
    {
        "↓"
    } else {
        ""
    }
}

/// A value for humans: rates with k/M/G, times and sizes with sensible decimals.
pub(crate) fn format_value(value: f64, unit: &str) -> String {
    if !value.is_finite() {
        return "n/a".to_string();
    }
    if unit.ends_with("/s") && unit != "ms/s" {
        let magnitude = value.abs();
        return if magnitude >= 1e9 {
            format!("{:.2}G", value / 1e9)
        } else if magnitude >= 1e6 {
            format!("{:.2}M", value / 1e6)
        } else if magnitude >= 1e3 {
            format!("{:.1}k", value / 1e3)
        } else {
            format!("{value:.1}")
        };
    }
    match unit {
        "count" => format!("{}", value as i64),
        "ms/s" => format!("{value:.3}"),
        _ if value.abs() >= 1000.0 => format!("{value:.0}"),
        _ => format!("{value:.1}"),
    }
}

fn render_histogram(histogram: &Histogram) -> String {
    let total: u64 = histogram.buckets.iter().map(|(_, c)| c).sum();
    let largest = histogram.buckets.iter().map(|(_, c)| *c).max().unwrap_or(0);
    let mut out = format!(
        "\n-- storm lateness (fire instant - deadline), {}, T={}, {} timers --\n",
        histogram.system, histogram.threads, total
    );
    const WIDTH: u64 = 40;
    for (label, count) in &histogram.buckets {
        let bar = if largest == 0 {
            0
        } else {
            (count * WIDTH).div_ceil(largest)
        };
        let share = if total == 0 {
            0.0
        } else {
            *count as f64 * 100.0 / total as f64
        };
        let _ = writeln!(
            out,
            "{label:>15} |{:<40}| {count:>9} {share:>6.2}%",
            "#".repeat(bar as usize)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_line_has_the_exact_shape() {
        let sample = Sample {
            system: "shardwheel",
            workload: "churn".into(),
            threads: 2,
            metric: "churn_pairs_per_s",
            value: 1234.5,
            unit: "pairs/s",
            run: 0,
        };
        assert_eq!(
            sample.to_json(),
            r#"{"system":"shardwheel","workload":"churn","threads":2,"metric":"churn_pairs_per_s","value":1234.5,"unit":"pairs/s"}"#
        );
        assert_eq!(json_number(1e6), "1000000");
        assert_eq!(json_number(f64::NAN), "null");
    }

    /// Two repetitions of shardwheel and tokio, alternating as the runner does.
    fn repeated_report(json: Option<&Path>) -> Report {
        let mut report = Report::new(json).unwrap();
        for (run, sw, tokio) in [(0, 300.0, 100.0), (1, 100.0, 100.0), (2, 400.0, 200.0)] {
            report.run = run;
            report.add(
                "shardwheel",
                "timeouts",
                1,
                "timeouts_per_s",
                sw,
                "timeouts/s",
            );
            report.add(
                "tokio",
                "timeouts",
                1,
                "timeouts_per_s",
                tokio,
                "timeouts/s",
            );
        }
        report
    }

    #[test]
    fn ratios_pair_the_runs_of_one_repetition() {
        let report = repeated_report(None);
        assert_eq!(
            report.ratios("tokio", "timeouts", 1, "timeouts_per_s"),
            vec![3.0, 1.0, 2.0]
        );
        assert!(
            report
                .ratios("heap", "timeouts", 1, "timeouts_per_s")
                .is_empty()
        );
        let medians = report.medians();
        assert_eq!(medians.len(), 2);
        assert_eq!(medians[0].value, 300.0);
        assert_eq!(medians[1].value, 100.0);
        let table = report.render();
        assert!(table.contains("100.0 / 300.0 / 400.0"), "{table}");
        assert!(table.contains("1.00x / 2.00x / 3.00x"), "{table}");
    }

    #[test]
    fn summary_json_lines_follow_the_run_lines() {
        let path = std::env::temp_dir().join(format!(
            "shardwheel-load-summary-{}.jsonl",
            std::process::id()
        ));
        let mut report = repeated_report(Some(&path));
        report.write_summary_json();
        drop(report);
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 6 + 3 + 3 + 3, "{text}");
        assert!(
            lines[..6]
                .iter()
                .all(|l| l.contains(r#""metric":"timeouts_per_s","#))
        );
        assert!(lines.contains(
            &r#"{"system":"shardwheel","workload":"timeouts","threads":1,"metric":"timeouts_per_s.median","value":300,"unit":"timeouts/s"}"#
        ));
        assert!(lines.contains(
            &r#"{"system":"shardwheel/tokio","workload":"timeouts","threads":1,"metric":"timeouts_per_s.max","value":3,"unit":"ratio"}"#
        ));
        assert!(lines.contains(
            &r#"{"system":"tokio","workload":"timeouts","threads":1,"metric":"timeouts_per_s.min","value":100,"unit":"timeouts/s"}"#
        ));
    }

    #[test]
    fn a_single_run_keeps_single_cells_and_no_summary() {
        let mut report = Report::new(None).unwrap();
        report.add("shardwheel", "reset", 1, "resets_per_s", 2e6, "resets/s");
        report.add("tokio", "reset", 1, "resets_per_s", 1e6, "resets/s");
        assert!(!report.repeated());
        let table = report.render();
        assert!(table.contains("2.00x") && !table.contains(" / "), "{table}");
        assert_eq!(summary_cell(&[], |v| v.to_string()), "-");
    }

    #[test]
    fn values_format_for_humans() {
        assert_eq!(format_value(12_345_678.0, "ops/s"), "12.35M");
        assert_eq!(format_value(42.0, "count"), "42");
        assert_eq!(format_value(0.1234, "ms/s"), "0.123");
    }
}
