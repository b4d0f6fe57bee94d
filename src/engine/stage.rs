//! Stages: how a thread hands new timers of its `Sleep`s to a shard without a shared queue, so
//! that a timer cancelled before its shard looked costs no message at all.
//!
//! # How it works
//!
//! Each (thread, shard) pair that schedules has a [`Stage`]: a bounded ring of new timers (slot
//! index, generation, deadline tick, task) with one producer, the thread, and one consumer, the
//! shard's owner. The producer writes a cell and publishes it by advancing `tail`; the owner
//! drains every stage of its shard at each turn and *adopts* each timer
//! ([`SlotTable::adopt`](super::slot::SlotTable::adopt)): it clears the slot's `STAGED` bit and
//! stores the timer in its wheel, or, if the timer was cancelled meanwhile, drops its task.
//! A cancel that finds `STAGED` set sends no message: the adoption finds it. Better still, the
//! producer itself may *retract* a timer it staged ([`Stages::retract`]: a `Sleep` dropped on
//! the thread that armed it): it takes the task back out of the cell and frees the slot at
//! once (keeping it as a spare for its own next timer: [`Spares`]), and the shard, finding the
//! slot no longer staged, skips the cell without touching it.
//! Most of a server's timeouts end this way, never seen by their shard. A retracted timer
//! in the last cell published is taken back whole (`Stage::rewind`): the next push reuses that
//! cell, still in the producer's cache, so a thread whose timeouts end in the order they began
//! cycles through a few cells and its shard finds nothing to drain. Other retracted cells stay
//! for the consumer to skip; when the stage fills up, the producer first consumes those at its
//! head itself (`Stage::reap`), so the shard is woken only for timers that are still there.
//!
//! A cell's task belongs to whoever moves its slot out of STAGED
//! ([`SlotTable::adopt`](super::slot::SlotTable::adopt) or
//! [`SlotTable::retract`](super::slot::SlotTable::retract)): one compare-and-swap each, so
//! exactly one thread takes it; the cell's other fields are read only by the consumer.
//!
//! | who | may touch |
//! |-----|-----------|
//! | the producer: the thread that registered the stage, or took it over after that thread exited ([`Stage::orphaned`]) | the cell at `tail`; advances `tail` |
//! | the consumer: whoever holds `consuming` (the shard's owner; after the shard's last drain at shutdown, the producer) | cells in `head..tail` (a task only once its adoption won); advances `head` |
//! | the producer, retracting | the task of a cell in `head..tail` whose retraction won; moves `tail` back over that cell if it is the last and no consumer can have seen it (see "Rewinding") |
//!
//! Only a `Sleep`'s timer is staged: it is likely to end before its shard looks, and adopting a
//! staged timer costs the shard a compare-and-swap that a message does not (`Via` in
//! `ShardShared`). Closure timers, a full stage and a thread whose thread-locals are gone take
//! the shard's inbox instead (`ShardShared::submit`).
//!
//! # Waking the shard
//!
//! The producer publishes `tail` with a read-modify-write and a fence, then reads the inbox's
//! flags ([`Inbox::staged`](super::inbox::Inbox::staged)); the owner, before it sleeps,
//! sets `PARKED` with a read-modify-write and a fence, then looks at every stage's tail
//! ([`StageList::due_before`]). Dekker's argument: either the owner sees the new cell (and does
//! not sleep past its deadline), or the producer sees the owner parked, and wakes it if the
//! timer is due before the owner's wake-up tick or if the stage is filling up (`filling` is
//! decided on a fresh read of `head`, every [`RECHECK`] pushes). A staged timer waits for a
//! shard that sleeps until a deadline before its own: a busy producer whose timeouts end
//! before their shard looks wakes it not at all.
//!
//! # Memory
//!
//! A stage lives as long as its shard: a thread that exits leaves its stages orphaned, and the
//! next thread to schedule on the shard takes one over. So a shard holds a ring of
//! [`CAPACITY`] cells for each thread that has staged on it at the same time as others, at
//! most [`MAX_STAGES`]: a process that once had many submitting threads at once keeps their
//! rings (reused, not grown) until its timer is dropped, and the default timer's for good.
//!
//! # Rewinding
//!
//! A producer that retracted the timer of cell `tail - 1` stores `tail - 1`, fences, then reads
//! `consuming` and `head`: if no one holds the consumer's role and `head` has not passed the
//! cell, the rewind stands; else it stores `tail` back (the cell, unchanged, is skipped as any
//! retracted cell is). The consumer takes its role with a compare-and-swap and a fence before
//! it reads `tail`. Dekker's argument again: a consumer whose `tail` read missed the rewind (so
//! it may read the cell) took its role before the producer looked, and the producer sees it
//! holding the role, or, if it is done, sees its `head` past the cell (stored before the role
//! was let go of). So no consumer reads a cell the producer rewinds and rewrites. A consumer
//! that comes in between the rewind and its undo may find `tail` below its `head`: nothing to
//! consume.
//!
//! # Shutdown
//!
//! A producer whose read of the flags finds the inbox closed settles its timer on the slot's word,
//! as an inbox push does (`ShardShared::submit`). The owner drains the stages before and after
//! it marks the inbox `DRAINED`; a producer that sees `DRAINED` drains its own stage, under
//! `consuming`, so every cell is consumed by exactly one thread.

