//! The one place that chooses between `std` and `loom` synchronization.
//!
//! Everything else in the crate imports atomics, `Arc`, `Mutex` and threads from here. Under
//! `--cfg shardwheel_loom` they are loom's model-checked types. (The inbox's message queue is the
//! crate's own, `engine/queue.rs`, built on these, so loom sees it whole.)

#[cfg(not(shardwheel_loom))]
pub(crate) use std::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(not(shardwheel_loom))]
pub(crate) use std::sync::{Arc, Mutex, MutexGuard};
#[cfg(not(shardwheel_loom))]
pub(crate) use std::thread;

#[cfg(shardwheel_loom)]
pub(crate) use loom::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(shardwheel_loom)]
pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};
#[cfg(shardwheel_loom)]
pub(crate) use loom::thread;

#[cfg(shardwheel_loom)]
pub(crate) use loom::thread_local;
#[cfg(not(shardwheel_loom))]
pub(crate) use std::thread_local;

/// Interior mutability whose accesses loom checks (`with` for reading, `with_mut` for
/// writing, through raw pointers); plain `std::cell::UnsafeCell` otherwise.
#[cfg(shardwheel_loom)]
pub(crate) use loom::cell::UnsafeCell;

/// `std::cell::UnsafeCell` with loom's access API (see the loom variant).
#[cfg(not(shardwheel_loom))]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(shardwheel_loom))]
impl<T> UnsafeCell<T> {
    pub(crate) fn new(value: T) -> UnsafeCell<T> {
        UnsafeCell(std::cell::UnsafeCell::new(value))
    }

    #[inline]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    #[inline]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// Set-once cell. Only used to publish a shard thread's handle before that thread first parks,
/// which the inbox's flags already order, so loom need not see it.
pub(crate) use std::sync::OnceLock;

/// The process-wide default timer's cells ([`default_timer`](mod@crate::default_timer)):
/// plain `std` even under loom, because no model uses the default timer.
pub(crate) mod process {
    pub(crate) use std::sync::{Mutex, OnceLock};
}

/// Reference counting for registries that must hand out weak references (loom's `Arc` has no
/// `Weak`): only the manual clock's list of engines to drive.
pub(crate) mod registry {
    pub(crate) use std::sync::{Arc, Weak};
}

/// Statistics counters and id generators: plain `std` atomics even under loom, because they
/// order nothing (they are only summed for [`Stats`](crate::Stats)) and loom need not explore
/// them.
pub(crate) mod statistics {
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
}

/// Dekker's protocol (store, then load the other side's word) needs store-load ordering on
/// both sides: each side's write must be globally visible before its read. Every such pair in
/// this crate (for one, a lazy reset's `swap` of the deadline against the shard's
/// compare-and-swap taking the deadline lock, see `engine/slot/`) writes with a
/// read-modify-write, and goes through the functions below, which glue the fence to the
/// read-modify-write: there is no free-standing fence that a plain `store` could be put in
/// front of.
///
/// On x86 every read-modify-write is a locked instruction, which already is a full fence, so
/// only the compiler is held back (crossbeam-epoch relies on the same fact); elsewhere, and under
/// loom (which models `fence(SeqCst)` but not the hardware), this is `fence(SeqCst)`. The
/// shortcut is kept because on x86 `fence(SeqCst)` is a second locked instruction (`lock or` on
/// the stack) right after the first, a measurable cost per reset when its loads miss the cache.
/// It is why the pairing must not be broken: with a plain `store` before it, a compiler
/// fence orders nothing on x86 while every loom model (which runs the real fence) still passes.
#[inline]
fn fence_after_read_modify_write() {
    #[cfg(all(any(target_arch = "x86", target_arch = "x86_64"), not(shardwheel_loom)))]
    std::sync::atomic::compiler_fence(Ordering::SeqCst);
    #[cfg(all(
        not(any(target_arch = "x86", target_arch = "x86_64")),
        not(shardwheel_loom)
    ))]
    std::sync::atomic::fence(Ordering::SeqCst);
    #[cfg(shardwheel_loom)]
    loom::sync::atomic::fence(Ordering::SeqCst);
}

