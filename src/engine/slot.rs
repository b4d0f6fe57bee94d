//! The shared half of every timer: an atomic state word and an atomic deadline per slot, in a
//! table that any thread may read and that never moves or shrinks.
//!
//! # Who touches what
//!
//! A timer lives in a *slot* of its shard's [`SlotTable`]. The slot index and generation form the
//! [`TimerHandle`](crate::TimerHandle). The slot's state word is the only memory that both the
//! owning shard and other threads (submitters, cancellers, handle owners) touch; the timer's task
//! and wheel links live in the shard's private table under the same index.
//!
//! # The state word
//!
//! ```text
//!  63          34 33      24 23         6     5         4          3       2       1  0
//! +--------------+----------+------------+---------+-----------+-----------+-------+---------+
//! |  generation  | handles  |  resets    | RUNNING | REPEATING | DL_LOCK   | SHARD | lifecyc |
//! +--------------+----------+------------+---------+-----------+-----------+-------+---------+
//! |  generation  |  next free slot + 1 (0 = none)                          | FREE=0          |
//! +--------------+---------------------------------------------------------+-----------------+
//! ```
//!
//! * `lifecycle`: FREE, PENDING, FIRED (handed to run), CANCELLED.
//! * `SHARD`: the owning shard still holds the slot's private entry (task or links).
//! * `DL_LOCK` (`DEADLINE_LOCK`): one-shot timers: the shard is reading the deadline to decide
//!   whether to fire (only the shard takes it).
//! * `REPEATING`: the timer is repeating (its resets go through the shard, see below).
//! * `RUNNING`: a repeating timer's task is out running; the shard re-arms it afterwards.
//! * `resets`: repeating timers only: resets that succeeded but whose message the shard has
//!   not applied yet.
//! * `handles`: live [`TimerHandle`](crate::TimerHandle)s; sticky once it reaches its maximum
//!   (1023), so a timer with that many handle clones keeps its slot forever instead of wrapping.
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
//! | PENDING                   | [`cancel`] (any thread)                 | CANCELLED (shard told by message)|
//! | PENDING, one-shot         | [`reset_lazy`] (any thread)             | unchanged (deadline swapped)     |
//! | PENDING, repeating        | [`reset`] (any thread)                  | PENDING, resets + 1              |
//! | any occupied, repeating   | [`reset_applied`] (shard)               | resets - 1                       |
//! | PENDING, one-shot, due    | [`fire`] (shard, under DL_LOCK)         | FIRED, SHARD cleared             |
//! | PENDING, one-shot, deadline later | [`fire`] (shard, under DL_LOCK) | unchanged: stored again later   |
//! | PENDING, repeating, resets > 0 | [`fire`] (shard)                   | unchanged: the reset wins        |
//! | PENDING, repeating        | [`fire`] (shard)                        | PENDING, RUNNING                 |
//! | RUNNING                   | [`finish_run`] (shard, `Rearm` message) | PENDING (re-armed), or FIRED / SHARD cleared |
//! | RUNNING, after shutdown   | [`end_run_after_shutdown`] (runner)     | CANCELLED if PENDING; SHARD cleared |
//! | CANCELLED                 | [`release_by_shard`] (shard)            | SHARD cleared                    |
//! | FIRED/CANCELLED, no SHARD, no handles | last of the above (whoever) | FREE, generation + 1, on free list |
//! | every slot FREE and on the free list | [`try_release`] (shard, idle)    | off the list; fresh again, at a generation above all; page memory given back |
//!
//! Every transition is one compare-and-swap or read-modify-write of the word, so exactly one
//! of {shard fires, a cancel succeeds} happens, and exactly one thread frees a slot (a lazy
//! reset changes only the deadline). A resetting handle holds a handle count, so its slot
//! cannot be freed (and reused) under it. The release (last row) writes no word: it empties
//! the list and restarts fresh allocation (see below).
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
//! | [`cancel`] -> CANCELLED, after its push found the inbox closed | the submitter    | the submitter: undoes `scheduled` |
//! | [`cancel_for_shutdown`] -> CANCELLED                 | the shard's last sweep     | the shard: `cancelled` |
//! | [`fire`] -> FIRED (one-shot)                         | the shard                  | the shard: `fired` |
//! | [`finish_run`] -> FIRED ([`RunEnd::Stopped`]: the task stopped or panicked) | the shard | the shard: `fired` |
//! | [`end_run_after_shutdown`] -> CANCELLED (returns true) | the runner of a late `Rearm` | the runner: `cancelled` |
//!
//! The shard's `live` count of entries it holds follows `SHARD` instead: one more when a
//! `Schedule` is stored, one less when the shard lets go of the entry (a one-shot fire, a
//! `Cancel` that finds the task, a `Rearm` that ends the run).
//!
//! Messages are validated against the slot's word when applied, never assumed current: those
//! that may arrive after their timer ended (`Cancel`, `Relocate`, `Reset`) carry its generation
//! and check it, and the state the message expects; `Rearm` must find its run (`RUNNING` and
//! `SHARD`: the slot cannot be reused before the `Rearm` is applied, so the index suffices,
//! and a generation would only grow every message). A `Cancel` of a repeating timer cancelled
//! during a run may arrive after the `Rearm` ended it, when the shard has gone idle and given
//! its entry table back: it finds the slot no longer held ([`cancel_pending_release`]) and
//! touches no entry.
//!
//! # Reclamation
//!
//! Slots are stored in pages of doubling size that are allocated once and freed only when the
//! table itself is dropped (when the engine and every handle are gone): `slot()` never meets a
//! null or freed page. A slot is reused only after its generation is bumped, so a stale reader
//! sees a generation mismatch, never freed memory: this design needs no epoch-based
//! reclamation.
//!
//! # Giving memory back: the release
//!
//! A table that held millions of timers would keep 16 bytes per timer after they are all gone.
//! So when its shard holds no timer any more, it tries [`try_release`]: if every slot ever
//! handed out is free, the table starts over (the free list empty, fresh allocation from index
//! 0) and the pages' memory goes back to the operating system with `madvise(MADV_DONTNEED)`:
//! the pages stay mapped (and allocated), they only read as zeros, FREE words, until written
//! again. Hot paths gain no read-modify-write: push and pop are unchanged, the fresh path gains
//! a branch and a load.
//!
//! `next_fresh` holds the fresh count (bits 0-39), `ready` (bits 40-44: how many leading pages
//! a fresh allocation may write, all 27 but during a release) and `SEALED` (bit 63). A second
//! word beside it holds the generation fresh slots start at. The release, run by the shard only:
//!
//! 1. Read the count `N` and the free list's head `H`.
//! 2. Walk the list from `H` (checked: every index below `N`, its page present, its word FREE;
//!    at most `N` steps; every 1024 steps give up if the head moved). It must hold exactly
//!    `N` slots, and note the newest generation on it.
//! 3. Seal: compare-and-swap `next_fresh` from what step 1 read to the same with `SEALED`.
//! 4. Empty the list: compare-and-swap the head from `H` to empty with the next tag. On
//!    failure, unseal (restore step 1's value) and give up.
//! 5. Commit: fresh generation := newest + 1; `next_fresh` := count 0, `ready` = the 6 small
//!    pages (under 64 KiB, kept as they are).
//! 6. For each used page above those, in order: `madvise` its whole OS pages below `N`, then
//!    add one to `ready` (release).
//!
//! A fresh allocation that finds `SEALED` throws its index away (the commit or the unseal
//! overwrites its increment) and waits for the seal to go, then starts over; one that lands on
//! a page at or above `ready` waits until that page is given back. Who else could touch a slot
//! while the table looks all free, and why the release cannot hurt them:
//!
//! | who                                                   | why it is safe |
//! |-------------------------------------------------------|----------------|
//! | a popper that read `H` and reads the head slot's link | step 4 bumped the tag: its compare-and-swap fails, whatever (zeros) it read |
//! | an allocator between taking a slot and `begin` (its word still looks FREE) | popped: not on the list under `H`; fresh: not on the list at all, so the walk counts fewer than `N`; a fresh one after step 1 fails step 3 |
//! | a free in progress (FREE word stored, push pending)   | not on the list under `H`: the walk counts fewer than `N` |
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

