//! A single-threaded hierarchical timing wheel: the heart of each shard.
//!
//! [`Wheel`] is a supported standalone API, under the same semver promise as [`Timer`](crate::Timer):
//! use it directly where one thread owns its timers and passes time in as ticks (an event loop,
//! a simulation). The engine's shards run the same raw wheel with their own storage; the property
//! tests (`tests/wheel_model.rs`, `tests/wheel_big.rs`) and `benches/wheel.rs` exercise this
//! public API.
//!
//! # How it works
//!
//! This is the hierarchical timing wheel of Varghese & Lauck ("Hashed and Hierarchical Timing
//! Wheels", SOSP 1987), in the form the Linux kernel and tokio use: levels of 64 slots, each
//! level 64 times coarser than the one below, and a 64-bit occupancy bitmap per level.
//!
//! Time is measured in **ticks** since the wheel's start; the wheel never reads a clock. The
//! caller converts instants to ticks, rounding deadlines **up**, and calls
//! [`advance_to`](Wheel::advance_to) with the current tick.
//!
//! | level | slot width (ticks) | level span (ticks) | span at 1 ms/tick |
//! |------:|-------------------:|-------------------:|------------------:|
//! | 0 (near ring) | 1          | 128 (two windows)  | 128 ms            |
//! | 1     | 64                 | 4 096              | 4.1 s             |
//! | 2     | 4 096              | 262 144            | 4.4 min           |
//! | 3     | 262 144            | 16 777 216         | 4.7 h             |
//! | 4     | 16 777 216         | 2^30               | 12.4 days         |
//! | 5     | 2^30               | 2^36               | 2.2 years         |
//! | overflow | —               | beyond             | re-examined when time reaches its block |
//!
//! An entry is stored at the level of the highest 6-bit group in which its deadline differs
//! from the current tick, in the slot named by its deadline's bits at that level. So every
//! entry of level `L` shares the current tick's bits above level `L`: there are no "remaining
//! rounds" counters.
//!
//! Level 0 is a **near ring** of 128 one-tick slots: two 64-tick windows, the current one and
//! the next. The levels above are placed relative to a second cursor, `far_elapsed`, which runs
//! up to one window ahead of the current tick: while the current window runs, each advance moves
//! a bounded slice of the next window's entries down into the ring ("cascade ahead"), so that a
//! crowded window is cascaded a slice at a time over the 64 ticks before it instead of all at
//! once when it comes due (with a million timers due within a second, a window holds 64,000
//! of them). When time jumps, whatever is due is cascaded in full first: ahead-of-time work is
//! only ever early, never missing.
//!
//! * **Insert** is O(1): compute the level and slot (or the ring slot), push onto that slot's
//!   list (or array), set the slot's occupancy bit.
//! * **Remove** is O(1) by key: the first entry of a list records the list's id in its `prev`
//!   link, and a ring entry records its slot and its position in the slot's array, so no slot is
//!   searched and no deadline is needed to find the entry.
//! * **Next expiration** is O(levels): the first set bit of the ring, or of the lowest
//!   non-empty level. Every entry of a lower level is due before any entry of a higher one.
//! * **Advance** fires the ring's slots in order and cascades what is due; levels are
//!   re-inserted relative to the far cursor and so move down until they reach the ring, where
//!   they expire at exactly their own tick. Empty stretches of time are skipped via the
//!   bitmaps, so an advance costs O(levels + entries expired or moved), never O(ticks elapsed).
//! * **Overflow**: with fewer than 11 levels, deadlines beyond the top level go to an overflow
//!   list that is re-examined when time reaches the start of the top-level block holding its
//!   earliest deadline. `u64::MAX` is a valid deadline.
//! * **Deadlines that move later in place.** The wheel reads an entry's deadline from its owner
//!   whenever it touches the entry. If the deadline moved later since the entry was placed (the
//!   engine's lazy resets), the entry is simply placed again; it is never handed out early.
//!
//! Expired entries are handed out in deadline order. Entries with the same deadline tick
//! (ties) come out together in an unspecified order.
//!
//! # Memory
//!
//! Each entry costs its links (previous and next `u32`: 8 bytes) plus, in
//! this standalone wheel, its deadline (`u64`), a `u32` generation and the `Option` around the
//! value: 24 bytes of bookkeeping when `T` has a niche (a `Box`, a reference, a `NonZero`), and
//! at most 32 bytes for any `T` of alignment 8 or less. The lists and the ring take a fixed
//! 4 KiB or so per wheel, plus the ring's arrays (one `u32` per entry due in the next 128
//! ticks). The engine's shards keep the 8 bytes of links beside each timer's task and the
//! deadline in the shared slot table.
//!
//! # Who may touch what
//!
//! A wheel is plain data owned by one thread (`&mut self` everywhere): no locks, no atomics.

