//! Where a [compaction](super::compact) moved the timers of the slots it retired.
//!
//! After a compaction every slot below `below` is retired: the timer it held, if any, lives on
//! in a slot from `base` up, and its own word reads 0 (stored by the move, or the zeros its
//! given-back memory reads as). A handle or message that names a retired slot finds its timer
//! here: bit `i` of `moved` says slot `i`'s timer was moved, to slot `base + rank(i)`, where
//! `rank(i)` counts the moved slots below `i` (kept per 64 slots in `ranks`). About 0.6 bits
//! of memory per retired slot; the map never changes once published.
//!
//! [`Retirement`] holds a table's map while it is in force, and the counts its next reclaim
//! needs. The map is freed by that reclaim or with the table: the reclaim succeeds only when
//! every slot is free, so no handle is left whose holder could be reading the map (the shard,
//! the only other reader, is the one reclaiming). Every `unsafe` of it is in this file.

use crate::sync::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

/// The map from a retired slot to the slot its timer was moved to.
#[derive(Debug)]
pub(crate) struct Retired {
    /// Every slot below this index is retired.
    below: u32,
    /// The first slot the moved timers went to.
    base: u32,
    /// Bit `i % 64` of word `i / 64`: slot `i`'s timer was moved.
    moved: Box<[u64]>,
    /// Moved slots below slot `64 * k`, for word `k`.
    ranks: Box<[u32]>,
    /// The newest generation of any retired slot, as an offset from the table's fresh
    /// generation when the slots were retired (see [`newest_offset`](Self::newest_offset)).
    newest: u32,
}

impl Retired {
    /// The map of a compaction that retired every slot below `below` and moved the timers of
    /// slots `moved` (ascending) to `base`, `base + 1`, ... in that order.
    pub(super) fn new(below: u32, base: u32, moved: &[u32], newest: u32) -> Retired {
        let words = (below as usize).div_ceil(64);
        let mut bits = vec![0u64; words].into_boxed_slice();
        for &index in moved {
            debug_assert!(index < below, "moved slot {index} not below {below}");
            bits[index as usize / 64] |= 1 << (index % 64);
        }
        let mut ranks = vec![0u32; words].into_boxed_slice();
        let mut rank = 0;
        for (word, slot) in bits.iter().zip(ranks.iter_mut()) {
            *slot = rank;
            rank += word.count_ones();
        }
        debug_assert_eq!(rank as usize, moved.len(), "moved slots repeated");
        Retired {
            below,
            base,
            moved: bits,
            ranks,
            newest,
        }
    }

    /// Every slot below this index is retired.
    pub(super) fn below(&self) -> u32 {
        self.below
    }

    /// The slot the timer of retired slot `index` was moved to, if it was moved.
    pub(super) fn moved_to(&self, index: u32) -> Option<u32> {
        if index >= self.below {
            return None;
        }
        let word = index as usize / 64;
        let bit = 1u64 << (index % 64);
        let bits = self.moved[word];
        (bits & bit != 0).then(|| self.base + self.ranks[word] + (bits & (bit - 1)).count_ones())
    }

    /// The newest generation among the retired slots, as an offset from the fresh generation
    /// at the compaction: a reclaim starts fresh slots above it too.
    pub(super) fn newest_offset(&self) -> u32 {
        self.newest
    }
}

/// A table's retirement: the [`Retired`] map in force, if any, the stash of a survey under way,
/// and the counts the reclaim needs (see [`compact`](super::compact)).
#[derive(Debug, Default)]
pub(super) struct Retirement {
    /// The map in force; null if none. Written by the shard only.
    map: AtomicPtr<Retired>,
    /// The bound of the survey under way or of the map in force, else 0. Kept apart from the
    /// map, which a reclaim may free: a free that saw the list's head marked reads it.
    below: AtomicU32,
    /// Slots below `below` freed during a survey: their first + 1 (0: none), chained through
    /// their FREE words like the free list; `SEALED` from the survey's step 4 (which took them)
    /// until the next survey begins.
    stash: AtomicU64,
    /// Reserved slots left unused: their timers were freed before their move. They are never
    /// handed out nor listed, so the reclaim does not count them.
    unused: AtomicU64,
    /// Frees of retired slots, found freed by their move, that have not given the slot up yet:
    /// one up for each such move, one down for each giving up. The reclaim waits for 0.
    drops_owed: AtomicU64,
}

/// The stash is sealed: step 4 of the survey took it.
const SEALED: u64 = 1 << 63;

impl Retirement {
    /// The bound of the survey under way or the map in force (0 if none).
    pub(super) fn below(&self) -> u32 {
        self.below.load(Ordering::Relaxed)
    }

    /// The shard begins a survey of the slots below `below` (before it marks the list's head,
    /// whose release publishes this).
    pub(super) fn begin(&self, below: u32) {
        debug_assert_eq!(self.below(), 0, "a survey while another retirement is on");
        self.stash.store(0, Ordering::Relaxed);
        self.below.store(below, Ordering::Relaxed);
    }

