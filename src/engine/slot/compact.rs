//! Compaction: moving the timers of a sparse table into fresh slots, so that the memory of the
//! slots they leave goes back to the operating system while the shard holds timers.
//!
//! The [reclaim](super::reclaim) gives memory back only when every slot is free. After a peak
//! that passes (10 M timers, 90% of them cancelled at random) every page of the table still
//! holds a tenth of its slots in use, so no page can go back. A compaction *retires* every slot
//! below the count handed out so far (`W`): it moves each timer still held there to a fresh
//! slot at `W`, `W + 1`, ... (in index order), leaves 0 in its old word, records the move in
//! an immutable [`Retired`] map, and gives back the memory of every page below `W`. Only the
//! owning shard compacts, between two turns, and only one retirement is in force until the
//! table is next reclaimed.
//!
//! # Finding a moved timer
//!
//! Handles and messages keep naming the old slot. Whoever reads 0 in a slot's word asks the
//! map ([`SlotTable::moved_to`]) and, if the slot was moved, goes on at the new one, whose
//! word carries the timer's generation, handles and state unchanged. A word is 0 only for a
//! retired slot or a fresh one nobody refers to (generation 0 and nothing chained), so the
//! common paths pay nothing: the check sits where they already treat an unexpected word.
//!
//! # The protocol (the shard)
//!
//! 1. [`survey`](SlotTable::survey): read the fresh count `W` and the free list's head `H`;
//!    walk the list (as the reclaim does) and count it.
//! 2. The owner [classifies](SlotTable::classify) every slot below `W`: FREE, held by the
//!    shard (moved with its entry), ended but still referenced by handles (moved alone), or
//!    unmovable (staged, a free or an allocation in progress, a schedule not yet applied). It
//!    goes on only if nothing is unmovable and the FREE ones are exactly the list's.
//! 3. [`retire`](SlotTable::retire): seal the fresh counter (fails if anything was allocated
//!    fresh since step 1); publish the map and the bound `W`; empty the list with its tag
//!    bumped and marked `RETIRED` (fails if anything was pushed or popped since step 1); then
//!    resume fresh allocation above the `M` slots reserved for the moved timers.
//! 4. [`move_slot`](SlotTable::move_slot) each moved timer, in index order; the owner moves
//!    its private entry and stores it in its wheel again.
//! 5. [`forget_retired`](SlotTable::forget_retired): give back the memory below `W`.
//!
//! A move of a one-shot timer the shard holds takes the deadline lock first, as `fire` does
//! (Dekker with `reset_lazy`): a lazy reset either lands in the deadline the move copies, or
//! sees the lock and then 0, and does it again at the new slot. The move ends with one
//! compare-and-swap to 0; any change to the word meanwhile (a cancel, a handle coming or
//! going) makes it copy the word again.
//!
//! | who else may touch a slot below `W` | why the compaction cannot hurt them |
//! |-------------------------------------|-------------------------------------|
//! | an allocator between taking a slot and `begin`, a free in progress | its slot is FREE off the list, or held without an entry: step 2 finds it and gives up |
//! | anything pushed or popped after step 1, a popper that read `H` | the tag changed: step 3 fails, or the popper's compare-and-swap does |
//! | a fresh allocation after step 1 | the seal fails |
//! | a handle of a moved timer (cancel, reset, clone, drop) | its compare-and-swap on the old word fails (the move changed it), it reads 0 and follows the map |
//! | the last handle of an ended timer, dropped between step 3 and its move | it frees the old slot; the free finds the list marked `RETIRED` and drops it instead of pushing it; the move finds it FREE and leaves its reserved slot unused (`unused`); the reclaim waits for the drop (`drops_owed`) |
//! | messages naming a moved timer (`Cancel`, `Relocate`, `Reset`, `Rearm`) | the owner follows the map before applying them ([`current`](SlotTable::current)) |
//! | the memory given back in step 5 | every word below `W` is dead: moved (0), on the emptied list, or freed and dropped; a late reader reads zeros, a late writer (the drop above) gets a fresh zero page |
//!
//! After a compaction the table is reclaimed as before once every slot is free: the reclaim
//! counts the list against the slots handed out above `W`, less the unused reserved ones, and
//! frees the map (no handle is left, so nobody is reading it).

use super::free_list::{RETIRED, next_head};
use super::pages::{locate, page_len, page_start};
use super::retired::Retired;
use super::word::{
    DEADLINE_LOCK, FREE, GENERATION_MASK, NEXT_FREE_MASK, NEXT_FREE_SHIFT, REPEATING, RUNNING,
    SHARD, STAGED, generation_of, handles_of, is_unreferenced, lifecycle_of,
};
use super::{FRESH_COUNT_MASK, MAX_SLOTS, SEALED, SlotTable};
use crate::sync::Ordering;