pub(crate) mod raw;

pub use self::raw::{DEFAULT_LEVELS, MAX_LEVELS, SLOTS_PER_LEVEL};
use self::raw::{LinkStore, Links, MAX_INDEX, RawWheel};

use std::fmt;

/// Identifies one entry of a [`Wheel`]: a slab index plus a generation, so a key whose entry
/// expired or was removed never matches a later entry stored in the same place.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntryKey {
    index: u32,
    generation: u32,
}

/// Errors from building or filling a [`Wheel`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WheelError {
    /// The level count is outside `1..=MAX_LEVELS`.
    InvalidLevels {
        /// The level count asked for.
        levels: usize,
    },
    /// The wheel holds the most entries it can index (2^32 - 2).
    Full,
}

impl fmt::Display for WheelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WheelError::InvalidLevels { levels } => {
                write!(f, "a wheel needs 1 to {MAX_LEVELS} levels, not {levels}")
            }
            WheelError::Full => write!(f, "the wheel holds the most entries it can index"),
        }
    }
}

impl std::error::Error for WheelError {}

struct SlabEntry<T> {
    links: Links,
    deadline: u64,
    generation: u32,
    value: Option<T>,
}

/// The standalone wheel's entry storage: a slab with a free list threaded through the links.
struct Slab<T> {
    entries: Vec<SlabEntry<T>>,
    free_head: u32,
}

impl<T> LinkStore for Slab<T> {
    fn links(&self, index: u32) -> &Links {
        &self.entries[index as usize].links
    }
    fn links_mut(&mut self, index: u32) -> &mut Links {
        &mut self.entries[index as usize].links
    }
    fn deadline(&self, index: u32) -> u64 {
        self.entries[index as usize].deadline
    }
}

impl<T> Slab<T> {
    /// Takes the value out of an entry the wheel has already unlinked, and frees the entry.
    fn release(&mut self, index: u32) -> (EntryKey, T) {
        let entry = &mut self.entries[index as usize];
        let key = EntryKey {
            index,
            generation: entry.generation,
        };
        let value = entry.value.take().expect("a linked entry holds a value");
        entry.generation = entry.generation.wrapping_add(1);
        entry.links = Links::vacant(self.free_head);
        self.free_head = index;
        (key, value)
    }
}

/// A hierarchical timing wheel storing values of type `T` under tick deadlines.
///
/// See the [module documentation](self) for how it works.
///
/// ```
/// use shardwheel::wheel::Wheel;
/// # fn main() -> Result<(), shardwheel::wheel::WheelError> {
/// let mut wheel = Wheel::new();
/// let early = wheel.insert(5, "five")?;
/// wheel.insert(70, "seventy")?;
/// assert_eq!(wheel.next_expiration(), Some(5));
/// let mut fired = Vec::new();
/// wheel.advance_to(100, |_key, value| fired.push(value));
/// assert_eq!(fired, ["five", "seventy"]);
/// assert_eq!(wheel.remove(early), None); // already expired
/// # Ok(())
/// # }
/// ```
pub struct Wheel<T> {
    raw: RawWheel,
    slab: Slab<T>,
}

impl<T> Default for Wheel<T> {
    fn default() -> Self {
        Wheel::new()
    }
}

impl<T> fmt::Debug for Wheel<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wheel")
            .field("elapsed", &self.raw.elapsed())
            .field("len", &self.raw.len())
            .field("next_expiration", &self.raw.next_expiration())
            .finish()
    }
}

impl<T> Wheel<T> {
    /// An empty wheel with [`DEFAULT_LEVELS`] levels, at tick 0.
    pub fn new() -> Wheel<T> {
        Wheel {
            raw: RawWheel::new(DEFAULT_LEVELS),
            slab: Slab {
                entries: Vec::new(),
                free_head: Links::END,
            },
        }
    }

