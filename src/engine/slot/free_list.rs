//! The slot table's free list: a lock-free, tagged Treiber stack threaded through the FREE
//! slots' state words (each FREE word holds the next free slot + 1, see [`word`](super::word)).
//!
//! The head (`SlotTable::free_head`) is `tag << 34 | RETIRING | RETIRED | (index + 1)`, 0 in
//! the low half when empty. The tag (30 bits) changes on every push and pop, so a stale
//! compare-and-swap fails (no ABA); the [reclaim](super::reclaim) and the
//! [compaction](super::compact) rely on it too. A compaction marks the head `RETIRING` while
//! it surveys the table, then `RETIRED` until the next reclaim; every push and pop keeps the
//! marks. A free of a slot below the compaction's bound that finds one does not list the slot:
//! it stashes it (`RETIRING`) or gives it up (`RETIRED`), see [`push_freed`](SlotTable::push_freed).
//!
//! The shard frees the slots of the timers its messages cancel into a [`Freed`] chain first,
//! threaded through their FREE words like the list itself and pushed in one exchange at the
//! end of the drain: the head's cache line then moves between the shard and the threads that
//! allocate once per drain, not once per slot. A chained slot is, to everyone else, a free in
//! progress (its word FREE, the push pending): no handle refers to it, and the reclaim's walk
//! does not find it, so the reclaim fails until it is pushed.

use super::SlotTable;
use super::word::{FREE, GENERATION_MASK, GENERATION_SHIFT, NEXT_FREE_MASK, NEXT_FREE_SHIFT};
use super::word::{generation_of, is_unreferenced, lifecycle_of};
use crate::sync::{Ordering, thread};

/// The free list's head is marked: a compaction retired the slots below its bound (see the
/// [module documentation](self)).
pub(super) const RETIRED: u64 = 1 << 32;
/// The free list's head is marked: a compaction is surveying the slots below its bound.
pub(super) const RETIRING: u64 = 1 << 33;
/// One step of the tag (bits 34-63: it wraps without touching the marks).
pub(super) const TAG_ONE: u64 = 1 << 34;

/// The head after one push or pop of `head`: the tag bumped, the marks kept, `link` (a slot
/// + 1, or 0) on top.
pub(super) fn next_head(head: u64, link: u32) -> u64 {
    (head & !(u32::MAX as u64)).wrapping_add(TAG_ONE) | link as u64
}

/// Slots freed by their shard and not yet pushed onto the free list (see the
/// [module documentation](self)); only the shard's owner holds one.
#[derive(Debug, Default)]
pub(crate) struct Freed {
    /// The chain's first slot + 1; 0 when empty.
    first: u32,
    /// The chain's last slot (meaningless when empty).
    last: u32,
}

impl Freed {
    /// The chain from slot `first - 1` to slot `last`, already linked through their words.
    pub(super) fn chained(first: u32, last: u32) -> Freed {
        Freed { first, last }
    }
}

impl SlotTable {
    /// Pops a free slot: its index and generation. `None` when the list is empty.
    #[inline]
    pub(super) fn pop_free(&self) -> Option<(u32, u32)> {
        let mut head = self.free_head.load(Ordering::Acquire);
        while head as u32 != 0 {
            let index = head as u32 - 1;
            // The word may change under us if another thread pops this slot first (or a
            // reclaim gives its page back); then the tag in `free_head` has changed too and
            // the exchange below fails.
            let word = self.word(index).load(Ordering::Acquire);
            let next = ((word & NEXT_FREE_MASK) >> NEXT_FREE_SHIFT) as u32;
            match self.free_head.compare_exchange_weak(
                head,
                next_head(head, next),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    debug_assert_eq!(
                        lifecycle_of(word),
                        FREE,
                        "slot {index} on the free list is occupied"
                    );
                    return Some((index, generation_of(word)));
                }
                Err(actual) => head = actual,
            }
        }
        None
    }

    /// Puts an unreferenced slot back on the free list with the next generation: a chain of
    /// one, pushed at once.
    pub(super) fn free(&self, index: u32, word: u64) {
        let mut chain = Freed::default();
        self.free_into(index, word, &mut chain);
        self.push_freed(&mut chain);
    }

    /// Frees an unreferenced slot (its word FREE at the next generation) into the chain
    /// `freed`, to be pushed onto the list later.
    pub(super) fn free_into(&self, index: u32, word: u64, freed: &mut Freed) {
        debug_assert!(
            is_unreferenced(word),
            "slot {index} freed while referenced: {word:#x}"
        );
        let generation = (generation_of(word).wrapping_add(1) & GENERATION_MASK) as u64;
        self.chain(index, generation << GENERATION_SHIFT | FREE, freed);
    }

    /// Links FREE slot `index`, whose word is `free_word` (FREE at its generation), at the
    /// front of the chain `freed`.
    pub(super) fn chain(&self, index: u32, free_word: u64, freed: &mut Freed) {
        debug_assert_eq!(
            lifecycle_of(free_word),
            FREE,
            "slot {index} chained while occupied"
        );
        self.word(index).store(
            free_word & !NEXT_FREE_MASK | (freed.first as u64) << NEXT_FREE_SHIFT,
            Ordering::Relaxed,
        );
        if freed.first == 0 {
            freed.last = index;
        }
        freed.first = index + 1;
    }

    /// Pushes the chain `freed` onto the free list in one exchange, and empties it.
    pub(crate) fn push_freed(&self, freed: &mut Freed) {
        if freed.first == 0 {
            return;
        }
        // Only the chain's holder writes a chained word: no handle refers to the slot and
        // the list does not reach it yet.
        let last = self.word(freed.last);
        let last_word = last.load(Ordering::Relaxed);
        let mut head = self.free_head.load(Ordering::Acquire);
        loop {
            // Acquire (above, or the failed exchange's): with a mark, the compaction's bound.
            if head & (RETIRED | RETIRING) != 0 && freed.last < self.retirement.below() {
                // Only single frees meet a mark: the shard frees slots below the bound one by
                // one while a compaction is on (see `let_go_into`).
                debug_assert_eq!(freed.first, freed.last + 1, "a chain of retired slots");
                if head & RETIRED != 0 {
                    // Retired: the slot is dead.
                    self.retirement.count_drop();
                } else if !self.retirement.stash(self, freed.last) {
                    // The stash is sealed: the survey is ending; look at the head again.
                    thread::yield_now();
                    head = self.free_head.load(Ordering::Acquire);
                    continue;
                }
                *freed = Freed::default();
                return;
            }
            let next = (head as u32) as u64;
            last.store(
                last_word & !NEXT_FREE_MASK | next << NEXT_FREE_SHIFT,
                Ordering::Relaxed,
            );
            match self.free_head.compare_exchange_weak(
                head,
                next_head(head, freed.first),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(actual) => head = actual,
            }
        }
        *freed = Freed::default();
    }

    /// The free list's head now (the shard compares it with [`Reclaim::Busy`]'s `head` to
    /// tell whether trying again could succeed).
    ///
    /// [`Reclaim::Busy`]: super::Reclaim::Busy
    pub(crate) fn free_head(&self) -> u64 {
        self.free_head.load(Ordering::Relaxed)
    }
}
