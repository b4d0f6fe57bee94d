//! Keeping an engine's memory alive for the sleeps of an owned [`Timer`](crate::Timer) without
//! a locked instruction per sleep.
//!
//! # Why
//!
//! A [`Sleep`](crate::Sleep) of an owned timer must keep the engine's memory (its shards' slot
//! tables) alive until it is dropped, even if the timer is dropped first. An `Arc` clone per
//! sleep does that with one count for the whole engine: the workers of a multi-threaded
//! executor then all write the same cache line twice per timeout, each time with a locked
//! instruction. A [`Lease`] counts on its thread's own *stripe* of the engine's [`Leases`]
//! instead, with a plain load and store: taken on the thread that makes the sleep, given back
//! on the thread that drops it (which may be another: a stripe's count may go below zero, only
//! the sum means anything).
//!
//! # Stripes
//!
//! A thread's stripe is its [`counter_stripe`] ordinal: the first `OWN_STRIPES` living threads
//! each hold one, written by that thread only (a thread that takes over an exited thread's
//! ordinal does so through a lock, which orders the two). Threads beyond them count on two
//! shared counters with read-modify-writes: `shared_taken`, and `shared_dropped`.
//!
//! # How the memory is let go
//!
//! While the timer lives, its [`Owner`] holds one strong count of the engine's `Arc`, and the
//! leases need none of their own. When the timer's last clone drops, the `Owner` *retires*: it
//! keeps that strong count for the leases, sets `retired`, runs the heavy side of the
//! [asymmetric barrier](crate::sync::asymmetric), and counts the leases still out: the sum of
//! the stripes plus `shared_taken` minus `shared_dropped` (read with a read-modify-write that
//! sets `CLOSED` in it). Every lease taken is counted in that sum: taking one needs the timer,
//! whose drop happened before. A lease dropped after the count is *late*: it subtracts one from
//! `unsettled` instead, to which the `Owner` adds the sum; whoever brings `unsettled` to zero
//! gives the strong count back (`Arc::from_raw`), dropping the engine if it was the last.
//! (`unsettled` starts at zero, the late drops take it below, the `Owner`'s sum above: only
//! the last of these read-modify-writes lands on zero.)
//!
//! A drop on an own stripe stores the stripe's new count with `BUSY` set, runs the light side
//! of the barrier, and reads `retired`:
//!
//! | `retired` read | the drop | why the `Owner`'s count agrees |
//! |----------------|----------|--------------------------------|
//! | false | stores the count without `BUSY`: done | the barrier: the `Owner`'s read of the stripe sees the `BUSY` store or a later one, and it waits until `BUSY` is gone |
//! | true | stores the old count back (without `BUSY`), then is late | the `Owner` read the old count, or waits out `BUSY` and reads the old count again: either way the lease is counted |
//!
//! A drop on the shared counters adds one to `shared_dropped`: late iff `CLOSED` was set. A
//! lease's drop touches the engine's memory last with the store that ends it, or, if late, its
//! subtraction from `unsettled`, which it was counted in: no access after the free.
//!
//! Model: `owned_sleeps_outlive_their_timer` in `loom-tests/`. Every `unsafe` of the scheme is in
//! this file.

use crate::stats::{OWN_STRIPES, counter_stripe};
use crate::sync::{Arc, AtomicBool, AtomicUsize, Ordering, asymmetric, thread};
use crossbeam_utils::CachePadded;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::ptr::NonNull;

/// An own stripe's low bit: a drop is between its store and its read of `retired`. The count
/// is kept in the bits above it (times two, wrapping).
const BUSY: usize = 1;
/// `shared_dropped`'s top bit: the `Owner` has counted the shared drops.
const CLOSED: usize = 1 << (usize::BITS - 1);

/// Anything whose memory [`Lease`]s can keep alive: it carries their [`Leases`].
pub(crate) trait Leasable {
    /// What a lease on a value that is never dropped holds besides the value: a part of it
    /// (on a line of its own) that the lease's holder reads without reading the value.
    type Line: 'static;

    /// The leases' counts.
    fn leases(&self) -> &Leases;

    /// Its [`Line`](Self::Line).
    fn line(&self) -> &Self::Line;
}

