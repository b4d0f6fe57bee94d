//! Compaction: moving the timers of a sparse table into fresh slots, so that the memory of the
//! slots they leave goes back to the operating system while the shard holds timers.
//!
//! The [reclaim](super::reclaim) gives memory back only when every slot is free. After a peak
//! that passes (10 M timers, 90% of them cancelled at random) every page of the table still
//! holds a tenth of its slots in use, so no page can go back. A compaction *retires* every slot
//! below the count handed out when it began (`W`): it moves each timer still there to a fresh
//! slot (`base`, `base + 1`, ... in index order), leaves 0 in its old word, records the moves
//! in an immutable [`Retired`] map, and gives back the memory of every page below `W`. Only the
//! owning shard compacts, a piece at a time between its turns (the owner's side, and when:
//! `engine::owner::compaction`); one retirement is in force at a time, until the table is next
//! reclaimed.
//!
//! # Finding a moved timer
//!
//! Handles and messages keep naming the old slot. Whoever reads 0 in a slot's word asks the
//! map ([`SlotTable::moved_to`]) and, if the slot was moved, goes on at the new one, whose
//! word carries the timer's generation, handles and state unchanged. A word is 0 only for a
//! retired slot or a fresh one nobody refers to (generation 0, nothing chained), so the common
//! paths pay nothing: the check sits where they already meet an unexpected word.
//!
//! # The protocol (the shard)
//!
//! 1. [`survey`](SlotTable::survey): read `W`, then take the whole free list, marking its head
//!    `RETIRING`: allocation goes on from fresh slots and from slots freed later; a free of a
//!    slot below `W` goes into the *stash* instead of the list, so that no slot below `W` is
//!    handed out again.
//! 2. [`walk_survey`](SlotTable::walk_survey), a piece at a time: walk the taken list (it is
//!    the shard's now), marking its slots.
//! 3. The owner [classifies](SlotTable::classify) every slot below `W`, a piece at a time:
//!    FREE and marked (dead); FREE or being freed but unmarked (a *suspect*: freed into the
//!    stash since, or an allocation still between taking the slot and `begin`); staged (the
//!    compaction gives up and tries again later: a stage's cell names the slot); or movable:
//!    held by the shard (with its entry, or its `Schedule` still on the way, which the owner
//!    follows like any message) or ended and kept by handles.
//! 4. [`retire`](SlotTable::retire): seal the stash and mark its slots; if a suspect is still
//!    unmarked, an allocation was under way: list everything taken again, clear `RETIRING`,
//!    give up ([`abandon`](SlotTable::abandon) does the same after a staged slot). Else
//!    reserve one fresh slot per movable timer (from `base`), publish the map, and mark the
//!    head `RETIRED` instead of `RETIRING`: from then on a free of a slot below `W` gives the
//!    slot up (it is dead) instead of listing it.
//! 5. [`move_slot`](SlotTable::move_slot) each movable timer, in index order, a piece at a
//!    time; the owner moves its entry and its place in the wheel along.
//! 6. [`forget_retired`](SlotTable::forget_retired), a piece at a time: give back the memory
//!    below `W`.
//!
//! A move of a one-shot timer the shard holds takes the deadline lock first, as `fire` does
//! (Dekker with `reset_lazy`): a lazy reset either lands in the deadline the move copies, or
//! sees the lock and then 0, and does it again at the new slot. The move ends with one
//! compare-and-swap to 0; any change to the word meanwhile (a cancel, a handle coming or
//! going) makes it copy the word again. A timer freed since step 3 is not moved: its reserved
//! slot stays unused (`unused`), and a free after step 4 owes the reclaim its giving up
//! (`drops_owed`).
//!
//! | who else may touch a slot below `W` | why the compaction cannot hurt them |
//! |-------------------------------------|-------------------------------------|
//! | a popper that read the head before step 1 | the tag changed: its compare-and-swap fails |
//! | an allocator between taking a slot and `begin` (popped before step 1, or fresh below `W`) | its slot is a suspect no stash holds: step 4 gives up; or it began, and the slot is movable |
//! | a free of a slot below `W` | before step 1: on the taken list; in steps 1-4: into the stash; after: gives the slot up |
//! | a handle of a moved timer (cancel, reset, clone, drop) | its compare-and-swap on the old word fails (the move changed it), it reads 0 and follows the map |
//! | messages naming a moved timer | the owner follows the map before applying them ([`current`](SlotTable::current)) |
//! | a staged timer's adoption | none below `W`: step 3 gives up while one is |
//! | the memory given back in step 6 | every word below `W` is dead: moved (0), taken, stashed or given up; a late reader reads zeros, a late writer (a free giving its slot up) gets a fresh zero page |
//!
//! After a compaction the table is reclaimed as before once every slot is free: the reclaim
//! counts the list against the slots handed out at `W` and up, less the reserved ones left
//! unused, waits for the frees still giving slots up, and frees the map (no handle is left, so
//! nobody is reading it).