/// A shard compacts its table only when more slots than this were handed out.
pub(crate) const COMPACT_ABOVE: u64 = if cfg!(shardwheel_loom) { 0 } else { 1 << 16 };

/// What step 1 of a compaction saw (see the [module documentation](self)), walked a piece at
/// a time ([`SlotTable::walk_survey`]).
#[derive(Debug)]
pub(crate) struct Survey {
    /// The fresh counter as read.
    observed: u64,
    /// The free list's head as read.
    head: u64,
    /// `W`: the slots handed out, all to be retired.
    below: u32,
    /// Slots on the free list walked so far.
    on_list: u64,
    /// The next link of the list to walk (a slot + 1; 0: the walk is done).
    link: u32,
}

impl Survey {
    /// `W`: every slot below it is to be retired.
    pub(crate) fn below(&self) -> u32 {
        self.below
    }

    /// How many slots the free list holds (once walked): the FREE slots found below `W` must be
    /// as many.
    pub(crate) fn on_list(&self) -> u64 {
        self.on_list
    }
}

/// What a slot below `W` holds, for step 2 (see [`SlotTable::classify`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SlotClass {
    /// FREE: it must be on the free list.
    Free,
    /// The shard holds it: movable if the owner has its entry with its task (else a schedule
    /// not applied yet).
    Held,
    /// A repeating timer out running: the owner holds its entry (without its task); movable.
    Running,
    /// Ended (fired or cancelled), let go of by the shard, kept by its handles: movable alone.
    Ended,
    /// Staged, or being freed: the compaction must wait.
    Unmovable,
}

impl SlotTable {
    /// Step 1: `None` if too few slots were handed out, a retirement is in force already, or
    /// the list changed under the walk.
    pub(crate) fn survey(&self, threshold: u64) -> Option<Survey> {
        let observed = self.fresh.next.load(Ordering::Acquire);
        let handed_out = (observed & FRESH_COUNT_MASK).min(MAX_SLOTS);
        if handed_out <= threshold || observed & SEALED != 0 || self.retirement.is_in_force() {
            return None;
        }
        let head = self.free_head.load(Ordering::Acquire);
        Some(Survey {
            observed,
            head,
            below: handed_out as u32,
            on_list: 0,
            link: head as u32,
        })
    }

    /// Step 1, a piece at a time: walks up to `steps` more slots of the free list. `Some(true)`
    /// once it is walked whole, `None` if it changed since the survey began (then the
    /// compaction gives up: step 3 would fail).
    pub(crate) fn walk_survey(&self, survey: &mut Survey, steps: u64) -> Option<bool> {
        if self.free_head.load(Ordering::Relaxed) != survey.head {
            return None;
        }
        for _ in 0..steps {
            if survey.link == 0 {
                return Some(true);
            }
            // More slots than handed out: a list that changed under us (a cycle).
            if survey.on_list == survey.below as u64 {
                return None;
            }
            let word = self.free_word(survey.link - 1, survey.below as u64)?;
            survey.on_list += 1;
            survey.link = ((word & NEXT_FREE_MASK) >> NEXT_FREE_SHIFT) as u32;
        }
        Some(survey.link == 0)
    }

    /// Whether the free list is still as the survey found it (else step 3 would fail).
    pub(crate) fn survey_holds(&self, survey: &Survey) -> bool {
        self.free_head.load(Ordering::Relaxed) == survey.head
    }

    /// Step 2, for one slot below the survey's `W`; `newest` gathers the newest generation
    /// seen (as an offset from the fresh generation).
    pub(crate) fn classify(&self, index: u32, newest: &mut u32) -> SlotClass {
        let word = self.word(index).load(Ordering::Acquire);
        let base = self.fresh.generation.load(Ordering::Relaxed) as u32;
        *newest = (*newest).max(generation_of(word).wrapping_sub(base) & GENERATION_MASK);
        if lifecycle_of(word) == FREE {
            SlotClass::Free
        } else if word & (STAGED | DEADLINE_LOCK) != 0 {
            SlotClass::Unmovable
        } else if word & (SHARD | RUNNING) == SHARD | RUNNING {
            SlotClass::Running
        } else if word & SHARD != 0 {
            SlotClass::Held
        } else if handles_of(word) > 0 {
            SlotClass::Ended
        } else {
            SlotClass::Unmovable
        }
    }