use super::slot::{Adoption, SlotTable, Spares};
use crate::sync::{Arc, AtomicBool, AtomicU64, AtomicUsize, Mutex, Ordering, UnsafeCell};
use crate::sync::{lock, thread, thread_local};
use crate::task::Task;
use crossbeam_utils::CachePadded;
use std::cell::RefCell;
use std::mem::MaybeUninit;

/// Cells per stage (a power of two). With [`WAKE_FILL`], it sets how long a timer may stay
/// staged, and so be cancelled or retracted for free, at a given rate of schedules.
#[cfg(not(shardwheel_loom))]
const CAPACITY: u64 = 4096;
/// Small under loom, so that a model can fill a stage.
#[cfg(shardwheel_loom)]
const CAPACITY: u64 = 4;

/// Cells waiting past which a producer wakes its shard to drain them.
const WAKE_FILL: u64 = CAPACITY / 4 * 3;

/// How many cells ahead the consumer prefetches the slot of.
const PREFETCH_AHEAD: u64 = 8;

/// Pushes between two looks at `head` while the stage is past [`WAKE_FILL`].
const RECHECK: u64 = if CAPACITY >= 64 { CAPACITY / 64 } else { 1 };

/// Cells the owner looks at, before sleeping, for one due before its wake-up; beyond that it
/// drains instead.
const PEEK_LIMIT: u64 = 256;

/// What a cell says of its timer: written by the producer, read by the consumer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Meta {
    pub(crate) index: u32,
    pub(crate) generation: u32,
    /// The deadline tick at scheduling (the slot's deadline may have moved since).
    pub(crate) deadline: u64,
}

/// Where a timer was staged, for [`Stages::retract`] by the thread that staged it: the
/// stage's number in its shard's registry (plus one) and the cell's, in one word (a `Sleep`
/// keeps it). Never 0, so that an `Option<StagedAt>` takes no more room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StagedAt(std::num::NonZeroU32);

/// Stages a shard registers at most (their numbers fit [`StagedAt`]); threads beyond take
/// the inbox.
const MAX_STAGES: usize = u16::MAX as usize;

impl StagedAt {
    fn new(stage: u16, position: u64) -> StagedAt {
        // A stage's number is below `MAX_STAGES`: plus one, it fits the high half, not 0.
        let word = (u32::from(stage) + 1) << 16 | (position % CAPACITY) as u32;
        debug_assert!(usize::from(stage) < MAX_STAGES && word >> 16 != 0);
        StagedAt(std::num::NonZeroU32::new(word).unwrap_or(std::num::NonZeroU32::MAX))
    }

    fn stage(self) -> u16 {
        ((self.0.get() >> 16) - 1) as u16
    }

    fn cell(self) -> u64 {
        u64::from(self.0.get() & 0xffff)
    }
}

const _: () = assert!(CAPACITY <= 1 << 16, "cell numbers fit StagedAt");

/// One cell of a stage.
struct Cell {
    meta: UnsafeCell<MaybeUninit<Meta>>,
    /// Taken once, by whoever moved the slot out of STAGED (see the module documentation).
    task: UnsafeCell<MaybeUninit<Task>>,
}

