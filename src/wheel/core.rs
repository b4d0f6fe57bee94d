//! The geometry and list surgery of the hierarchical wheel, independent of where entries live.
//!
//! [`WheelCore`] owns the levels (slot heads and occupancy bitmaps), the overflow list and the
//! current tick. The entries themselves live in a caller-owned store that implements
//! [`LinkStore`]: the standalone [`Wheel`](super::Wheel) keeps them in a slab, the engine's shard
//! keeps them beside each timer's task. Each entry carries only its [`Links`]: 16 bytes.

/// Bits of the tick consumed by one level.
const SLOT_BITS: u32 = 6;
/// Slots in each level (one bit each in the level's occupancy bitmap).
pub const SLOTS_PER_LEVEL: usize = 1 << SLOT_BITS;
/// Levels of a wheel built with defaults: 6 levels of 64 slots cover 2^36 ticks
/// (over 2 years at 1 ms) before the overflow list is used.
pub const DEFAULT_LEVELS: usize = 6;
/// The most levels a wheel may have: 11 levels cover all 2^64 ticks, so nothing overflows.
pub const MAX_LEVELS: usize = 11;
/// Indices at or above this are reserved for list markers.
pub(crate) const MAX_INDEX: u32 = u32::MAX - 2;

/// End of a list (no previous or no next entry).
const NONE: u32 = u32::MAX;
/// `prev` of an entry that is in no list.
const UNLINKED: u32 = u32::MAX - 1;
/// `next` of an entry that is in no list but carries a deferred deadline.
const DEFERRED: u32 = u32::MAX - 1;

/// The wheel's bookkeeping inside each stored entry.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Links {
    /// Deadline tick, already clamped to be no earlier than the wheel's tick at insertion.
    deadline: u64,
    prev: u32,
    next: u32,
}

impl Links {
    /// Links of an entry that is in no list.
    pub(crate) const UNLINKED: Links = Links {
        deadline: 0,
        prev: UNLINKED,
        next: NONE,
    };

    /// Whether the entry is stored in the wheel.
    pub(crate) fn is_linked(&self) -> bool {
        self.prev != UNLINKED
    }

    /// Marks the entry as in no list, keeping its last deadline for the owner to read.
    fn mark_unlinked(&mut self) {
        self.prev = UNLINKED;
        self.next = NONE;
    }

    /// Records, in an entry that is out of the wheel, a deadline to use when it comes back.
    pub(crate) fn set_deferred_deadline(&mut self, deadline: u64) {
        debug_assert!(
            !self.is_linked(),
            "deferring the deadline of a linked entry"
        );
        self.deadline = deadline;
        self.next = DEFERRED;
    }

    /// Takes the deadline recorded by [`set_deferred_deadline`](Self::set_deferred_deadline).
    pub(crate) fn take_deferred_deadline(&mut self) -> Option<u64> {
        if self.is_linked() || self.next != DEFERRED {
            return None;
        }
        self.next = NONE;
        Some(self.deadline)
    }

    /// The deadline tick the entry was last stored with (kept after it leaves the wheel).
    pub(crate) fn deadline(&self) -> u64 {
        self.deadline
    }

    /// The next entry of a free list threaded through `next` (slabs reuse it while vacant).
    pub(crate) fn free_next(&self) -> u32 {
        self.next
    }

    /// Links of a vacant slab entry whose free-list successor is `next`.
    pub(crate) fn vacant(next: u32) -> Links {
        Links {
            deadline: 0,
            prev: UNLINKED,
            next,
        }
    }

    /// The end-of-list marker for free lists.
    pub(crate) const END: u32 = NONE;
}

/// Where the caller keeps entries: the wheel reads and writes their [`Links`] by index.
pub(crate) trait LinkStore {
    /// The links of entry `index`.
    fn links(&self, index: u32) -> &Links;
    /// The links of entry `index`, mutably.
    fn links_mut(&mut self, index: u32) -> &mut Links;
}

/// One level: 64 list heads and a bitmap of the non-empty ones.
#[derive(Clone)]
struct Level {
    occupied: u64,
    heads: [u32; SLOTS_PER_LEVEL],
}

/// Which list an entry with a given deadline belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Location {
    Slot { level: usize, slot: usize },
    Overflow,
}

