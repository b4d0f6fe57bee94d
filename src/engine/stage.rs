//! Stages: how a thread hands new one-shot timers to a shard without a shared queue, so that a
//! timer cancelled before its shard looked costs no message at all.
//!
//! # How it works
//!
//! Each (thread, shard) pair that schedules has a [`Stage`]: a bounded ring of new timers (slot
//! index, generation, deadline tick, task) with one producer, the thread, and one consumer, the
//! shard's owner. The producer writes a cell and publishes it by advancing `tail`; the owner
//! drains every stage of its shard at each turn and *adopts* each timer
//! ([`SlotTable::adopt`](super::slot::SlotTable::adopt)): it clears the slot's `STAGED` bit and
//! stores the timer in its wheel, or, if the timer was cancelled meanwhile, drops its task.
//! A cancel that finds `STAGED` set sends no message: the adoption finds it. Most of a server's
//! timeouts end this way, seen by their shard once, in a batch, without a wake-up of their own.
//!
//! | who | may touch |
//! |-----|-----------|
//! | the producer: the thread that registered the stage, or took it over after that thread exited ([`Stage::orphaned`]) | the cell at `tail`; advances `tail` |
//! | the consumer: whoever holds `consuming` (the shard's owner; after the shard's last drain at shutdown, the producer) | cells in `head..tail`; advances `head` |
//!
//! Repeating timers, a full stage and a thread whose thread-locals are gone take the shard's
//! inbox instead (`ShardShared::submit`).
//!
//! # Waking the shard
//!
//! The producer publishes `tail` with a read-modify-write and a fence, then reads the inbox's
//! signal word ([`Inbox::staged`](super::inbox::Inbox::staged)); the owner, before it sleeps,
//! sets `PARKED` with a compare-and-swap and a fence, then looks at every stage's tail
//! ([`Stages::due_before`]). Dekker's argument: either the owner sees the new cell (and does
//! not sleep past its deadline), or the producer sees the owner parked, and wakes it if the
//! timer is due before the owner's wake-up tick, if the owner sleeps long, or if the stage is
//! half full. A busy producer thus wakes its shard about once per drain interval, not once per
//! timer.
//!
//! # Shutdown
//!
//! A producer whose signal read finds the inbox closed settles its timer on the slot's word,
//! as an inbox push does (`ShardShared::submit`). The owner drains the stages before and after
//! it marks the inbox `DRAINED`; a producer that sees `DRAINED` drains its own stage, under
//! `consuming`, so every cell is consumed by exactly one thread.

use crate::sync::{Arc, AtomicBool, AtomicU64, AtomicUsize, Mutex, Ordering, UnsafeCell};
use crate::sync::{lock, thread, thread_local};
use crate::task::Task;
use crossbeam_utils::CachePadded;
use std::cell::RefCell;
use std::mem::MaybeUninit;

/// Cells per stage (a power of two).
#[cfg(not(shardwheel_loom))]
const CAPACITY: u64 = 1024;
/// Small under loom, so that a model can fill a stage.
#[cfg(shardwheel_loom)]
const CAPACITY: u64 = 4;

/// Cells the owner looks at, before sleeping, for one due before its wake-up; beyond that it
/// drains instead.
const PEEK_LIMIT: u64 = 256;

/// One staged timer.
pub(crate) struct Staged {
    pub(crate) index: u32,
    pub(crate) generation: u32,
    /// The deadline tick at scheduling (the slot's deadline may have moved since).
    pub(crate) deadline: u64,
    pub(crate) task: Task,
}

/// One (thread, shard) pair's ring of staged timers. See the [module documentation](self).
pub(crate) struct Stage {
    /// Cells published (a count; the cell is `tail % CAPACITY`). Written by the producer.
    tail: CachePadded<AtomicU64>,
    /// Cells consumed. Written by the consumer.
    head: CachePadded<AtomicU64>,
    /// Held by whoever consumes.
    consuming: AtomicBool,
    /// The producing thread exited: another thread may take the stage over.
    orphaned: AtomicBool,
    /// The shard is gone: threads forget the stage.
    shard_gone: AtomicBool,
    cells: Box<[UnsafeCell<MaybeUninit<Staged>>]>,
}

