//! The message queue of an [inbox](super::inbox): many producers, one consumer at a time,
//! unbounded, in blocks that the consumer hands back for reuse.
//!
//! # How it works
//!
//! One counter, `tail`, hands out positions 0, 1, 2, ...: a producer takes the next with one
//! read-modify-write (a push's only one), finds the block that holds it, writes its value into
//! that cell and then sets the cell's `ready` flag with a plain store. The consumer keeps
//! `head` to itself: one consumer at a time, under a lock it takes once per drain
//! ([`Queue::consumer`]), not once per message. It reads a cell once the cell's flag is set.
//! So a pop writes nothing that a producer reads, and a push allocates nothing while blocks
//! come back. A block's flags sit together, apart from its values: the consumer polls the
//! flags, and reads a value's line once, to take it (or to look at it: below).
//! A pop finds nothing while the producer of the head's position is still writing, even if
//! later cells are ready; [`Consumer::pop_through`] waits for it instead (shutdown's last
//! drain must not leave a delivered message behind). [`Consumer::any_through`] looks at
//! values without taking them (a parking inbox looks for an urgent one).
//!
//! # The tail word
//!
//! `tail` counts positions above its low [`FLAG_BITS`] bits, which belong to the queue's user
//! (the inbox keeps its flags there: `inbox.rs`). So the read-modify-write that takes a
//! position also reads the flags, and a flag set with a read-modify-write of its own is ordered
//! against every position taken: those taken before it are exactly the positions counted in
//! the word it changed ([`Queue::set_flags_then_fence`] returns that count). Flags change only
//! by `fetch_or` and `fetch_and`, which never fail, so producers taking positions never make a
//! flag's writer retry. A producer that must know the flags as they are once its value is in
//! reads them with a read-modify-write of the word ([`Queue::flags_after_push`]), which a
//! flag's writer is ordered against in the same way.
//!
//! Blocks of [`CAPACITY`] cells form a list, oldest first. `tail_block` is a hint for
//! producers: a block at or before the one holding the next position. A producer walks from it
//! along `next` to its own block, appending one where the list ends. A producer that walks
//! past a block whose every cell is ready (all its positions taken, and every producer of one
//! done with the block) moves the hint past it (a compare-and-swap), then reads `tail` and
//! records it in the block as `released_at`.
//!
//! # Handing blocks back
//!
//! The consumer is done with a block once it has read its last cell, but producers may still
//! walk through it. It hands the block back (appends it at the end of the list, with new
//! positions, or frees it) only once
//!
//! 1. the block is released: the hint has moved past it, so no producer finds it from now on;
//! 2. `head` has reached its `released_at`: every producer that found the block through the
//!    hint took its position before the hint moved, so below `released_at` (see below), and
//!    walks before it writes its cell, which the consumer has read.
//!
//! Why a producer that read the old hint took a position below `released_at`: the producer
//! takes its position, fences, then reads the hint; the releasing producer moves the hint,
//! fences, then reads `tail` (Dekker, with the fences of `crate::sync`). If the producer's read
//! missed the move, the releaser's read of `tail` counts the producer's position.
//!
//! At most [`SPARE_BLOCKS`] blocks wait past the one holding `tail`; more are freed. A block
//! that holds a position is never handed back before the position's cell is read, so a
//! producer's own block is safe to write.
//!
//! | who | may touch |
//! |-----|-----------|
//! | a producer | the cell of the position it took, and its flag; `next` of a block it walks to whose `next` is null (appending); the hint and `released_at` of a block it moved the hint past |
//! | the consumer (holds the lock) | cells from `head` on whose flag it saw set; blocks it hands back, every field, until it appends them |

use crate::sync::{AtomicBool, AtomicPtr, AtomicU64, Mutex, MutexGuard, Ordering, UnsafeCell};
use crate::sync::{
    compare_exchange_ptr_then_fence, fetch_add_then_fence, fetch_or_then_fence, lock,
};
use crossbeam_utils::CachePadded;
use std::mem::MaybeUninit;
use std::ptr;

/// Cells per block.
#[cfg(not(shardwheel_loom))]
const CAPACITY: u64 = 64;
/// Small under loom, so that a model fills, releases and hands back blocks.
#[cfg(shardwheel_loom)]
const CAPACITY: u64 = 2;