use crate::sync::{AtomicPtr, AtomicU64, Ordering, thread};
use crossbeam_utils::CachePadded;

const LIFECYCLE_MASK: u64 = 0b11;
const FREE: u64 = 0;
const PENDING: u64 = 1;
const FIRED: u64 = 2;
const CANCELLED: u64 = 3;
const SHARD: u64 = 1 << 2;
const DEADLINE_LOCK: u64 = 1 << 3;
const REPEATING: u64 = 1 << 4;
const RUNNING: u64 = 1 << 5;
const RESET_SHIFT: u32 = 6;
const RESET_ONE: u64 = 1 << RESET_SHIFT;
const RESET_MASK: u64 = ((1 << 18) - 1) << RESET_SHIFT;
const HANDLE_SHIFT: u32 = 24;
const HANDLE_ONE: u64 = 1 << HANDLE_SHIFT;
const HANDLE_MASK: u64 = ((1 << 10) - 1) << HANDLE_SHIFT;
const NEXT_FREE_SHIFT: u32 = 2;
const NEXT_FREE_MASK: u64 = (u32::MAX as u64) << NEXT_FREE_SHIFT;
const GENERATION_SHIFT: u32 = 34;
/// Generations wrap at 2^30.
const GENERATION_MASK: u32 = (1 << 30) - 1;

/// Slots in the first page; page `k` holds `FIRST_PAGE << k`.
const FIRST_PAGE: usize = 64;
const FIRST_PAGE_BITS: u32 = FIRST_PAGE.trailing_zeros();
/// Enough pages for 2^32 slots.
const PAGES: usize = 27;
/// The most slots a table hands out (indices must also fit the wheel's `u32` links).
pub(crate) const MAX_SLOTS: u64 = crate::wheel::core::MAX_INDEX as u64 + 1;

/// `next_fresh`, bits 0-39: slots handed out fresh since the table was made or last released.
/// It may count past [`MAX_SLOTS`] (failed allocations do not undo their increment), by at most
/// the number of threads allocating at once (see [`SlotTable::allocate`]).
const FRESH_COUNT_MASK: u64 = (1 << 40) - 1;
/// `next_fresh`, bits 40-44: `ready`, the number of leading pages a fresh allocation may write
/// ([`PAGES`]: all). Lower only while a release gives pages back (see the module documentation).
const READY_SHIFT: u32 = 40;
const READY_ONE: u64 = 1 << READY_SHIFT;
const READY_MASK: u64 = 0b1_1111 << READY_SHIFT;
const ALL_READY: u64 = (PAGES as u64) << READY_SHIFT;
/// `next_fresh`, bit 63: a release is committing; fresh allocations wait.
const SEALED: u64 = 1 << 63;
const _: () = assert!(MAX_SLOTS < FRESH_COUNT_MASK / 2 && PAGES < 32);

