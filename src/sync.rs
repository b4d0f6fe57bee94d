//! The one place that chooses between `std` and `loom` synchronization.
//!
//! Everything else in the crate imports atomics, `Arc`, `Mutex` and threads from here. Under
//! `--cfg shardwheel_loom` they are loom's model-checked types. (The inbox's message queue is the
//! crate's own, `engine/queue.rs`, built on these, so loom sees it whole.)

#[cfg(not(shardwheel_loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(shardwheel_loom))]
pub(crate) use std::sync::{Arc, Mutex, MutexGuard};
#[cfg(not(shardwheel_loom))]
pub(crate) use std::thread;

#[cfg(shardwheel_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
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
