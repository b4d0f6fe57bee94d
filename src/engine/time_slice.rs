//! Short time slices for the engine's threads: a woken shard gets its CPU sooner.
//!
//! A shard thread wakes for a tick, works briefly, and sleeps again; every timer it expires is
//! late by however long the thread waited for a CPU after it woke. On a busy CPU that wait is
//! the rest of whatever runs there: another thread's turn, or a kernel thread's (README's notes
//! on the storm workload show one stalling a pinned shard).
//!
//! Linux's EEVDF scheduler (6.12 and later) lets a thread of the normal policy ask for a
//! shorter slice (`sched_attr.sched_runtime`, clamped to 0.1-100 ms; no privilege needed).
//! The thread's virtual deadline then comes sooner: when it wakes, it preempts a thread that
//! asked for a longer slice, instead of waiting for that thread's turn to end. The cost: when
//! it competes for a CPU for long, it runs in shorter turns (more context switches). The
//! engine's threads run little and rarely for long, so they ask for the shortest slice: the
//! shard threads, and the threads of the engine's own expiry pool (a task's lateness is
//! measured when it runs there). A caller's own pool is left alone.
//!
//! Best effort, as pinning is: other systems, kernels before 6.12 (which accept the field and
//! ignore it: the slice read back tells), and real-time or idle policies change nothing, and
//! [`ShardStats::short_time_slice`](crate::ShardStats::short_time_slice) says whether a shard
//! thread got it. [`Builder::short_time_slices`](crate::Builder::short_time_slices) turns the
//! request off.
//!
//! # Waking on time
//!
//! A shard sleeps until its next tick starts with a timed park. Linux ends such a sleep up to
//! the thread's *timer slack* late (50 µs by default), to batch wake-ups; every timer of that
//! tick is then as much later. A shard thread asks for a slack of 1 ns
//! ([`exact_wake_ups_for_current_thread`]): its few wake-ups a second are worth their own
//! interrupt. It changes nothing but when a timed sleep ends, so it is always asked for.

/// Asks the scheduler for the shortest slice for the calling thread, keeping its policy and
/// nice value; true if the slice read back is the one asked for.
pub(crate) fn request_for_current_thread() -> bool {
    #[cfg(all(target_os = "linux", not(shardwheel_loom)))]
    return linux::request();
    #[cfg(not(all(target_os = "linux", not(shardwheel_loom))))]
    return false;
}

/// Asks the kernel to end the calling thread's timed sleeps on time: a timer slack of 1 ns
/// (see [Waking on time](self#waking-on-time)). Best effort: nothing to report.
pub(crate) fn exact_wake_ups_for_current_thread() {
    #[cfg(all(target_os = "linux", not(shardwheel_loom)))]
    linux::exact_wake_ups();
}

#[cfg(all(target_os = "linux", not(shardwheel_loom)))]
mod linux {
    /// The shortest slice Linux grants, in nanoseconds.
    const SLICE_NANOS: u64 = 100_000;
    const SCHED_OTHER: u32 = 0;
    const SCHED_BATCH: u32 = 3;
    const SCHED_FLAG_RESET_ON_FORK: u64 = 1;

    /// `struct sched_attr` as of its first version (`SCHED_ATTR_SIZE_VER0`, 48 bytes).
    #[repr(C)]
    #[derive(Default)]
    struct SchedAttr {
        size: u32,
        policy: u32,
        flags: u64,
        nice: i32,
        priority: u32,
        runtime: u64,
        deadline: u64,
        period: u64,
    }

    const SIZE: u32 = std::mem::size_of::<SchedAttr>() as u32;
    const _: () = assert!(SIZE == 48, "SCHED_ATTR_SIZE_VER0");

    /// The calling thread's scheduling attributes.
    fn get() -> Option<SchedAttr> {
        let mut attr = SchedAttr::default();
        // SAFETY: `sched_getattr(0, attr, size, 0)` writes at most `size` bytes into `attr`, a
        // live, writable `SchedAttr` of exactly `SIZE` bytes; it keeps no pointer.
        let result = unsafe {
            libc::syscall(
                libc::SYS_sched_getattr,
                0,
                &mut attr as *mut SchedAttr,
                SIZE,
                0u32,
            )
        };
        (result == 0).then_some(attr)
    }

    pub(super) fn exact_wake_ups() {
        // SAFETY: `prctl(PR_SET_TIMERSLACK, n)` takes an integer and touches no memory of ours.
        unsafe {
            libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
        }
    }

    pub(super) fn request() -> bool {
        let Some(mut attr) = get() else {
            return false;
        };
        if attr.policy != SCHED_OTHER && attr.policy != SCHED_BATCH {
            return false;
        }
        if attr.runtime != SLICE_NANOS {
            // Same policy and nice value (changing either may need a privilege); a new slice.
            attr.size = SIZE;
            attr.flags &= SCHED_FLAG_RESET_ON_FORK;
            attr.runtime = SLICE_NANOS;
            // SAFETY: `sched_setattr(0, attr, 0)` reads `attr.size` (= `SIZE`) bytes from a
            // live, initialized `SchedAttr`; it keeps no pointer.
            let result = unsafe {
                libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0u32)
            };
            if result != 0 {
                return false;
            }
        }
        // Kernels before 6.12 accept the field for the normal policy and ignore it (they
        // read back 0).
        get().is_some_and(|now| now.runtime == SLICE_NANOS)
    }
}
