//! Which shard a thread schedules on (its home shard), and the per-thread numbering behind it
//! and behind striped counters. The home-shard policy is described here and only here.
//!
//! # The home-shard policy
//!
//! A thread's home shard is chosen at its first schedule:
//!
//! 1. A shard's own worker thread uses its own shard ([`set_home`]), for good.
//! 2. Otherwise, where the thread's CPU is known (pinned shards on Linux, not under loom), a
//!    shard pinned to the CPU it runs on then: the messages and the shard's entries stay in that
//!    core's caches (a submitter and its shard time-share the core). Among that CPU's shards,
//!    the one the fewest threads took as home so far, unless another shard anywhere has fewer
//!    (new threads often first run on the CPU that spawned them); see [`Placement::home`].
//! 3. Otherwise (no pinning, other systems, loom) the threads are spread round-robin in the
//!    order they first schedule on the engine (each engine counts its own): the thread's
//!    ordinal, modulo the shard count.
//!
//! Under rule 2 the choice is looked at again, though not at every schedule. The operating
//! system moves unpinned threads between CPUs, and a thread that stayed with its first choice
//! would send every message, and touch every entry, across cores: two submitters that swapped
//! CPUs each feed the other's shard; two that first ran on the same CPU may even share one shard
//! while the other idles. So:
//!
//! * every [`RECHECK_EVERY`]th schedule of the thread reads its CPU;
//! * once the readings in a row (at least [`AWAY_READINGS`] of them, over at least
//!   [`AWAY_FOR`]) have found it on a CPU that has shards but not its home, the thread takes
//!   that CPU's shard the fewest threads have as its new home;
//! * except when it has its home shard to itself and that CPU's shards are nobody's home: then
//!   the thread and its shard run side by side on two CPUs, which beats sharing one.
//!
//! The trade-off: a thread that moves for good moves its new timers with it, so for a while
//! both shards hold its timers (their tables grow to what the thread has pending, at most); the
//! hysteresis keeps a short visit to another CPU from doing that. Timers already scheduled stay
//! where they are: a handle always names its shard.
//!
//! # Thread numbers
//!
//! Each thread gets two numbers the first time it needs them, both kept in thread-locals: its
//! home ordinal (above) and its stripe of striped counters
//! ([`counter_stripe`](crate::stats::counter_stripe), with the counters in `stats.rs`). They are
//! separate so that a thread that only resets timers never picks a home shard.

use crate::sync::statistics::AtomicUsize;
use crate::sync::thread_local;
use std::cell::Cell;
use std::sync::atomic::Ordering;

/// Schedules between two readings of the thread's CPU (a power of two).
pub(crate) const RECHECK_EVERY: u32 = 1024;
/// How long readings in a row must find the thread on a CPU without its home shard before it
/// moves home, and how many readings at least.
pub(crate) const AWAY_FOR: std::time::Duration = std::time::Duration::from_millis(200);
/// See [`AWAY_FOR`].
pub(crate) const AWAY_READINGS: u32 = 16;

/// A thread's home: its shard ordinal and what re-homing needs.
struct Home {
    /// The home shard ordinal (taken modulo the shard count); `usize::MAX` = unset.
    ordinal: Cell<usize>,
    /// Set by [`set_home`]: a shard's worker never moves home.
    fixed: Cell<bool>,
    /// Schedules since the thread's CPU was last read.
    calls: Cell<u32>,
    /// Since when the readings in a row have found the thread away from its home shard's CPU.
    away_since: Cell<Option<std::time::Instant>>,
    /// How many readings in a row have found it away.
    away_readings: Cell<u32>,
}

impl Home {
    const fn new() -> Home {
        Home {
            ordinal: Cell::new(usize::MAX),
            fixed: Cell::new(false),
            calls: Cell::new(0),
            away_since: Cell::new(None),
            away_readings: Cell::new(0),
        }
    }
}

#[cfg(not(shardwheel_loom))]
thread_local! {
    static HOME: Home = const { Home::new() };
}

// Loom's thread-locals take no `const` initializers.
#[cfg(shardwheel_loom)]
thread_local! {
    static HOME: Home = Home::new();
}

/// Where the shards are, for choosing threads' home shards.
#[derive(Debug)]
pub(crate) struct Placement {
    /// For each CPU, the shards whose threads are pinned to it (empty where none is, or
    /// without pinning).
    shards_by_cpu: Box<[Box<[usize]>]>,
    /// Threads that have each shard as their home, by the policy's rule 2 (a placement hint:
    /// see [`homes`](Self::homes)).
    homed: Box<[AtomicUsize]>,
    /// The next round-robin number (rule 3): per engine, so that the threads of one engine
    /// spread over its shards whatever other engines they used first (and so that a loom
    /// model, with a fresh engine per execution, hands out the same numbers every time).
    next: AtomicUsize,
}