/// What the producer of a stage writes: one cache line, which the consumer only reads.
struct ProducerSide {
    /// Cells published (a count; the cell is `tail % CAPACITY`).
    tail: AtomicU64,
    /// The consumer's `head` when the producer last read it (a lower bound of it).
    head_seen: AtomicU64,
    /// The `tail` at which the producer next reads `head` (and reaps) while the stage is
    /// past [`WAKE_FILL`].
    recheck_at: AtomicU64,
    /// Slots the producer retracted, for its next timers (the shard flushes them before a
    /// reclaim: see [`Spares`]).
    spares: Spares,
}

/// One (thread, shard) pair's ring of staged timers. See the [module documentation](self).
///
/// It has no `Drop` of its own: its cells are consumed, at the latest, by [`Stages::close`]
/// when its shard goes, and nothing can be published after that (a producer needs the shard).
/// A stage may outlive its shard in a thread's list, empty.
pub(crate) struct Stage {
    /// Written by the producer only.
    producer: CachePadded<ProducerSide>,
    /// Cells consumed. Written by the consumer, at the end of each drain.
    head: CachePadded<AtomicU64>,
    /// Held by whoever consumes.
    consuming: AtomicBool,
    /// The producing thread exited: another thread may take the stage over.
    orphaned: AtomicBool,
    /// The shard is gone: threads forget the stage.
    shard_gone: AtomicBool,
    /// Its place in the shard's registry.
    number: u16,
    /// A fixed-size array: a cell's number, taken modulo [`CAPACITY`], needs no bounds check.
    cells: Box<[Cell; CAPACITY as usize]>,
}

// SAFETY: the cells are accessed as the module documentation's table says: the producer writes
// a cell only outside `head..tail`; the consumer reads a cell's `meta` only inside it; a cell's
// `task` is read by exactly one thread, the winner of the compare-and-swap that takes its slot
// out of STAGED. `tail`'s Release / Acquire pair orders each cell's writes before those reads
// (through the slot word's Release / Acquire for a retracting producer on another stage's
// thread, which cannot happen: only the producer retracts), and `head`'s pair orders the reads
// before the cell's next write. `Meta` and `Task` are `Send`.
unsafe impl Send for Stage {}
// SAFETY: as above: every shared access goes through the atomics or the protocol they order.
unsafe impl Sync for Stage {}

impl Stage {
    fn new(number: u16) -> Stage {
        Stage {
            number,
            producer: CachePadded::new(ProducerSide {
                tail: AtomicU64::new(0),
                head_seen: AtomicU64::new(0),
                recheck_at: AtomicU64::new(0),
                spares: Spares::default(),
            }),
            head: CachePadded::new(AtomicU64::new(0)),
            consuming: AtomicBool::new(false),
            orphaned: AtomicBool::new(false),
            shard_gone: AtomicBool::new(false),
            // Made on the heap (a `Box::new` of the array may build it on the stack first: too
            // much for a thread with a small stack).
            cells: match (0..CAPACITY)
                .map(|_| Cell {
                    meta: UnsafeCell::new(MaybeUninit::uninit()),
                    task: UnsafeCell::new(MaybeUninit::uninit()),
                })
                .collect::<Box<[Cell]>>()
                .try_into()
            {
                Ok(cells) => cells,
                Err(_) => unreachable!("the iterator yields CAPACITY cells"),
            },
        }
    }

    fn cell(&self, position: u64) -> &Cell {
        &self.cells[(position % CAPACITY) as usize]
    }