use super::free_list::{Freed, RETIRED, RETIRING, next_head};
use super::pages::{locate, page_len, page_start};
use super::retired::Retired;
use super::word::{
    DEADLINE_LOCK, FREE, GENERATION_MASK, NEXT_FREE_MASK, NEXT_FREE_SHIFT, REPEATING, SHARD,
    STAGED, generation_of, is_unreferenced, lifecycle_of,
};
use super::{FRESH_COUNT_MASK, MAX_SLOTS, SEALED, SlotTable};
use crate::sync::Ordering;

/// A shard compacts its table only when more slots than this were handed out.
pub(crate) const COMPACT_ABOVE: u64 = 1 << 16;

/// A compaction's steps 1 to 4 (see the [module documentation](self)).
#[derive(Debug)]
pub(crate) struct Survey {
    /// `W`: the slots handed out when it began, all to be retired.
    below: u32,
    /// The taken list, less the slots moved to `keep`: first slot + 1 (0: empty), last slot.
    taken: (u32, u32),
    /// The next link of the taken list to walk (a slot + 1; 0: walked).
    link: u32,
    /// The last slot walked and left on the taken list, + 1 (0: none yet).
    prev: u32,
    /// Slots of the taken list at `W` and up (freed between the read of `W` and the take: not
    /// retired), chained apart to be listed again: first slot + 1 (0: none), last slot.
    keep: (u32, u32),
    /// Bit `i`: slot `i` is on the taken list or in the stash.
    marks: Vec<u64>,
    /// Slots below `W` found FREE or being freed, unmarked (see step 3).
    suspects: Vec<u32>,
    /// The newest generation seen below `W`, as an offset from the fresh generation.
    newest: u32,
}

impl Survey {
    /// `W`: every slot below it is to be retired.
    pub(crate) fn below(&self) -> u32 {
        self.below
    }

    fn mark(&mut self, index: u32) {
        if let Some(bits) = self.marks.get_mut(index as usize / 64) {
            *bits |= 1 << (index % 64);
        }
    }

    /// Whether slot `index` is on the taken list or (after step 4's seal) in the stash: a
    /// timer freed before its move needs no drop then.
    pub(crate) fn is_marked(&self, index: u32) -> bool {
        self.marks
            .get(index as usize / 64)
            .is_some_and(|bits| bits & 1 << (index % 64) != 0)
    }
}

/// What a slot below `W` holds, for step 3 (see [`SlotTable::classify`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SlotClass {
    /// FREE and on the taken list: dead once retired.
    Free,
    /// FREE or being freed, but not on the taken list: checked at step 4.
    Suspect,
    /// Held by the shard, or ended and kept by handles: moved.
    Movable,
    /// Staged: the compaction gives up (for now).
    Staged,
}