/// Mask of the low `bits` bits (all bits when `bits >= 64`).
fn low_mask(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

/// The level holding `deadline` when the wheel is at `elapsed`: the level of the highest bit in
/// which they differ (level 0 when they agree above the lowest six bits).
fn level_for(elapsed: u64, deadline: u64) -> usize {
    let masked = (elapsed ^ deadline) | low_mask(SLOT_BITS);
    let significant = 63 - masked.leading_zeros();
    (significant / SLOT_BITS) as usize
}

/// The hierarchical timing wheel over indices into a [`LinkStore`]. See [`Wheel`](super::Wheel)
/// for how it works.
#[derive(Clone)]
pub(crate) struct WheelCore {
    /// Every tick before this one has been processed.
    elapsed: u64,
    levels: Box<[Level]>,
    overflow_head: u32,
    /// A lower bound of the overflow list's deadlines (`u64::MAX` when it is empty).
    overflow_min: u64,
    len: usize,
}

impl WheelCore {
    /// A wheel with `levels` levels (1..=MAX_LEVELS, checked by the caller) at tick 0.
    pub(crate) fn new(levels: usize) -> WheelCore {
        debug_assert!(
            (1..=MAX_LEVELS).contains(&levels),
            "bad level count {levels}"
        );
        WheelCore {
            elapsed: 0,
            levels: vec![
                Level {
                    occupied: 0,
                    heads: [NONE; SLOTS_PER_LEVEL]
                };
                levels
            ]
            .into(),
            overflow_head: NONE,
            overflow_min: u64::MAX,
            len: 0,
        }
    }

    /// The current tick: every deadline before it has been handed out.
    pub(crate) fn elapsed(&self) -> u64 {
        self.elapsed
    }

    /// Entries stored.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn location_for(&self, deadline: u64) -> Location {
        let level = level_for(self.elapsed, deadline);
        if level >= self.levels.len() {
            Location::Overflow
        } else {
            let slot = (deadline >> (level as u32 * SLOT_BITS)) as usize & (SLOTS_PER_LEVEL - 1);
            Location::Slot { level, slot }
        }
    }

    fn head_mut(&mut self, location: Location) -> &mut u32 {
        match location {
            Location::Slot { level, slot } => &mut self.levels[level].heads[slot],
            Location::Overflow => &mut self.overflow_head,
        }
    }

    /// Stores entry `index` (which must be unlinked) to expire at `deadline`. A deadline before
    /// the current tick is stored at the current tick: it expires at the next advance.
    pub(crate) fn insert<S: LinkStore>(&mut self, store: &mut S, index: u32, deadline: u64) {
        debug_assert!(
            index <= MAX_INDEX,
            "index {index} collides with list markers"
        );
        debug_assert!(
            !store.links(index).is_linked(),
            "entry {index} inserted while already in the wheel"
        );
        let deadline = deadline.max(self.elapsed);
        let location = self.location_for(deadline);
        let head = *self.head_mut(location);
        *store.links_mut(index) = Links {
            deadline,
            prev: NONE,
            next: head,
        };
        if head != NONE {
            store.links_mut(head).prev = index;
        }
        *self.head_mut(location) = index;
        match location {
            Location::Slot { level, slot } => self.levels[level].occupied |= 1 << slot,
            Location::Overflow => self.overflow_min = self.overflow_min.min(deadline),
        }
        self.len += 1;
    }

    /// Removes entry `index` from the wheel in O(1). Returns false if it was not stored.
    pub(crate) fn remove<S: LinkStore>(&mut self, store: &mut S, index: u32) -> bool {
        let links = *store.links(index);
        if !links.is_linked() {
            return false;
        }
        // The entry's list follows from its deadline and the current tick: an entry never
        // changes level without being re-inserted (see `process`).
        let location = self.location_for(links.deadline);
        if links.prev == NONE {
            debug_assert_eq!(
                *self.head_mut(location),
                index,
                "entry {index} is not its list's head"
            );
            *self.head_mut(location) = links.next;
            if links.next == NONE {
                if let Location::Slot { level, slot } = location {
                    self.levels[level].occupied &= !(1 << slot);
                }
            }
        } else {
            store.links_mut(links.prev).next = links.next;
        }
        if links.next != NONE {
            store.links_mut(links.next).prev = links.prev;
        }
        store.links_mut(index).mark_unlinked();
        self.len -= 1;
        true
    }

    /// The list processed next and the tick at which it comes due: the earliest non-empty slot
    /// of the lowest non-empty level, else the overflow list at the start of its earliest
    /// top-level block.
    fn next_due(&self) -> Option<(u64, Location)> {
        for (level, state) in self.levels.iter().enumerate() {
            if state.occupied == 0 {
                continue;
            }
            let shift = level as u32 * SLOT_BITS;
            let position = (self.elapsed >> shift) as usize & (SLOTS_PER_LEVEL - 1);
            let ahead = state.occupied & (u64::MAX << position);
            debug_assert_eq!(
                ahead, state.occupied,
                "level {level} has slots behind its cursor {position} at tick {}",
                self.elapsed
            );
            let slot = ahead.trailing_zeros() as usize;
            let block_start = self.elapsed & !low_mask(shift + SLOT_BITS);
            let due = block_start + ((slot as u64) << shift);
            return Some((due, Location::Slot { level, slot }));
        }
        if self.overflow_head != NONE {
            let top_bits = self.levels.len() as u32 * SLOT_BITS;
            let due = (self.overflow_min & !low_mask(top_bits)).max(self.elapsed);
            return Some((due, Location::Overflow));
        }
        None
    }

    /// The tick at which the next entry expires or must be moved down a level: the caller may
    /// sleep until then. `None` when the wheel is empty.
    pub(crate) fn next_expiration(&self) -> Option<u64> {
        self.next_due().map(|(due, _)| due)
    }

    /// Moves the wheel to tick `now`, calling `on_expired(store, index)` for every entry whose
    /// deadline is at or before `now`, in deadline order. The entry is already unlinked when the
    /// callback runs. Returns how many entries expired. A `now` before the current tick counts
    /// as the current tick (time never moves back; entries due at it still expire).
    pub(crate) fn advance_to<S: LinkStore>(
        &mut self,
        store: &mut S,
        now: u64,
        mut on_expired: impl FnMut(&mut S, u32),
    ) -> usize {
        let now = now.max(self.elapsed);
        let mut expired = 0;
        while let Some((due, location)) = self.next_due() {
            if due > now {
                break;
            }
            expired += self.process(store, due, location, &mut on_expired);
        }
        self.elapsed = self.elapsed.max(now);
        expired
    }

    /// Takes the list at `location`, due at tick `due`: level-0 entries expire, the others are
    /// re-inserted relative to the new tick (they move to a lower level, or stay in overflow).
    fn process<S: LinkStore>(
        &mut self,
        store: &mut S,
        due: u64,
        location: Location,
        on_expired: &mut impl FnMut(&mut S, u32),
    ) -> usize {
        debug_assert!(
            due >= self.elapsed,
            "time went backwards: {due} < {}",
            self.elapsed
        );
        self.elapsed = due;
        let mut cursor = std::mem::replace(self.head_mut(location), NONE);
        match location {
            Location::Slot { level, slot } => self.levels[level].occupied &= !(1 << slot),
            Location::Overflow => self.overflow_min = u64::MAX,
        }
        let mut expired = 0;
        while cursor != NONE {
            let links = *store.links(cursor);
            store.links_mut(cursor).mark_unlinked();
            self.len -= 1;
            if links.deadline <= due {
                debug_assert_eq!(
                    links.deadline, due,
                    "entry {cursor} expired late inside the wheel"
                );
                expired += 1;
                on_expired(store, cursor);
            } else {
                debug_assert!(
                    !matches!(location, Location::Slot { level: 0, .. }),
                    "level-0 entry {cursor} with deadline {} in slot due at {due}",
                    links.deadline
                );
                self.insert(store, cursor, links.deadline);
            }
            cursor = links.next;
        }
        expired
    }

    /// Unlinks every stored entry, calling `on_removed(store, index)` for each (any order).
    pub(crate) fn drain<S: LinkStore>(
        &mut self,
        store: &mut S,
        mut on_removed: impl FnMut(&mut S, u32),
    ) {
        let mut heads: Vec<u32> = Vec::new();
        for level in self.levels.iter_mut() {
            let mut occupied = std::mem::take(&mut level.occupied);
            while occupied != 0 {
                let slot = occupied.trailing_zeros() as usize;
                occupied &= occupied - 1;
                heads.push(std::mem::replace(&mut level.heads[slot], NONE));
            }
        }
        heads.push(std::mem::replace(&mut self.overflow_head, NONE));
        self.overflow_min = u64::MAX;
        for mut cursor in heads {
            while cursor != NONE {
                let next = store.links(cursor).next;
                store.links_mut(cursor).mark_unlinked();
                self.len -= 1;
                on_removed(store, cursor);
                cursor = next;
            }
        }
        debug_assert_eq!(self.len, 0, "drain left entries behind");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn level_boundaries() {
        assert_eq!(level_for(0, 0), 0);
        assert_eq!(level_for(0, 63), 0);
        assert_eq!(level_for(0, 64), 1);
        assert_eq!(level_for(0, 4095), 1);
        assert_eq!(level_for(0, 4096), 2);
        assert_eq!(level_for(0, u64::MAX), 10);
        assert_eq!(level_for(64, 127), 0);
        assert_eq!(level_for(63, 64), 1);
    }
}