    /// Producer: publishes a timer, its task made by `make` right into the cell, with a fence
    /// after (see "Waking the shard"). Returns where it went and whether the shard should drain
    /// the stage soon ([`WAKE_FILL`] cells wait), or gives `make` back if the stage is full.
    #[inline]
    fn push<M: FnOnce() -> Task>(
        &self,
        meta: Meta,
        make: M,
        slots: &SlotTable,
    ) -> Result<(StagedAt, bool), M> {
        let producer = &*self.producer;
        let tail = producer.tail.load(Ordering::Relaxed);
        // The consumer's `head` is read again only when the stage looks full enough to matter:
        // its cache line then moves once per drain, not once per timer.
        let mut head = producer.head_seen.load(Ordering::Relaxed);
        // Whether to ask the shard to drain: decided only on a fresh look at `head` (a stale
        // one would ask again at every push until the next look, though the shard drained).
        let mut filling = false;
        // Past WAKE_FILL, look (and reap) again only every RECHECK pushes, unless the stage
        // may be full: a shard that is simply behind costs its producer nothing per push.
        if tail - head >= WAKE_FILL
            && (tail >= producer.recheck_at.load(Ordering::Relaxed) || tail - head >= CAPACITY)
        {
            head = self.head.load(Ordering::Acquire);
            if tail - head >= WAKE_FILL {
                head = self.reap(head, slots);
            }
            producer.head_seen.store(head, Ordering::Relaxed);
            producer.recheck_at.store(tail + RECHECK, Ordering::Relaxed);
            if tail - head >= CAPACITY {
                return Err(make);
            }
            filling = tail + 1 - head >= WAKE_FILL;
        }
        let cell = self.cell(tail);
        // SAFETY: only the producer writes cells, and this one is outside `head..tail` for a
        // `head` it acquired (now or at an earlier push): the consumer is done with it (its
        // `head` store came after its reads of the cell), or, if this thread rewound over it,
        // never read it (see "Rewinding"); and so is any retraction (made by this thread,
        // before this call).
        unsafe {
            cell.meta.with_mut(|slot| (*slot).write(meta));
            cell.task.with_mut(|slot| (*slot).write(make()));
        }
        crate::sync::swap_then_fence(&producer.tail, tail + 1, Ordering::AcqRel);
        // The next push writes the next cell, last touched a lap ago and by now out of this
        // core's cache: taken for writing here, its fetch overlaps the caller's work instead of
        // holding up that push's exchange (which waits for the cell's stores).
        let next = std::ptr::from_ref(self.cell(tail + 1));
        crate::prefetch::for_write(next);
        crate::prefetch::for_write(next.cast::<u8>().wrapping_add(size_of::<Cell>() - 1));
        Ok((StagedAt::new(self.number, tail), filling))
    }

    /// Producer: consumes the cells at the head whose timers it retracted (nothing is left to
    /// do for them), if the consumer's role is free; returns the head after. So a thread whose
    /// timers end where they began never needs its shard to make room.
    fn reap(&self, head: u64, slots: &SlotTable) -> u64 {
        let Some(consumer) = self.try_consume() else {
            return head;
        };
        let tail = self.producer.tail.load(Ordering::Relaxed);
        while consumer.head.get() < tail {
            let position = consumer.head.get();
            // SAFETY: published by this thread (the producer), not consumed, and we hold the
            // consumer's role.
            let meta = unsafe { self.meta(position) };
            if !slots.is_retracted(meta.index, meta.generation) {
                break;
            }
            consumer.head.set(position + 1);
        }
        consumer.head.get()
    }

    /// What the cell at `position` says of its timer.
    ///
    /// # Safety
    ///
    /// The cell is published and not yet reused (`head <= position < tail` as the caller
    /// knows it), and the caller holds the consumer's role (or is the producer, which is the
    /// only writer).
    unsafe fn meta(&self, position: u64) -> Meta {
        // SAFETY: the caller's contract: the producer's write is ordered before this read, and
        // the cell is not written again before the consumer's next `head` store.
        self.cell(position)
            .meta
            .with(|slot| unsafe { (*slot).assume_init_read() })
    }

    /// The task of the cell at `position` (a count, or a cell number: taken modulo
    /// [`CAPACITY`]).
    ///
    /// # Safety
    ///
    /// The cell is published and not yet reused (`head <= position < tail` as the caller
    /// knows it), and the caller moved its timer's slot out of STAGED (so took its task: no
    /// one else reads it, and it is read once).
    unsafe fn take_task(&self, position: u64) -> Task {
        // SAFETY: the caller's contract.
        self.cell(position)
            .task
            .with(|slot| unsafe { (*slot).assume_init_read() })
    }