/// Low bits of the tail word that belong to the queue's user, not to positions (see "The tail
/// word").
pub(crate) const FLAG_BITS: u32 = 4;
/// The user's bits of the tail word.
pub(crate) const FLAGS: u64 = (1 << FLAG_BITS) - 1;
/// One position in the tail word.
const POSITION_ONE: u64 = 1 << FLAG_BITS;

/// How many cells ahead of its own a producer takes the line of for writing.
const WRITE_AHEAD: u64 = 4;

/// Blocks kept past the one holding `tail` when the consumer hands one back.
const SPARE_BLOCKS: u64 = 4;

struct Block<T> {
    /// Position of the first cell. Written only while no other thread can reach the block.
    start: AtomicU64,
    next: AtomicPtr<Block<T>>,
    /// 0 until the hint moved past the block; then `tail` as read right after (never 0).
    released_at: AtomicU64,
    /// `ready[i]`: cell `i` is written.
    ready: [AtomicBool; CAPACITY as usize],
    cells: [UnsafeCell<MaybeUninit<T>>; CAPACITY as usize],
}

impl<T> Block<T> {
    fn allocate(start: u64) -> *mut Block<T> {
        Box::into_raw(Box::new(Block {
            start: AtomicU64::new(start),
            next: AtomicPtr::new(ptr::null_mut()),
            released_at: AtomicU64::new(0),
            ready: std::array::from_fn(|_| AtomicBool::new(false)),
            cells: std::array::from_fn(|_| UnsafeCell::new(MaybeUninit::uninit())),
        }))
    }

    /// Whether every cell is written.
    fn all_ready(&self) -> bool {
        self.ready.iter().all(|ready| ready.load(Ordering::Acquire))
    }
}

/// What the producers share: one cache line.
struct Tail<T> {
    /// The next position to take, above the user's flags (see "The tail word").
    word: AtomicU64,
    /// The hint: a block at or before the one holding `position`.
    block: AtomicPtr<Block<T>>,
}

/// The consumer's state, under the queue's lock.
struct Head<T> {
    /// The next position to read.
    position: u64,
    /// The block holding `position`, or the one before it when `position` is its end.
    block: *mut Block<T>,
    /// `block`'s first position.
    block_start: u64,
    /// The oldest block not handed back yet; those before `block` are read through.
    oldest: *mut Block<T>,
}

/// An unbounded queue for many producers and one consumer at a time. See the
/// [module documentation](self).
pub(crate) struct Queue<T> {
    tail: CachePadded<Tail<T>>,
    head: Mutex<Head<T>>,
    /// The consumer's `head` position as of its last drain: how far behind producers are.
    consumed: CachePadded<AtomicU64>,
}

/// The tail word as a read-modify-write found it: what a [`Queue::push`] took, or what
/// [`Queue::set_flags_then_fence`] changed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Taken {
    /// The positions taken before: for a push, its value's position.
    pub(crate) position: u64,
    /// The user's flags before.
    pub(crate) flags: u64,
}

impl Taken {
    fn of(word: u64) -> Taken {
        Taken {
            position: word >> FLAG_BITS,
            flags: word & FLAGS,
        }
    }
}

// SAFETY: values move from producers to the consumer, so `T: Send` suffices; every block is
// reached through the atomics and the protocol of the module documentation.
unsafe impl<T: Send> Send for Queue<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Queue<T> {}
// SAFETY: the raw pointers are the consumer's view of blocks the queue owns.
unsafe impl<T: Send> Send for Head<T> {}

impl<T> std::fmt::Debug for Queue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tail = Taken::of(self.tail.word.load(Ordering::Relaxed));
        f.debug_struct("Queue")
            .field("positions_taken", &tail.position)
            .field("flags", &tail.flags)
            .finish_non_exhaustive()
    }
}

/// The consumer's role, held from [`Queue::consumer`] until dropped.
pub(crate) struct Consumer<'a, T> {
    queue: &'a Queue<T>,
    head: MutexGuard<'a, Head<T>>,
}

impl<T> Queue<T> {
    pub(crate) fn new() -> Queue<T> {
        let first = Block::allocate(0);
        Queue {
            tail: CachePadded::new(Tail {
                word: AtomicU64::new(0),
                block: AtomicPtr::new(first),
            }),
            head: Mutex::new(Head {
                position: 0,
                block: first,
                block_start: 0,
                oldest: first,
            }),
            consumed: CachePadded::new(AtomicU64::new(0)),
        }
    }

