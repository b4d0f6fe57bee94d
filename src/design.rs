//! Design notes (documentation only): a timer's life from end to end.
//!
//! This page tells the story once and names, at each step, the file that owns the mechanism;
//! the details (state tables, invariants, who may touch what) live in that file's
//! documentation and only there. `README.md` gives the reading order of those files.
//!
//! Data flows one way: timer -> engine -> a shard's shared side -> inbox -> owner -> wheel ->
//! hand-off -> executor. A shard is one pinned thread, its owner, that alone mutates the shard's
//! wheel and entries; every other thread reaches it through messages. The only memory both
//! sides touch is each timer's slot in the shard's slot table.
//!
//! # A timer's life
//!
//! 1. **Build.** [`Builder`](crate::Builder) checks the configuration (typed errors, never a
//!    panic) and starts the engine: one shard per CPU, their threads and the executor
//!    (`src/timer.rs`, `src/engine/timer_engine.rs`). Time is passed in: the wheel never reads
//!    a clock, and a deadline rounds up to the tick (`src/clock.rs`, `src/cycle_clock.rs` for
//!    the cheap reading behind `schedule(delay)`, `reset(delay)` and `sleep(delay)`).
//! 2. **Schedule** (any thread). The thread's home shard is chosen at its first schedule and
//!    moved only when the thread stays on another core: the policy and the per-thread
//!    numbering it uses live in `src/engine/placement.rs`. The caller takes a
//!    slot from that shard's slot table (lock-free; `src/engine/slot/free_list.rs`; a `Sleep`'s
//!    timer first takes one its thread retracted, `src/engine/slot/spares.rs`), writes the
//!    deadline beside its state word (bit layout: `src/engine/slot/word.rs`), counts the timer
//!    against the pending limit and hands the task over (`src/engine/shared.rs`): a `Sleep`'s
//!    timer goes, marked STAGED, into the thread's own ring for that shard, its *stage*, with
//!    no shared queue and usually no wake-up (`src/engine/stage.rs`); a closure timer (or one
//!    that finds the stage full) is sent as a `Schedule` message (`src/engine/message.rs`).
//!    The caller gets a [`TimerHandle`](crate::TimerHandle): slot index plus generation
//!    (`src/engine/handle.rs`).
//! 3. **Delivered** (owner). The inbox (`src/engine/inbox.rs`) is a lock-free queue whose tail
//!    word carries a few flags, which are also how a parked shard is woken without ever losing
//!    a wake-up (the argument is in that file; stages join it by Dekker's protocol, argued in
//!    `src/engine/stage.rs`). The owner drains it and the stages in its turn, adopts each
//!    staged timer (or drops the task of one cancelled while staged), checks each message
//!    against the slot's generation and state (a stale message is dropped, never assumed
//!    current), stores the task in its private entry and links the entry into the wheel
//!    (`src/engine/owner.rs`).
//! 4. **Cancel and reset** (any thread). Both are decided on the slot's state word, on the
//!    spot, by the handle; the owner learns of them by message when it must (an unlink of an
//!    adopted timer (a staged one needs none), an earlier deadline, a repeating timer's new
//!    schedule). A later deadline of a one-shot timer needs no message at all: the entry stays where it is and is stored again further on when
//!    the wheel reaches it. Every legal transition of the state word, with who may make it, is
//!    the table in `src/engine/slot/mod.rs`; why a reset that returned `true` can never be
//!    overtaken by a firing, and so nothing fires early, is argued there too.
//! 5. **Expire** (owner). One turn of the owner (the same function whether the shard's thread
//!    or a manual clock drives it; `src/engine/owner.rs`, the thread loop in
//!    `src/engine/worker.rs`) applies the inbox, advances the wheel to the current tick and
//!    collects what expired. The wheel (`src/wheel/mod.rs`, the single-threaded raw wheel in
//!    `src/wheel/raw.rs`) is hierarchical, 64 slots a level with occupancy bitmaps, and keeps a
//!    near ring of two windows so that a storm of timers due in one second never waits for a
//!    long cascade. Repeating timers are re-armed by the owner (`src/periodic.rs`).
//! 6. **Hand-off** (owner, then executor). Expired tasks are collected first and handed off in
//!    batches after the owner let go of its state (`src/engine/handoff.rs`): closures to the
//!    pool, waker tasks inline (`src/engine/executor.rs`). Async sleeps, timeouts and intervals
//!    are such waker tasks (`src/futures/mod.rs`, `src/default_timer.rs`). A sleep moved later
//!    keeps its timer, and the default timer's sleeps (its free functions' and `HyperTimer`'s)
//!    leave theirs, when dropped, to their task's next sleep (`src/futures/kept.rs`): such a
//!    timer may wake its task early, once, and the sleep then schedules one for its own
//!    deadline.
//! 7. **Free.** When a timer has fired or been cancelled, the owner has let go of it and no
//!    handle is left, whoever made that last change returns the slot to the free list with the
//!    next generation (`src/engine/slot/mod.rs`; the slots that the owner frees as it applies
//!    `Cancel` messages are gathered during a drain and returned at once,
//!    `src/engine/slot/free_list.rs`).
//!
//! # Memory
//!
//! A pending timer costs a shared slot (state word and deadline) and a private entry (wheel
//! links and the task, closures of up to 16 bytes stored inline); the layout is documented with
//! the slot (`src/engine/slot/word.rs`) and the task (`src/task.rs`). Slot pages are allocated
//! once and never unmapped before the table is dropped, and a slot with live handles is never
//! reused, so nothing is ever read after it is freed and no epoch-based reclamation is needed
//! (storage and all of its `unsafe`: `src/engine/slot/pages.rs`). The inbox's message queue
//! reuses its blocks without epochs either: a block goes back only once every producer that
//! could still reach it has written its cell and the shard has read it
//! (`src/engine/queue.rs`). The sleeps of an owned `Timer` keep its engine's memory alive by
//! counts on per-thread stripes, written without locked instructions; the timer's drop pays
//! for that with one `membarrier` (`src/engine/lease.rs`, the barrier in `src/sync.rs`).
//!
//! An idle shard gives memory back: its entry table, and once every handle is gone its slot
//! pages (`madvise`, in place), with a backoff so that an idle engine stays asleep
//! (`src/engine/reclaim.rs`). In one line, the slot table's reclaim protocol commits only when
//! no slot is in use, being allocated or being freed, and restarts generations above every one
//! used before so that no stale message can reach a new timer; its invariants, and what keeps
//! each, are the table in `src/engine/slot/reclaim.rs`. The slots producers keep as spares are
//! flushed onto the free list first (`src/engine/slot/spares.rs`).
//!
//! A shard that still holds timers, but few of the slots it handed out (a peak that passed),
//! compacts instead: it moves its timers into fresh slots, a piece at a time between its turns,
//! and gives back the pages of the slots they left. Handles and messages keep naming the old
//! slot; one that reads 0 there follows an immutable map, freed by the next reclaim (when no
//! handle is left to read it). The protocol and why each other thread is safe: the table in
//! `src/engine/slot/compact.rs`; when, and the owner's side: `src/engine/owner/compaction.rs`.
//!
//! # User code
//!
//! Tasks (run, or dropped when that runs a destructor of theirs), wakers and panic payloads are
//! user code. The engine calls it only through one containment helper that catches and counts
//! a panic, never while holding shard state: see "Containing user code" in
//! `src/engine/executor.rs`, where every call site is listed. A shard thread that dies anyway
//! (an engine bug) is marked failed, reported by
//! [`Stats::failed_shards`](crate::Stats::failed_shards), and its timers are returned at
//! shutdown (`src/engine/worker.rs`).
//!
//! # Shutdown
//!
//! `shutdown()` closes every inbox, joins the shard threads and has each owner apply what was
//! delivered before the close, then return every timer still pending as
//! [`UnfiredTimer`](crate::UnfiredTimer)s (`src/engine/timer_engine.rs`,
//! `src/engine/handoff.rs`). A submitter racing the close either gets
//! [`ScheduleError::Shutdown`](crate::ScheduleError::Shutdown) or finds its timer among those
//! returned, decided on the timer's own state word (`src/engine/shared.rs`).