    /// A free, finding the list's head `RETIRING`, puts slot `index` (FREE, its holder's
    /// alone) into the stash: false if the stash is sealed.
    pub(super) fn stash(&self, table: &super::SlotTable, index: u32) -> bool {
        let mut head = self.stash.load(Ordering::Acquire);
        loop {
            if head & SEALED != 0 {
                return false;
            }
            table.set_next_free(index, head as u32);
            match self.stash.compare_exchange_weak(
                head,
                (index + 1) as u64,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(actual) => head = actual,
            }
        }
    }

    /// The shard seals the stash: returns its chain's first slot + 1 (0: empty).
    pub(super) fn seal_stash(&self) -> u32 {
        self.stash.swap(SEALED, Ordering::AcqRel) as u32
    }

    /// The shard gave its survey up (having cleared the list's mark). The stash stays sealed
    /// until the next survey: a free that read the mark before it was cleared must not put a
    /// slot there now (nobody would take it out), but look at the head again.
    pub(super) fn end_survey(&self) {
        debug_assert!(
            !self.is_in_force(),
            "a survey ended while its map is in force"
        );
        self.below.store(0, Ordering::Relaxed);
    }

    /// Whether a map is in force.
    pub(super) fn is_in_force(&self) -> bool {
        !self.map.load(Ordering::Relaxed).is_null()
    }

    /// The shard puts `map` in force. Release: the map, for whoever reads a moved slot's 0
    /// (the moves come later and release it again).
    pub(super) fn publish(&self, map: Retired) {
        debug_assert!(
            !self.is_in_force(),
            "a second retirement while one is in force"
        );
        debug_assert_eq!(self.below(), map.below(), "a map for another survey");
        self.map
            .store(Box::into_raw(Box::new(map)), Ordering::Release);
    }

    /// The shard ends the retirement in force (at a reclaim, or when the table is dropped).
    pub(super) fn withdraw(&self) {
        let map = self.map.swap(std::ptr::null_mut(), Ordering::AcqRel);
        self.below.store(0, Ordering::Relaxed);
        self.unused.store(0, Ordering::Relaxed);
        if !map.is_null() {
            // SAFETY: `map` came from `Box::into_raw` in `publish` and was in force until the
            // swap above took it out; nobody can be reading it: a reclaim or drop comes only
            // when no handle is left (see the module documentation).
            drop(unsafe { Box::from_raw(map) });
        }
    }

    /// Where the timer of retired slot `index` went, if it was moved.
    pub(super) fn moved_to(&self, index: u32) -> Option<u32> {
        let map = self.map.load(Ordering::Acquire);
        // SAFETY: a map in force lives until the shard withdraws it, which happens only when
        // no handle is left (see the module documentation); the caller, who read 0 in a word
        // it names by a handle or a message, is a handle's holder or the shard.
        unsafe { map.as_ref() }?.moved_to(index)
    }

    /// The newest generation offset of the retired slots (0 if no map is in force); only the
    /// shard calls it.
    pub(super) fn newest_offset(&self) -> u32 {
        // SAFETY: only the shard withdraws the map, and the shard is the caller.
        unsafe { self.map.load(Ordering::Acquire).as_ref() }.map_or(0, Retired::newest_offset)
    }

    /// A move found its timer freed: its reserved slot stays unused; `owed`: the free has yet
    /// to give the slot up (it was not stashed).
    pub(super) fn count_unused(&self, owed: bool) {
        self.unused.fetch_add(1, Ordering::Relaxed);
        if owed {
            self.drops_owed.fetch_add(1, Ordering::Release);
        }
    }

    /// Reserved slots left unused.
    pub(super) fn unused(&self) -> u64 {
        self.unused.load(Ordering::Relaxed)
    }

    /// A free of a retired slot gave the slot up (its last act on the table).
    pub(super) fn count_drop(&self) {
        self.drops_owed.fetch_sub(1, Ordering::Release);
    }

    /// Whether every free of a retired slot has given it up.
    pub(super) fn drops_settled(&self) -> bool {
        self.drops_owed.load(Ordering::Acquire) == 0
    }
}

impl Drop for Retirement {
    fn drop(&mut self) {
        self.withdraw();
    }
}

#[cfg(all(test, not(shardwheel_loom)))]
mod tests {
    use super::Retired;

    #[test]
    fn moved_slots_map_to_their_rank_from_base() {
        let moved = [0, 5, 63, 64, 130, 199];
        let map = Retired::new(200, 1000, &moved, 0);
        for (rank, &index) in moved.iter().enumerate() {
            assert_eq!(map.moved_to(index), Some(1000 + rank as u32));
        }
        for index in [1, 4, 62, 65, 129, 131, 198, 200, 5000] {
            assert_eq!(map.moved_to(index), None, "slot {index}");
        }
    }
}