    /// Appends `value`; returns its position and the flags as it was taken. Never blocks.
    pub(crate) fn push(&self, value: T) -> Taken {
        // The fence: Dekker with a producer moving the hint (`find_block`).
        let taken = Taken::of(fetch_add_then_fence(
            &self.tail.word,
            POSITION_ONE,
            Ordering::AcqRel,
        ));
        let block = self.find_block(taken.position);
        let offset = (taken.position % CAPACITY) as usize;
        // SAFETY: the block holds `position`, which this thread took, so no other thread
        // writes the cell, and the consumer reads it only once its flag is set (below); the
        // block is not handed back before that read (module documentation).
        unsafe {
            (*block).cells[offset].with_mut(|cell| (*cell).write(value));
            // Take a later cell's line for writing now, so that the next locked instruction,
            // which waits for this thread's earlier writes, does not wait for that line's
            // transfer from the consumer's CPU (see `crate::prefetch`). Within this block only.
            if let Some(ahead) = (*block).cells.get(offset + WRITE_AHEAD as usize) {
                crate::prefetch::for_write(ahead);
            }
            (*block).ready[offset].store(true, Ordering::Release);
        }
        taken
    }

    /// The user's flags, read with a read-modify-write of the tail word after this thread's
    /// push: whoever sets a flag with [`set_flags_then_fence`](Self::set_flags_then_fence)
    /// either is seen here or sees this thread's value ready.
    pub(crate) fn flags_after_push(&self) -> u64 {
        self.tail.word.fetch_or(0, Ordering::AcqRel) & FLAGS
    }

    /// The block holding `position`, which this thread took and has not written yet.
    fn find_block(&self, position: u64) -> *mut Block<T> {
        let start = position - position % CAPACITY;
        let mut current = self.tail.block.load(Ordering::Acquire);
        let mut may_release = true;
        loop {
            // SAFETY: reached from the hint after taking `position`, whose cell is not written
            // yet: not handed back before it is (module documentation).
            let block = unsafe { &*current };
            let block_start = block.start.load(Ordering::Relaxed);
            if block_start == start {
                return current;
            }
            debug_assert!(
                block_start < start,
                "the hint passed a position not written"
            );
            let next = match block.next.load(Ordering::Acquire) {
                next if next.is_null() => self.append_new(block, block_start),
                next => next,
            };
            if may_release && block.all_ready() {
                match compare_exchange_ptr_then_fence(
                    &self.tail.block,
                    current,
                    next,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        let tail = self.positions_taken();
                        block.released_at.store(tail, Ordering::Release);
                    }
                    Err(_) => may_release = false,
                }
            } else {
                may_release = false;
            }
            current = next;
        }
    }

    /// Appends a new block after `last` (which started at `last_start` and had no next);
    /// returns `last`'s next, ours or the one another producer appended first.
    fn append_new(&self, last: &Block<T>, last_start: u64) -> *mut Block<T> {
        let new = Block::allocate(last_start + CAPACITY);
        match last
            .next
            .compare_exchange(ptr::null_mut(), new, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => new,
            Err(next) => {
                // SAFETY: `new` was never published: this thread owns it.
                unsafe { self.hand_back(next, new) };
                next
            }
        }
    }

    /// Appends `block`, which this thread owns, at the end of the list (walking from `from`),
    /// unless [`SPARE_BLOCKS`] blocks already wait there: then frees it.
    ///
    /// # Safety
    ///
    /// `block` is unreachable by other threads; `from` is in the list and not handed back
    /// while this runs.
    unsafe fn hand_back(&self, mut from: *mut Block<T>, block: *mut Block<T>) {
        // SAFETY: the caller owns `block`.
        let owned = unsafe { &*block };
        for ready in &owned.ready {
            ready.store(false, Ordering::Relaxed);
        }
        owned.released_at.store(0, Ordering::Relaxed);
        owned.next.store(ptr::null_mut(), Ordering::Relaxed);
        loop {
            // SAFETY: blocks after `from` are not handed back before `from` is.
            let last = unsafe { &*from };
            let next = last.next.load(Ordering::Acquire);
            if !next.is_null() {
                from = next;
                continue;
            }
            let start = last.start.load(Ordering::Relaxed) + CAPACITY;
            let tail = self.tail.word.load(Ordering::Relaxed) >> FLAG_BITS;
            if start > tail + SPARE_BLOCKS * CAPACITY {
                // SAFETY: the caller owns `block`, allocated by `Block::allocate`.
                drop(unsafe { Box::from_raw(block) });
                return;
            }
            owned.start.store(start, Ordering::Relaxed);
            match last.next.compare_exchange(
                ptr::null_mut(),
                block,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(next) => from = next,
            }
        }
    }

    /// How many positions producers have taken so far. A push that took one finishes its
    /// write without waiting for any other thread.
    pub(crate) fn positions_taken(&self) -> u64 {
        self.tail.word.load(Ordering::Acquire) >> FLAG_BITS
    }

    /// The user's flags (see "The tail word").
    pub(crate) fn flags(&self) -> u64 {
        self.tail.word.load(Ordering::Acquire) & FLAGS
    }

    /// Sets `flags` (of [`FLAGS`]), then fences; returns the word before: the flags, and how
    /// many positions had been taken (exactly the pushes that will not see these flags).
    pub(crate) fn set_flags_then_fence(&self, flags: u64) -> Taken {
        debug_assert_eq!(flags & !FLAGS, 0, "not a flag: {flags:#x}");
        Taken::of(fetch_or_then_fence(
            &self.tail.word,
            flags,
            Ordering::AcqRel,
        ))
    }

    /// Clears `flags` (of [`FLAGS`]); returns the flags before.
    pub(crate) fn clear_flags(&self, flags: u64) -> u64 {
        debug_assert_eq!(flags & !FLAGS, 0, "not a flag: {flags:#x}");
        self.tail.word.fetch_and(!flags, Ordering::AcqRel) & FLAGS
    }

    /// How many positions below `position` the consumer had not read as of its last drain.
    pub(crate) fn behind(&self, position: u64) -> u64 {
        position.saturating_sub(self.consumed.load(Ordering::Relaxed))
    }

    /// Takes the consumer's role until the returned value is dropped.
    pub(crate) fn consumer(&self) -> Consumer<'_, T> {
        Consumer {
            queue: self,
            head: lock(&self.head),
        }
    }
}

