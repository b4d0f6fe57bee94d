//! Keeping an engine's memory alive for the sleeps of an owned [`Timer`](crate::Timer) without
//! one reference count that every thread writes.
//!
//! # Why
//!
//! A [`Sleep`](crate::Sleep) of an owned timer must keep the engine's memory (its shards' slot
//! tables) alive until it is dropped, even if the timer is dropped first. An `Arc` clone per
//! sleep does that with one count for the whole engine: the workers of a multi-threaded
//! executor then all write the same cache line twice per timeout, and pull it from each other's
//! cores. A [`Lease`] counts in one of the engine's [`Leases`] *stripes* instead, the one of the
//! creating thread's home shard (threads with different homes write different lines), and
//! gives it back to the same stripe.
//!
//! # How the memory is let go
//!
//! While the timer lives, its [`Owner`] holds one strong count of the engine's `Arc`, and the
//! leases need none of their own. When the timer's last clone drops, the `Owner` *retires*:
//! it does not give its strong count back, but hands it to the leases, and marks every stripe
//! `RETIRED` with a read-modify-write. Then the count is settled stripe by stripe:
//!
//! | stripe when marked | who settles it                                          |
//! |--------------------|---------------------------------------------------------|
//! | no leases          | the retiring `Owner`, at once                           |
//! | `n` leases         | the lease whose drop finds `RETIRED` and 1 (the last)   |
//!
//! `unsettled` starts at the stripe count plus one (the `Owner`'s own part); each settler
//! subtracts its part, and whoever brings it to zero gives the strong count back
//! (`Arc::from_raw`), dropping the engine if it was the last. No lease is taken after the
//! retirement (taking one needs the timer), so a stripe's count only falls once marked, and a
//! stripe found empty by the `Owner` stays empty. A lease's drop touches the engine's memory
//! only through its read-modify-writes, and after the last one only if its stripe was its to
//! settle, which keeps `unsettled` above zero until it subtracts: no access after the free.
//!
//! Model: `owned_sleeps_outlive_their_timer` in `loom-tests/`. Every `unsafe` of the scheme is in
//! this file.

use crate::sync::{Arc, AtomicUsize, Ordering};
use crossbeam_utils::CachePadded;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::ptr::NonNull;

/// A stripe's top bit: its engine's `Owner` has retired.
const RETIRED: usize = 1 << (usize::BITS - 1);

/// Anything whose memory [`Lease`]s can keep alive: it carries their [`Leases`].
pub(crate) trait Leasable {
    /// The leases' counts.
    fn leases(&self) -> &Leases;
}

/// The striped lease counts of one engine, and how much of its retirement is unsettled.
#[derive(Debug)]
pub(crate) struct Leases {
    /// Leases taken on each stripe and not yet dropped, plus `RETIRED` once retired.
    stripes: Box<[CachePadded<AtomicUsize>]>,
    /// Parts of the retirement not yet settled: one per stripe and one for the `Owner`.
    unsettled: AtomicUsize,
}

impl Leases {
    /// Counts in at least `stripes` stripes (a power of two, so that choosing one is a mask).
    pub(crate) fn new(stripes: usize) -> Leases {
        let stripes = stripes.max(1).next_power_of_two();
        Leases {
            stripes: (0..stripes)
                .map(|_| CachePadded::new(AtomicUsize::new(0)))
                .collect(),
            unsettled: AtomicUsize::new(stripes + 1),
        }
    }

