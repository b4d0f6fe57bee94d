//! The shared half of every timer: an atomic state word and an atomic deadline per slot, in a
//! table that any thread may read and that never moves (its pages' memory may go back).
//!
//! # Who touches what
//!
//! A timer lives in a *slot* of its shard's [`SlotTable`]. The slot index and generation form the
//! [`TimerHandle`](crate::TimerHandle). The slot's state word is the only memory that both the
//! owning shard and other threads (submitters, cancellers, handle owners) touch; the timer's task
//! and wheel links live in the shard's private table under the same index.
//!
//! # The files
//!
//! * this file: the [`SlotTable`] type and every transition of a slot's state word;
//! * [`word`]: the state word's bit layout and accessors;
//! * [`pages`]: page storage, where every `unsafe` of the table lives;
//! * [`free_list`]: the lock-free list of free slots;
//! * [`reclaim`]: giving the table's memory back when its shard is idle, and why that is safe;
//! * [`compact`]: moving the timers of a sparse table to fresh slots, so that the memory of the
//!   others goes back while the shard holds timers; [`retired`]: the map handles follow;
//! * [`spares`]: the free slots a stage's producer keeps for its own next timers;
//! * `hook`: the loom models' handle on a table (`cfg(shardwheel_loom)` only); `tests`.
//!
//! # The state word
//!
//! One word per slot holds its lifecycle (FREE, PENDING, FIRED, CANCELLED), whether the shard
//! still holds its entry (`SHARD`), the deadline lock (`DL_LOCK`), `REPEATING`, `RUNNING`, the
//! count of resets in flight and of live handles, and its generation; its bit layout is in
//! [`word`].
//!
//! # The deadline, and lazy resets
//!
//! Beside the word sits the timer's deadline tick. The submitter writes it before publishing
//! the slot; after that, a handle of a one-shot timer moves it with [`reset_lazy`]: check that
//! the word is PENDING and one-shot, swap the deadline (the reset's one locked instruction),
//! then read the word again. No message is sent when the deadline moved later: the shard finds
//! the entry at its old place in the wheel, reads the deadline, and stores it again further on.
//! An earlier deadline also sends a `Relocate` message, so the shard moves the entry forward.
//! The swap orders concurrent resets of one timer, so whoever moves the deadline earlier knows.
//!
//! The shard decides to fire a one-shot timer under `DEADLINE_LOCK`, which only the shard
//! takes: it locks the word, reads the deadline, and then, in one compare-and-swap, either fires
//! (FIRED, lock released) or releases the lock and stores the entry again at the later deadline.
//! Between the shard's lock and its read, and between a handle's swap and its second read of
//! the word, stands a sequentially consistent fence (Dekker's protocol): either the shard reads
//! the handle's deadline, or the handle sees the lock (and waits the few instructions until the
//! decision) or the decision itself. A reset whose second read finds the timer FIRED returns
//! false, so a reset that returned true is never outrun by its timer firing at the old deadline;
//! unless it moved the deadline earlier: the shard may have fired on the new deadline, and the
//! reset must then not say it moved nothing (the task ran before the old deadline, which the
//! caller would still believe in), so it returns true (the task ran no earlier than either).
//! The shard never waits for a handle, and no user code runs under the lock.
//!
//! | from                      | event (by whom)                         | to                               |
//! |---------------------------|-----------------------------------------|----------------------------------|
//! | FREE                      | allocate + [`begin`] (submitter)        | PENDING, SHARD, 1 handle         |
//! | FREE                      | allocate + [`begin_staged`] (submitter, one-shot) | PENDING, SHARD, STAGED, 1 handle |
//! | PENDING, STAGED           | [`adopt`] (shard, at the stage's cell)  | STAGED cleared: the shard holds it |
//! | CANCELLED, STAGED         | [`adopt`] (shard, at the stage's cell)  | STAGED and SHARD cleared (task dropped) |
//! | PENDING, STAGED, 1 handle | [`retract`] (the stage's producer, its handle's owner) | CANCELLED, nothing held: freed at once (task taken back), into the producer's [`spares`] if there is room |
//! | PENDING                   | [`cancel`] (any thread)                 | CANCELLED (shard told by message, unless STAGED: it finds out at [`adopt`]) |
//! | PENDING                   | [`cancel_and_release`] (a `Sleep`)      | CANCELLED, handles - 1 (message as for [`cancel`]) |
//! | FIRED/CANCELLED           | [`cancel_and_release`] (a `Sleep`)      | handles - 1 (as a handle's drop) |
//! | PENDING, one-shot         | [`reset_lazy`] (any thread)             | unchanged (deadline swapped)     |
//! | PENDING, repeating        | [`reset`] (any thread)                  | PENDING, resets + 1              |
//! | any occupied, repeating   | [`reset_applied`] (shard)               | resets - 1                       |
//! | PENDING, one-shot, due    | [`fire`] (shard, under DL_LOCK)         | FIRED, SHARD cleared             |
//! | PENDING, one-shot, deadline later | [`fire`] (shard, under DL_LOCK) | unchanged: stored again later   |
//! | PENDING, repeating, resets > 0 | [`fire`] (shard)                   | unchanged: the reset wins        |
//! | PENDING, repeating        | [`fire`] (shard)                        | PENDING, RUNNING                 |
//! | RUNNING                   | [`finish_run`] (shard, `Rearm` message) | PENDING (re-armed), or FIRED / SHARD cleared |
//! | RUNNING, after shutdown   | [`end_run_after_shutdown`] (runner)     | CANCELLED if PENDING; SHARD cleared |
//! | CANCELLED                 | [`let_go`] (shard)                      | SHARD cleared                    |
//! | FIRED/CANCELLED, no SHARD, no handles | last of the above (whoever) | FREE, generation + 1, on free list (the shard's let-go on a `Cancel` message: first in its [`Freed`] chain, pushed at the end of its drain) |
//! | FREE, a spare             | taken by its producer ([`spares`])      | as allocated                     |
//! | FREE, a spare             | flushed by the shard, before a reclaim ([`spares`]) | on the free list     |
//! | every slot FREE and on the free list | [`try_reclaim`] (shard, idle)    | off the list; fresh again, at a generation above all; page memory given back |
//! | FREE, below a compaction's bound | taken with the list, stashed or given up ([`compact`], shard) | dead (0 once its page goes back) |
//! | occupied, below a compaction's bound, not STAGED | [`move_slot`] (shard; a held one-shot under DL_LOCK) | 0; the same word in a fresh slot, which handles and messages follow |
//!
//! Every transition is one compare-and-swap or read-modify-write of the word, so exactly one
//! of {shard fires, a cancel succeeds} happens, and exactly one thread frees a slot (a lazy
//! reset changes only the deadline). A move ends with one compare-and-swap to 0; whoever then
//! reads 0 in a slot a handle or message names follows the [`retired`] map to the timer's new
//! slot (`load_following`), so every transition above applies there. A resetting handle holds
//! a handle count, so its slot cannot be freed (and reused) under it. The reclaim (last row)
//! writes no word: it empties the list and restarts fresh allocation (see [`reclaim`]).
//!
//! # Who counts a timer's end
//!
//! A timer ends exactly once: by the one compare-and-swap that takes it out of PENDING. Whoever
//! makes that transition, and only they, counts the end (`fired` or `cancelled`, hence
//! `pending` and `stats()`) and gives back its `max_pending` place. Every later message about
//! the timer (a `Cancel` arriving after the `Rearm` that ended it, a `Rearm` finding it
//! cancelled, a `Reset` or `Relocate` finding it ended) counts nothing.
//!
//! | transition out of PENDING                            | made by                    | counts |
//! |------------------------------------------------------|----------------------------|--------|
//! | [`cancel`] -> CANCELLED                              | a handle                   | the handle: `cancelled` |
//! | [`retract`] -> CANCELLED                             | the stage's producer       | the producer: `cancelled` |
//! | [`cancel_and_release`] -> CANCELLED (returns `Some`) | a `Sleep` dropping or replacing its timer | the sleep: `cancelled` |
//! | [`cancel`] -> CANCELLED, after its push found the inbox closed | the submitter    | the submitter: undoes `scheduled` |
//! | [`cancel_for_shutdown`] -> CANCELLED                 | the shard's last sweep     | the shard: `cancelled` |
//! | [`fire`] -> FIRED (one-shot)                         | the shard                  | the shard: `fired` |
//! | [`finish_run`] -> FIRED ([`RunEnd::Stopped`]: the task stopped or panicked) | the shard | the shard: `fired` |
//! | [`end_run_after_shutdown`] -> CANCELLED (returns true) | the runner of a late `Rearm` | the runner: `cancelled` |
//!
//! A staged timer cancelled before its shard adopted it ends like any other cancelled timer
//! (its canceller counts it); [`adopt`] only lets go of it and counts nothing.
//!
//! The shard's `live` count of entries it holds follows `SHARD` instead: one more when a
//! `Schedule` is stored or a staged timer adopted, one less when the shard lets go of the entry (a one-shot fire, a
//! `Cancel` that finds the task, a `Rearm` that ends the run).
//!
//! Messages are validated against the slot's word when applied, never assumed current: those
//! that may arrive after their timer ended (`Cancel`, `Relocate`, `Reset`) carry its generation
//! and check it, and the state the message expects; `Rearm` must find its run (`RUNNING` and
//! `SHARD`: the slot cannot be reused before the `Rearm` is applied, so the index suffices,
//! and a generation would only grow every message). A `Cancel` of a repeating timer cancelled
//! during a run may arrive after the `Rearm` ended it, when the shard has gone idle and given
//! its entry table back: it finds the slot no longer held ([`cancel_awaits_let_go`]) and
//! touches no entry.
//!
//! [`begin`]: SlotTable::begin
//! [`begin_staged`]: SlotTable::begin_staged
//! [`adopt`]: SlotTable::adopt
//! [`retract`]: SlotTable::retract
//! [`cancel`]: SlotTable::cancel
//! [`cancel_and_release`]: SlotTable::cancel_and_release
//! [`reset_lazy`]: SlotTable::reset_lazy
//! [`reset`]: SlotTable::reset
//! [`reset_applied`]: SlotTable::reset_applied
//! [`fire`]: SlotTable::fire
//! [`finish_run`]: SlotTable::finish_run
//! [`end_run_after_shutdown`]: SlotTable::end_run_after_shutdown
//! [`let_go`]: SlotTable::let_go
//! [`try_reclaim`]: SlotTable::try_reclaim
//! [`cancel_for_shutdown`]: SlotTable::cancel_for_shutdown
//! [`cancel_awaits_let_go`]: SlotTable::cancel_awaits_let_go
//! [`move_slot`]: SlotTable::move_slot