impl<T> Consumer<'_, T> {
    /// The offset in `head.block` of the head's cell if its producer has written it (moving
    /// `head` on to the next block first if it is at the end of its own).
    fn ready_offset(&mut self) -> Option<u64> {
        let head = &mut *self.head;
        let mut offset = head.position - head.block_start;
        if offset == CAPACITY {
            // SAFETY: `head.block` is in the list (the consumer hands back only blocks before it).
            let next = unsafe { &*head.block }.next.load(Ordering::Acquire);
            if next.is_null() {
                return None;
            }
            head.block = next;
            head.block_start = head.position;
            offset = 0;
        }
        // SAFETY: as above.
        let ready = &unsafe { &*head.block }.ready[offset as usize];
        ready.load(Ordering::Acquire).then_some(offset)
    }

    /// The next position to read: every position below it has been read.
    pub(crate) fn position(&self) -> u64 {
        self.head.position
    }

    /// Looks at the values at positions from the head up to `until`, without taking them:
    /// `Some(true)` as soon as `wanted` holds for one, `Some(false)` if it holds for none, and
    /// `None` if one of them is still being written.
    pub(crate) fn any_through(
        &self,
        until: u64,
        mut wanted: impl FnMut(&T) -> bool,
    ) -> Option<bool> {
        let head = &*self.head;
        let (mut block, mut block_start) = (head.block, head.block_start);
        for position in head.position..until {
            if position - block_start == CAPACITY {
                // SAFETY: blocks from `head.block` on are in the list (only this role hands
                // blocks back, and only those before `head.block`).
                block = unsafe { &*block }.next.load(Ordering::Acquire);
                if block.is_null() {
                    return None;
                }
                block_start = position;
            }
            // SAFETY: as above.
            let current = unsafe { &*block };
            let offset = (position - block_start) as usize;
            if !current.ready[offset].load(Ordering::Acquire) {
                return None;
            }
            // SAFETY: the cell's flag was set (Release) after its producer wrote it, and loaded
            // (Acquire) just now; nobody writes it again before this role has popped it.
            let found =
                current.cells[offset].with(|cell| wanted(unsafe { (*cell).assume_init_ref() }));
            if found {
                return Some(true);
            }
        }
        Some(false)
    }

    /// The value at the head, if its producer has written it; `None` when the queue is empty
    /// or the producer of the head's position is still writing.
    pub(crate) fn pop(&mut self) -> Option<T> {
        let offset = self.ready_offset()?;
        let head = &mut *self.head;
        head.position += 1;
        // SAFETY: the cell's flag was set (Release) after its producer wrote it, and loaded
        // (Acquire) above; each position is read once, so the value is moved out exactly once.
        Some(unsafe {
            (*head.block).cells[offset as usize].with(|cell| (*cell).assume_init_read())
        })
    }

    /// Like [`pop`](Self::pop), but waits for a producer still writing the value at a
    /// position below `until` rather than return `None`: `None` once every position below
    /// `until` has been read and nothing after is ready. (The producer is between taking its
    /// position and setting its flag, which waits for no one.)
    pub(crate) fn pop_through(&mut self, until: u64) -> Option<T> {
        let mut spins = 0u32;
        loop {
            if let Some(value) = self.pop() {
                return Some(value);
            }
            if self.head.position >= until {
                return None;
            }
            wait_a_little(&mut spins);
        }
    }
}

