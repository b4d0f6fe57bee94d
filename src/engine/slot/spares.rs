//! Spare slots: the few free slots a stage's producer keeps for its own next timers.
//!
//! # Why
//!
//! A `Sleep` dropped on the thread that armed it, before its shard adopted the timer, is taken
//! back by that thread ([`SlotTable::retract`]), and the same thread's next sleep needs a slot.
//! Through the [free list](super::free_list) that is two compare-and-swaps of the list's head
//! per timeout, the freeing and the allocating one. A producer keeps up to [`SPARES`] of the
//! slots it retracted instead, in [`Spares`] (part of its stage, on the producer's cache line),
//! and its next timers take them back, with plain loads and stores.
//!
//! # The reclaim
//!
//! A spare slot is FREE (at its next generation) but on no list: to everyone else it is a free
//! in progress, as a slot in the shard's [`Freed`] chain is, so the reclaim's walk does not
//! count it and the reclaim fails while any slot is spare. So before the shard tries to reclaim
//! the table, it *flushes* every stage's spares onto the free list
//! ([`flush_spares`](SlotTable::flush_spares)); from the moment it plans the try until the
//! reclaim succeeds (or its shard holds timers again), producers keep no spares
//! ([`refuse_spares`](SlotTable::refuse_spares)): a slot they free then goes onto the list,
//! whose head is what a shard that failed a try watches for a change.
//!
//! Producer and flush meet as in Dekker's protocol, with the cost on the flush's side
//! ([`asymmetric`]): a producer marks itself `busy`, runs the light side of the barrier, and
//! reads `flushing`; the flush (`flushing` already set) runs the heavy side, and then reads
//! each producer's `busy`.
//!
//! | the producer's read of `flushing` | the producer | the flush |
//! |-----------------------------------|--------------|-----------|
//! | true | leaves the spares alone (frees to, and allocates from, the free list) | takes every spare there is |
//! | false | takes or gives one spare, then clears `busy` (Release) | sees `busy` (the barrier), waits until it clears, then takes the spares as the producer left them |
//!
//! Reclaims are rare (an idle shard, after a delay, with backoff), so the heavy side costs
//! nothing that matters; the producer's side is two plain stores and a load.

use super::SlotTable;
use super::free_list::Freed;
use super::word::{FREE, GENERATION_MASK, GENERATION_SHIFT, generation_of, lifecycle_of};
use crate::sync::{AtomicBool, AtomicU32, Ordering, asymmetric, thread};

/// The most slots one producer keeps.
pub(crate) const SPARES: usize = 8;

/// One stage's spare slots. Written by the stage's producer, except during a flush (see the
/// [module documentation](self)).
#[derive(Debug, Default)]
pub(crate) struct Spares {
    /// The producer is between its store of `busy` and its last store to the spares.
    busy: AtomicBool,
    /// How many of `slots` hold a spare.
    pub(super) len: AtomicU32,
    /// The spares' indices.
    slots: [AtomicU32; SPARES],
}

impl Spares {
    /// The producer: enters its side of the protocol; false if a flush is on (then the spares
    /// must not be touched).
    #[inline]
    fn enter(&self, table: &SlotTable) -> bool {
        self.busy.store(true, Ordering::Relaxed);
        asymmetric::light();
        // Acquire: a finished flush's emptying of the spares (its Release in `end_flush`).
        if table.flushing.load(Ordering::Acquire) {
            self.busy.store(false, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// The producer: leaves its side; Release: its stores to the spares (and a spare's word),
    /// for the flush that waits for `busy` to clear.
    #[inline]
    fn leave(&self) {
        self.busy.store(false, Ordering::Release);
    }
}

impl SlotTable {
    /// The producer of `spares`: takes a spare slot, if it has one (and no flush is on): its
    /// index and generation, as [`allocate`](Self::allocate) gives them.
    #[inline]
    pub(crate) fn take_spare(&self, spares: &Spares) -> Option<(u32, u32)> {
        if spares.len.load(Ordering::Relaxed) == 0 || !spares.enter(self) {
            return None;
        }
        // A flush since our first look may have emptied the spares.
        let len = spares.len.load(Ordering::Relaxed) as usize;
        let index = len
            .checked_sub(1)
            .map(|last| spares.slots[last].load(Ordering::Relaxed));
        if index.is_some() {
            spares.len.store(len as u32 - 1, Ordering::Relaxed);
        }
        spares.leave();
        let index = index?;
        // Ours alone: FREE on no list, and no longer among the spares the flush can see.
        let word = self.word(index).load(Ordering::Relaxed);
        debug_assert_eq!(lifecycle_of(word), FREE, "spare slot {index} is occupied");
        Some((index, generation_of(word)))
    }

    /// The producer of `spares`: frees slot `index`, unreferenced with word `word`, into its
    /// spares if there is room (and no flush is on), else onto the free list.
    #[inline]
    pub(super) fn free_to_spares(&self, index: u32, word: u64, spares: &Spares) {
        if (spares.len.load(Ordering::Relaxed) as usize) < SPARES && spares.enter(self) {
            let len = spares.len.load(Ordering::Relaxed) as usize;
            if len < SPARES {
                let generation = (generation_of(word).wrapping_add(1) & GENERATION_MASK) as u64;
                self.word(index)
                    .store(generation << GENERATION_SHIFT | FREE, Ordering::Relaxed);
                spares.slots[len].store(index, Ordering::Relaxed);
                spares.len.store(len as u32 + 1, Ordering::Relaxed);
                spares.leave();
                return;
            }
            spares.leave();
        }
        self.free(index, word);
    }

    /// The shard: producers are to keep no spares from now on (they read it at their next
    /// spare taken or given; [`flush_spares`](Self::flush_spares) makes sure).
    pub(crate) fn refuse_spares(&self) {
        self.flushing.store(true, Ordering::Relaxed);
    }

    /// The shard: producers may keep spares again. Release: the spares the last flush
    /// emptied (see `Spares::enter`).
    pub(crate) fn allow_spares(&self) {
        self.flushing.store(false, Ordering::Release);
    }

    /// The shard, before it tries to reclaim the table, spares refused
    /// ([`refuse_spares`](Self::refuse_spares)): moves every spare of `all` (every stage's)
    /// onto the free list. If the barrier fails, the spares stay (the reclaim then fails, as
    /// with any slot that is not on the list).
    pub(crate) fn flush_spares<'a>(&self, all: impl IntoIterator<Item = &'a Spares>) {
        debug_assert!(
            self.flushing.load(Ordering::Relaxed),
            "spares flushed while allowed"
        );
        if !asymmetric::heavy() {
            return;
        }
        let mut chain = Freed::default();
        for spares in all {
            // Acquire: the producer's stores before it left (see `Spares::leave`).
            while spares.busy.load(Ordering::Acquire) {
                // A producer between two of its stores (a few instructions).
                thread::yield_now();
            }
            let len = spares.len.load(Ordering::Relaxed) as usize;
            for spare in &spares.slots[..len] {
                let index = spare.load(Ordering::Relaxed);
                // Already at its next generation: chained as it is.
                let word = self.word(index).load(Ordering::Relaxed);
                self.chain(index, word, &mut chain);
            }
            spares.len.store(0, Ordering::Relaxed);
        }
        self.push_freed(&mut chain);
    }
}