// SAFETY: the cells are accessed by one producer and one consumer at a time, as the module
// documentation's table says: the producer writes a cell only outside `head..tail`, the
// consumer reads only inside it, and `tail`'s Release / Acquire pair orders each cell's write
// before its read (`head`'s pair orders the read before the cell's next write). `Staged` is
// `Send` (its task is).
unsafe impl Send for Stage {}
// SAFETY: as above: every shared access goes through the atomics or the protocol they order.
unsafe impl Sync for Stage {}

impl Stage {
    fn new() -> Stage {
        Stage {
            tail: CachePadded::new(AtomicU64::new(0)),
            head: CachePadded::new(AtomicU64::new(0)),
            consuming: AtomicBool::new(false),
            orphaned: AtomicBool::new(false),
            shard_gone: AtomicBool::new(false),
            cells: (0..CAPACITY)
                .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
                .collect(),
        }
    }

    fn cell(&self, position: u64) -> &UnsafeCell<MaybeUninit<Staged>> {
        &self.cells[(position % CAPACITY) as usize]
    }

    /// Producer: publishes `staged`, with a fence after (see "Waking the shard"). Returns
    /// whether the stage is now at least half full, or gives `staged` back if it is full.
    fn push(&self, staged: Staged) -> Result<bool, Staged> {
        let tail = self.tail.load(Ordering::Relaxed);
        let head = self.head.load(Ordering::Acquire);
        if tail - head >= CAPACITY {
            return Err(staged);
        }
        // SAFETY: only the producer writes cells, and this one is outside `head..tail`: the
        // consumer is done with it (its `head` store, acquired above, came after its read).
        self.cell(tail)
            .with_mut(|cell| unsafe { (*cell).write(staged) });
        crate::sync::swap_then_fence(&self.tail, tail + 1, Ordering::AcqRel);
        Ok(tail + 1 - head >= CAPACITY / 2)
    }

    /// Takes the consumer's role, if no one holds it.
    fn try_consume(&self) -> Option<Consumer<'_>> {
        self.consuming
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
            .then_some(Consumer { stage: self })
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

impl Drop for Stage {
    /// Tasks still staged (only if the shard was dropped without its last drain, after a
    /// failure) are user code: dropped contained.
    fn drop(&mut self) {
        let consumer = Consumer { stage: self };
        while let Some(staged) = consumer.pop() {
            super::executor::drop_uncounted(staged.task);
        }
        std::mem::forget(consumer);
    }
}

/// The consumer's role on a stage, let go of on drop.
pub(crate) struct Consumer<'a> {
    stage: &'a Stage,
}

impl Consumer<'_> {
    /// The next published cell, if any.
    pub(crate) fn pop(&self) -> Option<Staged> {
        let stage = self.stage;
        let head = stage.head.load(Ordering::Relaxed);
        if head == stage.tail.load(Ordering::Acquire) {
            return None;
        }
        // SAFETY: `head < tail`: the producer published this cell (Acquire above) and will not
        // write it again before our `head` store below; we hold the consumer's role.
        let staged = stage
            .cell(head)
            .with(|cell| unsafe { (*cell).assume_init_read() });
        stage.head.store(head + 1, Ordering::Release);
        Some(staged)
    }

    /// Whether a published cell not yet consumed is due before tick `tick` (or there are more
    /// than [`PEEK_LIMIT`] of them).
    fn due_before(&self, tick: u64) -> bool {
        let stage = self.stage;
        let head = stage.head.load(Ordering::Relaxed);
        let tail = stage.tail.load(Ordering::Acquire);
        if tail - head > PEEK_LIMIT {
            return true;
        }
        (head..tail).any(|position| {
            // SAFETY: as in `pop`: published, not consumed, and ours to read.
            stage
                .cell(position)
                .with(|cell| unsafe { (*cell).assume_init_ref().deadline })
                < tick
        })
    }
}