/// One step of waiting for a producer that is mid-push: a few spins, then yields.
fn wait_a_little(spins: &mut u32) {
    #[cfg(not(shardwheel_loom))]
    if *spins < 64 {
        *spins += 1;
        std::hint::spin_loop();
        return;
    }
    let _ = spins;
    crate::sync::thread::yield_now();
}

impl<T> Drop for Consumer<'_, T> {
    /// Records how far the consumer got, and hands back the blocks read through that no
    /// producer can reach any more.
    fn drop(&mut self) {
        let head = &mut *self.head;
        self.queue.consumed.store(head.position, Ordering::Relaxed);
        while head.oldest != head.block {
            // SAFETY: `oldest` is in the list, before `block`.
            let oldest = unsafe { &*head.oldest };
            let released_at = oldest.released_at.load(Ordering::Acquire);
            if released_at == 0 || released_at > head.position {
                break;
            }
            let block = head.oldest;
            head.oldest = oldest.next.load(Ordering::Acquire);
            // The hint is never a released block, and only this thread hands blocks back.
            let from = self.queue.tail.block.load(Ordering::Acquire);
            // SAFETY: released and read through up to `released_at`: no other thread can reach
            // `block` (module documentation); `from` stays in the list while this runs.
            unsafe { self.queue.hand_back(from, block) };
        }
    }
}

impl<T> Drop for Queue<T> {
    /// Drops the values not popped, and frees every block.
    fn drop(&mut self) {
        let mut consumer = self.consumer();
        while consumer.pop().is_some() {}
        drop(consumer);
        let mut block = lock(&self.head).oldest;
        while !block.is_null() {
            // SAFETY: no other thread is left (`&mut self`); every block in the list came from
            // `Block::allocate`.
            let owned = unsafe { Box::from_raw(block) };
            block = owned.next.load(Ordering::Relaxed);
        }
    }
}

/// A queue of numbers for the loom model of this module's protocol. Not part of the API.
#[cfg(shardwheel_loom)]
#[doc(hidden)]
#[derive(Debug)]
pub struct QueueHook(Queue<u64>);

#[cfg(shardwheel_loom)]
impl Default for QueueHook {
    fn default() -> QueueHook {
        QueueHook(Queue::new())
    }
}

#[cfg(shardwheel_loom)]
impl QueueHook {
    /// [`Queue::push`].
    pub fn push(&self, value: u64) {
        let _ = self.0.push(value);
    }
    /// Pops, as one consumer, every value ready at the head.
    pub fn pop_ready(&self) -> Vec<u64> {
        let mut consumer = self.0.consumer();
        std::iter::from_fn(|| consumer.pop()).collect()
    }
    /// Pops, as one consumer, through every position taken so far (`Consumer::pop_through`
    /// of `Queue::positions_taken`).
    pub fn pop_through_taken(&self) -> Vec<u64> {
        let until = self.0.positions_taken();
        let mut consumer = self.0.consumer();
        std::iter::from_fn(|| consumer.pop_through(until)).collect()
    }
}