    /// Producer, having just retracted the timer of cell `cell`: takes the cell back if it
    /// is the last published and no consumer can have seen it (see "Rewinding").
    #[inline]
    fn rewind(&self, cell: u64) {
        let producer = &*self.producer;
        let tail = producer.tail.load(Ordering::Relaxed);
        if tail % CAPACITY != (cell + 1) % CAPACITY {
            return;
        }
        // `cell` holds a timer until the consumer passes it, so it is `tail - 1`, not a cell
        // a lap earlier.
        crate::sync::swap_then_fence(&producer.tail, tail - 1, Ordering::Relaxed);
        // Acquire: a finished consumer's `head` (stored before it let go of the role).
        if !self.consuming.load(Ordering::Acquire) && self.head.load(Ordering::Acquire) < tail {
            return;
        }
        // A consumer may have seen the cell: it stays, to be skipped. Release: as a push's.
        producer.tail.store(tail, Ordering::Release);
    }

    /// Takes the consumer's role, if no one holds it (with a fence before its first read of
    /// `tail`: see "Rewinding").
    fn try_consume(&self) -> Option<Consumer<'_>> {
        crate::sync::compare_exchange_flag_then_fence(
            &self.consuming,
            false,
            true,
            Ordering::Acquire,
            Ordering::Relaxed,
        )
        .is_ok()
        .then(|| Consumer {
            stage: self,
            head: std::cell::Cell::new(self.head.load(Ordering::Relaxed)),
        })
    }

    /// Takes the consumer's role, waiting for whoever holds it.
    fn consume(&self) -> Consumer<'_> {
        loop {
            if let Some(consumer) = self.try_consume() {
                return consumer;
            }
            thread::yield_now();
        }
    }
}

/// The consumer's role on a stage: `head` advances locally and is published when the role is
/// let go of (on drop, also when unwinding: a cell is never read twice).
struct Consumer<'a> {
    stage: &'a Stage,
    head: std::cell::Cell<u64>,
}

impl Consumer<'_> {
    /// Consumes the next published cell, if any: adopts its timer (`Some` with the task, if
    /// adopted or cancelled while staged), or skips it (`None` inside: retracted by its
    /// producer, whose task it is).
    fn pop(&self, slots: &SlotTable) -> Option<(Meta, Option<(Adoption, Task)>)> {
        let stage = self.stage;
        let position = self.head.get();
        let tail = stage.producer.tail.load(Ordering::Acquire);
        // Below `position` while a producer checks a rewind it then undoes (see "Rewinding").
        if position >= tail {
            return None;
        }
        // The slots of the cells a few ahead, written last by their producer's core: fetched
        // while this one is adopted.
        if position + PREFETCH_AHEAD < tail {
            // SAFETY: as below, for a cell also in `head..tail`.
            slots.prefetch(unsafe { stage.meta(position + PREFETCH_AHEAD) }.index);
        }
        // SAFETY: `head <= position < tail`: published (Acquire above), not rewritten before
        // our `head` store (in `drop`), and we hold the consumer's role.
        let meta = unsafe { stage.meta(position) };
        self.head.set(position + 1);
        let adoption = slots.adopt(meta.index, meta.generation);
        let task = (adoption != Adoption::Retracted).then(|| {
            // SAFETY: published and not reused (above); our adoption took the slot out of
            // STAGED.
            unsafe { stage.take_task(position) }
        });
        Some((meta, task.map(|task| (adoption, task))))
    }

    /// Consumes up to `budget` cells ([`pop`](Self::pop)); `each` gets those whose task is now
    /// the caller's. Returns how many cells there were.
    fn drain(
        &self,
        slots: &SlotTable,
        budget: usize,
        mut each: impl FnMut(Meta, Adoption, Task),
    ) -> usize {
        let mut taken = 0;
        while taken < budget {
            let Some((meta, task)) = self.pop(slots) else {
                break;
            };
            taken += 1;
            if let Some((adoption, task)) = task {
                each(meta, adoption, task);
            }
        }
        taken
    }

    /// Whether a published cell not yet consumed is due before tick `tick` (or there are more
    /// than [`PEEK_LIMIT`] of them): by the deadline at scheduling, or by its slot's now, which
    /// a reset may have moved earlier (its `Relocate`, applied before the shard adopts the
    /// timer, wakes nothing then). A slot retracted and reused since only wakes the shard for
    /// nothing.
    fn due_before(&self, slots: &SlotTable, tick: u64) -> bool {
        let stage = self.stage;
        let head = self.head.get();
        // May be below `head`: as in `pop`.
        let tail = stage.producer.tail.load(Ordering::Acquire);
        if tail.saturating_sub(head) > PEEK_LIMIT {
            return true;
        }
        (head..tail).any(|position| {
            // SAFETY: as in `pop`: published, not reused, and ours to read.
            let meta = unsafe { stage.meta(position) };
            meta.deadline.min(slots.deadline(meta.index)) < tick
        })
    }
}

