//! Live progress: one `indicatif` bar per (system, workload), split in one segment per run
//! (thread count, size). Workers publish their progress in padded per-thread counters that
//! the main thread polls; nothing draws from the workers' hot loops.

use crossbeam_utils::CachePadded;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How often the main thread redraws.
const POLL: Duration = Duration::from_millis(50);

/// Where the bars go.
pub(crate) struct Ui {
    multi: Option<MultiProgress>,
}

impl Ui {
    pub(crate) fn new(enabled: bool) -> Ui {
        let multi = enabled.then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()));
        Ui { multi }
    }

    /// A bar for `label` made of `segments` runs.
    pub(crate) fn bar(&self, label: String, segments: usize) -> Bar {
        let segments = segments.max(1) as u64;
        let bar = match &self.multi {
            Some(multi) => {
                let bar = multi.add(ProgressBar::new(segments * SEGMENT));
                bar.set_style(
                    ProgressStyle::with_template(
                        "{prefix:<18} [{bar:30.cyan/blue}] {percent:>3}% {elapsed:>4} {msg}",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
                );
                bar
            }
            None => ProgressBar::hidden(),
        };
        bar.set_prefix(label);
        Bar {
            bar,
            segment: 0,
            started: Instant::now(),
        }
    }
}

const SEGMENT: u64 = 1000;

/// A bar: the current segment, and the fraction of it done.
pub(crate) struct Bar {
    bar: ProgressBar,
    segment: u64,
    started: Instant,
}

impl Bar {
    /// Starts run number `segment`.
    pub(crate) fn segment(&mut self, segment: usize) {
        self.segment = segment as u64;
        self.set(0.0, String::new());
    }

    /// Sets the fraction done of the current run, and the message.
    pub(crate) fn set(&self, fraction: f64, message: String) {
        let fraction = fraction.clamp(0.0, 1.0);
        self.bar
            .set_position(self.segment * SEGMENT + (fraction * SEGMENT as f64) as u64);
        self.bar.set_message(message);
    }

    /// Completes the bar, saying it ran `seconds` (its runs interleave with other bars').
    pub(crate) fn finish_after(&self, seconds: f64) {
        self.bar
            .finish_with_message(format!("done in {seconds:.1} s"));
    }

    /// Completes the bar; returns the seconds since it was created.
    pub(crate) fn finish(&self) -> f64 {
        let seconds = self.started.elapsed().as_secs_f64();
        self.bar
            .finish_with_message(format!("done in {seconds:.1} s"));
        seconds
    }
}

/// Per-thread progress counters, plus how many threads finished their phase.
pub(crate) struct Counters {
    counts: Vec<CachePadded<AtomicU64>>,
    finished: AtomicUsize,
}

impl Counters {
    pub(crate) fn new(threads: usize) -> Counters {
        Counters {
            counts: (0..threads)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
            finished: AtomicUsize::new(0),
        }
    }

    /// Thread `thread` has done `done` operations of its phase.
    #[inline]
    pub(crate) fn set(&self, thread: usize, done: u64) {
        self.counts[thread].store(done, Ordering::Relaxed);
    }

    /// Thread `thread` finished its phase having done `done` operations.
    pub(crate) fn finish(&self, thread: usize, done: u64) {
        self.set(thread, done);
        self.finished.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn total(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    pub(crate) fn finished(&self) -> usize {
        self.finished.load(Ordering::Acquire)
    }
}

/// Redraws `bar` until `threads` threads finished: fraction `from + (to - from) * done/total`.
pub(crate) fn watch_counts(
    bar: &Bar,
    counters: &Counters,
    threads: usize,
    total: u64,
    (from, to): (f64, f64),
    label: &str,
) {
    loop {
        let done = counters.total();
        let fraction = if total == 0 {
            1.0
        } else {
            done as f64 / total as f64
        };
        bar.set(
            from + (to - from) * fraction,
            format!("{label} {}/{}", short_count(done), short_count(total)),
        );
        if counters.finished() >= threads {
            return;
        }
        std::thread::sleep(POLL);
    }
}

/// Redraws `bar` until `until`: a timed phase.
pub(crate) fn watch_time(
    bar: &Bar,
    start: Instant,
    length: Duration,
    (from, to): (f64, f64),
    label: &str,
) {
    let until = start + length;
    loop {
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(start).as_secs_f64();
        bar.set(
            from + (to - from) * (elapsed / length.as_secs_f64()),
            format!("{label} {elapsed:.1}/{:.1} s", length.as_secs_f64()),
        );
        if now >= until {
            return;
        }
        std::thread::sleep(POLL.min(until - now));
    }
}

/// 1234567 -> "1.23M".
pub(crate) fn short_count(count: u64) -> String {
    if count >= 1_000_000 {
        format!("{:.2}M", count as f64 / 1e6)
    } else if count >= 1_000 {
        format!("{:.0}k", count as f64 / 1e3)
    } else {
        count.to_string()
    }
}