/// `atomic.swap(value, order)`, then a sequentially consistent fence (see
/// [`fence_after_read_modify_write`]).
#[inline]
pub(crate) fn swap_then_fence(atomic: &AtomicU64, value: u64, order: Ordering) -> u64 {
    let old = atomic.swap(value, order);
    fence_after_read_modify_write();
    old
}

/// `atomic.compare_exchange_weak(..)`, then, if it succeeded, a sequentially consistent fence
/// (see [`fence_after_read_modify_write`]).
#[inline]
pub(crate) fn compare_exchange_weak_then_fence(
    atomic: &AtomicU64,
    current: u64,
    new: u64,
    success: Ordering,
    failure: Ordering,
) -> Result<u64, u64> {
    let result = atomic.compare_exchange_weak(current, new, success, failure);
    if result.is_ok() {
        fence_after_read_modify_write();
    }
    result
}

/// `atomic.compare_exchange(..)` on a flag, then, if it succeeded, a sequentially consistent
/// fence (see [`fence_after_read_modify_write`]).
#[inline]
pub(crate) fn compare_exchange_flag_then_fence(
    atomic: &AtomicBool,
    current: bool,
    new: bool,
    success: Ordering,
    failure: Ordering,
) -> Result<bool, bool> {
    let result = atomic.compare_exchange(current, new, success, failure);
    if result.is_ok() {
        fence_after_read_modify_write();
    }
    result
}

/// `atomic.fetch_add(value, order)`, then a sequentially consistent fence (see
/// [`fence_after_read_modify_write`]).
#[inline]
pub(crate) fn fetch_add_then_fence(atomic: &AtomicU64, value: u64, order: Ordering) -> u64 {
    let old = atomic.fetch_add(value, order);
    fence_after_read_modify_write();
    old
}

/// `atomic.fetch_or(value, order)`, then a sequentially consistent fence (see
/// [`fence_after_read_modify_write`]).
#[inline]
pub(crate) fn fetch_or_then_fence(atomic: &AtomicU64, value: u64, order: Ordering) -> u64 {
    let old = atomic.fetch_or(value, order);
    fence_after_read_modify_write();
    old
}

/// `atomic.compare_exchange(..)` on a pointer, then, if it succeeded, a sequentially consistent
/// fence (see [`fence_after_read_modify_write`]).
#[inline]
pub(crate) fn compare_exchange_ptr_then_fence<T>(
    atomic: &AtomicPtr<T>,
    current: *mut T,
    new: *mut T,
    success: Ordering,
    failure: Ordering,
) -> Result<*mut T, *mut T> {
    let result = atomic.compare_exchange(current, new, success, failure);
    if result.is_ok() {
        fence_after_read_modify_write();
    }
    result
}

/// An asymmetric barrier: a store-load fence split between a *light* side, run often, and a
/// *heavy* side, run rarely, that together order what a fence on each side would (Dekker's
/// protocol, as in [`fence_after_read_modify_write`], with one side's cost moved to the other).
///
/// On Linux the heavy side is `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`: the kernel runs a
/// full fence on every CPU that is running a thread of this process, and a thread that is not
/// running passes one when it is next scheduled. So a light side that is only a compiler fence
/// (its store and load stay in program order in the instruction stream) pairs with it: if the
/// light side's load missed the heavy side's store, the fence that interrupted it came after
/// that load, so its earlier store was drained to memory before `membarrier` returned, and the
/// heavy side's load sees it. The protocol is the one of liburcu's and folly's asymmetric fences.
///
/// [`init`](asymmetric::init) registers the process once (the expedited command needs it); if
/// that fails (not Linux, a kernel before 4.14, a seccomp filter) both sides are
/// `fence(SeqCst)`. The choice is made before the first light side it pairs with can run (see
/// `init`) and never changes. Under loom both sides are `fence(SeqCst)`: the models check the
/// protocol that uses the barrier, not the kernel's part of it.
pub(crate) mod asymmetric {
    #[cfg(not(shardwheel_loom))]
    use std::sync::atomic::{AtomicU8, Ordering};

