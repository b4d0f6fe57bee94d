//! Giving the slot table's memory back: the reclaim protocol.
//!
//! A table that held millions of timers would keep 16 bytes per timer after they are all gone.
//! So when its shard holds no timer any more, it tries [`try_reclaim`](SlotTable::try_reclaim):
//! if every slot ever handed out is free, the table starts over (the free list empty, fresh
//! allocation from index 0) and the pages' memory goes back to the operating system with
//! `madvise(MADV_DONTNEED)` ([`Pages::forget`](super::pages::Pages::forget)): the pages stay
//! mapped (and allocated), they only read as zeros, FREE words, until written again. Hot paths
//! gain no read-modify-write: push and pop are unchanged, the fresh path gains a branch and a
//! load.
//!
//! `next_fresh` holds the fresh count (bits 0-39), `ready` (bits 40-44: how many leading pages
//! a fresh allocation may write, all 27 but during a reclaim) and `SEALED` (bit 63). A second
//! word beside it holds the generation fresh slots start at (see `Fresh`). The reclaim, run by
//! the shard only:
//!
//! 1. Read the count `N` and the free list's head `H`.
//! 2. Walk the list from `H` (checked: every index below `N`, its page present, its word FREE;
//!    at most `N` steps; every 1024 steps give up if the head moved). It must hold exactly
//!    `N` slots, and note the newest generation on it. After a [compaction](super::compact):
//!    `N` less the slots it retired and the fresh ones it reserved and left unused, with no
//!    free of a retired slot still under way; the newest generation counts the retired ones.
//! 3. Seal: compare-and-swap `next_fresh` from what step 1 read to the same with `SEALED`.
//! 4. Empty the list: compare-and-swap the head from `H` to empty with the next tag. On
//!    failure, unseal (restore step 1's value) and give up.
//! 5. Commit: fresh generation := newest + 1; `next_fresh` := count 0, `ready` = the 6 small
//!    pages (under 64 KiB, kept as they are); a compaction's retirement ends (its map freed:
//!    no handle is left to follow it).
//! 6. For each used page above those, in order: `madvise` its whole OS pages below `N`, then
//!    add one to `ready` (release).
//!
//! A fresh allocation that finds `SEALED` throws its index away (the commit or the unseal
//! overwrites its increment) and waits for the seal to go, then starts over; one that lands on
//! a page at or above `ready` waits until that page is given back. Who else could touch a slot
//! while the table looks all free, and why the reclaim cannot hurt them:
//!
//! | who                                                   | why it is safe |
//! |-------------------------------------------------------|----------------|
//! | a popper that read `H` and reads the head slot's link | step 4 bumped the tag: its compare-and-swap fails, whatever (zeros) it read |
//! | an allocator between taking a slot and `begin` (its word still looks FREE) | popped: not on the list under `H`; fresh: not on the list at all, so the walk counts fewer than `N`; a fresh one after step 1 fails step 3 |
//! | a free in progress (FREE word stored, push pending; or in the shard's [`Freed`](super::Freed) chain) | not on the list under `H`: the walk counts fewer than `N` |
//! | anything pushed or popped during the walk             | the tag changed: step 4 fails (and the walk may stop early) |
//! | a stale `Relocate` / `Reset` (index, generation)      | every old generation is at most the newest one walked: new timers start above it, so the generation check rejects it |
//! | `Schedule`, `Rearm`                                   | their slot has `SHARD` set, so it is not free: the walk fails |
//! | a late `Cancel` (index, generation)                   | as a stale `Reset`: the generation check rejects it |
//! | a handle                                              | its slot has a handle count, so it is not free: the walk fails |
//! | `begin` on a page being given back                    | waits for `ready` (acquire, paired with the release after `madvise`) |
//! | a reader of a page being given back                   | only atomic loads, which accept any FREE word, zeros included |
//!
//! Nothing depends on the zeros (`begin` writes the whole slot), so a failing `madvise` only
//! keeps the memory. Generations wrap at 2^30, as before.

use super::SlotTable;
use super::free_list::{RETIRED, next_head};
use super::pages::{PAGES, Slot, page_len, page_start};
use super::word::{FREE, GENERATION_MASK, NEXT_FREE_MASK, NEXT_FREE_SHIFT};
use super::word::{generation_of, lifecycle_of};
use super::{ALL_READY, FRESH_COUNT_MASK, MAX_SLOTS, READY_MASK, READY_ONE, READY_SHIFT, SEALED};
use crate::sync::Ordering;

/// A shard tries to reclaim its table only when more slots than this were handed out: the
/// small leading pages are kept anyway.
pub(crate) const RECLAIM_ABOVE: u64 = 4096;
/// Leading pages a reclaim keeps (never given back to the operating system): those under
/// 64 KiB, where giving back would save little and cost page faults on the next burst. Under
/// loom none, so that the model sees every page given back.
const KEPT_PAGES: usize = if cfg!(shardwheel_loom) {
    0
} else {
    let mut page = 0;
    while page_len(page) * std::mem::size_of::<Slot>() < 64 * 1024 {
        page += 1;
    }
    page
};
/// Free-list steps between the reclaim walk's checks that the list has not changed.
const WALK_CHECK_EVERY: u64 = 1024;

/// What [`SlotTable::try_reclaim`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reclaim {
    /// Every slot was free: the table starts over, its pages' memory given back.
    Reclaimed,
    /// Some slot is in use, or allocated or freed meanwhile: nothing changed. `head` is the
    /// free list's head that was walked; while it stays the same, walking again is pointless.
    Busy { head: u64 },
    /// Too few slots were ever handed out to be worth it.
    Nothing,
}