/// The striped lease counts of one engine (see the [module](self)).
#[derive(Debug)]
pub(crate) struct Leases {
    /// Per own stripe: leases taken minus leases dropped on it, times two, plus `BUSY`.
    own: Box<[CachePadded<AtomicUsize>]>,
    /// Leases taken by threads without an own stripe.
    shared_taken: CachePadded<AtomicUsize>,
    /// Leases dropped by threads without an own stripe, plus `CLOSED`.
    shared_dropped: CachePadded<AtomicUsize>,
    /// The `Owner` has retired.
    retired: AtomicBool,
    /// After the retirement: leases out, minus late drops (wrapping; see the module).
    unsettled: AtomicUsize,
}

impl Default for Leases {
    fn default() -> Leases {
        asymmetric::init();
        Leases {
            own: (0..OWN_STRIPES)
                .map(|_| CachePadded::new(AtomicUsize::new(0)))
                .collect(),
            shared_taken: CachePadded::new(AtomicUsize::new(0)),
            shared_dropped: CachePadded::new(AtomicUsize::new(0)),
            retired: AtomicBool::new(false),
            unsettled: AtomicUsize::new(0),
        }
    }
}

impl Leases {
    /// Adds `count` to `unsettled` (wrapping); true iff that brought it to zero: the caller
    /// gives the strong count back.
    fn settle(&self, count: usize) -> bool {
        self.unsettled
            .fetch_add(count, Ordering::AcqRel)
            .wrapping_add(count)
            == 0
    }

    /// Counts one lease taken on this thread.
    #[inline]
    fn take(&self) {
        let ordinal = counter_stripe();
        match self.own.get(ordinal) {
            Some(stripe) => {
                stripe.store(
                    stripe.load(Ordering::Relaxed).wrapping_add(2),
                    Ordering::Relaxed,
                );
            }
            None => {
                self.shared_taken.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Counts one lease dropped on this thread: true iff late (see the module).
    #[inline]
    fn give_back(&self) -> bool {
        let ordinal = counter_stripe();
        let Some(stripe) = self.own.get(ordinal) else {
            return self.shared_dropped.fetch_add(1, Ordering::AcqRel) & CLOSED != 0;
        };
        let before = stripe.load(Ordering::Relaxed);
        stripe.store(before.wrapping_sub(2) | BUSY, Ordering::Relaxed);
        asymmetric::light();
        if !self.retired.load(Ordering::Relaxed) {
            // Release: the sleep's accesses to the engine, before the `Owner` may free it.
            stripe.store(before.wrapping_sub(2), Ordering::Release);
            return false;
        }
        stripe.store(before, Ordering::Release);
        true
    }

    /// The `Owner`'s retirement: the leases still out (see the module). `None` if the barrier
    /// failed: nothing can be told, and the value is never freed.
    fn retire(&self) -> Option<usize> {
        self.retired.store(true, Ordering::Relaxed);
        if !asymmetric::heavy() {
            return None;
        }
        // Acquire: the takes (ordered before the timer's drop anyway) and every drop counted.
        let mut out = self.shared_taken.load(Ordering::Acquire);
        let dropped = self.shared_dropped.fetch_or(CLOSED, Ordering::AcqRel);
        out = out.wrapping_sub(dropped);
        for stripe in self.own.iter() {
            let count = loop {
                let word = stripe.load(Ordering::Acquire);
                if word & BUSY == 0 {
                    break word;
                }
                // A drop between two of its stores (a few instructions).
                thread::yield_now();
            };
            // Times two, wrapping: an arithmetic shift halves a negative count too.
            out = out.wrapping_add(((count as isize) >> 1) as usize);
        }
        Some(out)
    }
}

/// The one strong handle of a leased value that its leases depend on (the [`Timer`]'s engine).
/// Dropping it retires: the strong count goes to the leases (see the [module](self)).
///
/// [`Timer`]: crate::Timer
pub(crate) struct Owner<T: Leasable + 'static>(ManuallyDrop<Arc<T>>);

impl<T: Leasable + 'static> Owner<T> {
    /// Takes over `value`, the one handle to stand for its leases.
    pub(crate) fn new(value: Arc<T>) -> Owner<T> {
        Owner(ManuallyDrop::new(value))
    }

    /// A lease on the value, counted on this thread's stripe.
    #[inline]
    pub(crate) fn lease(&self) -> Lease<T> {
        self.0.leases().take();
        Lease::Counted(NonNull::from(&**self.0))
    }
}

impl<T: Leasable + 'static> Deref for Owner<T> {
    type Target = Arc<T>;

    #[inline]
    fn deref(&self) -> &Arc<T> {
        &self.0
    }
}

impl<T: Leasable + 'static> Drop for Owner<T> {
    fn drop(&mut self) {
        // SAFETY: `self.0` is taken once, here, and never used again.
        let value = unsafe { ManuallyDrop::take(&mut self.0) };
        let raw = Arc::into_raw(value);
        // SAFETY: the strong count `into_raw` kept is not given back until `unsettled` reaches
        // zero after the count below is added.
        let leases = unsafe { &*raw }.leases();
        let Some(out) = leases.retire() else {
            return; // The count could not be made: keep the value forever.
        };
        if leases.settle(out) {
            // SAFETY: `raw` came from `into_raw` above, and every lease is dropped: none is
            // left to read the value, and this gives back the one count kept for them.
            drop(unsafe { Arc::from_raw(raw) });
        }
    }
}