impl Placement {
    /// `shard_count` shards, shard `i` pinned to `pins[i % pins.len()]` (none if `pins` is
    /// empty).
    pub(crate) fn new(shard_count: usize, pins: &[core_affinity::CoreId]) -> Placement {
        let mut shards_by_cpu: Vec<Vec<usize>> = Vec::new();
        if !pins.is_empty() {
            for ordinal in 0..shard_count {
                let cpu = pins[ordinal % pins.len()].id;
                if shards_by_cpu.len() <= cpu {
                    shards_by_cpu.resize_with(cpu + 1, Vec::new);
                }
                shards_by_cpu[cpu].push(ordinal);
            }
        }
        Placement {
            shards_by_cpu: shards_by_cpu
                .into_iter()
                .map(Vec::into_boxed_slice)
                .collect(),
            homed: (0..shard_count).map(|_| AtomicUsize::new(0)).collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// This thread's home shard: its ordinal among the shards (see the
    /// [policy](self#the-home-shard-policy)).
    #[inline]
    pub(crate) fn home(&self) -> usize {
        let shard_count = self.homed.len();
        let ordinal = HOME.with(|home| {
            let ordinal = home.ordinal.get();
            if ordinal == usize::MAX {
                return self.first_home(home);
            }
            let calls = home.calls.get().wrapping_add(1);
            home.calls.set(calls);
            if calls % RECHECK_EVERY == 0 && !self.shards_by_cpu.is_empty() && !home.fixed.get() {
                self.recheck(home, ordinal % shard_count);
            }
            home.ordinal.get()
        });
        if ordinal < shard_count {
            ordinal
        } else {
            ordinal % shard_count
        }
    }

    /// Rule 2 of the policy where it applies, else the thread's round-robin number.
    #[cold]
    fn first_home(&self, home: &Home) -> usize {
        let chosen = current_cpu().and_then(|cpu| {
            let local = self.least_homed_on(cpu)?;
            let fewest = (0..self.homed.len()).min_by_key(|&shard| self.homes(shard))?;
            let chosen = if self.homes(local) <= self.homes(fewest) {
                local
            } else {
                fewest
            };
            self.took_home(chosen);
            Some(chosen)
        });
        let ordinal = chosen.unwrap_or_else(|| self.next.fetch_add(1, Ordering::Relaxed));
        home.ordinal.set(ordinal);
        ordinal
    }

    /// One reading of the thread's CPU (every [`RECHECK_EVERY`]th schedule), which may move its
    /// home there (see the [policy](self#the-home-shard-policy)).
    #[cold]
    fn recheck(&self, home: &Home, current: usize) {
        if let Some(cpu) = current_cpu() {
            self.seen_on(home, current, cpu, std::time::Instant::now());
        }
    }

    /// A reading at `now` found the thread, whose home is shard `current`, on `cpu`.
    fn seen_on(&self, home: &Home, current: usize, cpu: usize, now: std::time::Instant) {
        let on_cpu = match self.shards_by_cpu.get(cpu) {
            Some(shards) if !shards.is_empty() => shards,
            // A CPU without shards: no better home to move to.
            _ => return,
        };
        if on_cpu.contains(&current) {
            home.away_since.set(None);
            home.away_readings.set(0);
            return;
        }
        let readings = home.away_readings.get() + 1;
        home.away_readings.set(readings);
        let since = home.away_since.get().unwrap_or(now);
        home.away_since.set(Some(since));
        if readings < AWAY_READINGS || now.saturating_duration_since(since) < AWAY_FOR {
            return;
        }
        home.away_since.set(None);
        home.away_readings.set(0);
        let Some(chosen) = self.least_homed_on(cpu) else {
            return;
        };
        // The policy's exception: alone on its shard, beside it on an unused CPU.
        if self.homes(current) <= 1 && self.homes(chosen) == 0 {
            return;
        }
        self.left_home(current);
        self.took_home(chosen);
        home.ordinal.set(chosen);
    }

    /// Among the shards pinned to `cpu`, the one the fewest threads took as home.
    fn least_homed_on(&self, cpu: usize) -> Option<usize> {
        self.shards_by_cpu
            .get(cpu)?
            .iter()
            .copied()
            .min_by_key(|&shard| self.homes(shard))
    }

    /// How many threads have `shard` as their home (a hint: threads that ended, or that chose
    /// through another engine, are not taken off).
    fn homes(&self, shard: usize) -> usize {
        self.homed[shard].load(Ordering::Relaxed)
    }

    fn took_home(&self, shard: usize) {
        self.homed[shard].fetch_add(1, Ordering::Relaxed);
    }

    fn left_home(&self, shard: usize) {
        // Saturating: the thread may have chosen its home through another engine.
        let _ = self.homed[shard].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |homes| {
            homes.checked_sub(1)
        });
    }
}

/// Makes shard `ordinal` this thread's home for good: a shard's worker thread, at its start.
pub(crate) fn set_home(ordinal: usize) {
    HOME.with(|home| {
        home.ordinal.set(ordinal);
        home.fixed.set(true);
    });
}

/// The CPU this thread runs on now (it may move at any time: only a placement hint).
#[cfg(all(target_os = "linux", not(shardwheel_loom)))]
fn current_cpu() -> Option<usize> {
    // SAFETY: `sched_getcpu` has no preconditions; it returns -1 on error.
    usize::try_from(unsafe { libc::sched_getcpu() }).ok()
}

/// The CPU this thread runs on: not known on this system (or under loom).
#[cfg(not(all(target_os = "linux", not(shardwheel_loom))))]
fn current_cpu() -> Option<usize> {
    None
}

#[cfg(all(test, not(shardwheel_loom)))]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// Two shards pinned to CPUs 0 and 1, with `homes[i]` threads homed on shard `i`.
    fn two_cpus(homes: [usize; 2]) -> Placement {
        let pins = [
            core_affinity::CoreId { id: 0 },
            core_affinity::CoreId { id: 1 },
        ];
        let placement = Placement::new(2, &pins);
        for (shard, &count) in homes.iter().enumerate() {
            (0..count).for_each(|_| placement.took_home(shard));
        }
        placement
    }