impl Drop for Consumer<'_> {
    fn drop(&mut self) {
        self.stage.head.store(self.head.get(), Ordering::Release);
        self.stage.consuming.store(false, Ordering::Release);
    }
}

/// Every stage of one shard: the registry producers join and the owner drains.
pub(crate) struct Stages {
    /// Identifies the shard in threads' lists of their stages (unique in the process).
    id: u64,
    registered: Mutex<Vec<Arc<Stage>>>,
    /// How many stages `registered` holds (it only grows): the owner refreshes its copy when
    /// this changes.
    count: AtomicUsize,
}

impl std::fmt::Debug for Stages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stages")
            .field("count", &self.count.load(Ordering::Relaxed))
            .finish()
    }
}

impl Stages {
    pub(crate) fn new() -> Stages {
        static NEXT_ID: crate::sync::statistics::AtomicU64 =
            crate::sync::statistics::AtomicU64::new(0);
        Stages {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            registered: Mutex::new(Vec::new()),
            count: AtomicUsize::new(0),
        }
    }

    /// Publishes a timer on this thread's stage of this shard (registering or taking one over
    /// at first use). Returns where it went and whether the stage is filling up, or gives the
    /// task back if the stage is full or this thread's list of stages is out of reach (being
    /// destroyed, or in use further up the stack).
    #[inline]
    pub(crate) fn push<M: FnOnce() -> Task>(
        &self,
        meta: Meta,
        make: M,
        slots: &SlotTable,
    ) -> Result<(StagedAt, bool), M> {
        match self.own_or_join() {
            Some(stage) => stage.push(meta, make, slots),
            None => Err(make),
        }
    }

    /// The calling thread's own stage of this shard, registering or taking one over if it has
    /// none (`None` if that cannot be done: see [`push`](Self::push)).
    #[inline]
    fn own_or_join(&self) -> Option<&Stage> {
        if let Some(stage) = self.own() {
            return Some(stage);
        }
        MINE.try_with(|mine| {
            let mut mine = mine.try_borrow_mut().ok()?;
            mine.retain(|mine| !mine.stage.shard_gone.load(Ordering::Relaxed));
            let stage = self.join()?;
            self.remember(&stage);
            mine.push(Mine {
                shard: self.id,
                stage,
            });
            Some(())
        })
        .ok()??;
        self.last()
    }

    /// The calling thread's own stage of this shard, if it has one: the one [`LAST`] names, or
    /// the one its list of stages holds (which then becomes `LAST`).
    #[inline]
    fn own(&self) -> Option<&Stage> {
        if let Some(stage) = self.last() {
            return Some(stage);
        }
        MINE.try_with(|mine| {
            let mine = mine.try_borrow().ok()?;
            self.remember(&mine.iter().find(|mine| mine.shard == self.id)?.stage);
            Some(())
        })
        .ok()??;
        self.last()
    }

    /// Makes `stage`, this thread's stage of this shard (held in its list), the one [`LAST`]
    /// names.
    fn remember(&self, stage: &Stage) {
        let _ = LAST.try_with(|last| last.set((self.id, std::ptr::from_ref(stage))));
    }

    /// The stage [`LAST`] names, if it is this shard's.
    #[inline]
    fn last(&self) -> Option<&Stage> {
        let (shard, stage) = LAST.try_with(std::cell::Cell::get).ok()?;
        // SAFETY: `LAST` names a stage of this thread's that this `Stages` registered (ids are
        // unique in the process), and a stage lives as long as its `Stages` (see `LAST`),
        // which `self` borrows.
        (shard == self.id).then(|| unsafe { &*stage })
    }