mod compact;
mod free_list;
#[cfg(shardwheel_loom)]
mod hook;
mod pages;
mod reclaim;
mod retired;
mod spares;
#[cfg(test)]
mod tests;
mod word;

pub(crate) use compact::{COMPACT_ABOVE, SlotClass, Survey};
pub(crate) use free_list::Freed;
#[cfg(shardwheel_loom)]
pub use hook::SlotTableHook;
pub(crate) use pages::Slot;
pub(crate) use reclaim::{RECLAIM_ABOVE, Reclaim};
pub(crate) use spares::Spares;

use crate::sync::{AtomicBool, AtomicU64, Ordering, thread};
use crossbeam_utils::CachePadded;
use pages::{PAGES, Pages, locate};
use retired::Retirement;
use word::*;

/// The most slots a table hands out (indices must also fit the wheel's `u32` links).
pub(crate) const MAX_SLOTS: u64 = crate::wheel::raw::MAX_INDEX as u64 + 1;

/// `next_fresh`, bits 0-39: slots handed out fresh since the table was made or last reclaimed.
/// It may count past [`MAX_SLOTS`] (failed allocations do not undo their increment), by at most
/// the number of threads allocating at once (see [`SlotTable::allocate`]).
const FRESH_COUNT_MASK: u64 = (1 << 40) - 1;
/// `next_fresh`, bits 40-44: `ready`, the number of leading pages a fresh allocation may write
/// ([`PAGES`]: all). Lower only while a reclaim gives pages back (see [`reclaim`]).
const READY_SHIFT: u32 = 40;
const READY_ONE: u64 = 1 << READY_SHIFT;
const READY_MASK: u64 = 0b1_1111 << READY_SHIFT;
const ALL_READY: u64 = (PAGES as u64) << READY_SHIFT;
/// `next_fresh`, bit 63: a reclaim is committing; fresh allocations wait.
const SEALED: u64 = 1 << 63;
const _: () = assert!(MAX_SLOTS < FRESH_COUNT_MASK / 2 && PAGES < 32);