    /// Not decided yet: both sides fence.
    #[cfg(not(shardwheel_loom))]
    const UNDECIDED: u8 = 0;
    /// `membarrier` is registered: the light side is a compiler fence.
    #[cfg(not(shardwheel_loom))]
    const MEMBARRIER: u8 = 1;
    /// No `membarrier`: both sides fence.
    #[cfg(not(shardwheel_loom))]
    const FENCES: u8 = 2;

    #[cfg(not(shardwheel_loom))]
    static MODE: AtomicU8 = AtomicU8::new(UNDECIDED);

    /// Decides how the barrier works, once per process. Must return before any light side
    /// that pairs with a heavy side runs: callers run it when they build the structure whose
    /// protocol uses the barrier (the light side runs on a thread that has seen it built, and
    /// so this store).
    pub(crate) fn init() {
        #[cfg(not(shardwheel_loom))]
        if MODE.load(Ordering::Acquire) == UNDECIDED {
            let mode = if register() { MEMBARRIER } else { FENCES };
            // Racing first calls may decide differently only if registration can fail and
            // then succeed; the first decision stands.
            let _ = MODE.compare_exchange(UNDECIDED, mode, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// The light side: between a store and a load of the protocol.
    #[inline]
    pub(crate) fn light() {
        #[cfg(not(shardwheel_loom))]
        if MODE.load(Ordering::Relaxed) == MEMBARRIER {
            std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
        } else {
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        }
        #[cfg(shardwheel_loom)]
        loom::sync::atomic::fence(loom::sync::atomic::Ordering::SeqCst);
    }

    /// The heavy side: between a store and a load of the protocol. False if it could not
    /// order anything (`membarrier` failed after registering, which the kernel does not do):
    /// the caller must then act as if its load saw nothing it can rely on.
    #[must_use]
    pub(crate) fn heavy() -> bool {
        #[cfg(not(shardwheel_loom))]
        {
            match MODE.load(Ordering::Acquire) {
                MEMBARRIER => membarrier(),
                _ => {
                    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
                    true
                }
            }
        }
        #[cfg(shardwheel_loom)]
        {
            loom::sync::atomic::fence(loom::sync::atomic::Ordering::SeqCst);
            true
        }
    }

    /// `membarrier` commands (`linux/membarrier.h`).
    #[cfg(all(target_os = "linux", not(shardwheel_loom)))]
    const PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
    #[cfg(all(target_os = "linux", not(shardwheel_loom)))]
    const REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

    /// Registers the process for expedited private `membarrier`; true iff done.
    #[cfg(not(shardwheel_loom))]
    fn register() -> bool {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: `membarrier` takes two integers and a CPU number and touches no memory
            // of ours; an unknown command fails with an error code.
            let result =
                unsafe { libc::syscall(libc::SYS_membarrier, REGISTER_PRIVATE_EXPEDITED, 0, 0) };
            result == 0 && membarrier()
        }
        #[cfg(not(target_os = "linux"))]
        false
    }

    /// Runs the heavy fence; true iff the kernel did.
    #[cfg(not(shardwheel_loom))]
    fn membarrier() -> bool {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: as in `register`.
            unsafe { libc::syscall(libc::SYS_membarrier, PRIVATE_EXPEDITED, 0, 0) == 0 }
        }
        #[cfg(not(target_os = "linux"))]
        false
    }
}

/// Locks a mutex, recovering the data if a panicking thread poisoned it (the engine never
/// panics while holding one, but user code must not be able to wedge it).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Runs a concurrency test: under `--cfg shardwheel_loom` as a loom model exploring every interleaving
/// (within `LOOM_MAX_PREEMPTIONS`), otherwise once as a plain test. For models inside the crate;
/// the `loom-tests` crate has its own `loom_tests::model` (the same `loom::model` call), so this
/// module stays private.
#[allow(dead_code)] // No model inside the crate uses it yet.
pub fn model<F>(test: F)
where
    F: Fn() + Sync + Send + 'static,
{
    #[cfg(shardwheel_loom)]
    loom::model(test);
    #[cfg(not(shardwheel_loom))]
    test();
}