    /// A slot this thread retracted earlier on this shard, if its stage keeps one
    /// ([`SlotTable::take_spare`]): its index and generation, as `SlotTable::allocate` gives them.
    #[inline]
    pub(crate) fn take_spare(&self, slots: &SlotTable) -> Option<(u32, u32)> {
        slots.take_spare(&self.own()?.producer.spares)
    }

    /// The producer takes back timer `(index, generation)`, staged at `at`, before the shard
    /// adopted it: cancelled, its one handle let go of, its slot freed into the stage's spares
    /// or the free list ([`SlotTable::retract`]), and its task handed to `dispose` (to be
    /// dropped). False
    /// (nothing changed) if this thread is not the stage's producer, or the timer is not in
    /// that state: the caller cancels it the ordinary way.
    #[inline]
    pub(crate) fn retract(
        &self,
        at: StagedAt,
        index: u32,
        generation: u32,
        slots: &SlotTable,
        dispose: impl FnOnce(Task),
    ) -> bool {
        let Some(own) = self.own() else {
            return false;
        };
        if own.number != at.stage() || !slots.retract(index, generation, &own.producer.spares) {
            return false;
        }
        // SAFETY: we are the stage's producer, so the cell at `at.cell()` holds this timer
        // until the consumer's `head` passes it, which it cannot have done before our
        // retraction took the slot out of STAGED (its adoption would have); the retraction
        // gives us its task.
        let task = unsafe { own.take_task(at.cell()) };
        own.rewind(at.cell());
        dispose(task);
        true
    }

    /// A stage for the calling thread: an orphaned one, or a new one (`None` past
    /// [`MAX_STAGES`]).
    fn join(&self) -> Option<Arc<Stage>> {
        let mut registered = lock(&self.registered);
        for stage in registered.iter() {
            // Acquire: the exited producer's last `tail` (its Release below).
            if stage
                .orphaned
                .compare_exchange(true, false, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return Some(stage.clone());
            }
        }
        if registered.len() >= MAX_STAGES {
            return None;
        }
        let stage = Arc::new(Stage::new(registered.len() as u16));
        registered.push(stage.clone());
        self.count.store(registered.len(), Ordering::Release);
        Some(stage)
    }

    /// Drains the calling thread's own stage of this shard, if it has one, after the shard's
    /// last drain (see "Shutdown"): `each` gets the task of every cell left that was not
    /// retracted (all of them cancelled while staged), once the consumer's role is let go of:
    /// a task's drop (user code) may submit, and so drain this stage, itself.
    pub(crate) fn drain_own(&self, slots: &SlotTable, mut each: impl FnMut(Adoption, Task)) {
        let Some(stage) = self.own() else {
            return;
        };
        let mut left = Vec::new();
        stage
            .consume()
            .drain(slots, usize::MAX, |_, adoption, task| {
                left.push((adoption, task));
            });
        for (adoption, task) in left {
            each(adoption, task);
        }
    }

    /// When the shard goes: drains every stage (only a failure can have kept the shard from
    /// its last drain), `each` getting the tasks once the stage list's lock and the consumers'
    /// roles are let go of (a task's drop may stage, or drain a stage, itself), and threads
    /// forget the stages.
    pub(crate) fn close(&self, slots: &SlotTable, mut each: impl FnMut(Task)) {
        let mut left = Vec::new();
        for stage in lock(&self.registered).iter() {
            stage.shard_gone.store(true, Ordering::Relaxed);
            if let Some(consumer) = stage.try_consume() {
                consumer.drain(slots, usize::MAX, |_, _, task| left.push(task));
            }
        }
        for task in left {
            each(task);
        }
    }
}

/// The owner's copy of its shard's stage list (refreshed when a stage registers).
#[derive(Default)]
pub(crate) struct StageList {
    stages: Vec<Arc<Stage>>,
}

impl StageList {
    fn refresh(&mut self, stages: &Stages) {
        if stages.count.load(Ordering::Acquire) != self.stages.len() {
            self.stages = lock(&stages.registered).clone();
        }
    }