/// A shard tries to release its table only when more slots than this were handed out: the
/// small leading pages are kept anyway.
pub(crate) const RELEASE_ABOVE: u64 = 4096;
/// Leading pages a release keeps (never given back to the operating system): those under
/// 64 KiB, where giving back would save little and cost page faults on the next burst. Under
/// loom none, so that the model sees every page given back.
const KEPT_PAGES: usize = if cfg!(loom) {
    0
} else {
    let mut page = 0;
    while page_len(page) * std::mem::size_of::<Slot>() < 64 * 1024 {
        page += 1;
    }
    page
};
/// Free-list steps between the release walk's checks that the list has not changed.
const WALK_CHECK_EVERY: u64 = 1024;

fn generation_of(word: u64) -> u32 {
    (word >> GENERATION_SHIFT) as u32
}

fn lifecycle_of(word: u64) -> u64 {
    word & LIFECYCLE_MASK
}

fn handles_of(word: u64) -> u64 {
    (word & HANDLE_MASK) >> HANDLE_SHIFT
}

fn resets_of(word: u64) -> u64 {
    (word & RESET_MASK) >> RESET_SHIFT
}

/// One slot: the state word and the deadline tick, side by side (one cache line).
#[repr(align(16))]
pub(crate) struct Slot {
    state: AtomicU64,
    deadline: AtomicU64,
}

/// Whether nothing refers to an occupied slot any more, so it can be freed.
fn is_unreferenced(word: u64) -> bool {
    let lifecycle = lifecycle_of(word);
    (lifecycle == FIRED || lifecycle == CANCELLED) && word & (SHARD | HANDLE_MASK) == 0
}

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
    /// A cancel won: its message will release the entry.
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

/// What [`SlotTable::try_release`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Release {
    /// Every slot was free: the table starts over, its pages' memory given back.
    Released,
    /// Some slot is in use, or allocated or freed meanwhile: nothing changed. `head` is the
    /// free list's head that was walked; while it stays the same, walking again is pointless.
    Busy { head: u64 },
    /// Too few slots were ever handed out to be worth it.
    Nothing,
}

/// The fresh-allocation counter and the generation fresh slots start at, on one cache line
/// (every fresh allocation reads both).
struct Fresh {
    /// Slots never handed out since the last release start here: the count, `ready` and
    /// `SEALED` (see [`FRESH_COUNT_MASK`], [`READY_SHIFT`], [`SEALED`]).
    next: AtomicU64,
    /// The generation of freshly handed out slots: above every generation a message or
    /// handle of the table's earlier life may still carry (0 until the first release).
    generation: AtomicU64,
}

/// The per-shard table of slot state words, with a lock-free free list.
pub(crate) struct SlotTable {
    /// Page `k` holds `FIRST_PAGE << k` slots; null until first needed.
    pages: [AtomicPtr<Slot>; PAGES],
    /// Head of the free list: `tag << 32 | (index + 1)`, 0 in the low half when empty. The tag
    /// changes on every push and pop, so a stale compare-and-swap fails (no ABA).
    free_head: CachePadded<AtomicU64>,
    /// Slots never handed out (since the last release) start here.
    fresh: CachePadded<Fresh>,
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

/// Page and offset of a slot index.
fn locate(index: u32) -> (usize, usize) {
    let shifted = index as u64 + FIRST_PAGE as u64;
    let page = (63 - shifted.leading_zeros() - FIRST_PAGE_BITS) as usize;
    let offset = (shifted - ((FIRST_PAGE as u64) << page)) as usize;
    (page, offset)
}

const fn page_len(page: usize) -> usize {
    FIRST_PAGE << page
}

/// The index of the first slot of page `page`.
fn page_start(page: usize) -> u64 {
    ((FIRST_PAGE as u64) << page) - FIRST_PAGE as u64
}

impl SlotTable {
    pub(crate) fn new() -> SlotTable {
        SlotTable {
            pages: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
            free_head: CachePadded::new(AtomicU64::new(0)),
            fresh: CachePadded::new(Fresh {
                next: AtomicU64::new(ALL_READY),
                generation: AtomicU64::new(0),
            }),
        }
    }

    /// The state word of a slot that has been handed out (its page exists).
    fn word(&self, index: u32) -> &AtomicU64 {
        &self.slot(index).state
    }

    /// A slot that has been handed out (its page exists).
    #[inline]
    pub(crate) fn slot(&self, index: u32) -> &Slot {
        let (page, offset) = locate(index);
        let base = self.pages[page].load(Ordering::Acquire);
        debug_assert!(
            !base.is_null(),
            "slot {index} read before its page was allocated"
        );
        // SAFETY: `base` points to a live page of `page_len(page)` slots: pages are installed
        // before any index in them is handed out (see `allocate`), the Acquire load above
        // synchronizes with their Release install, and they are freed only in `Drop`, which
        // takes `&mut self`. `offset < page_len(page)` by construction of `locate`.
        unsafe { &*base.add(offset) }
    }