/// A timer's state as a handle sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TimerState {
    /// Waiting for its deadline.
    Pending,
    /// Its deadline passed and its task was handed to run (it may still be running).
    Expired,
    /// It was cancelled (by a handle, or by shutdown); its task will never run.
    Cancelled,
}

/// What [`SlotTable::adopt`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Adoption {
    /// Pending: the shard holds it now and stores it in its wheel.
    Pending,
    /// Cancelled while staged: the shard has let go of it; drop its task.
    Cancelled,
    /// Retracted by its producer, who took the task: skip the cell.
    Retracted,
}

/// What [`SlotTable::fire`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FireOutcome {
    /// The timer is now FIRED: run its task. `free` says the caller must free the slot.
    Fire { free: bool },
    /// A repeating timer is now RUNNING: run its task, then hand it back with a `Rearm`
    /// message, which the shard applies with `finish_run`.
    Run,
    /// A reset is in flight: keep the entry aside until its message arrives.
    ResetInFlight,
    /// A one-shot timer's deadline moved later: store it again at this tick.
    Later(u64),
    /// A cancel won: its message will let go of the entry.
    Cancelled,
}

/// How [`SlotTable::finish_run`] ended a repeating timer's run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RunEnd {
    /// Still PENDING and its task wants another run: the shard re-arms it.
    Again,
    /// This call ended it, PENDING -> FIRED (its task stopped, or panicked): the shard counts
    /// the end (a fire) and gives back its `max_pending` place.
    Stopped,
    /// It was cancelled during the run: its canceller counted the end; the shard counts nothing.
    WasCancelled,
    /// The slot holds no run of this timer (a bug): nothing changed.
    Stale,
}

/// What [`SlotTable::reset_lazy`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LazyReset {
    /// Done. `earlier`: the deadline moved earlier, so tell the shard to move the entry.
    Done { earlier: bool },
    /// The timer is no longer pending.
    NotPending,
    /// A repeating timer: reset it through the shard ([`SlotTable::reset`]).
    Repeating,
}

/// What [`SlotTable::reset`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ResetOutcome {
    /// Counted: send the reset message.
    Accepted,
    /// The timer is no longer pending.
    NotPending,
    /// Too many resets in flight: let the shard catch up and retry.
    Busy,
}

/// The fresh-allocation counter and the generation fresh slots start at, on one cache line
/// (every fresh allocation reads both).
struct Fresh {
    /// Slots never handed out since the last reclaim start here: the count, `ready` and
    /// `SEALED` (see [`FRESH_COUNT_MASK`], [`READY_SHIFT`], [`SEALED`]).
    next: AtomicU64,
    /// The generation of freshly handed out slots: above every generation a message or
    /// handle of the table's earlier life may still carry (0 until the first reclaim).
    generation: AtomicU64,
}

/// The per-shard table of slot state words, with a lock-free free list.
pub(crate) struct SlotTable {
    /// The slots themselves ([`pages`]).
    pages: Pages,
    /// Head of the [free list](free_list) (its tagged encoding is described there).
    free_head: CachePadded<AtomicU64>,
    /// Slots never handed out (since the last reclaim) start here.
    fresh: CachePadded<Fresh>,
    /// Producers are to keep no [spares] (read at each spare taken or given, written
    /// by the shard around its reclaims).
    flushing: CachePadded<AtomicBool>,
    /// The slots a [compaction](compact) retired, and where their timers went.
    retirement: Retirement,
}

impl std::fmt::Debug for SlotTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotTable")
            .field(
                "allocated",
                &(self.fresh.next.load(Ordering::Relaxed) & FRESH_COUNT_MASK),
            )
            .finish()
    }
}

impl SlotTable {
    pub(crate) fn new() -> SlotTable {
        SlotTable {
            pages: Pages::new(),
            free_head: CachePadded::new(AtomicU64::new(0)),
            fresh: CachePadded::new(Fresh {
                next: AtomicU64::new(ALL_READY),
                generation: AtomicU64::new(0),
            }),
            flushing: CachePadded::new(AtomicBool::new(false)),
            retirement: Retirement::default(),
        }
    }

    /// The state word of a slot that has been handed out (its page exists).
    fn word(&self, index: u32) -> &AtomicU64 {
        &self.slot(index).state
    }

