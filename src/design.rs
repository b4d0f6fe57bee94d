//! Design notes (documentation only).
//!
//! # A timer's life
//!
//! 1. **Schedule** (any thread). The thread's home shard is used, chosen at its first schedule
//!    and kept: one pinned to the CPU the thread ran on then (so the message and the entry stay
//!    in that core's caches), else round-robin by thread; a shard's own thread uses its own. A
//!    slot is popped from the shard's
//!    lock-free free list (a tagged Treiber stack threaded through the free slots' state
//!    words) or taken fresh; the deadline tick is written beside the state word, which then
//!    becomes PENDING with one handle and the SHARD bit.
//!    The task (24 bytes, closures up to 16 bytes stored inline) travels to the shard in a
//!    `Schedule` message through the shard's inbox, a `crossbeam_queue::SegQueue`.
//! 2. **Stored** (owner). The shard pops the message, writes the task into its private entry
//!    (same index as the slot) and links the entry into its wheel at the slot's deadline.
//! 3. **Cancel** (any thread). A compare-and-swap PENDING -> CANCELLED decides, on the
//!    spot, that the task will never run; a `Cancel` message then tells the shard to unlink the
//!    entry and drop the task at its next turn.
//! 4. **Reset** (any thread). One-shot timers are reset in place: the handle checks that the
//!    state word is PENDING, swaps the deadline beside it (its one locked instruction), and
//!    reads the word again (see 5). A later deadline needs nothing more: the entry stays where
//!    it is, and when the shard reaches it, it reads the deadline and stores the entry again
//!    further on (idle-connection timeouts pushed back on every request cost no message and no
//!    work in the shard until their old deadline). An earlier deadline also sends a `Relocate`
//!    message so the shard moves the entry forward. The deadline is `delay` after a reading of
//!    the processor's cycle counter (`cycle_clock`, where sound) plus a 50 µs margin: the ordered
//!    `Instant::now()` would wait for the reset's cache misses and stop consecutive resets from
//!    overlapping them. Repeating timers keep the message path (their task must learn of the
//!    new schedule): the compare-and-swap counts a reset in flight and a `Reset` message carries
//!    the deadline; the shard sets such a timer aside at its old deadline until the message
//!    arrives.
//! 5. **Fire** (owner). When the wheel hands out an entry, the shard locks the state word
//!    (`DEADLINE_LOCK`, which only the shard takes), then reads the deadline: if it is due, a
//!    compare-and-swap of the word to FIRED fires it; otherwise the entry goes back in the wheel
//!    at its new deadline. A fence stands between the lock and the read, and between a reset's
//!    swap and its second read of the word (Dekker): either the shard sees the new deadline, or
//!    the reset sees the lock, waits for the decision, and returns false if the timer fired. So
//!    a reset that returned true always moves the deadline, and nothing fires early. The task
//!    goes into the turn's batch; batches of 128 go to the executor while the shard collects
//!    the rest.
//! 6. **Free.** When the timer is FIRED or CANCELLED, the shard has let go of it and no handle
//!    is left, whoever made that last change pushes the slot back on the free list with the
//!    next generation.
//!
//! # Memory per timer
//!
//! Shared slot: state word 8 bytes + deadline 8 bytes. Private entry: wheel links 8 bytes +
//! task 24 bytes. In all 48 bytes per pending timer, task included, when the closure fits in
//! 16 bytes; the handle (16 bytes) is the caller's.
//! All of it is given back once a shard is idle and every handle of its timers is gone (see
//! below): about 1 byte per cancelled timer remains (the load generator's memory workload).
//!
//! # Firing a million timers in a second
//!
//! A hierarchical wheel cascades: when time enters a new 64-tick window, the level-1 slot
//! holding that window's timers is walked and each timer moved down. With a million timers due
//! over one second, that slot holds 64,000 timers, and walking a linked list of them is a cache
//! miss per timer: milliseconds during which nothing fires. So the wheel keeps a near ring of
//! two windows (the current one and the next) and cascades the next window while the current
//! one runs, a bounded slice per advance (more as its deadline nears), after the turn's expired
//! tasks were handed off. Near-ring slots are arrays of entry indices rather than linked lists,
//! so expiry reads indices in order and prefetches entries and slots eight ahead. Giving an
//! emptied shard's memory back (its entry table to the allocator, its slot table's pages to
//! the operating system: unmapping that takes milliseconds) waits 20 ms after the last timer
//! left, so it never delays the last tasks of a burst.
//!
//! # Why nothing is read after it is freed
//!
//! Slot pages are allocated once and freed only when the table is dropped, which happens when
//! the engine and every handle are gone (handles hold an `Arc` to their shard). A slot is
//! reused only after its generation changes, and a slot with live handles is never reused,
//! so every access through a handle reads the right timer's word. The inbox queue reclaims
//! its own blocks (crossbeam). Hence no epoch-based reclamation is needed.
//!
//! # Giving memory back after a mass cancel
//!
//! An idle shard (no timer left in it) gives back its entry table and, once every slot is free
//! (every handle dropped), its slot table's memory, so that resident memory returns to where it
//! was before the timers came. The slot pages cannot be freed (any thread may hold a slot
//! index and read its page), so the shard gives their memory back in place with
//! `madvise(MADV_DONTNEED)`: still mapped, reading as zeros (FREE words). The table then starts
//! over: fresh slots from index 0, at a generation above every one used before. See the
//! reclaim protocol of the slot table (`engine/slot/reclaim.rs`); in short:
//!
//! | invariant | kept by |
//! |-----------|---------|
//! | the release commits only if no slot is in use, being allocated or being freed | the free list walked from head `H` holds every slot handed out; the fresh counter is sealed unchanged; the head is still `H` (tagged: no push or pop in between) |
//! | a stale pop (of a list read before the release) fails | emptying the list bumps its tag |
//! | a fresh allocation never overlaps a release's commit | it sees `SEALED`, discards its index and starts over |
//! | no new timer's write is erased by `madvise` | a fresh allocation waits until its page is `ready` (published after the `madvise`) |
//! | a stale message (`Relocate`, `Reset`, `Cancel`) never hits a new timer | new generations start above every generation on the list |
//! | pages are never unmapped or freed before the table is dropped | `madvise` changes content, not mappings |
//!
//! While handles are still held, the shard tries again after 20 ms, 40 ms, ... up to 1 s,
//! walking the list only when it changed, and stops when it has not changed for a second (an
//! idle engine stays asleep); a later turn of the shard starts over if it changed.
//!
//! # Waking a sleeping shard
//!
//! See the inbox's signal word: a single atomic word carries the "parked" flags and the count
//! of messages pushed since the shard's last drain. A submitter pushes, then adds to the count;
//! the shard parks only with a compare-and-swap that expects a zero count. Either the park
//! fails, or the submitter's add sees the parked flag and wakes the shard if its message is due
//! before the shard's wake-up (or the shard sleeps long). No wake-up is lost.
//!
//! # User code
//!
//! Tasks (run or dropped), wakers and panic payloads are user code; the engine calls it only
//! through one containment helper, which catches and counts a panic, so that user code can
//! never take a shard or the process down: see "Containing user code" in the executor's
//! documentation (`engine/executor.rs`), where every such call site is listed. A shard thread
//! that dies anyway (an engine bug) is marked failed: `Stats::failed_shards` reports it,
//! schedules routed to it fail with `ScheduleError::ShardFailed`, and shutdown returns the
//! timers it held (see `engine/worker.rs`).
//!
//! # Shutdown
//!
//! `shutdown()` closes every inbox (a flag in the same signal word), joins the shard threads
//! and has each shard apply the messages delivered before the close, then cancel and return
//! every timer still pending. A submitter whose push found the inbox closed races the shard on
//! the timer's own state word: if the submitter wins the schedule fails with
//! `ScheduleError::Shutdown`, else the timer is among those `shutdown()` returned.