impl SlotTable {
    /// Gives the memory of every slot back if every slot handed out is free, and starts over
    /// (see [the reclaim protocol](self)). Only the owning shard calls it, when it holds no
    /// timer; any thread may use the table meanwhile. Does nothing unless more than
    /// [`RECLAIM_ABOVE`] slots were handed out.
    pub(crate) fn try_reclaim(&self) -> Reclaim {
        self.try_reclaim_above(RECLAIM_ABOVE)
    }

    /// [`try_reclaim`](Self::try_reclaim) with any threshold (loom models reclaim tiny tables).
    pub(super) fn try_reclaim_above(&self, threshold: u64) -> Reclaim {
        // 1. What to account for: every slot handed out, and the list that should hold them.
        let observed = self.fresh.next.load(Ordering::Acquire);
        debug_assert!(
            observed & SEALED == 0 && observed & READY_MASK == ALL_READY,
            "reclaim started while another was under way: {observed:#x}"
        );
        let handed_out = (observed & FRESH_COUNT_MASK).min(MAX_SLOTS);
        if handed_out <= threshold {
            return Reclaim::Nothing;
        }
        let head = self.free_head.load(Ordering::Acquire);
        // 2. Every slot handed out must be on the list: not in use, not between allocation
        // and `begin`, not being freed. After a compaction, every slot handed out above the
        // retired ones, less those it reserved and left unused, and no free of a retired slot
        // still under way.
        let retired = self.retirement.below() as u64 + self.retirement.unused();
        if !self.retirement.drops_settled() {
            return Reclaim::Busy { head };
        }
        let Some((listed, newest)) = self.walk_free_list(head, handed_out) else {
            return Reclaim::Busy { head };
        };
        if listed + retired != handed_out {
            return Reclaim::Busy { head };
        }
        let newest = newest.max(self.retirement.newest_offset());
        // 3. Seal the fresh counter: fails if a fresh allocation came since step 1.
        if self
            .fresh
            .next
            .compare_exchange(
                observed,
                observed | SEALED,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return Reclaim::Busy { head };
        }
        // 4. Empty the list, bumping its tag: fails if anything was pushed or popped since step
        // 1 (every push and pop changes the tag); a popper that read `head` fails too.
        let emptied = next_head(head, 0) & !RETIRED;
        if self
            .free_head
            .compare_exchange(head, emptied, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            // Unseal; this also discards the increments of allocations that found the seal
            // (they threw their index away and start over). An exchange, like the commit's: a
            // plain store would do on hardware, but loom 0.7 lets a plain store slip between
            // the read and the write of a concurrent `fetch_add` (tokio-rs/loom#254).
            self.fresh.next.swap(observed, Ordering::Release);
            return Reclaim::Busy { head };
        }
        // 5. Commit. Fresh slots now start above every generation seen, so a stale message
        // (`Relocate`, `Reset`) carrying an old (index, generation) never matches a new timer.
        // A compaction's retirement ends: no handle is left to follow its map.
        self.retirement.withdraw();
        let base = self.fresh.generation.load(Ordering::Relaxed) as u32;
        let generation = base.wrapping_add(newest).wrapping_add(1) & GENERATION_MASK;
        self.fresh
            .generation
            .store(generation as u64, Ordering::Relaxed);
        self.fresh
            .next
            .swap((KEPT_PAGES as u64) << READY_SHIFT, Ordering::Release);
        // 6. Give the used pages back in order, each made writable again (`ready`) only after
        // its `madvise`, so that no `begin` is erased by it.
        for page in KEPT_PAGES..PAGES {
            let start = page_start(page);
            if start >= handed_out {
                self.fresh
                    .next
                    .fetch_add((PAGES - page) as u64 * READY_ONE, Ordering::Release);
                break;
            }
            let used = (handed_out - start).min(page_len(page) as u64) as usize;
            self.pages.forget(page, 0, used);
            self.fresh.next.fetch_add(READY_ONE, Ordering::Release);
        }
        debug_assert_eq!(
            self.fresh.next.load(Ordering::Relaxed) & READY_MASK,
            ALL_READY,
            "reclaim left pages unready"
        );
        Reclaim::Reclaimed
    }

    /// Walks the free list from `head`, which may hold at most the `handed_out` slots. Returns
    /// how many it holds and the largest generation on it (as an offset from the fresh
    /// generation, so that a wrapped one still counts as newer); `None` if the list changed
    /// under us.
    pub(super) fn walk_free_list(&self, head: u64, handed_out: u64) -> Option<(u64, u32)> {
        let base = self.fresh.generation.load(Ordering::Relaxed) as u32;
        let mut newest = 0;
        let mut count = 0u64;
        let mut link = head as u32;
        while link != 0 {
            // More than `handed_out` steps: a list that changed under us (a cycle).
            if count == handed_out {
                return None;
            }
            let word = self.free_word(link - 1, handed_out)?;
            newest = newest.max(generation_of(word).wrapping_sub(base) & GENERATION_MASK);
            count += 1;
            if count.is_multiple_of(WALK_CHECK_EVERY)
                && self.free_head.load(Ordering::Relaxed) != head
            {
                return None;
            }
            link = ((word & NEXT_FREE_MASK) >> NEXT_FREE_SHIFT) as u32;
        }
        Some((count, newest))
    }

    /// The word of slot `index` if it is one of the `handed_out` slots, its page exists and it
    /// is FREE (a walk over a list that changed under us may reach any value).
    pub(super) fn free_word(&self, index: u32, handed_out: u64) -> Option<u64> {
        if index as u64 >= handed_out {
            return None;
        }
        let word = self
            .pages
            .slot_if_present(index)?
            .state
            .load(Ordering::Acquire);
        (lifecycle_of(word) == FREE).then_some(word)
    }
}