/// Keeps a leased value's memory alive until dropped, like an `Arc` clone, counted on its
/// thread's stripe of the [`Leases`] (see the [module](self)); or plain references to a value
/// that is never dropped and to its [`Line`](Leasable::Line) ([`forever`](Self::forever)). Two
/// words either way.
///
/// An enum of references, as the reference it replaced in [`Sleep`](crate::Sleep) was: with a
/// struct of the same size in its place, the compiler copied a `Timeout` once more on its way
/// into an `.await` (`callgrind` counted two `memcpy` calls per timeout instead of one).
pub(crate) enum Lease<T: Leasable + 'static> {
    /// Counted: the pointer is valid while this lease lives.
    Counted(NonNull<T>),
    /// On a value that is never dropped, and its line: counts nothing.
    Forever(Forever<T>),
}

/// A value that is never dropped and its [`Line`](Leasable::Line), read once: what a
/// [`Lease::forever`] holds. Copied by whoever makes such leases often (the default timer's
/// sleeps), so that making one reads neither.
pub(crate) struct Forever<T: Leasable + 'static> {
    value: &'static T,
    line: &'static T::Line,
}

impl<T: Leasable + 'static> Forever<T> {
    /// `value`'s.
    #[inline]
    pub(crate) fn new(value: &'static T) -> Forever<T> {
        Forever {
            value,
            line: value.line(),
        }
    }

    /// The value.
    #[inline]
    pub(crate) fn value(self) -> &'static T {
        self.value
    }
}

impl<T: Leasable + 'static> Clone for Forever<T> {
    fn clone(&self) -> Forever<T> {
        *self
    }
}

impl<T: Leasable + 'static> Copy for Forever<T> {}

impl<T: Leasable + 'static> std::fmt::Debug for Forever<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forever").finish_non_exhaustive()
    }
}

// SAFETY: a lease is a shared reference to a `T` that it keeps alive, as an `Arc<T>` is.
unsafe impl<T: Leasable + Send + Sync + 'static> Send for Lease<T> {}
// SAFETY: as for `Send`.
unsafe impl<T: Leasable + Send + Sync + 'static> Sync for Lease<T> {}

impl<T: Leasable + 'static> Deref for Lease<T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        match self {
            // SAFETY: this lease's count keeps the value alive (see the module).
            Lease::Counted(value) => unsafe { value.as_ref() },
            Lease::Forever(forever) => forever.value,
        }
    }
}

impl<T: Leasable + 'static> Lease<T> {
    /// A lease on a value that is never dropped: it counts nothing.
    #[inline]
    pub(crate) fn forever(forever: Forever<T>) -> Lease<T> {
        Lease::Forever(forever)
    }

    /// The value, if this lease is on one that is never dropped ([`forever`](Self::forever)).
    #[inline]
    pub(crate) fn as_forever(&self) -> Option<&'static T> {
        match self {
            Lease::Forever(forever) => Some(forever.value),
            Lease::Counted(_) => None,
        }
    }

    /// The value's [`Line`](Leasable::Line): on a value that is never dropped, without reading
    /// the value.
    #[inline]
    pub(crate) fn line(&self) -> &T::Line {
        match self {
            Lease::Forever(forever) => forever.line,
            Lease::Counted(_) => (**self).line(),
        }
    }

    /// The end of a late drop: settles it (out of line, so that the common drop stays small).
    #[cold]
    #[inline(never)]
    fn settle_late(&self) {
        // `unsettled` counts this lease, so the value is still here.
        if self.leases().settle(1usize.wrapping_neg()) {
            // SAFETY: the value came from an `Arc` (`Owner::lease` took the pointer from the
            // `Owner`'s), whose retirement kept one strong count for the leases; every lease
            // is now dropped, so this is the one place that gives it back.
            drop(unsafe { Arc::from_raw(&**self as *const T) });
        }
    }
}

