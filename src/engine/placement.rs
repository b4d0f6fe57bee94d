//! Which shard a thread schedules on (its home shard), and the per-thread numbering behind it
//! and behind striped counters. The home-shard policy is described here and only here.
//!
//! # The home-shard policy
//!
//! A thread's home shard is chosen at its first schedule and kept:
//!
//! 1. A shard's own worker thread uses its own shard ([`set_home`]).
//! 2. Otherwise, where the thread's CPU is known (pinned shards on Linux, not under loom), a
//!    shard pinned to the CPU it runs on then: the messages and the shard's entries stay in that
//!    core's caches (a submitter and its shard time-share the core). Among that CPU's shards,
//!    the one the fewest threads took as home so far, unless another shard anywhere has fewer
//!    (new threads often first run on the CPU that spawned them); see [`Placement::home`].
//! 3. Otherwise (no pinning, other systems, loom) the threads are spread round-robin in the
//!    order they first schedule: the thread's ordinal, modulo the shard count.
//!
//! Kept, not chosen again at each schedule: a thread's timers stay on one shard, so a thread
//! that moves between CPUs does not shift its timers from one shard's tables to another's
//! (which grew memory).
//!
//! # Thread numbers
//!
//! Each thread gets two numbers the first time it needs them, both kept in thread-locals: its
//! home ordinal (above) and its stripe of striped counters
//! ([`counter_stripe`](crate::stats::counter_stripe), with the counters in `stats.rs`). They are
//! separate so that a thread that only resets timers never picks a home shard.

use crate::sync::thread_local;
use std::cell::Cell;

#[cfg(not(shardwheel_loom))]
thread_local! {
    /// This thread's home shard ordinal (taken modulo the shard count); `usize::MAX` = unset.
    static HOME: Cell<usize> = const { Cell::new(usize::MAX) };
}

// Loom's thread-locals take no `const` initializers.
#[cfg(shardwheel_loom)]
thread_local! {
    static HOME: Cell<usize> = Cell::new(usize::MAX);
}

/// Where the shards are, for choosing threads' home shards.
#[derive(Debug)]
pub(crate) struct Placement {
    /// For each CPU, the shards whose threads are pinned to it (empty where none is, or
    /// without pinning).
    shards_by_cpu: Box<[Box<[usize]>]>,
    /// Threads that took each shard as their home by CPU (never decremented: a placement hint).
    homed: Box<[crate::sync::statistics::AtomicUsize]>,
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
            homed: (0..shard_count)
                .map(|_| crate::sync::statistics::AtomicUsize::new(0))
                .collect(),
        }
    }

    /// This thread's home shard: its ordinal among the shards (see the
    /// [policy](self#the-home-shard-policy)).
    pub(crate) fn home(&self) -> usize {
        let shard_count = self.homed.len();
        let ordinal = home_ordinal(|| {
            let on_cpu = self.shards_by_cpu.get(current_cpu()?)?;
            let homed =
                |shard: &usize| self.homed[*shard].load(std::sync::atomic::Ordering::Relaxed);
            let local = on_cpu.iter().copied().min_by_key(homed)?;
            let fewest = (0..shard_count).min_by_key(homed)?;
            let chosen = if homed(&local) <= homed(&fewest) {
                local
            } else {
                fewest
            };
            self.homed[chosen].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Some(chosen)
        });
        if ordinal < shard_count {
            ordinal
        } else {
            ordinal % shard_count
        }
    }
}

/// Makes shard `ordinal` this thread's home: a shard's worker thread, at its start.
pub(crate) fn set_home(ordinal: usize) {
    HOME.with(|home| home.set(ordinal));
}

/// The ordinal this thread submits to (modulo the shard count), chosen at its first schedule
/// and kept: `first()` where it chooses, else the thread's round-robin number.
fn home_ordinal(first: impl FnOnce() -> Option<usize>) -> usize {
    static NEXT: crate::sync::statistics::AtomicUsize =
        crate::sync::statistics::AtomicUsize::new(0);
    HOME.with(|home| {
        if home.get() == usize::MAX
            && let Some(ordinal) = first()
        {
            home.set(ordinal);
        }
        numbered(home, &NEXT)
    })
}

/// The number in `cell`, or, the first time (`usize::MAX`), the next one of `next`.
fn numbered(cell: &Cell<usize>, next: &crate::sync::statistics::AtomicUsize) -> usize {
    let value = cell.get();
    if value != usize::MAX {
        return value;
    }
    let value = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    cell.set(value);
    value
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