impl SlotTable {
    /// Step 1: `None` if too few slots were handed out, or a retirement is in force already.
    /// Else the list is taken: the caller goes on to [`retire`](Self::retire) or
    /// [`abandon`](Self::abandon).
    pub(crate) fn survey(&self, threshold: u64) -> Option<Survey> {
        let handed_out =
            (self.fresh.next.load(Ordering::Acquire) & FRESH_COUNT_MASK).min(MAX_SLOTS);
        if handed_out <= threshold || self.retirement.below() != 0 {
            return None;
        }
        let below = handed_out as u32;
        // Before the head says RETIRING (its release), for the frees that see it.
        self.retirement.begin(below);
        let mut head = self.free_head.load(Ordering::Acquire);
        loop {
            match self.free_head.compare_exchange_weak(
                head,
                next_head(head, 0) | RETIRING,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(actual) => head = actual,
            }
        }
        Some(Survey {
            below,
            taken: (head as u32, 0),
            link: head as u32,
            prev: 0,
            keep: (0, 0),
            marks: vec![0; (below as usize).div_ceil(64)],
            suspects: Vec::new(),
            newest: 0,
        })
    }

    /// Step 2, a piece at a time: walks up to `steps` more slots of the taken list. True once
    /// it is walked whole.
    pub(crate) fn walk_survey(&self, survey: &mut Survey, steps: u32) -> bool {
        for _ in 0..steps {
            if survey.link == 0 {
                return true;
            }
            let index = survey.link - 1;
            // Ours alone since step 1: nobody else writes a listed word.
            let word = self.word(index).load(Ordering::Acquire);
            debug_assert_eq!(
                lifecycle_of(word),
                FREE,
                "slot {index} listed while occupied"
            );
            let next = ((word & NEXT_FREE_MASK) >> NEXT_FREE_SHIFT) as u32;
            survey.link = next;
            if index < survey.below {
                survey.mark(index);
                survey.prev = index + 1;
                survey.taken.1 = index;
                continue;
            }
            match survey.prev {
                0 => survey.taken.0 = next,
                prev => self.set_next_free(prev - 1, next),
            }
            self.set_next_free(index, survey.keep.0);
            if survey.keep.0 == 0 {
                survey.keep.1 = index;
            }
            survey.keep.0 = index + 1;
        }
        survey.link == 0
    }

    /// Step 3, for slot `index` below `W` (after step 2).
    pub(crate) fn classify(&self, survey: &mut Survey, index: u32) -> SlotClass {
        let word = self.word(index).load(Ordering::Acquire);
        let base = self.fresh.generation.load(Ordering::Relaxed) as u32;
        survey.newest = survey
            .newest
            .max(generation_of(word).wrapping_sub(base) & GENERATION_MASK);
        if lifecycle_of(word) == FREE || is_unreferenced(word) {
            if survey.is_marked(index) {
                return SlotClass::Free;
            }
            survey.suspects.push(index);
            SlotClass::Suspect
        } else if word & STAGED != 0 {
            SlotClass::Staged
        } else {
            SlotClass::Movable
        }
    }

    /// Step 4: retires every slot below `W` and reserves one fresh slot for each of `moved`
    /// (ascending; the slots step 3 found movable): returns the first (`moved[k]` goes to it
    /// `+ k`) and the survey (for [`Survey::is_marked`]). `None` if an allocation was under way
    /// (then everything taken is listed again, as [`abandon`](Self::abandon) does).
    pub(crate) fn retire(&self, mut survey: Survey, moved: &[u32]) -> Option<(u32, Survey)> {
        debug_assert_eq!(survey.link, 0, "retiring before the taken list was walked");
        let stash = self.take_stash(&mut survey);
        let accounted = survey.suspects.iter().all(|&index| survey.is_marked(index));
        let reserved = accounted
            .then(|| self.reserve_fresh(moved.len() as u64))
            .flatten();
        let Some(base) = reserved else {
            self.relist(&survey, stash);
            return None;
        };
        self.retirement
            .publish(Retired::new(survey.below, base, moved, survey.newest));
        self.mark_head(|head| head & !RETIRING | RETIRED);
        self.push_chain(survey.keep);
        Some((base, survey))
    }

    /// Gives a survey up before step 4 (the owner found a staged slot): lists again
    /// everything taken and stashed, and clears `RETIRING`.
    pub(crate) fn abandon(&self, mut survey: Survey) {
        while !self.walk_survey(&mut survey, u32::MAX) {}
        let stash = self.take_stash(&mut survey);
        self.relist(&survey, stash);
    }