    /// Consumer: consumes up to `budget` cells from every stage, adopting their timers;
    /// `each` gets those it must handle (adopted, or cancelled while staged, with the task).
    /// Returns how many cells there were. A stage whose consumer role is held elsewhere (its
    /// producer, after the shard's last drain) is skipped: that producer drains it. `wait`:
    /// wait for the role instead.
    pub(crate) fn drain(
        &mut self,
        stages: &Stages,
        slots: &SlotTable,
        budget: usize,
        wait: bool,
        mut each: impl FnMut(Meta, Adoption, Task),
    ) -> usize {
        self.refresh(stages);
        let mut taken = 0;
        for stage in &self.stages {
            let consumer = if wait {
                Some(stage.consume())
            } else {
                stage.try_consume()
            };
            if let Some(consumer) = consumer {
                taken += consumer.drain(slots, budget - taken, &mut each);
            }
        }
        taken
    }

    /// Before a reclaim: moves every stage's spare slots onto the free list
    /// ([`SlotTable::flush_spares`]).
    pub(crate) fn flush_spares(&mut self, stages: &Stages, slots: &SlotTable) {
        self.refresh(stages);
        slots.flush_spares(self.stages.iter().map(|stage| &stage.producer.spares));
    }

    /// Whether a stage holds a timer due before tick `tick` (see [`Consumer::due_before`]);
    /// called by the owner after it set `PARKED` (Dekker: see "Waking the shard").
    pub(crate) fn due_before(&mut self, stages: &Stages, slots: &SlotTable, tick: u64) -> bool {
        self.refresh(stages);
        self.stages.iter().any(|stage| {
            stage
                .try_consume()
                .is_none_or(|consumer| consumer.due_before(slots, tick))
        })
    }
}

/// The calling thread's stage of one shard.
struct Mine {
    shard: u64,
    stage: Arc<Stage>,
}

impl Drop for Mine {
    /// The thread exits (or forgets the shard): another thread may take the stage over.
    fn drop(&mut self) {
        // This thread is no longer the stage's producer: forget it first.
        let _ = LAST.try_with(|last| {
            if std::ptr::eq(last.get().1, &*self.stage) {
                last.set(NO_STAGE);
            }
        });
        // Release: our last `tail` store, for whoever takes the stage over (Acquire in `join`).
        self.stage.orphaned.store(true, Ordering::Release);
    }
}

#[cfg(not(shardwheel_loom))]
thread_local! {
    /// This thread's stages, one per shard it scheduled on.
    static MINE: RefCell<Vec<Mine>> = const { RefCell::new(Vec::new()) };
    /// The stage of `MINE` this thread used last, and its shard's id: read without borrowing
    /// `MINE` (and without a destructor, so also while `MINE` is being destroyed). The pointer
    /// stays valid as long as the stage's `Stages`, whose `registered` only grows; an entry
    /// of `MINE` clears it when it goes (the thread is then no longer that stage's producer).
    static LAST: std::cell::Cell<(u64, *const Stage)> = const { std::cell::Cell::new(NO_STAGE) };
}

// Loom's thread-locals take no `const` initializers.
#[cfg(shardwheel_loom)]
thread_local! {
    static MINE: RefCell<Vec<Mine>> = RefCell::new(Vec::new());
    static LAST: std::cell::Cell<(u64, *const Stage)> = std::cell::Cell::new(NO_STAGE);
}

/// What [`LAST`] holds when it names no stage (no `Stages` has this id).
const NO_STAGE: (u64, *const Stage) = (u64::MAX, std::ptr::null());

#[cfg(all(test, not(shardwheel_loom)))]
mod tests {
    use super::*;

    /// A staged timer whose deadline a reset moved earlier, before its shard adopted it, is
    /// due by its new deadline: the shard must not sleep past it.
    #[test]
    fn a_staged_timer_moved_earlier_is_due_by_its_new_deadline() {
        let (stages, slots) = (Stages::new(), SlotTable::new());
        let (index, generation) = slots.allocate().expect("a free slot");
        slots.begin_staged(index, generation, 100);
        let meta = Meta {
            index,
            generation,
            deadline: 100,
        };
        assert!(
            stages.push(meta, || Task::new(|| {}), &slots).is_ok(),
            "staged"
        );
        let mut list = StageList::default();
        assert!(!list.due_before(&stages, &slots, 10));
        slots.set_deadline(index, 5);
        assert!(list.due_before(&stages, &slots, 10));
        list.drain(&stages, &slots, usize::MAX, true, |_, _, _| {});
    }
}