    /// Makes sure page `page` exists.
    fn ensure_page(&self, page: usize) {
        if !self.pages[page].load(Ordering::Acquire).is_null() {
            return;
        }
        let fresh = new_page(page_len(page));
        if self.pages[page]
            .compare_exchange(
                std::ptr::null_mut(),
                fresh,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
        {
            // Another thread installed the page first.
            // SAFETY: `fresh` came from `new_page` with this length just above and was never
            // shared.
            unsafe { free_page(fresh, page_len(page)) };
        }
    }

    /// Takes a free slot: returns its index and generation. `None` when 2^32 - 2 slots are in use.
    pub(crate) fn allocate(&self) -> Option<(u32, u32)> {
        loop {
            let mut head = self.free_head.load(Ordering::Acquire);
            while head as u32 != 0 {
                let index = head as u32 - 1;
                // The word may change under us if another thread pops this slot first (or a
                // release gives its page back); then the tag in `free_head` has changed too and
                // the exchange below fails.
                let word = self.word(index).load(Ordering::Acquire);
                let next = ((word & NEXT_FREE_MASK) >> NEXT_FREE_SHIFT) as u32;
                let tag = (head >> 32).wrapping_add(1);
                match self.free_head.compare_exchange_weak(
                    head,
                    tag << 32 | next as u64,
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
            // Acquire: a release's commit and each page it gave back (see `try_release`).
            let fresh = self.fresh.next.fetch_add(1, Ordering::Acquire);
            if fresh & SEALED != 0 {
                // A release is committing. Our increment is discarded with the seal, so the
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
                // The release that just committed has not given this page back yet: writing it
                // now could be erased by its `madvise`.
                self.wait_ready(page);
            }
            self.ensure_page(page);
            let generation = self.fresh.generation.load(Ordering::Relaxed) as u32;
            return Some((index, generation));
        }
    }

    /// Waits until no release is committing (a few instructions of the shard's).
    #[cold]
    fn wait_unsealed(&self) {
        while self.fresh.next.load(Ordering::Acquire) & SEALED != 0 {
            thread::yield_now();
        }
    }

    /// Waits until a committed release has given back page `page` (and every page before it).
    #[cold]
    fn wait_ready(&self, page: usize) {
        while (self.fresh.next.load(Ordering::Acquire) & READY_MASK) >> READY_SHIFT <= page as u64 {
            thread::yield_now();
        }
    }

    /// Every slot is in use: brings the count back to [`MAX_SLOTS`], so that failing
    /// allocations cannot carry it into `ready` (undoing with a subtraction could borrow from
    /// `ready` if a release committed meanwhile; this compare-and-swap cannot).
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
        let slot = self.slot(index);
        slot.deadline.store(deadline, Ordering::Relaxed);
        let repeating = if repeating { REPEATING } else { 0 };
        let word =
            (generation as u64) << GENERATION_SHIFT | HANDLE_ONE | SHARD | repeating | PENDING;
        slot.state.store(word, Ordering::Release);
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
        let slot = self.slot(index);
        let word = slot.state.load(Ordering::Acquire);
        if generation_of(word) != generation || lifecycle_of(word) != PENDING {
            return LazyReset::NotPending;
        }
        if word & REPEATING != 0 {
            return LazyReset::Repeating;
        }
        // The reset's one locked instruction. The swap makes concurrent resets of one timer
        // follow each other, so whoever moves the deadline earlier knows it (and tells the shard).
        // Dekker with `fire`, which locks the word and then reads the deadline: either the
        // shard reads our deadline, or we see its lock (or its decision) below. Why the fence
        // must follow a read-modify-write: `crate::sync::swap_then_fence`.
        let old = crate::sync::swap_then_fence(&slot.deadline, deadline, Ordering::AcqRel);
        #[cfg(feature = "test-hooks")]
        test_hooks::after_reset_swap();
        let mut word = slot.state.load(Ordering::Acquire);
        while word & DEADLINE_LOCK != 0 {
            // The shard is deciding on a deadline it read (a few instructions): wait for it.
            thread::yield_now();
            word = slot.state.load(Ordering::Acquire);
        }
        match lifecycle_of(word) {
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
        }
    }

    /// Puts an unreferenced slot back on the free list with the next generation.
    fn free(&self, index: u32, word: u64) {
        debug_assert!(
            is_unreferenced(word),
            "slot {index} freed while referenced: {word:#x}"
        );
        let generation = (generation_of(word).wrapping_add(1) & GENERATION_MASK) as u64;
        let word = self.word(index);
        let mut head = self.free_head.load(Ordering::Acquire);
        loop {
            let next = (head as u32) as u64;
            word.store(
                generation << GENERATION_SHIFT | next << NEXT_FREE_SHIFT | FREE,
                Ordering::Relaxed,
            );
            let tag = (head >> 32).wrapping_add(1);
            match self.free_head.compare_exchange_weak(
                head,
                tag << 32 | (index as u64 + 1),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(actual) => head = actual,
            }
        }
    }

    /// Applies `change` to the word of an occupied slot of generation `generation` until it
    /// sticks. `change` returns `None` to leave the word alone. Returns the old and new word.
    fn update(
        &self,
        index: u32,
        generation: u32,
        mut change: impl FnMut(u64) -> Option<u64>,
    ) -> Result<(u64, u64), u64> {
        let slot = self.word(index);
        let mut word = slot.load(Ordering::Acquire);
        loop {
            if generation_of(word) != generation || lifecycle_of(word) == FREE {
                return Err(word);
            }
            let Some(new) = change(word) else {
                return Err(word);
            };
            match slot.compare_exchange_weak(word, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok((word, new)),
                Err(actual) => word = actual,
            }
        }
    }

    /// The timer's state as handle `(index, generation)` sees it.
    pub(crate) fn state(&self, index: u32, generation: u32) -> TimerState {
        let word = self.word(index).load(Ordering::Acquire);
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
        let word = self.word(index).load(Ordering::Acquire);
        generation_of(word) == generation && lifecycle_of(word) == PENDING
    }

    /// PENDING -> CANCELLED. True iff this call did it (so the task will never run).
    pub(crate) fn cancel(&self, index: u32, generation: u32) -> bool {
        self.update(index, generation, |word| {
            (lifecycle_of(word) == PENDING).then_some(word & !LIFECYCLE_MASK | CANCELLED)
        })
        .is_ok()
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
                // Cancelled while we held the lock: its message will release the entry.
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
    pub(crate) fn cancel_pending_release(&self, index: u32, generation: u32) -> bool {
        let word = self.word(index).load(Ordering::Acquire);
        generation_of(word) == generation
            && lifecycle_of(word) == CANCELLED
            && word & (SHARD | RUNNING) == SHARD
    }

    /// A repeating timer's run ended after its shard shut down: it counts as cancelled by the
    /// shutdown, and nothing holds it for the shard any more. True iff this call cancelled it.
    pub(crate) fn end_run_after_shutdown(&self, index: u32) -> bool {
        let slot = self.word(index);
        let mut word = slot.load(Ordering::Acquire);
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
            match slot.compare_exchange_weak(word, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    if is_unreferenced(new) {
                        self.free(index, new);
                    }
                    return lifecycle_of(word) == PENDING;
                }
                Err(actual) => word = actual,
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
    pub(crate) fn release_by_shard(&self, index: u32) {
        let old = self.word(index).fetch_and(!SHARD, Ordering::AcqRel);
        debug_assert!(old & SHARD != 0, "slot {index} released twice: {old:#x}");
        debug_assert_eq!(
            lifecycle_of(old),
            CANCELLED,
            "slot {index} released while not cancelled"
        );
        if is_unreferenced(old & !SHARD) {
            self.free(index, old & !SHARD);
        }
    }

    /// Shutdown: PENDING -> CANCELLED whatever the reset count. True iff this call did it.
    pub(crate) fn cancel_for_shutdown(&self, index: u32) -> bool {
        let word = self.word(index).load(Ordering::Acquire);
        self.cancel(index, generation_of(word))
    }

    /// Another handle to the same timer. The count sticks at its maximum (the slot is then
    /// never freed: a leak of 16 bytes rather than a wrapped count).
    pub(crate) fn clone_handle(&self, index: u32) {
        let word = self.word(index);
        let mut current = word.load(Ordering::Relaxed);
        while current & HANDLE_MASK != HANDLE_MASK {
            match word.compare_exchange_weak(
                current,
                current + HANDLE_ONE,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
    }

    /// A handle went away; frees the slot if nothing else refers to it.
    pub(crate) fn drop_handle(&self, index: u32) {
        let word = self.word(index);
        let mut current = word.load(Ordering::Relaxed);
        loop {
            debug_assert!(
                handles_of(current) > 0,
                "slot {index} lost more handles than it had"
            );
            if current & HANDLE_MASK == HANDLE_MASK {
                return; // Sticky: see `clone_handle`.
            }
            match word.compare_exchange_weak(
                current,
                current - HANDLE_ONE,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(actual) => current = actual,
            }
        }
        let new = current - HANDLE_ONE;
        if is_unreferenced(new) {
            self.free(index, new);
        }
    }

    /// The free list's head now (the shard compares it with [`Release::Busy`]'s `head` to
    /// tell whether trying again could succeed).
    pub(crate) fn free_head(&self) -> u64 {
        self.free_head.load(Ordering::Relaxed)
    }

    /// Gives the memory of every slot back if every slot handed out is free, and starts over
    /// (see "Reclamation" in the module documentation). Only the owning shard calls it, when it
    /// holds no timer; any thread may use the table meanwhile. Does nothing unless more than
    /// [`RELEASE_ABOVE`] slots were handed out.
    pub(crate) fn try_release(&self) -> Release {
        self.try_release_above(RELEASE_ABOVE)
    }

    /// [`try_release`](Self::try_release) with any threshold (loom models release tiny tables).
    fn try_release_above(&self, threshold: u64) -> Release {
        // 1. What to account for: every slot handed out, and the list that should hold them.
        let observed = self.fresh.next.load(Ordering::Acquire);
        debug_assert!(
            observed & SEALED == 0 && observed & READY_MASK == ALL_READY,
            "release started while another was under way: {observed:#x}"
        );
        let handed_out = (observed & FRESH_COUNT_MASK).min(MAX_SLOTS);
        if handed_out <= threshold {
            return Release::Nothing;
        }
        let head = self.free_head.load(Ordering::Acquire);
        // 2. Every slot handed out must be on the list: not in use, not between allocation
        // and `begin`, not being freed.
        let Some(newest) = self.walk_free_list(head, handed_out) else {
            return Release::Busy { head };
        };
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
            return Release::Busy { head };
        }
        // 4. Empty the list, bumping its tag: fails if anything was pushed or popped since step
        // 1 (every push and pop changes the tag); a popper that read `head` fails too.
        let emptied = (head >> 32).wrapping_add(1) << 32;
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
            return Release::Busy { head };
        }
        // 5. Commit. Fresh slots now start above every generation seen, so a stale message
        // (`Relocate`, `Reset`) carrying an old (index, generation) never matches a new timer.
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
            self.forget(page, used);
            self.fresh.next.fetch_add(READY_ONE, Ordering::Release);
        }
        debug_assert_eq!(
            self.fresh.next.load(Ordering::Relaxed) & READY_MASK,
            ALL_READY,
            "release left pages unready"
        );
        Release::Released
    }

    /// Walks the free list from `head`. Returns the largest generation on it (as an offset from
    /// the fresh generation, so that a wrapped one still counts as newer) if it holds exactly
    /// the `handed_out` slots, `None` otherwise (including when the list changes under us).
    fn walk_free_list(&self, head: u64, handed_out: u64) -> Option<u32> {
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
        (count == handed_out).then_some(newest)
    }

    /// The word of slot `index` if it is one of the `handed_out` slots, its page exists and it
    /// is FREE (a walk over a list that changed under us may reach any value).
    fn free_word(&self, index: u32, handed_out: u64) -> Option<u64> {
        if index as u64 >= handed_out {
            return None;
        }
        let (page, offset) = locate(index);
        let base = self.pages[page].load(Ordering::Acquire);
        if base.is_null() {
            return None;
        }
        // SAFETY: a non-null page is a live page of `page_len(page)` slots (see `slot`), and
        // `offset < page_len(page)` by construction of `locate`.
        let word = unsafe { &*base.add(offset) }.state.load(Ordering::Acquire);
        (lifecycle_of(word) == FREE).then_some(word)
    }

    /// Gives the memory of the first `used` slots of page `page` back to the operating system
    /// (`madvise(MADV_DONTNEED)` of the whole OS pages inside them): they read as zeros (FREE
    /// words) afterwards and cost no memory until written again. Their content does not matter
    /// (a fresh slot is written whole by `begin`, a stale reader accepts any FREE word), so a
    /// failure only means the memory stays.
    #[cfg(all(unix, not(loom)))]
    fn forget(&self, page: usize, used: usize) {
        let base = self.pages[page].load(Ordering::Acquire);
        if base.is_null() {
            return;
        }
        // SAFETY: sysconf has no preconditions.
        let os_page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
            size if size > 0 => size as usize,
            _ => return,
        };
        let start = (base as usize).next_multiple_of(os_page);
        let end = (base as usize + used * std::mem::size_of::<Slot>()) / os_page * os_page;
        if end <= start {
            return;
        }
        // SAFETY: [start, end) lies inside the page's allocation (rounded inwards to whole OS
        // pages), which stays allocated until `Drop`. The release protocol guarantees that no
        // thread writes to these slots until `ready` passes this page; readers only load the
        // words atomically and accept the zeros (FREE) they may read. MADV_DONTNEED changes no
        // mapping, only the content (to zeros, for the private anonymous memory the allocator
        // hands out; other memory keeps its content, which is fine too).
        let result =
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
        // A failure leaves the memory in place; nothing else depends on it.
        let _ = result;
    }

    /// Elsewhere the memory stays (nothing depends on it being given back).
    #[cfg(all(not(unix), not(loom)))]
    fn forget(&self, _page: usize, _used: usize) {}

    /// Loom: what `madvise` does to the words, as atomic stores the model checker sees, so
    /// that a write it could erase shows up.
    #[cfg(loom)]
    fn forget(&self, page: usize, used: usize) {
        let base = self.pages[page].load(Ordering::Acquire);
        if base.is_null() {
            return;
        }
        for offset in 0..used {
            // SAFETY: as in `free_word`; `used <= page_len(page)`.
            let slot = unsafe { &*base.add(offset) };
            slot.state.store(0, Ordering::Relaxed);
            slot.deadline.store(0, Ordering::Relaxed);
        }
    }

    /// Slots handed out fresh since the table was made or last released.
    #[cfg(test)]
    pub(crate) fn allocated(&self) -> u64 {
        self.fresh.next.load(Ordering::Relaxed) & FRESH_COUNT_MASK
    }
}

impl Drop for SlotTable {
    fn drop(&mut self) {
        for (page, pointer) in self.pages.iter_mut().enumerate() {
            let base = pointer.load(Ordering::Acquire);
            if !base.is_null() {
                // SAFETY: a non-null page pointer came from `new_page(page_len(page))` in
                // `ensure_page`; `&mut self` means no one else can use it any more, and it is
                // freed only here.
                unsafe { free_page(base, page_len(page)) };
            }
        }
    }
}

/// A page of `len` FREE slots, generation 0. Outside loom it is zeroed memory straight from the
/// allocator (all-zero bytes are exactly that state), so the operating system provides its
/// pages only as slots are first used: a large, mostly unused last page costs no memory.
#[cfg(not(loom))]
fn new_page(len: usize) -> *mut Slot {
    let layout = std::alloc::Layout::array::<Slot>(len).expect("page layout fits in memory");
    // SAFETY: the layout has a non-zero size (pages hold at least FIRST_PAGE slots).
    let base = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<Slot>();
    if base.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    const { assert!(FREE == 0, "a zeroed word must be a free slot") };
    base
}

/// Frees a page made by [`new_page`].
///
/// # Safety
/// `base` came from `new_page(len)` and is not used afterwards.
#[cfg(not(loom))]
unsafe fn free_page(base: *mut Slot, len: usize) {
    let layout = std::alloc::Layout::array::<Slot>(len).expect("page layout fits in memory");
    // SAFETY: per the contract, `base` was allocated with this very layout.
    unsafe { std::alloc::dealloc(base.cast::<u8>(), layout) };
}

/// Loom's atomics are not plain memory: build the page word by word.
#[cfg(loom)]
fn new_page(len: usize) -> *mut Slot {
    let page: Box<[Slot]> = (0..len)
        .map(|_| Slot {
            state: AtomicU64::new(FREE),
            deadline: AtomicU64::new(0),
        })
        .collect();
    Box::into_raw(page).cast::<Slot>()
}

/// Frees a page made by [`new_page`].
///
/// # Safety
/// `base` came from `new_page(len)` and is not used afterwards.
#[cfg(loom)]
unsafe fn free_page(base: *mut Slot, len: usize) {
    // SAFETY: per the contract, `base` is a boxed slice of `len` words.
    drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(base, len)) });
}

