//! Design notes (documentation only).
//!
//! # A timer's life
//!
//! 1. **Schedule** (any thread). The calling thread's home shard is chosen (round-robin by
//!    thread, or the shard itself for its own thread). A slot is popped from the shard's
//!    lock-free free list (a tagged Treiber stack threaded through the free slots' state
//!    words) or taken fresh; its state word becomes PENDING with one handle and the SHARD bit.
//!    The task (24 bytes, closures up to 16 bytes stored inline) travels to the shard in a
//!    `Schedule` message through the shard's inbox, a `crossbeam_queue::SegQueue`.
//! 2. **Stored** (owner). The shard pops the message, writes the task into its private entry
//!    (same index as the slot) and links the entry into its wheel.
//! 3. **Cancel** (any thread). A compare-and-swap PENDING -> CANCELLED decides, on the
//!    spot, that the task will never run; a `Cancel` message then tells the shard to unlink the
//!    entry and drop the task at its next turn.
//! 4. **Reset** (any thread). A compare-and-swap that keeps the timer PENDING but counts a
//!    reset in flight; a `Reset` message carries the new deadline. While a reset is in flight
//!    the shard does not fire the timer: when its old deadline comes, the entry is set aside
//!    until the message arrives. So a reset that returned true always moves the deadline.
//! 5. **Fire** (owner). At the deadline, a compare-and-swap PENDING (no reset in flight) ->
//!    FIRED; the task goes into the turn's batch, handed to the executor after the turn.
//! 6. **Free.** When the timer is FIRED or CANCELLED, the shard has let go of it and no handle
//!    is left, whoever made that last change pushes the slot back on the free list with the
//!    next generation.
//!
//! # Memory per timer
//!
//! Shared state word: 8 bytes. Private entry: wheel links 16 bytes + task 24 bytes. In all
//! 48 bytes per pending timer, task included, when the closure fits in 16 bytes; the
//! handle (16 bytes) is the caller's.
//!
//! # Why nothing is read after it is freed
//!
//! Slot pages are allocated once and freed only when the table is dropped, which happens when
//! the engine and every handle are gone (handles hold an `Arc` to their shard). A slot is
//! reused only after its generation changes, and a slot with live handles is never reused,
//! so every access through a handle reads the right timer's word. The inbox queue reclaims
//! its own blocks (crossbeam). Hence no epoch-based reclamation is needed.
//!
//! # Waking a sleeping shard
//!
//! See the inbox's signal word: a single atomic word carries the "parked" flags and the count
//! of messages pushed since the shard's last drain. A submitter pushes, then adds to the count;
//! the shard parks only with a compare-and-swap that expects a zero count. Either the park
//! fails, or the submitter's add sees the parked flag and wakes the shard if its message is due
//! before the shard's wake-up (or the shard sleeps long). No wake-up is lost.
//!
//! # Shutdown
//!
//! `shutdown()` closes every inbox (a flag in the same signal word), joins the shard threads
//! and has each shard apply the messages delivered before the close, then cancel and return
//! every timer still pending. A submitter whose push found the inbox closed races the shard on
//! the timer's own state word: if the submitter wins the schedule fails with
//! `ScheduleError::Shutdown`, else the timer is among those `shutdown()` returned.