    /// Step 3: retires every slot below `survey.below()`, reserving one fresh slot for each of
    /// `moved` (ascending; the slots step 2 found movable), and returns the first: `moved[k]`
    /// goes to it `+ k`. `newest`: from step 2. `None` if anything changed since step 1 (then
    /// nothing did here).
    pub(crate) fn retire(&self, survey: &Survey, moved: &[u32], newest: u32) -> Option<u32> {
        let below = survey.below;
        let end = below as u64 + moved.len() as u64;
        if end > MAX_SLOTS {
            return None;
        }
        if self
            .fresh
            .next
            .compare_exchange(
                survey.observed,
                survey.observed | SEALED,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return None;
        }
        // Published before the head says RETIRED (its release), for the frees that see it.
        self.retirement
            .publish(Retired::new(below, below, moved, newest));
        let emptied = next_head(survey.head, 0) | RETIRED;
        if self
            .free_head
            .compare_exchange(survey.head, emptied, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            // Nobody saw RETIRED: take the map back, and unseal (an exchange, as the reclaim's).
            self.retirement.withdraw();
            self.fresh.next.swap(survey.observed, Ordering::Release);
            return None;
        }
        for page in locate(below).0..=locate(end.max(below as u64 + 1) as u32 - 1).0 {
            self.pages.ensure(page);
        }
        self.fresh
            .next
            .swap(survey.observed & !FRESH_COUNT_MASK | end, Ordering::Release);
        Some(below)
    }

    /// Step 4, for one timer: moves retired slot `old` to slot `new` (reserved for it by
    /// [`retire`](Self::retire)). False if the timer's last handle freed it first: then `new`
    /// stays unused.
    pub(crate) fn move_slot(&self, old: u32, new: u32) -> bool {
        let from = self.slot(old);
        let to = self.slot(new);
        let mut word = from.state.load(Ordering::Acquire);
        // A one-shot timer the shard holds: lock its deadline, as `fire` does.
        while lifecycle_of(word) != FREE && word & (SHARD | REPEATING) == SHARD {
            match crate::sync::compare_exchange_weak_then_fence(
                &from.state,
                word,
                word | DEADLINE_LOCK,
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    word |= DEADLINE_LOCK;
                    break;
                }
                Err(actual) => word = actual,
            }
        }
        to.deadline
            .store(from.deadline.load(Ordering::Acquire), Ordering::Relaxed);
        loop {
            if lifecycle_of(word) == FREE || is_unreferenced(word) {
                // Freed, or being freed, since step 3 by its last holder (a handle, or the
                // shard at a fire or a cancel before the move): the free gives the old slot up
                // instead of listing it (see `drops_owed`).
                self.retirement.count_unused();
                return false;
            }
            // Release: the new slot's deadline and word, for whoever reads 0 here and follows.
            to.state.store(word & !DEADLINE_LOCK, Ordering::Relaxed);
            match from
                .state
                .compare_exchange_weak(word, 0, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(actual) => word = actual,
            }
        }
    }

    /// Step 5, a piece at a time: gives back the memory of the retired slots from `from`, up
    /// to `count` of them; returns where to go on from (the bound `W` once done).
    pub(crate) fn forget_retired(&self, from: u32, count: u32) -> u32 {
        let below = self.retirement.below();
        let to = from.saturating_add(count).min(below);
        let mut index = from;
        while index < to {
            let (page, offset) = locate(index);
            let end = (page_start(page) + page_len(page) as u64).min(to as u64) as u32;
            self.pages.forget(page, offset, (end - index) as usize);
            index = end;
        }
        to
    }

    /// The slot now holding the timer of slot `index`, whose word the caller just read as 0:
    /// `None` unless `index` was retired and its timer moved.
    #[cold]
    #[inline(never)]
    pub(super) fn moved_to(&self, index: u32) -> Option<u32> {
        self.retirement.moved_to(index)
    }

    /// The shard, about to free slot `index` (a fire or a cancel it applied): true if the slot
    /// is retired, so the free gives it up instead (the slot's move, later, finds it being
    /// freed and leaves its reserved slot unused).
    pub(super) fn give_up_retired(&self, index: u32) -> bool {
        if index >= self.retirement.below() {
            return false;
        }
        self.retirement.count_drop();
        true
    }

    /// Every slot below this was retired by the compaction in force (0 if none).
    pub(crate) fn retired_below(&self) -> u32 {
        self.retirement.below()
    }

    /// The shard, applying a message that names slot `index`: the slot that holds its timer now
    /// (`index` itself unless it was retired and its timer moved).
    pub(crate) fn current(&self, index: u32) -> u32 {
        if self.word(index).load(Ordering::Acquire) == 0 {
            self.moved_to(index).unwrap_or(index)
        } else {
            index
        }
    }
}