    /// The word of the slot that holds the timer slot `*index` held, which becomes `*index`:
    /// the slot itself unless a [compaction](compact) moved its timer (then its own word reads
    /// 0). For handles and messages, which keep naming the old slot.
    #[inline]
    fn load_following(&self, index: &mut u32) -> u64 {
        let word = self.word(*index).load(Ordering::Acquire);
        self.follow(index, word)
    }

    /// After reading `word` in slot `*index` (a load, or a failed compare-and-swap): if it is
    /// 0 and the slot's timer was moved, the word of its new slot, which becomes `*index` (see
    /// [`load_following`](Self::load_following)).
    #[inline]
    fn follow(&self, index: &mut u32, word: u64) -> u64 {
        if word != 0 {
            return word;
        }
        let (moved, word) = self.follow_moved(*index);
        *index = moved;
        word
    }

    /// [`follow`](Self::follow) for a loop that keeps `*slot`, the word of slot `*index`.
    #[inline]
    fn follow_slot<'a>(&'a self, index: &mut u32, slot: &mut &'a AtomicU64, word: u64) -> u64 {
        if word != 0 {
            return word;
        }
        let word = self.follow(index, word);
        *slot = self.word(*index);
        word
    }

    /// [`follow`](Self::follow) past a word read as 0 in slot `index`: the slot holding its
    /// timer now, and its word.
    #[cold]
    #[inline(never)]
    fn follow_moved(&self, mut index: u32) -> (u32, u64) {
        while let Some(moved) = self.moved_to(index) {
            index = moved;
            let word = self.word(moved).load(Ordering::Acquire);
            if word != 0 {
                return (index, word);
            }
        }
        (index, 0)
    }

    /// A slot that has been handed out (its page exists).
    #[inline]
    pub(crate) fn slot(&self, index: u32) -> &Slot {
        self.pages.slot(index)
    }

    /// Takes a free slot: returns its index and generation. `None` when 2^32 - 2 slots are in use.
    pub(crate) fn allocate(&self) -> Option<(u32, u32)> {
        loop {
            if let Some(popped) = self.pop_free() {
                return Some(popped);
            }
            // Acquire: a reclaim's commit and each page it gave back (see `try_reclaim`).
            let fresh = self.fresh.next.fetch_add(1, Ordering::Acquire);
            if fresh & SEALED != 0 {
                // A reclaim is committing. Our increment is discarded with the seal, so the
                // index means nothing: wait, then start over (the free list may have changed).
                self.wait_unsealed();
                continue;
            }
            let count = fresh & FRESH_COUNT_MASK;
            if count >= MAX_SLOTS {
                self.undo_exhausted();
                return None;
            }
            let index = count as u32;
            let page = locate(index).0;
            if page as u64 >= (fresh & READY_MASK) >> READY_SHIFT {
                // The reclaim that just committed has not given this page back yet: writing it
                // now could be erased by its `madvise`.
                self.wait_ready(page);
            }
            self.pages.ensure(page);
            let generation = self.fresh.generation.load(Ordering::Relaxed) as u32;
            return Some((index, generation));
        }
    }

    /// Waits until no reclaim is committing (a few instructions of the shard's).
    #[cold]
    fn wait_unsealed(&self) {
        while self.fresh.next.load(Ordering::Acquire) & SEALED != 0 {
            thread::yield_now();
        }
    }

    /// Waits until a committed reclaim has given back page `page` (and every page before it).
    #[cold]
    fn wait_ready(&self, page: usize) {
        while (self.fresh.next.load(Ordering::Acquire) & READY_MASK) >> READY_SHIFT <= page as u64 {
            thread::yield_now();
        }
    }

    /// Every slot is in use: brings the count back to [`MAX_SLOTS`], so that failing
    /// allocations cannot carry it into `ready` (undoing with a subtraction could borrow from
    /// `ready` if a reclaim committed meanwhile; this compare-and-swap cannot).
    #[cold]
    fn undo_exhausted(&self) {
        let _ = self
            .fresh
            .next
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |fresh| {
                (fresh & SEALED == 0 && fresh & FRESH_COUNT_MASK > MAX_SLOTS)
                    .then_some(fresh & !FRESH_COUNT_MASK | MAX_SLOTS)
            });
    }

    /// Publishes a freshly allocated slot as a pending timer with one handle, due at tick
    /// `deadline`.
    pub(crate) fn begin(&self, index: u32, generation: u32, deadline: u64, repeating: bool) {
        self.begin_with(
            index,
            generation,
            deadline,
            if repeating { REPEATING } else { 0 },
        );
    }

    /// Like [`begin`](Self::begin) for a one-shot timer that goes through a
    /// [stage](crate::engine::stage): STAGED until its shard [adopts](Self::adopt) it. Until
    /// the stage's cell is published nobody else knows the slot, so [`begin`](Self::begin)
    /// may still overwrite this if the stage is full.
    pub(crate) fn begin_staged(&self, index: u32, generation: u32, deadline: u64) {
        self.begin_with(index, generation, deadline, STAGED);
    }

    fn begin_with(&self, index: u32, generation: u32, deadline: u64, flags: u64) {
        let slot = self.slot(index);
        slot.deadline.store(deadline, Ordering::Relaxed);
        let word = (generation as u64) << GENERATION_SHIFT | HANDLE_ONE | SHARD | flags | PENDING;
        slot.state.store(word, Ordering::Release);
    }

    /// The shard reaches a staged timer's cell: clears STAGED. If the timer is still pending,
    /// the shard now holds it (and stores it in its wheel at the slot's deadline, read after
    /// this call); if it was cancelled meanwhile, the shard lets go of it here (its task is
    /// dropped by the caller), freeing the slot if no handle is left. Nothing is counted: the
    /// cancel counted the end. [`Adoption::Retracted`] if its producer took it back first
    /// ([`retract`](Self::retract): the slot is no longer STAGED, or already reused): the
    /// cell's task is not the caller's.
    pub(crate) fn adopt(&self, index: u32, generation: u32) -> Adoption {
        let slot = self.word(index);
        let mut word = slot.load(Ordering::Acquire);
        loop {
            if !is_staged_for(word, generation) {
                return Adoption::Retracted;
            }
            debug_assert!(
                word & SHARD != 0,
                "slot {index} staged without its shard's hold: {word:#x}"
            );
            let (new, adoption) = if lifecycle_of(word) == PENDING {
                (word & !STAGED, Adoption::Pending)
            } else {
                (word & !(STAGED | SHARD), Adoption::Cancelled)
            };
            match slot.compare_exchange_weak(word, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    if is_unreferenced(new) {
                        self.free(index, new);
                    }
                    return adoption;
                }
                Err(actual) => word = actual,
            }
        }
    }

    /// Whether the staged timer `(index, generation)` was [retracted](Self::retract) (the slot
    /// is no longer staged for it): what [`adopt`](Self::adopt) would find, without adopting.
    pub(crate) fn is_retracted(&self, index: u32, generation: u32) -> bool {
        !is_staged_for(self.word(index).load(Ordering::Acquire), generation)
    }

    /// The producer of a staged timer takes it back before its shard adopted it: PENDING,
    /// STAGED, held for the shard, with exactly one handle (the caller's) -> CANCELLED with
    /// nothing held, and freed at once. True iff done: the caller then owns the task in the
    /// stage's cell and counts the cancel; the shard will skip the cell
    /// ([`Adoption::Retracted`]).
    pub(crate) fn retract(&self, index: u32, generation: u32, spares: &Spares) -> bool {
        let slot = self.word(index);
        let mut word = slot.load(Ordering::Acquire);
        loop {
            if generation_of(word) != generation
                || lifecycle_of(word) != PENDING
                || word & (STAGED | SHARD) != STAGED | SHARD
                || handles_of(word) != 1
            {
                return false;
            }
            let new = word & !(LIFECYCLE_MASK | STAGED | SHARD | HANDLE_MASK) | CANCELLED;
            match slot.compare_exchange_weak(word, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    self.free_to_spares(index, new, spares);
                    return true;
                }
                Err(actual) => word = actual,
            }
        }
    }

    /// Hints the processor to fetch slot `index` (handed out) ahead of its use.
    #[inline]
    pub(crate) fn prefetch(&self, index: u32) {
        self.pages.prefetch(index);
    }

    /// The deadline tick of a slot that has been handed out (see the module documentation).
    #[inline]
    pub(crate) fn deadline(&self, index: u32) -> u64 {
        self.slot(index).deadline.load(Ordering::Relaxed)
    }

    /// The shard sets the deadline of a repeating timer it holds (handles never write it).
    pub(crate) fn set_deadline(&self, index: u32, deadline: u64) {
        self.slot(index).deadline.store(deadline, Ordering::Relaxed);
    }

    /// Moves a one-shot timer's deadline in place (see the module documentation).
    pub(crate) fn reset_lazy(&self, index: u32, generation: u32, deadline: u64) -> LazyReset {
        let mut index = index;
        let mut first_old = None;
        loop {
            if let Some(reset) =
                self.reset_lazy_at(&mut index, generation, deadline, &mut first_old)
            {
                return reset;
            }
        }
    }

    /// [`reset_lazy`](Self::reset_lazy) at slot `*index`; `None` if a compaction moved the
    /// timer meanwhile (the deadline it copied may not be ours): then `*index` is its new
    /// slot, to reset again. `first_old`: the deadline the first try swapped out, the one the
    /// reset replaced (a try again swaps out a copy, maybe its own).
    #[inline]
    fn reset_lazy_at(
        &self,
        index: &mut u32,
        generation: u32,
        deadline: u64,
        first_old: &mut Option<u64>,
    ) -> Option<LazyReset> {
        let word = self.load_following(index);
        let slot = self.slot(*index);
        if generation_of(word) != generation || lifecycle_of(word) != PENDING {
            // Tried again after a move: the moved timer may have fired on our deadline.
            if let Some(old) = *first_old
                && generation_of(word) == generation
                && lifecycle_of(word) == FIRED
                && deadline < old
                && slot.deadline.load(Ordering::Acquire) == deadline
            {
                return Some(LazyReset::Done { earlier: false });
            }
            return Some(LazyReset::NotPending);
        }
        if word & REPEATING != 0 {
            return Some(LazyReset::Repeating);
        }
        // The reset's one locked instruction. The swap makes concurrent resets of one timer
        // follow each other, so whoever moves the deadline earlier knows it (and tells the shard).
        // Dekker with `fire`, which locks the word and then reads the deadline: either the
        // shard reads our deadline, or we see its lock (or its decision) below. Why the fence
        // must follow a read-modify-write: `crate::sync::swap_then_fence`.
        let swapped = crate::sync::swap_then_fence(&slot.deadline, deadline, Ordering::AcqRel);
        let old = *first_old.get_or_insert(swapped);
        #[cfg(feature = "test-hooks")]
        reset_hook::after_reset_swap();
        let mut word = slot.state.load(Ordering::Acquire);
        while word & DEADLINE_LOCK != 0 {
            // The shard is deciding on a deadline it read, or moving the timer (a few
            // instructions): wait for it.
            thread::yield_now();
            word = slot.state.load(Ordering::Acquire);
        }
        if word == 0 && self.moved_to(*index).is_some() {
            return None;
        }
        Some(match lifecycle_of(word) {
            PENDING => LazyReset::Done {
                earlier: deadline < old,
            },
            // Fired meanwhile, on the deadline the shard read: the old one, or ours. Ours only
            // counts if it is the earlier one (the shard fired on it, and the reset must not
            // say it changed nothing: that timer ran before the old deadline). Then either way
            // the timer ran no earlier than our deadline, so the reset is honestly "in time".
            FIRED if deadline < old => LazyReset::Done { earlier: false },
            // Fired at a deadline no later than ours, or cancelled.
            _ => LazyReset::NotPending,
        })
    }

    /// Applies `change` to the word of an occupied slot of generation `generation` until it
    /// sticks. `change` returns `None` to leave the word alone. Returns the old and new word.
    #[inline]
    fn update(
        &self,
        index: u32,
        generation: u32,
        mut change: impl FnMut(u64) -> Option<u64>,
    ) -> Result<(u64, u64), u64> {
        let mut index = index;
        let mut slot = self.word(index);
        let first = slot.load(Ordering::Acquire);
        let mut word = self.follow_slot(&mut index, &mut slot, first);
        loop {
            if generation_of(word) != generation || lifecycle_of(word) == FREE {
                return Err(word);
            }
            let Some(new) = change(word) else {
                return Err(word);
            };
            match slot.compare_exchange_weak(word, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok((word, new)),
                Err(actual) => word = self.follow_slot(&mut index, &mut slot, actual),
            }
        }
    }

    /// The timer's state as handle `(index, generation)` sees it.
    #[inline]
    pub(crate) fn state(&self, index: u32, generation: u32) -> TimerState {
        let word = self.load_following(&mut { index });
        debug_assert_eq!(
            generation_of(word),
            generation,
            "slot {index} reused under a live handle"
        );
        match lifecycle_of(word) {
            PENDING => TimerState::Pending,
            FIRED => TimerState::Expired,
            _ => TimerState::Cancelled,
        }
    }

    /// Whether the timer of generation `generation` in slot `index` is still pending (false
    /// once the slot was reused).
    pub(crate) fn is_pending(&self, index: u32, generation: u32) -> bool {
        let word = self.load_following(&mut { index });
        generation_of(word) == generation && lifecycle_of(word) == PENDING
    }

    /// PENDING -> CANCELLED. True iff this call did it (so the task will never run).
    pub(crate) fn cancel(&self, index: u32, generation: u32) -> bool {
        self.cancel_staged(index, generation).is_some()
    }

    /// [`cancel`](Self::cancel), telling whether the timer was still STAGED (then its shard
    /// needs no message: it lets go of the timer when it reaches the stage's cell). `None`:
    /// this call cancelled nothing.
    #[inline]
    pub(crate) fn cancel_staged(&self, index: u32, generation: u32) -> Option<bool> {
        self.update(index, generation, |word| {
            (lifecycle_of(word) == PENDING).then_some(word & !LIFECYCLE_MASK | CANCELLED)
        })
        .ok()
        .map(|(old, _)| old & STAGED != 0)
    }

    /// [`cancel`](Self::cancel) and [`drop_handle`](Self::drop_handle) in one compare-and-swap,
    /// for a holder of one of the slot's handles that is done with the timer (a `Sleep`
    /// dropped, or replacing its timer): PENDING -> CANCELLED and one handle less; a timer no
    /// longer pending only loses the handle (and its slot is freed if nothing else refers to
    /// it). `Some` iff this call cancelled it (so the task will never run), telling whether
    /// it was STAGED (as [`cancel_staged`](Self::cancel_staged)).
    ///
    /// The caller holds no handle afterwards: once the shard lets go of a cancelled slot it may
    /// be freed and reused, so what follows the cancel (its message) must not touch the slot,
    /// and is validated by generation when applied.
    pub(crate) fn cancel_and_release(&self, index: u32, generation: u32) -> Option<bool> {
        let mut index = index;
        let mut slot = self.word(index);
        let first = slot.load(Ordering::Acquire);
        let mut word = self.follow_slot(&mut index, &mut slot, first);
        loop {
            debug_assert_eq!(
                generation_of(word),
                generation,
                "slot {index} reused under a live handle"
            );
            debug_assert!(
                handles_of(word) > 0,
                "slot {index} lost more handles than it had"
            );
            let pending = lifecycle_of(word) == PENDING;
            let mut new = if pending {
                word & !LIFECYCLE_MASK | CANCELLED
            } else {
                word
            };
            if word & HANDLE_MASK != HANDLE_MASK {
                new -= HANDLE_ONE; // Else sticky: see `clone_handle`.
            }
            if new == word {
                return None;
            }
            match slot.compare_exchange_weak(word, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    if is_unreferenced(new) {
                        self.free(index, new);
                    }
                    return pending.then_some(word & STAGED != 0);
                }
                Err(actual) => word = self.follow_slot(&mut index, &mut slot, actual),
            }
        }
    }

    /// Counts a reset of a pending repeating timer; the caller then sends the reset message.
    pub(crate) fn reset(&self, index: u32, generation: u32) -> ResetOutcome {
        let mut busy = false;
        let result = self.update(index, generation, |word| {
            if lifecycle_of(word) != PENDING {
                return None;
            }
            busy = word & RESET_MASK == RESET_MASK;
            (!busy).then_some(word + RESET_ONE)
        });
        match result {
            Ok(_) => ResetOutcome::Accepted,
            Err(_) if busy => ResetOutcome::Busy,
            Err(_) => ResetOutcome::NotPending,
        }
    }

    /// The shard applies one reset message. Returns whether the timer is still pending (the
    /// shard then moves it), or `None` if the message is stale (the slot was reused).
    pub(crate) fn reset_applied(&self, index: u32, generation: u32) -> Option<bool> {
        match self.update(index, generation, |word| {
            debug_assert!(
                resets_of(word) > 0,
                "reset message for slot {index} without a count"
            );
            Some(word - RESET_ONE)
        }) {
            Ok((old, _)) => Some(lifecycle_of(old) == PENDING),
            Err(_) => None,
        }
    }

    /// The shard's attempt to fire a slot it holds, at tick `due` (`repeating`: its task is
    /// repeating).
    pub(crate) fn fire(&self, index: u32, due: u64, repeating: bool) -> FireOutcome {
        let cell = self.slot(index);
        let slot = &cell.state;
        let mut word = slot.load(Ordering::Acquire);
        loop {
            debug_assert!(
                word & SHARD != 0,
                "firing slot {index} the shard does not hold: {word:#x}"
            );
            debug_assert_eq!(
                word & REPEATING != 0,
                repeating,
                "slot {index}'s REPEATING bit disagrees with its task"
            );
            if lifecycle_of(word) != PENDING {
                return FireOutcome::Cancelled;
            }
            if repeating {
                if resets_of(word) != 0 {
                    return FireOutcome::ResetInFlight;
                }
            } else {
                debug_assert!(
                    word & DEADLINE_LOCK == 0,
                    "slot {index}'s deadline lock is taken by someone other than its shard"
                );
                // Dekker with `reset_lazy`, which swaps the deadline and then reads the word:
                // either we read its deadline, or it sees our lock. The fence comes with the
                // compare-and-swap (`crate::sync::swap_then_fence` says why).
                match crate::sync::compare_exchange_weak_then_fence(
                    slot,
                    word,
                    word | DEADLINE_LOCK,
                    Ordering::Acquire,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        return self.decide_locked(index, word | DEADLINE_LOCK, due);
                    }
                    Err(actual) => {
                        word = actual;
                        continue;
                    }
                }
            }
            debug_assert!(word & RUNNING == 0, "slot {index} fired while running");
            let new = if repeating {
                word | RUNNING
            } else {
                word & !(LIFECYCLE_MASK | SHARD) | FIRED
            };
            match slot.compare_exchange_weak(word, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) if repeating => return FireOutcome::Run,
                Ok(_) => {
                    return FireOutcome::Fire {
                        free: is_unreferenced(new),
                    };
                }
                Err(actual) => word = actual,
            }
        }
    }

    /// The rest of [`fire`](Self::fire) for a one-shot timer whose deadline lock the shard
    /// holds (`word` is the word it locked): fire, or unlock and look again later.
    fn decide_locked(&self, index: u32, mut word: u64, due: u64) -> FireOutcome {
        let cell = self.slot(index);
        // After the lock and the fence: a reset whose swap we do not see here sees our lock
        // and waits for the decision (and learns from it whether it was in time).
        let deadline = cell.deadline.load(Ordering::Acquire);
        loop {
            let (new, outcome) = if lifecycle_of(word) != PENDING {
                // Cancelled while we held the lock: its message will let go of the entry.
                (word & !DEADLINE_LOCK, FireOutcome::Cancelled)
            } else if deadline > due {
                (word & !DEADLINE_LOCK, FireOutcome::Later(deadline))
            } else {
                let fired = word & !(LIFECYCLE_MASK | SHARD | DEADLINE_LOCK) | FIRED;
                (
                    fired,
                    FireOutcome::Fire {
                        free: is_unreferenced(fired),
                    },
                )
            };
            match cell
                .state
                .compare_exchange_weak(word, new, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return outcome,
                // A cancel, or a handle coming or going; the lock is still ours.
                Err(actual) => word = actual,
            }
        }
    }

    /// The shard takes back a repeating timer after a run (applying its `Rearm` message). If it is still pending and `again` (the task wants
    /// another run), it stays PENDING and the shard re-arms it. Otherwise it ends: FIRED if it
    /// stopped by itself (or panicked), CANCELLED if cancelled meanwhile; the shard lets go of
    /// it and it is freed if no handle is left. See "Who counts a timer's end" for what the
    /// outcome tells the shard to count.
    pub(crate) fn finish_run(&self, index: u32, again: bool) -> RunEnd {
        let slot = self.word(index);
        let mut word = slot.load(Ordering::Acquire);
        loop {
            // Validated, never assumed. `RUNNING | SHARD` identifies the run: the slot cannot be
            // freed, so not reused, until its `Rearm` is applied (or, after shutdown, ends it).
            if word & (RUNNING | SHARD) != RUNNING | SHARD {
                debug_assert!(
                    false,
                    "slot {index} finished a run it was not in: {word:#x}"
                );
                return RunEnd::Stale;
            }
            let (new, end) = if lifecycle_of(word) != PENDING {
                (word & !(RUNNING | SHARD), RunEnd::WasCancelled)
            } else if again {
                (word & !RUNNING, RunEnd::Again)
            } else {
                (
                    word & !(RUNNING | SHARD | LIFECYCLE_MASK) | FIRED,
                    RunEnd::Stopped,
                )
            };
            match slot.compare_exchange_weak(word, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    if is_unreferenced(new) {
                        self.free(index, new);
                    }
                    return end;
                }
                Err(actual) => word = actual,
            }
        }
    }

    /// Whether a `Cancel` message of timer `(index, generation)` still has work: the slot is
    /// that timer's, CANCELLED, and the shard holds its entry with its task (not out running:
    /// the `Rearm` of a repeating timer cancelled during its run ends it instead, and may have
    /// done so already, after which the entry, even the whole entry table, may be gone).
    pub(crate) fn cancel_awaits_let_go(&self, index: u32, generation: u32) -> bool {
        let word = self.word(index).load(Ordering::Acquire);
        generation_of(word) == generation
            && lifecycle_of(word) == CANCELLED
            && word & (SHARD | RUNNING) == SHARD
    }

    /// A repeating timer's run ended after its shard shut down: it counts as cancelled by the
    /// shutdown, and nothing holds it for the shard any more. True iff this call cancelled it.
    pub(crate) fn end_run_after_shutdown(&self, index: u32) -> bool {
        let mut index = index;
        let mut word = self.load_following(&mut index);
        loop {
            if word & (RUNNING | SHARD) != RUNNING | SHARD {
                debug_assert!(false, "slot {index} ended a run it was not in: {word:#x}");
                return false;
            }
            let new = word & !(RUNNING | SHARD | LIFECYCLE_MASK)
                | if lifecycle_of(word) == PENDING {
                    CANCELLED
                } else {
                    lifecycle_of(word)
                };
            match self.word(index).compare_exchange_weak(
                word,
                new,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    if is_unreferenced(new) {
                        self.free(index, new);
                    }
                    return lifecycle_of(word) == PENDING;
                }
                Err(actual) => word = self.follow(&mut index, actual),
            }
        }
    }

    /// Frees a slot the shard just fired with no handle left (see [`FireOutcome::Fire`]).
    pub(crate) fn free_fired(&self, index: u32) {
        let word = self.word(index).load(Ordering::Acquire);
        self.free(index, word);
    }

    /// The shard lets go of a cancelled slot (after dropping its task); frees it if no handle
    /// is left.
    pub(crate) fn let_go(&self, index: u32) {
        if let Some(word) = self.let_go_unfreed(index) {
            self.free(index, word);
        }
    }

    /// [`let_go`](Self::let_go), freeing into the shard's chain `freed` (pushed onto the free
    /// list later, see [`free_list`]).
    /// `compacting`: a compaction of the table is under way or in force (the shard knows);
    /// then a slot below its bound is freed alone, into its stash or given up (`push_freed`).
    pub(crate) fn let_go_into(&self, index: u32, freed: &mut Freed, compacting: bool) {
        if let Some(word) = self.let_go_unfreed(index) {
            if compacting && index < self.retirement.below() {
                self.free(index, word);
            } else {
                self.free_into(index, word, freed);
            }
        }
    }

    /// Clears SHARD; returns the word to free with if no handle is left.
    #[inline]
    fn let_go_unfreed(&self, index: u32) -> Option<u64> {
        let old = self.word(index).fetch_and(!SHARD, Ordering::AcqRel);
        debug_assert!(old & SHARD != 0, "slot {index} let go twice: {old:#x}");
        debug_assert_eq!(
            lifecycle_of(old),
            CANCELLED,
            "slot {index} let go while not cancelled"
        );
        is_unreferenced(old & !SHARD).then_some(old & !SHARD)
    }

    /// Shutdown: PENDING -> CANCELLED whatever the reset count. True iff this call did it.
    pub(crate) fn cancel_for_shutdown(&self, index: u32) -> bool {
        let word = self.word(index).load(Ordering::Acquire);
        self.cancel(index, generation_of(word))
    }

    /// Another handle to the same timer. The count sticks at its maximum (the slot is then
    /// never freed: a leak of 16 bytes rather than a wrapped count).
    pub(crate) fn clone_handle(&self, index: u32) {
        let mut index = index;
        let mut slot = self.word(index);
        let first = slot.load(Ordering::Acquire);
        let mut current = self.follow_slot(&mut index, &mut slot, first);
        while current & HANDLE_MASK != HANDLE_MASK {
            match slot.compare_exchange_weak(
                current,
                current + HANDLE_ONE,
                Ordering::Relaxed,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(actual) => current = self.follow_slot(&mut index, &mut slot, actual),
            }
        }
    }

    /// A handle went away; frees the slot if nothing else refers to it.
    #[inline]
    pub(crate) fn drop_handle(&self, index: u32) {
        let mut index = index;
        let mut slot = self.word(index);
        let first = slot.load(Ordering::Acquire);
        let mut current = self.follow_slot(&mut index, &mut slot, first);
        loop {
            debug_assert!(
                handles_of(current) > 0,
                "slot {index} lost more handles than it had"
            );
            if current & HANDLE_MASK == HANDLE_MASK {
                return; // Sticky: see `clone_handle`.
            }
            match slot.compare_exchange_weak(
                current,
                current - HANDLE_ONE,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(actual) => current = self.follow_slot(&mut index, &mut slot, actual),
            }
        }
        let new = current - HANDLE_ONE;
        if is_unreferenced(new) {
            self.free(index, new);
        }
    }

    /// Slots handed out fresh since the table was made or last reclaimed.
    #[cfg(test)]
    pub(crate) fn allocated(&self) -> u64 {
        self.fresh.next.load(Ordering::Relaxed) & FRESH_COUNT_MASK
    }
}

/// The test hook between a lazy reset's swap and its second read (feature `test-hooks`), set
/// through [`crate::test_hooks::set_after_reset_swap`].
#[cfg(feature = "test-hooks")]
pub(crate) mod reset_hook {
    use std::cell::RefCell;

    thread_local! {
        static AFTER_RESET_SWAP: RefCell<Option<Box<dyn FnMut()>>> = const { RefCell::new(None) };
    }

    /// See [`crate::test_hooks::set_after_reset_swap`].
    pub(crate) fn set_after_reset_swap(hook: Option<Box<dyn FnMut()>>) {
        AFTER_RESET_SWAP.with(|slot| *slot.borrow_mut() = hook);
    }

    /// Runs this thread's hook, if set (taken out while it runs, so it may reset timers).
    pub(crate) fn after_reset_swap() {
        let hook = AFTER_RESET_SWAP
            .try_with(|slot| slot.borrow_mut().take())
            .ok()
            .flatten();
        if let Some(mut hook) = hook {
            hook();
            let _ = AFTER_RESET_SWAP.try_with(|slot| {
                let mut slot = slot.borrow_mut();
                if slot.is_none() {
                    *slot = Some(hook);
                }
            });
        }
    }
}