    /// Subtracts `parts` from `unsettled`; true iff that settled the last.
    fn settle(&self, parts: usize) -> bool {
        self.unsettled.fetch_sub(parts, Ordering::AcqRel) == parts
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

    /// A lease on the value, counted on `stripe` (any number: taken modulo the stripe count).
    #[inline]
    pub(crate) fn lease(&self, stripe: usize) -> Lease<T> {
        let leases = self.0.leases();
        let stripe = stripe & (leases.stripes.len() - 1);
        let before = leases.stripes[stripe].fetch_add(1, Ordering::Relaxed);
        debug_assert_eq!(before & RETIRED, 0, "a lease taken after its owner retired");
        Lease::Counted(NonNull::from(&**self.0), stripe as u32)
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
        // zero, and this `Owner`'s part of it is still unsettled.
        let leases = unsafe { &*raw }.leases();
        let mut parts = 1;
        for stripe in leases.stripes.iter() {
            if stripe.fetch_or(RETIRED, Ordering::AcqRel) == 0 {
                parts += 1;
            }
        }
        if leases.settle(parts) {
            // SAFETY: `raw` came from `into_raw` above, and every part is settled: no lease
            // is left to read the value, and this gives back the one count kept for them.
            drop(unsafe { Arc::from_raw(raw) });
        }
    }
}

/// Keeps a leased value's memory alive until dropped, like an `Arc` clone, counted on one
/// stripe of its [`Leases`] (see the [module](self)); or a plain reference to a value that is
/// never dropped ([`forever`](Self::forever)). Two words either way.
///
/// An enum of two references, as the reference it replaced in [`Sleep`](crate::Sleep) was:
/// with a struct of the same size in its place, the compiler copied a `Timeout` once more on
/// its way into an `.await` (`callgrind` counted two `memcpy` calls per timeout instead of one).
pub(crate) enum Lease<T: Leasable + 'static> {
    /// Counted on stripe `.1`: the pointer is valid while this lease lives.
    Counted(NonNull<T>, u32),
    /// On a value that is never dropped: counts nothing.
    Forever(&'static T),
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
            // SAFETY: this lease's count on its stripe keeps the value alive (see the module).
            Lease::Counted(value, _) => unsafe { value.as_ref() },
            Lease::Forever(value) => value,
        }
    }
}

impl<T: Leasable + 'static> Lease<T> {
    /// A lease on a value that is never dropped: it counts nothing.
    pub(crate) fn forever(value: &'static T) -> Lease<T> {
        Lease::Forever(value)
    }

    /// The end of a drop that found its stripe retired and itself the stripe's last lease:
    /// settles the stripe (out of line, so that the common drop stays small).
    #[cold]
    #[inline(never)]
    fn settle_stripe(&self) {
        // `unsettled` counts this stripe's part, so the value is still here.
        if self.leases().settle(1) {
            // SAFETY: the value came from an `Arc` (`Owner::lease` took the pointer from the
            // `Owner`'s), whose retirement kept one strong count for the leases; every part is
            // now settled, so this is the one place that gives it back.
            drop(unsafe { Arc::from_raw(&**self as *const T) });
        }
    }
}

impl<T: Leasable + 'static> Drop for Lease<T> {
    #[inline]
    fn drop(&mut self) {
        let Lease::Counted(_, stripe) = *self else {
            return;
        };
        let before = self.leases().stripes[stripe as usize].fetch_sub(1, Ordering::AcqRel);
        // After that subtraction the value may be gone, unless the stripe is this lease's to
        // settle.
        if before == RETIRED | 1 {
            self.settle_stripe();
        }
    }
}

#[cfg(all(test, not(shardwheel_loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize as Count;

    /// A leasable value that counts its drops.
    struct Probe {
        leases: Leases,
        drops: Arc<Count>,
    }

    impl Leasable for Probe {
        fn leases(&self) -> &Leases {
            &self.leases
        }
    }

    impl Drop for Probe {
        fn drop(&mut self) {
            self.drops.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn probe(stripes: usize) -> (Owner<Probe>, Arc<Count>) {
        let drops = Arc::new(Count::new(0));
        let value = Arc::new(Probe {
            leases: Leases::new(stripes),
            drops: drops.clone(),
        });
        (Owner::new(value), drops)
    }

    #[test]
    fn an_owner_without_leases_drops_the_value() {
        let (owner, drops) = probe(4);
        drop(owner);
        assert_eq!(drops.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn the_last_lease_drops_the_value_whatever_its_stripe() {
        for last in 0..3 {
            let (owner, drops) = probe(2);
            let mut leases: Vec<_> = (0..3).map(|stripe| owner.lease(stripe)).collect();
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
        let (owner, drops) = probe(2);
        let other = Arc::clone(&owner);
        let lease = owner.lease(1);
        drop(owner);
        drop(lease);
        assert_eq!(drops.load(Ordering::Relaxed), 0);
        drop(other);
        assert_eq!(drops.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn leases_dropped_on_many_threads_drop_the_value_once() {
        for _ in 0..200 {
            let (owner, drops) = probe(3);
            let leases: Vec<_> = (0..4).map(|stripe| owner.lease(stripe)).collect();
            let droppers: Vec<_> = leases
                .into_iter()
                .map(|lease| std::thread::spawn(move || drop(lease)))
                .collect();
            drop(owner);
            for dropper in droppers {
                dropper.join().unwrap();
            }
            assert_eq!(drops.load(Ordering::Relaxed), 1);
        }
    }
}
