//! The state word's bit layout and accessors. What each state means, and which transition
//! moves a slot between them, is in [the slot table's documentation](super).
//!
//! ```text
//!  63          34 33      24     23    22        6     5         4          3       2       1  0
//! +--------------+----------+--------+------------+---------+-----------+---------+-------+---------+
//! |  generation  | handles  | STAGED |  resets    | RUNNING | REPEATING | DL_LOCK | SHARD | lifecyc |
//! +--------------+----------+--------+------------+---------+-----------+---------+-------+---------+
//! |  generation  |  next free slot + 1 (0 = none)                          | FREE=0          |
//! +--------------+---------------------------------------------------------+-----------------+
//! ```
//!
//! * `lifecycle`: FREE, PENDING, FIRED (handed to run), CANCELLED.
//! * `SHARD`: the owning shard still holds the slot's private entry (task or links).
//! * `DL_LOCK` (`DEADLINE_LOCK`): one-shot timers: the shard is reading the deadline to decide
//!   whether to fire (only the shard takes it).
//! * `REPEATING`: the timer is repeating (its resets go through the shard).
//! * `RUNNING`: a repeating timer's task is out running; the shard re-arms it afterwards.
//! * `resets`: repeating timers only: resets that succeeded but whose message the shard has
//!   not applied yet.
//! * `STAGED`: the timer waits in a [stage](crate::engine::stage) for its shard to adopt it; the
//!   shard holds no entry for it yet (`SHARD` stands for the stage's cell, which holds its task).
//! * `handles`: live [`TimerHandle`](crate::TimerHandle)s; sticky once it reaches its maximum
//!   (1023), so a timer with that many handle clones keeps its slot forever instead of wrapping.
//! * A FREE word holds the next slot of the [free list](super::free_list) instead.

pub(super) const LIFECYCLE_MASK: u64 = 0b11;
pub(super) const FREE: u64 = 0;
pub(super) const PENDING: u64 = 1;
pub(super) const FIRED: u64 = 2;
pub(super) const CANCELLED: u64 = 3;
pub(super) const SHARD: u64 = 1 << 2;
pub(super) const DEADLINE_LOCK: u64 = 1 << 3;
pub(super) const REPEATING: u64 = 1 << 4;
pub(super) const RUNNING: u64 = 1 << 5;
const RESET_SHIFT: u32 = 6;
pub(super) const RESET_ONE: u64 = 1 << RESET_SHIFT;
pub(super) const RESET_MASK: u64 = ((1 << 17) - 1) << RESET_SHIFT;
pub(super) const STAGED: u64 = 1 << 23;
const HANDLE_SHIFT: u32 = 24;
pub(super) const HANDLE_ONE: u64 = 1 << HANDLE_SHIFT;
pub(super) const HANDLE_MASK: u64 = ((1 << 10) - 1) << HANDLE_SHIFT;
pub(super) const NEXT_FREE_SHIFT: u32 = 2;
pub(super) const NEXT_FREE_MASK: u64 = (u32::MAX as u64) << NEXT_FREE_SHIFT;
pub(super) const GENERATION_SHIFT: u32 = 34;
/// Generations wrap at 2^30.
pub(super) const GENERATION_MASK: u32 = (1 << 30) - 1;

pub(super) fn generation_of(word: u64) -> u32 {
    (word >> GENERATION_SHIFT) as u32
}

pub(super) fn lifecycle_of(word: u64) -> u64 {
    word & LIFECYCLE_MASK
}

pub(super) fn handles_of(word: u64) -> u64 {
    (word & HANDLE_MASK) >> HANDLE_SHIFT
}

pub(super) fn resets_of(word: u64) -> u64 {
    (word & RESET_MASK) >> RESET_SHIFT
}

/// Whether nothing refers to an occupied slot any more, so it can be freed.
pub(super) fn is_unreferenced(word: u64) -> bool {
    let lifecycle = lifecycle_of(word);
    (lifecycle == FIRED || lifecycle == CANCELLED) && word & (SHARD | HANDLE_MASK) == 0
}

/// Whether `word` is still the STAGED timer of generation `generation` (not retracted, the
/// slot not reused since).
pub(super) fn is_staged_for(word: u64, generation: u32) -> bool {
    generation_of(word) == generation && word & STAGED != 0
}