    /// Seals the stash and marks its slots: returns its chain (first slot + 1, or 0; last).
    fn take_stash(&self, survey: &mut Survey) -> (u32, u32) {
        let first = self.retirement.seal_stash();
        let mut link = first;
        let mut last = 0;
        while link != 0 {
            last = link - 1;
            survey.mark(last);
            link = ((self.word(last).load(Ordering::Acquire) & NEXT_FREE_MASK) >> NEXT_FREE_SHIFT)
                as u32;
        }
        (first, last)
    }

    /// Sets the link of FREE slot `index`, which only the caller holds.
    pub(super) fn set_next_free(&self, index: u32, link: u32) {
        let word = self.word(index);
        let free = word.load(Ordering::Relaxed);
        word.store(
            free & !NEXT_FREE_MASK | (link as u64) << NEXT_FREE_SHIFT,
            Ordering::Relaxed,
        );
    }

    /// Lists again what a survey took (the walked taken list, its kept slots, the stash's
    /// chain: first slot + 1, or 0; last slot), clears `RETIRING`, and ends the survey.
    fn relist(&self, survey: &Survey, stash: (u32, u32)) {
        // First the marks: pushed under `RETIRING`, these slots would go to the (sealed) stash.
        self.mark_head(|head| head & !RETIRING);
        self.retirement.end_survey();
        self.push_chain(survey.taken);
        self.push_chain(survey.keep);
        self.push_chain(stash);
    }

    /// Changes the free list head's marks by `mark`, whatever its content.
    fn mark_head(&self, mark: impl Fn(u64) -> u64) {
        let mut head = self.free_head.load(Ordering::Acquire);
        loop {
            match self.free_head.compare_exchange_weak(
                head,
                mark(head),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(actual) => head = actual,
            }
        }
    }

    /// Pushes a chain of FREE slots (first slot + 1, or 0; last slot) onto the list.
    fn push_chain(&self, (first, last): (u32, u32)) {
        if first != 0 {
            self.push_freed(&mut Freed::chained(first, last));
        }
    }

    /// Takes `count` fresh slots at once: the first, `None` if the table would overflow.
    fn reserve_fresh(&self, count: u64) -> Option<u32> {
        let mut fresh = self.fresh.next.load(Ordering::Acquire);
        loop {
            debug_assert!(
                fresh & SEALED == 0,
                "a reclaim under way during a compaction"
            );
            let first = fresh & FRESH_COUNT_MASK;
            if first + count > MAX_SLOTS {
                return None;
            }
            match self.fresh.next.compare_exchange_weak(
                fresh,
                fresh + count,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    if let Some(last) = count.checked_sub(1) {
                        for page in locate(first as u32).0..=locate((first + last) as u32).0 {
                            self.pages.ensure(page);
                        }
                    }
                    return Some(first as u32);
                }
                Err(actual) => fresh = actual,
            }
        }
    }

    /// Step 5, for one timer: moves retired slot `old` to slot `new` (reserved for it by
    /// [`retire`](Self::retire)). False if it was freed, or is being freed, since step 3:
    /// then `new` stays unused, and unless `stashed` (the free went into the stash) the free
    /// owes the reclaim its giving up (see `drops_owed`).
    pub(crate) fn move_slot(&self, old: u32, new: u32, stashed: bool) -> bool {
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
                self.retirement.count_unused(!stashed);
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

    /// Step 6, a piece at a time: gives back the memory of the retired slots from `from`, up
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

    /// Every slot below this was retired by the compaction in force (0 if none).
    pub(crate) fn retired_below(&self) -> u32 {
        self.retirement.below()
    }

    /// The shard, applying a message that names slot `index`: the slot that holds its timer now
    /// (`index` itself unless it was retired and its timer moved).
    pub(crate) fn current(&self, index: u32) -> u32 {
        let mut index = index;
        self.load_following(&mut index);
        index
    }
}