/// A slot table for the loom models (`loom-tests`), which drive the release protocol directly:
/// through the public API it needs thousands of timers. Not part of the API.
#[cfg(loom)]
#[doc(hidden)]
#[derive(Debug)]
pub struct SlotTableHook(SlotTable);

#[cfg(loom)]
impl Default for SlotTableHook {
    fn default() -> SlotTableHook {
        SlotTableHook(SlotTable::new())
    }
}

#[cfg(loom)]
impl SlotTableHook {
    /// [`SlotTable::allocate`].
    pub fn allocate(&self) -> Option<(u32, u32)> {
        self.0.allocate()
    }
    /// [`SlotTable::begin`] of a one-shot timer due at tick 1.
    pub fn begin(&self, index: u32, generation: u32) {
        self.0.begin(index, generation, 1, false);
    }
    /// [`SlotTable::cancel`].
    pub fn cancel(&self, index: u32, generation: u32) -> bool {
        self.0.cancel(index, generation)
    }
    /// [`SlotTable::is_pending`].
    pub fn is_pending(&self, index: u32, generation: u32) -> bool {
        self.0.is_pending(index, generation)
    }
    /// [`SlotTable::release_by_shard`].
    pub fn release_by_shard(&self, index: u32) {
        self.0.release_by_shard(index);
    }
    /// [`SlotTable::drop_handle`].
    pub fn drop_handle(&self, index: u32) {
        self.0.drop_handle(index);
    }
    /// [`SlotTable::try_release`] whatever the table's size; true iff it released.
    pub fn try_release(&self) -> bool {
        self.0.try_release_above(0) == Release::Released
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locate_pages() {
        assert_eq!(locate(0), (0, 0));
        assert_eq!(locate(63), (0, 63));
        assert_eq!(locate(64), (1, 0));
        assert_eq!(locate(191), (1, 127));
        assert_eq!(locate(192), (2, 0));
        let (page, offset) = locate(u32::MAX - 2);
        assert!(page < PAGES && offset < page_len(page));
    }

    #[test]
    fn lifecycle_and_reuse() {
        let table = SlotTable::new();
        let (index, generation) = table.allocate().unwrap();
        table.begin(index, generation, 10, false);
        assert_eq!(table.state(index, generation), TimerState::Pending);
        assert!(table.cancel(index, generation));
        assert!(!table.cancel(index, generation));
        table.release_by_shard(index);
        table.drop_handle(index);
        let (again, next_generation) = table.allocate().unwrap();
        assert_eq!(again, index);
        assert_eq!(next_generation, generation + 1);
        table.begin(again, next_generation, 10, false);
        assert!(
            !table.cancel(index, generation),
            "stale handle must not cancel"
        );
        assert_eq!(table.fire(again, 9, false), FireOutcome::Later(10));
        assert_eq!(
            table.reset_lazy(again, next_generation, 20),
            LazyReset::Done { earlier: false }
        );
        assert_eq!(table.fire(again, 10, false), FireOutcome::Later(20));
        assert_eq!(
            table.reset_lazy(again, next_generation, 15),
            LazyReset::Done { earlier: true }
        );
        assert_eq!(
            table.fire(again, 15, false),
            FireOutcome::Fire { free: false }
        );
        assert_eq!(table.state(again, next_generation), TimerState::Expired);
        assert_eq!(
            table.reset_lazy(again, next_generation, 30),
            LazyReset::NotPending
        );
        assert_eq!(table.allocated(), 1);
    }

    #[test]
    fn repeating_timers_reset_through_the_shard() {
        let table = SlotTable::new();
        let (index, generation) = table.allocate().unwrap();
        table.begin(index, generation, 10, true);
        assert_eq!(
            table.reset_lazy(index, generation, 20),
            LazyReset::Repeating
        );
        assert_eq!(table.reset(index, generation), ResetOutcome::Accepted);
        assert_eq!(table.fire(index, 10, true), FireOutcome::ResetInFlight);
        assert_eq!(table.reset_applied(index, generation), Some(true));
        assert_eq!(table.fire(index, 10, true), FireOutcome::Run);
        assert_eq!(table.allocated(), 1);
    }

    /// Schedules `count` timers and cancels them the way a handle and the shard do (their
    /// handles are left to drop); returns their (index, generation).
    fn fill_and_cancel(table: &SlotTable, count: usize) -> Vec<(u32, u32)> {
        let timers: Vec<(u32, u32)> = (0..count)
            .map(|_| {
                let (index, generation) = table.allocate().unwrap();
                table.begin(index, generation, 10, false);
                (index, generation)
            })
            .collect();
        for &(index, generation) in &timers {
            assert!(table.cancel(index, generation));
            table.release_by_shard(index);
        }
        timers
    }

    #[test]
    fn release_then_reuse() {
        let table = SlotTable::new();
        let count = RELEASE_ABOVE as usize + 1000;
        // A few slots reused many times: their generations run ahead of the others'.
        for _ in 0..5 {
            let (index, generation) = table.allocate().unwrap();
            table.begin(index, generation, 10, false);
            assert!(table.cancel(index, generation));
            table.release_by_shard(index);
            table.drop_handle(index);
        }
        let old = fill_and_cancel(&table, count);
        let newest = old.iter().map(|&(_, generation)| generation).max().unwrap();
        assert_eq!(newest, 5, "slot 0 was reused five times");
        for &(index, _) in &old {
            table.drop_handle(index);
        }
        assert_eq!(table.allocated(), count as u64);
        assert_eq!(table.try_release(), Release::Released);
        assert_eq!(table.allocated(), 0);
        // The used part of page 6 (slots 4032..) was given back: it reads as zeros.
        #[cfg(target_os = "linux")]
        assert_eq!(table.word(4032 + 512).load(Ordering::Relaxed), 0);
        // Stale operations (a handle's, or a message's) find no timer.
        for &(index, generation) in &old {
            assert!(!table.is_pending(index, generation));
            assert!(
                !table.cancel(index, generation),
                "stale cancel of slot {index}"
            );
            assert_eq!(table.reset_applied(index, generation), None);
        }
        // Allocation starts over, above every old generation, on pages given back.
        let new = fill_and_cancel(&table, count);
        for (position, &(index, generation)) in new.iter().enumerate() {
            assert_eq!(
                index as usize, position,
                "fresh slots are handed out in order"
            );
            assert!(
                generation > newest + 1,
                "generation {generation} not above {newest} + 1"
            );
            assert_eq!(table.state(index, generation), TimerState::Cancelled);
        }
        // The old handles of the same indices still cannot touch the new timers.
        for &(index, generation) in old.iter().take(10) {
            assert!(!table.cancel(index, generation));
        }
        for &(index, _) in &new {
            table.drop_handle(index);
        }
        // Twice in a row works (the generations keep rising).
        assert_eq!(table.try_release(), Release::Released);
        let (index, generation) = table.allocate().unwrap();
        assert_eq!(index, 0);
        assert!(generation > new[0].1);
    }

    #[test]
    fn release_waits_for_every_handle() {
        let table = SlotTable::new();
        let timers = fill_and_cancel(&table, RELEASE_ABOVE as usize + 100);
        let (held, held_generation) = timers[1234];
        for &(index, _) in &timers {
            if index != held {
                table.drop_handle(index);
            }
        }
        let Release::Busy { head } = table.try_release() else {
            panic!("released while a handle was held");
        };
        assert_eq!(head, table.free_head(), "a failed try changes nothing");
        assert_eq!(table.allocated(), timers.len() as u64);
        assert_eq!(table.state(held, held_generation), TimerState::Cancelled);
        table.drop_handle(held);
        assert_ne!(table.free_head(), head, "a free changes the head");
        assert_eq!(table.try_release(), Release::Released);
    }

    #[test]
    fn release_waits_for_slots_allocated_but_not_begun() {
        let table = SlotTable::new();
        let timers = fill_and_cancel(&table, 100);
        for &(index, _) in &timers {
            table.drop_handle(index);
        }
        assert_eq!(table.try_release(), Release::Nothing, "too small to bother");
        // A fresh slot allocated but not begun yet: its word looks FREE, but it is not on the
        // free list.
        let timers = fill_and_cancel(&table, RELEASE_ABOVE as usize);
        let (fresh, fresh_generation) = table.allocate().unwrap();
        assert_eq!(table.allocated(), RELEASE_ABOVE + 1);
        for &(index, _) in &timers {
            table.drop_handle(index);
        }
        assert!(matches!(table.try_release(), Release::Busy { .. }));
        table.begin(fresh, fresh_generation, 10, false);
        assert!(table.cancel(fresh, fresh_generation));
        table.release_by_shard(fresh);
        table.drop_handle(fresh);
        // A popped slot, likewise, through its life.
        let (index, generation) = table.allocate().unwrap();
        assert!(matches!(table.try_release(), Release::Busy { .. }));
        table.begin(index, generation, 10, false);
        assert!(matches!(table.try_release(), Release::Busy { .. }));
        assert!(table.cancel(index, generation));
        table.release_by_shard(index);
        assert!(matches!(table.try_release(), Release::Busy { .. }));
        table.drop_handle(index);
        assert_eq!(table.try_release(), Release::Released);
    }

    #[test]
    fn exhaustion_neither_undoes_into_ready_nor_creeps() {
        let table = SlotTable::new();
        table
            .fresh
            .next
            .store(ALL_READY | MAX_SLOTS, Ordering::Relaxed);
        for _ in 0..3 {
            assert_eq!(table.allocate(), None);
        }
        assert_eq!(
            table.fresh.next.load(Ordering::Relaxed),
            ALL_READY | MAX_SLOTS,
            "the count stays at the maximum, ready untouched"
        );
    }
}

/// Test hooks of the slot protocol (feature `test-hooks`), set through
/// [`crate::test_hooks`].
#[cfg(feature = "test-hooks")]
pub(crate) mod test_hooks {
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
        let hook = AFTER_RESET_SWAP.with(|slot| slot.borrow_mut().take());
        if let Some(mut hook) = hook {
            hook();
            AFTER_RESET_SWAP.with(|slot| {
                let mut slot = slot.borrow_mut();
                if slot.is_none() {
                    *slot = Some(hook);
                }
            });
        }
    }
}