    /// An empty wheel with `levels` levels of 64 slots (1 to [`MAX_LEVELS`]), at tick 0.
    /// Deadlines more than 64^levels ticks ahead wait in the overflow list.
    pub fn with_levels(levels: usize) -> Result<Wheel<T>, WheelError> {
        if !(1..=MAX_LEVELS).contains(&levels) {
            return Err(WheelError::InvalidLevels { levels });
        }
        Ok(Wheel {
            raw: RawWheel::new(levels),
            slab: Slab {
                entries: Vec::new(),
                free_head: Links::END,
            },
        })
    }

    /// The current tick: every deadline before it has been handed out.
    pub fn elapsed(&self) -> u64 {
        self.raw.elapsed()
    }

    /// How many entries are stored.
    pub fn len(&self) -> usize {
        self.raw.len()
    }

    /// Whether no entry is stored.
    pub fn is_empty(&self) -> bool {
        self.raw.len() == 0
    }

    /// Stores `value` to expire at tick `deadline`, in O(1). A deadline at or before the
    /// current tick expires at the next [`advance_to`](Self::advance_to).
    pub fn insert(&mut self, deadline: u64, value: T) -> Result<EntryKey, WheelError> {
        let index = if self.slab.free_head != Links::END {
            let index = self.slab.free_head;
            self.slab.free_head = self.slab.entries[index as usize].links.free_next();
            self.slab.entries[index as usize].value = Some(value);
            index
        } else {
            let index = self.slab.entries.len();
            if index > MAX_INDEX as usize {
                return Err(WheelError::Full);
            }
            self.slab.entries.push(SlabEntry {
                links: Links::UNLINKED,
                deadline: 0,
                generation: 0,
                value: Some(value),
            });
            index as u32
        };
        let deadline = deadline.max(self.raw.elapsed());
        self.slab.entries[index as usize].deadline = deadline;
        self.raw.insert(&mut self.slab, index, deadline);
        Ok(EntryKey {
            index,
            generation: self.slab.entries[index as usize].generation,
        })
    }

    fn live(&self, key: EntryKey) -> bool {
        self.slab
            .entries
            .get(key.index as usize)
            .is_some_and(|entry| entry.generation == key.generation && entry.value.is_some())
    }

    /// Removes the entry in O(1) and returns its value; `None` if it already expired or was
    /// removed (a stale key never touches a newer entry).
    pub fn remove(&mut self, key: EntryKey) -> Option<T> {
        if !self.live(key) {
            return None;
        }
        let removed = self.raw.remove(&mut self.slab, key.index);
        debug_assert!(removed, "live entry {key:?} was not linked");
        Some(self.slab.release(key.index).1)
    }

    /// The deadline tick of a stored entry (clamped to the tick at which it was inserted).
    pub fn deadline(&self, key: EntryKey) -> Option<u64> {
        self.live(key)
            .then(|| self.slab.entries[key.index as usize].deadline)
    }

    /// The tick at which the wheel next has work (an entry expires, or moves down a level): the
    /// owner may sleep until then. `None` when empty. O(levels).
    pub fn next_expiration(&self) -> Option<u64> {
        self.raw.next_expiration()
    }

    /// Moves the wheel to tick `now`, handing every entry with a deadline at or before `now` to
    /// `on_expired`, in deadline order (ties in unspecified order). Returns how many expired.
    /// Costs O(levels + entries expired or moved down), whatever the jump. A `now` before the
    /// current tick does not move time back.
    pub fn advance_to(&mut self, now: u64, mut on_expired: impl FnMut(EntryKey, T)) -> usize {
        self.raw
            .advance_to(&mut self.slab, now, |slab, index, _due| {
                let (key, value) = slab.release(index);
                on_expired(key, value);
                None
            })
    }

    /// Removes every entry, handing each to `on_removed` (any order).
    pub fn drain(&mut self, mut on_removed: impl FnMut(EntryKey, T)) {
        self.raw.drain(&mut self.slab, |slab, index| {
            let (key, value) = slab.release(index);
            on_removed(key, value);
        });
    }
}

#[cfg(test)]
mod tests;
