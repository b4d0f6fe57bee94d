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
//! false; so a reset that returned true is never outrun by its timer firing at the old deadline.
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
//! | RUNNING                   | [`finish_run`] (shard)                  | PENDING (re-armed), or FIRED / SHARD cleared |
//! | CANCELLED                 | [`release_by_shard`] (shard)            | SHARD cleared                    |
//! | FIRED/CANCELLED, no SHARD, no handles | last of the above (whoever) | FREE, generation + 1, on free list |
//!
//! Every transition is one compare-and-swap or read-modify-write of the word, so exactly one
//! of {shard fires, a cancel succeeds} happens, and exactly one thread frees a slot (a lazy
//! reset changes only the deadline). A resetting handle holds a handle count, so its slot
//! cannot be freed (and reused) under it.
//!
//! # Reclamation
//!
//! Slots are stored in pages of doubling size that are allocated once and freed only when the
//! table itself is dropped (when the engine and every handle are gone). A slot is reused only
//! after its generation is bumped, so a stale reader sees a generation mismatch, never freed
//! memory: this design needs no epoch-based reclamation.

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
    /// A repeating timer is now RUNNING: run its task, then re-arm it with `finish_run`.
    Run,
    /// A reset is in flight: keep the entry aside until its message arrives.
    ResetInFlight,
    /// A one-shot timer's deadline moved later: store it again at this tick.
    Later(u64),
    /// A cancel won: its message will release the entry.
    Cancelled,
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

/// The per-shard table of slot state words, with a lock-free free list.
pub(crate) struct SlotTable {
    /// Page `k` holds `FIRST_PAGE << k` slots; null until first needed.
    pages: [AtomicPtr<Slot>; PAGES],
    /// Head of the free list: `tag << 32 | (index + 1)`, 0 in the low half when empty. The tag
    /// changes on every push and pop, so a stale compare-and-swap fails (no ABA).
    free_head: CachePadded<AtomicU64>,
    /// Slots never handed out start here.
    next_fresh: CachePadded<AtomicU64>,
}

impl std::fmt::Debug for SlotTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotTable")
            .field("allocated", &self.next_fresh.load(Ordering::Relaxed))
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

fn page_len(page: usize) -> usize {
    FIRST_PAGE << page
}

impl SlotTable {
    pub(crate) fn new() -> SlotTable {
        SlotTable {
            pages: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
            free_head: CachePadded::new(AtomicU64::new(0)),
            next_fresh: CachePadded::new(AtomicU64::new(0)),
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
        let mut head = self.free_head.load(Ordering::Acquire);
        while head as u32 != 0 {
            let index = head as u32 - 1;
            // The word may change under us if another thread pops this slot first; then the
            // tag in `free_head` has changed too and the exchange below fails.
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
        let index = self.next_fresh.fetch_add(1, Ordering::Relaxed);
        if index >= MAX_SLOTS {
            self.next_fresh.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        let index = index as u32;
        self.ensure_page(locate(index).0);
        Some((index, 0))
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
        let old = slot.deadline.swap(deadline, Ordering::AcqRel);
        // Dekker with `fire`, which locks the word and then reads the deadline: either the
        // shard reads our deadline, or we see its lock (or its decision) below.
        crate::sync::fence_after_read_modify_write();
        let mut word = slot.state.load(Ordering::Acquire);
        while word & DEADLINE_LOCK != 0 {
            // The shard is deciding on a deadline it read (a few instructions): wait for it.
            thread::yield_now();
            word = slot.state.load(Ordering::Acquire);
        }
        if lifecycle_of(word) != PENDING {
            // Fired (at its old deadline, or ours if that was already due) or cancelled.
            return LazyReset::NotPending;
        }
        LazyReset::Done {
            earlier: deadline < old,
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
                match slot.compare_exchange_weak(
                    word,
                    word | DEADLINE_LOCK,
                    Ordering::Acquire,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        // Dekker with `reset_lazy`, which swaps the deadline and then reads
                        // the word: either we read its deadline, or it sees our lock.
                        crate::sync::fence_after_read_modify_write();
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

    /// The shard takes back a repeating timer after a run. If it is still pending and `again`
    /// (the task wants another run), it stays PENDING and the shard re-arms it (returns true).
    /// Otherwise it ends: FIRED if it stopped by itself, CANCELLED if cancelled meanwhile; the
    /// shard lets go of it and it is freed if no handle is left (returns false).
    pub(crate) fn finish_run(&self, index: u32, again: bool) -> bool {
        let slot = self.word(index);
        let mut word = slot.load(Ordering::Acquire);
        loop {
            debug_assert!(
                word & (RUNNING | SHARD) == RUNNING | SHARD,
                "slot {index} finished a run it was not in: {word:#x}"
            );
            let rearm = again && lifecycle_of(word) == PENDING;
            let new = if rearm {
                word & !RUNNING
            } else if lifecycle_of(word) == PENDING {
                word & !(RUNNING | SHARD | LIFECYCLE_MASK) | FIRED
            } else {
                word & !(RUNNING | SHARD)
            };
            match slot.compare_exchange_weak(word, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    if is_unreferenced(new) {
                        self.free(index, new);
                    }
                    return rearm;
                }
                Err(actual) => word = actual,
            }
        }
    }

    /// A repeating timer's run ended after its shard shut down: it counts as cancelled by the
    /// shutdown, and nothing holds it for the shard any more. True iff this call cancelled it.
    pub(crate) fn end_run_after_shutdown(&self, index: u32) -> bool {
        let slot = self.word(index);
        let mut word = slot.load(Ordering::Acquire);
        loop {
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

    /// Slots ever handed out (the private table's needed length).
    #[cfg(test)]
    pub(crate) fn allocated(&self) -> u64 {
        self.next_fresh.load(Ordering::Relaxed)
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
}