impl Drop for Consumer<'_> {
    fn drop(&mut self) {
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

    /// Publishes `staged` on this thread's stage of this shard (registering or taking one
    /// over at first use). Returns whether the stage is half full, or gives `staged` back if
    /// it is full or this thread's list of stages is out of reach (being destroyed, or in
    /// use further up the stack).
    pub(crate) fn push(&self, staged: Staged) -> Result<bool, Staged> {
        let mut staged = Some(staged);
        let pushed = MINE.try_with(|mine| {
            let mut mine = mine.try_borrow_mut().ok()?;
            let position = match mine.iter().position(|mine| mine.shard == self.id) {
                Some(position) => position,
                None => {
                    mine.retain(|mine| !mine.stage.shard_gone.load(Ordering::Relaxed));
                    let stage = self.join();
                    mine.push(Mine {
                        shard: self.id,
                        stage,
                    });
                    mine.len() - 1
                }
            };
            Some(mine[position].stage.push(staged.take()?))
        });
        match pushed {
            Ok(Some(result)) => result,
            _ => Err(staged.expect("not pushed")),
        }
    }

    /// A stage for the calling thread: an orphaned one, or a new one.
    fn join(&self) -> Arc<Stage> {
        let mut registered = lock(&self.registered);
        for stage in registered.iter() {
            // Acquire: the exited producer's last `tail` (its Release below).
            if stage
                .orphaned
                .compare_exchange(true, false, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return stage.clone();
            }
        }
        let stage = Arc::new(Stage::new());
        registered.push(stage.clone());
        self.count.store(registered.len(), Ordering::Release);
        stage
    }

    /// The calling thread's own stage of this shard, if it has one, drained after the shard's
    /// last drain (see "Shutdown"): `each` gets every cell left.
    pub(crate) fn drain_own(&self, mut each: impl FnMut(Staged)) {
        let stage = MINE
            .try_with(|mine| {
                let mine = mine.try_borrow().ok()?;
                mine.iter()
                    .find(|mine| mine.shard == self.id)
                    .map(|mine| mine.stage.clone())
            })
            .ok()
            .flatten();
        if let Some(stage) = stage {
            let consumer = stage.consume();
            while let Some(staged) = consumer.pop() {
                each(staged);
            }
        }
    }
}

impl Drop for Stages {
    /// Threads forget the shard's stages; tasks still staged (only after a failure kept the
    /// shard from its last drain) are user code: dropped contained.
    fn drop(&mut self) {
        for stage in lock(&self.registered).iter() {
            stage.shard_gone.store(true, Ordering::Relaxed);
            if let Some(consumer) = stage.try_consume() {
                while let Some(staged) = consumer.pop() {
                    super::executor::drop_uncounted(staged.task);
                }
            }
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

    /// Consumer: takes up to `budget` staged timers from every stage, `each` for each; returns
    /// how many. A stage whose consumer role is held elsewhere (its producer, after the shard's
    /// last drain) is skipped: that producer drains it. `wait`: wait for the role instead.
    pub(crate) fn drain(
        &mut self,
        stages: &Stages,
        budget: usize,
        wait: bool,
        mut each: impl FnMut(Staged),
    ) -> usize {
        self.refresh(stages);
        let mut taken = 0;
        for stage in &self.stages {
            let consumer = if wait {
                Some(stage.consume())
            } else {
                stage.try_consume()
            };
            let Some(consumer) = consumer else {
                continue;
            };
            while taken < budget {
                let Some(staged) = consumer.pop() else {
                    break;
                };
                taken += 1;
                each(staged);
            }
        }
        taken
    }

    /// Whether a stage holds a timer due before tick `tick` (see [`Consumer::due_before`]);
    /// called by the owner after it set `PARKED` (Dekker: see "Waking the shard").
    pub(crate) fn due_before(&mut self, stages: &Stages, tick: u64) -> bool {
        self.refresh(stages);
        self.stages.iter().any(|stage| {
            stage
                .try_consume()
                .is_none_or(|consumer| consumer.due_before(tick))
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
        // Release: our last `tail` store, for whoever takes the stage over (Acquire in `join`).
        self.stage.orphaned.store(true, Ordering::Release);
    }
}

thread_local! {
    /// This thread's stages, one per shard it scheduled on.
    static MINE: RefCell<Vec<Mine>> = RefCell::new(Vec::new());
}