    fn homed_on(shard: usize) -> Home {
        let home = Home::new();
        home.ordinal.set(shard);
        home
    }

    /// `count` readings on `cpu` of a thread homed on shard `current`, spread evenly over
    /// `from..=to` after `start`.
    fn readings(
        placement: &Placement,
        home: &Home,
        (current, cpu): (usize, usize),
        count: u32,
        (start, from, to): (Instant, Duration, Duration),
    ) {
        for k in 0..count {
            let at = from + (to - from) * k / (count - 1).max(1);
            placement.seen_on(home, current, cpu, start + at);
        }
    }

    #[test]
    fn a_thread_moves_home_only_after_readings_away_for_long_enough() {
        // Two threads that swapped CPUs: this one, homed on shard 0, runs on CPU 1, where the
        // other thread's home is.
        let placement = two_cpus([1, 1]);
        let home = homed_on(0);
        let start = Instant::now();
        let few = AWAY_READINGS - 1;
        readings(
            &placement,
            &home,
            (0, 1),
            few,
            (start, Duration::ZERO, AWAY_FOR * 2),
        );
        assert_eq!(home.ordinal.get(), 0, "moved after too few readings");
        // One reading back on the home CPU starts the run again.
        placement.seen_on(&home, 0, 0, start + AWAY_FOR * 2);
        let (from, short) = (AWAY_FOR * 3, AWAY_FOR - Duration::from_millis(1));
        readings(
            &placement,
            &home,
            (0, 1),
            2 * AWAY_READINGS,
            (start, from, from + short),
        );
        assert_eq!(
            home.ordinal.get(),
            0,
            "moved before it was away for long enough"
        );
        placement.seen_on(&home, 0, 1, start + from + AWAY_FOR);
        assert_eq!(home.ordinal.get(), 1);
        assert_eq!(home.away_since.get(), None);
        assert_eq!((placement.homes(0), placement.homes(1)), (0, 2));
    }

    #[test]
    fn a_thread_alone_on_its_shard_stays_beside_it_on_an_unused_cpu() {
        let placement = two_cpus([1, 0]);
        let home = homed_on(0);
        let start = Instant::now();
        let many = 4 * AWAY_READINGS;
        readings(
            &placement,
            &home,
            (0, 1),
            many,
            (start, Duration::ZERO, AWAY_FOR * 4),
        );
        assert_eq!(home.ordinal.get(), 0);
        // Once another thread shares its shard, it moves.
        placement.took_home(0);
        readings(
            &placement,
            &home,
            (0, 1),
            many,
            (start, AWAY_FOR * 5, AWAY_FOR * 9),
        );
        assert_eq!(home.ordinal.get(), 1);
    }

    #[test]
    fn a_cpu_without_shards_is_no_reason_to_move() {
        let placement = two_cpus([1, 1]);
        let home = homed_on(1);
        let start = Instant::now();
        let many = 4 * AWAY_READINGS;
        readings(
            &placement,
            &home,
            (1, 7),
            many,
            (start, Duration::ZERO, AWAY_FOR * 4),
        );
        assert_eq!(home.ordinal.get(), 1);
    }

    #[test]
    fn a_worker_keeps_its_shard() {
        let placement = two_cpus([0, 0]);
        std::thread::spawn(move || {
            set_home(1);
            for _ in 0..4 * RECHECK_EVERY {
                assert_eq!(placement.home(), 1);
            }
        })
        .join()
        .unwrap();
    }
}