impl<T: Leasable + 'static> Drop for Lease<T> {
    #[inline]
    fn drop(&mut self) {
        let Lease::Counted(_) = *self else {
            return;
        };
        // After a drop that is not late, the value may be gone.
        if self.leases().give_back() {
            self.settle_late();
        }
    }
}

#[cfg(all(test, not(shardwheel_loom)))]
mod tests {
    use super::*;
    use std::sync::Barrier;
    use std::sync::atomic::AtomicUsize as Count;

    /// A leasable value that counts its drops.
    struct Probe {
        leases: Leases,
        drops: Arc<Count>,
    }

    impl Leasable for Probe {
        type Line = Leases;

        fn leases(&self) -> &Leases {
            &self.leases
        }

        fn line(&self) -> &Leases {
            &self.leases
        }
    }

    impl Drop for Probe {
        fn drop(&mut self) {
            self.drops.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn probe() -> (Owner<Probe>, Arc<Count>) {
        let drops = Arc::new(Count::new(0));
        let value = Arc::new(Probe {
            leases: Leases::default(),
            drops: drops.clone(),
        });
        (Owner::new(value), drops)
    }

    #[test]
    fn an_owner_without_leases_drops_the_value() {
        let (owner, drops) = probe();
        drop(owner);
        assert_eq!(drops.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn the_last_lease_drops_the_value_whichever_it_is() {
        for last in 0..3 {
            let (owner, drops) = probe();
            let mut leases: Vec<_> = (0..3).map(|_| owner.lease()).collect();
            let kept = leases.remove(last);
            drop(owner);
            drop(leases);
            assert_eq!(drops.load(Ordering::Relaxed), 0, "dropped under a lease");
            assert_eq!(kept.drops.load(Ordering::Relaxed), 0);
            drop(kept);
            assert_eq!(drops.load(Ordering::Relaxed), 1);
        }
    }

    #[test]
    fn other_strong_counts_keep_the_value_after_the_leases() {
        let (owner, drops) = probe();
        let other = Arc::clone(&owner);
        let lease = owner.lease();
        drop(owner);
        drop(lease);
        assert_eq!(drops.load(Ordering::Relaxed), 0);
        drop(other);
        assert_eq!(drops.load(Ordering::Relaxed), 1);
    }

    /// Leases dropped on other threads than their own leave stripes below zero; dropped before
    /// and after the retirement, they still drop the value once, after the last.
    #[test]
    fn leases_dropped_on_many_threads_drop_the_value_once() {
        for round in 0..200 {
            let (owner, drops) = probe();
            let leases: Vec<_> = (0..4).map(|_| owner.lease()).collect();
            let droppers: Vec<_> = leases
                .into_iter()
                .map(|lease| std::thread::spawn(move || drop(lease)))
                .collect();
            if round % 2 == 0 {
                drop(owner);
                for dropper in droppers {
                    dropper.join().unwrap();
                }
            } else {
                for dropper in droppers {
                    dropper.join().unwrap();
                }
                assert_eq!(drops.load(Ordering::Relaxed), 0, "dropped under its owner");
                drop(owner);
            }
            assert_eq!(drops.load(Ordering::Relaxed), 1);
        }
    }

    /// More living threads than own stripes: some take and drop on the shared counters.
    #[test]
    fn threads_beyond_the_own_stripes_count_on_the_shared_counters() {
        let threads = OWN_STRIPES + 3;
        for _ in 0..20 {
            let (owner, drops) = probe();
            let owner = Arc::new(owner);
            let all_alive = Arc::new(Barrier::new(threads));
            let (to_main, leases) = std::sync::mpsc::channel();
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    let (owner, all_alive, to_main) =
                        (owner.clone(), all_alive.clone(), to_main.clone());
                    std::thread::spawn(move || {
                        all_alive.wait();
                        let kept = owner.lease();
                        drop(owner.lease());
                        to_main.send(kept).unwrap();
                        all_alive.wait();
                    })
                })
                .collect();
            drop(to_main);
            let leases: Vec<_> = leases.iter().collect();
            for worker in workers {
                worker.join().unwrap();
            }
            assert_eq!(leases.len(), threads);
            drop(Arc::into_inner(owner).expect("the workers let go of the owner"));
            assert_eq!(drops.load(Ordering::Relaxed), 0, "dropped under a lease");
            drop(leases);
            assert_eq!(drops.load(Ordering::Relaxed), 1);
        }
    }
}
