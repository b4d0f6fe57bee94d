//! The geometry and list surgery of the hierarchical wheel, independent of where entries live.
//!
//! [`RawWheel`] owns the list heads (the near ring, the far levels, the overflow list and the
//! list being cascaded), their occupancy bitmaps and the two cursors. The entries themselves live
//! in a caller-owned store that implements [`LinkStore`]: the standalone [`Wheel`](super::Wheel)
//! keeps them in a slab, the engine's shard keeps them beside each timer's task. Each entry
//! carries only its [`Links`] (8 bytes); the store also answers each entry's deadline, which may
//! have moved later since the entry was placed (the engine's lazy resets): the wheel re-reads
//! it whenever it touches the entry, and never hands out an entry before it.

/// Bits of the tick consumed by one level.
const SLOT_BITS: u32 = 6;
/// Slots in each level (one bit each in the level's occupancy bitmap).
pub const SLOTS_PER_LEVEL: usize = 1 << SLOT_BITS;
/// Levels of a wheel built with defaults: 6 levels of 64 slots cover 2^36 ticks
/// (over 2 years at 1 ms) before the overflow list is used.
pub const DEFAULT_LEVELS: usize = 6;
/// The most levels a wheel may have: 11 levels cover all 2^64 ticks, so nothing overflows.
pub const MAX_LEVELS: usize = 11;

/// Ticks in one window: the span of level 0, and of one level-1 slot.
const WINDOW: u64 = SLOTS_PER_LEVEL as u64;
/// Slots of the near ring, one tick each: two windows, the current one and the next.
const NEAR_SLOTS: usize = 2 * SLOTS_PER_LEVEL;

/// Ids of the linked lists: far level `L`, slot `s` is `FAR_LISTS + L * SLOTS_PER_LEVEL + s`
/// (level 0 of the far levels is never used: the near ring takes its place); then the overflow
/// list and the list being cascaded.
const FAR_LISTS: usize = 0;
const OVERFLOW_LIST: usize = FAR_LISTS + MAX_LEVELS * SLOTS_PER_LEVEL;
const CASCADING_LIST: usize = OVERFLOW_LIST + 1;
const LIST_COUNT: usize = CASCADING_LIST + 1;

/// End of a list (no next entry).
const NONE: u32 = u32::MAX;
/// `prev` of an entry that is in no list.
const UNLINKED: u32 = u32::MAX - 1;
/// `next` of an entry that is in no list but carries a deferred deadline.
const DEFERRED: u32 = u32::MAX - 1;
/// `prev` of a list's first entry is `FIRST_OF + list id`: removal finds the head to update
/// without working out where the entry is.
const FIRST_OF: u32 = UNLINKED - 1024;
const _: () = assert!(LIST_COUNT <= 1024, "list ids must fit below UNLINKED");
/// `next` of an entry in near slot `s` is `IN_RING + s`; its `prev` is then its position in
/// the slot's array.
const IN_RING: u32 = FIRST_OF;
/// Indices above this are reserved for list markers.
pub(crate) const MAX_INDEX: u32 = FIRST_OF - 1;

/// Entries an `advance_to` moves ahead of time when a whole window is left before they are
/// needed; the budget grows as that time runs out (see [`RawWheel::cascade_ahead`]).
const CASCADE_BUDGET: u64 = 512;
/// How many entries ahead of use expiry asks the store to prefetch.
const PREFETCH_AHEAD: usize = 8;

/// The wheel's bookkeeping inside each stored entry: where it is linked.
///
/// | state            | `prev`                      | `next`                        |
/// |------------------|-----------------------------|-------------------------------|
/// | in no list       | `UNLINKED`                  | `NONE`, or `DEFERRED`         |
/// | near ring slot s | position in the slot array  | `IN_RING + s`                 |
/// | first of list l  | `FIRST_OF + l`              | next entry or `NONE`          |
/// | inside a list    | previous entry              | next entry or `NONE`          |
#[derive(Clone, Copy, Debug)]
pub(crate) struct Links {
    prev: u32,
    next: u32,
}

impl Links {
    /// Links of an entry that is in no list.
    pub(crate) const UNLINKED: Links = Links {
        prev: UNLINKED,
        next: NONE,
    };

    /// Whether the entry is stored in the wheel.
    pub(crate) fn is_linked(&self) -> bool {
        self.prev != UNLINKED
    }

    /// Marks the entry as in no list.
    fn mark_unlinked(&mut self) {
        self.prev = UNLINKED;
        self.next = NONE;
    }

    /// Marks an entry that is out of the wheel as owing a move: its owner recorded a new
    /// deadline to use when it comes back (a reset of a repeating timer out running).
    pub(crate) fn set_deferred(&mut self) {
        debug_assert!(!self.is_linked(), "deferring a linked entry");
        self.next = DEFERRED;
    }

    /// Takes the mark of [`set_deferred`](Self::set_deferred): whether it was set.
    pub(crate) fn take_deferred(&mut self) -> bool {
        if self.is_linked() || self.next != DEFERRED {
            return false;
        }
        self.next = NONE;
        true
    }

    /// The next entry of a free list threaded through `next` (slabs reuse it while vacant).
    pub(crate) fn free_next(&self) -> u32 {
        self.next
    }

    /// Links of a vacant slab entry whose free-list successor is `next`.
    pub(crate) fn vacant(next: u32) -> Links {
        Links {
            prev: UNLINKED,
            next,
        }
    }

    /// The end-of-list marker for free lists.
    pub(crate) const END: u32 = NONE;
}

/// Where the caller keeps entries: the wheel reads and writes their [`Links`] by index.
pub(crate) trait LinkStore {
    /// A hint that entry `index` is about to be handed to `on_expired`: the store may prefetch
    /// what the callback touches.
    #[inline]
    fn prefetch(&self, index: u32) {
        let _ = index;
    }
    /// The links of entry `index`.
    fn links(&self, index: u32) -> &Links;
    /// The links of entry `index`, mutably.
    fn links_mut(&mut self, index: u32) -> &mut Links;
    /// The deadline tick of entry `index` now: never earlier than where the wheel placed it,
    /// unless the owner moves the entry (removes and inserts it) afterwards.
    fn deadline(&self, index: u32) -> u64;
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

/// The first tick of the window holding `tick`.
fn window_start(tick: u64) -> u64 {
    tick & !(WINDOW - 1)
}

/// The hierarchical timing wheel over indices into a [`LinkStore`]. See [`Wheel`](super::Wheel)
/// for how it works.
///
/// Two cursors: `elapsed` (every deadline before it has been handed out) and `far_elapsed` (a
/// window start, at most one window ahead of `elapsed`'s): the far levels are placed relative to
/// `far_elapsed`, and every entry of a window up to `far_elapsed`'s is in the near ring, except,
/// while a cascade is under way, entries of `far_elapsed`'s own window still in the cascading
/// list.
#[derive(Clone)]
pub(crate) struct RawWheel {
    /// The fire cursor: every tick before it has been processed.
    elapsed: u64,
    /// The far cursor: a window start, `elapsed`'s or the next one.
    far_elapsed: u64,
    /// Far levels in use (`1..=MAX_LEVELS`; level 0 is the near ring).
    levels: usize,
    heads: Box<[u32; LIST_COUNT]>,
    /// The near ring: slot `t % NEAR_SLOTS` holds the indices of the entries placed at tick `t`
    /// (due then, or later if their deadline moved in place),
    /// as an array (each entry's `prev` is its position), so that expiry reads indices in order
    /// and can fetch the entries ahead of use instead of chasing one link at a time.
    near: Box<[Vec<u32>]>,
    /// Bit `s`: near slot `s` is non-empty.
    near_occupied: u128,
    /// Bit `s` of word `L`: far level `L`, slot `s` is non-empty (word 0 unused).
    far_occupied: [u64; MAX_LEVELS],
    /// A lower bound of the overflow list's deadlines (`u64::MAX` once it was emptied by a
    /// cascade).
    overflow_min: u64,
    len: usize,
}

impl RawWheel {
    /// A wheel with `levels` levels (1..=MAX_LEVELS, checked by the caller) at tick 0.
    pub(crate) fn new(levels: usize) -> RawWheel {
        debug_assert!(
            (1..=MAX_LEVELS).contains(&levels),
            "bad level count {levels}"
        );
        RawWheel {
            elapsed: 0,
            far_elapsed: 0,
            levels,
            heads: Box::new([NONE; LIST_COUNT]),
            near: (0..NEAR_SLOTS).map(|_| Vec::new()).collect(),
            near_occupied: 0,
            far_occupied: [0; MAX_LEVELS],
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

    /// Pushes `index` on the front of list `list`.
    fn push_front<S: LinkStore>(&mut self, store: &mut S, list: usize, index: u32) {
        let head = self.heads[list];
        *store.links_mut(index) = Links {
            prev: FIRST_OF + list as u32,
            next: head,
        };
        if head != NONE {
            store.links_mut(head).prev = index;
        }
        self.heads[list] = index;
    }

    /// Takes list `list` whole, clearing its occupancy; returns its first entry.
    fn take_list(&mut self, list: usize) -> u32 {
        self.clear_occupied(list);
        std::mem::replace(&mut self.heads[list], NONE)
    }

    /// Marks list `list` empty in its bitmap (the overflow list keeps its lower bound).
    fn clear_occupied(&mut self, list: usize) {
        if list < OVERFLOW_LIST {
            let far = list - FAR_LISTS;
            self.far_occupied[far / SLOTS_PER_LEVEL] &= !(1u64 << (far % SLOTS_PER_LEVEL));
        } else if list == OVERFLOW_LIST {
            self.overflow_min = u64::MAX;
        }
    }

    /// Links `index` (unlinked, `deadline` at or after `elapsed`) into the list its deadline
    /// belongs to now. Does not count it.
    fn link<S: LinkStore>(&mut self, store: &mut S, index: u32, deadline: u64) {
        debug_assert!(
            deadline >= self.elapsed,
            "linking entry {index} at {deadline}, before the tick {}",
            self.elapsed
        );
        let list = if deadline >> SLOT_BITS <= self.far_elapsed >> SLOT_BITS {
            debug_assert!(
                (deadline >> SLOT_BITS) - (self.elapsed >> SLOT_BITS) <= 1,
                "near ring overrun: deadline {deadline} at tick {}",
                self.elapsed
            );
            let slot = (deadline % NEAR_SLOTS as u64) as usize;
            self.near_occupied |= 1u128 << slot;
            let near = &mut self.near[slot];
            *store.links_mut(index) = Links {
                prev: near.len() as u32,
                next: IN_RING + slot as u32,
            };
            near.push(index);
            return;
        } else {
            let level = level_for(self.far_elapsed, deadline);
            debug_assert!(
                level >= 1,
                "far entry {index} at {deadline} in far_elapsed's window {}",
                self.far_elapsed
            );
            if level >= self.levels {
                self.overflow_min = self.overflow_min.min(deadline);
                OVERFLOW_LIST
            } else {
                let slot =
                    (deadline >> (level as u32 * SLOT_BITS)) as usize & (SLOTS_PER_LEVEL - 1);
                self.far_occupied[level] |= 1u64 << slot;
                FAR_LISTS + level * SLOTS_PER_LEVEL + slot
            }
        };
        self.push_front(store, list, index);
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
        self.link(store, index, deadline.max(self.elapsed));
        self.len += 1;
    }

    /// Removes entry `index` from the wheel in O(1). Returns false if it was not stored.
    pub(crate) fn remove<S: LinkStore>(&mut self, store: &mut S, index: u32) -> bool {
        let links = *store.links(index);
        if !links.is_linked() {
            return false;
        }
        if (IN_RING..IN_RING + NEAR_SLOTS as u32).contains(&links.next) {
            let slot = (links.next - IN_RING) as usize;
            let near = &mut self.near[slot];
            let position = links.prev as usize;
            debug_assert_eq!(
                near.get(position),
                Some(&index),
                "entry {index} is not at its place in near slot {slot}"
            );
            near.swap_remove(position);
            if let Some(&moved) = near.get(position) {
                store.links_mut(moved).prev = position as u32;
            } else if near.is_empty() {
                self.near_occupied &= !(1u128 << slot);
            }
            store.links_mut(index).mark_unlinked();
            self.len -= 1;
            return true;
        }
        if links.prev >= FIRST_OF {
            let list = (links.prev - FIRST_OF) as usize;
            debug_assert_eq!(
                self.heads[list], index,
                "entry {index} is not the head of its list {list}"
            );
            self.heads[list] = links.next;
            if links.next == NONE {
                self.clear_occupied(list);
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

    /// The earliest tick held by the near ring.
    fn near_next(&self) -> Option<u64> {
        if self.near_occupied == 0 {
            return None;
        }
        let position = (self.elapsed % NEAR_SLOTS as u64) as u32;
        let ahead = self.near_occupied.rotate_right(position).trailing_zeros();
        Some(self.elapsed + u64::from(ahead))
    }

    /// The far list cascaded next and the tick at which it is due: the earliest non-empty slot
    /// of the lowest non-empty far level, else the overflow list at the start of its earliest
    /// top-level block.
    fn far_next_due(&self) -> Option<(u64, usize)> {
        for level in 1..self.levels {
            let occupied = self.far_occupied[level];
            if occupied == 0 {
                continue;
            }
            let shift = level as u32 * SLOT_BITS;
            let position = (self.far_elapsed >> shift) as usize & (SLOTS_PER_LEVEL - 1);
            debug_assert_eq!(
                occupied & (u64::MAX << position),
                occupied,
                "far level {level} has slots behind its cursor {position} at tick {}",
                self.far_elapsed
            );
            let slot = occupied.trailing_zeros() as usize;
            let block_start = self.far_elapsed & !low_mask(shift + SLOT_BITS);
            let due = block_start + ((slot as u64) << shift);
            return Some((due, FAR_LISTS + level * SLOTS_PER_LEVEL + slot));
        }
        if self.heads[OVERFLOW_LIST] != NONE {
            let top_bits = self.levels as u32 * SLOT_BITS;
            let due = (self.overflow_min & !low_mask(top_bits)).max(self.far_elapsed);
            return Some((due, OVERFLOW_LIST));
        }
        None
    }

    /// The last tick whose entries are all in the near ring.
    pub(super) fn complete_through(&self) -> u64 {
        if self.heads[CASCADING_LIST] != NONE {
            self.far_elapsed - 1
        } else {
            self.far_elapsed | (WINDOW - 1)
        }
    }

    /// The tick at which the next entry expires, or at which entries must be moved down to
    /// expire on time (never later than the earliest deadline). `None` when the wheel is empty.
    pub(crate) fn next_expiration(&self) -> Option<u64> {
        let far = if self.heads[CASCADING_LIST] != NONE {
            Some(self.far_elapsed)
        } else {
            self.far_next_due().map(|(due, _)| due)
        };
        match (self.near_next(), far) {
            (Some(near), Some(far)) => Some(near.min(far)),
            (near, far) => near.or(far),
        }
    }

    /// The tick at which the owner should call [`advance_to`](Self::advance_to) next: the next
    /// expiration, or earlier, when the next cascade may start ahead of time (a window before
    /// it is due) so that it is spread over many advances.
    pub(crate) fn next_work(&self) -> Option<u64> {
        let ahead = if self.heads[CASCADING_LIST] != NONE {
            Some(self.elapsed.saturating_add(1))
        } else {
            self.far_next_due().map(|(due, _)| {
                due.saturating_sub(WINDOW)
                    .max(self.elapsed.saturating_add(1))
            })
        };
        match (self.next_expiration(), ahead) {
            (Some(next), Some(ahead)) => Some(next.min(ahead)),
            (next, ahead) => next.or(ahead),
        }
    }

    /// Moves the wheel to tick `now`, calling `on_expired(store, index, due)` for every entry
    /// whose deadline is at or before `now`, in deadline order (`due` is the tick being
    /// processed). The entry is already unlinked when the callback runs; the callback returns
    /// `None` when the entry is done with, or `Some(tick)` to have it stored again, at `tick` or
    /// the next tick, whichever is later. Returns how many entries were done with. A `now`
    /// before the current tick counts as the current tick (time never moves back; entries due at
    /// it still expire).
    ///
    /// Then moves a bounded number of entries of the next window down into the near ring, so
    /// that a crowded window's cascade is spread over the window before it.
    pub(crate) fn advance_to<S: LinkStore>(
        &mut self,
        store: &mut S,
        now: u64,
        on_expired: impl FnMut(&mut S, u32, u64) -> Option<u64>,
    ) -> usize {
        let expired = self.expire_to(store, now, on_expired);
        self.cascade_ahead(store);
        expired
    }

    /// [`advance_to`](Self::advance_to) without the work ahead of time: the caller does that
    /// later with [`cascade_ahead`](Self::cascade_ahead) (the engine, after handing the
    /// expired tasks off, so they do not wait for it).
    pub(crate) fn expire_to<S: LinkStore>(
        &mut self,
        store: &mut S,
        now: u64,
        mut on_expired: impl FnMut(&mut S, u32, u64) -> Option<u64>,
    ) -> usize {
        let now = now.max(self.elapsed);
        let mut expired = 0;
        loop {
            let through = self.complete_through();
            expired += self.fire_near(store, now.min(through), &mut on_expired);
            if now <= through {
                break;
            }
            // Entries due by `now` may still be outside the ring: cascade them now, in full.
            if self.heads[CASCADING_LIST] != NONE {
                self.cascade(store, u64::MAX);
                continue;
            }
            debug_assert_eq!(
                self.near_occupied, 0,
                "near ring not empty after firing through {through}"
            );
            match self.far_next_due() {
                Some((due, list)) if due <= now => {
                    // Every deadline before `due` has been handed out.
                    self.elapsed = due;
                    self.start_cascade(store, due, list);
                }
                _ => self.far_elapsed = window_start(now),
            }
        }
        self.elapsed = now;
        expired
    }

    /// Expires the near ring's entries due at or before `limit` (which must be no later than
    /// [`complete_through`](Self::complete_through)), in order, and moves `elapsed` to `limit`.
    fn fire_near<S: LinkStore>(
        &mut self,
        store: &mut S,
        limit: u64,
        on_expired: &mut impl FnMut(&mut S, u32, u64) -> Option<u64>,
    ) -> usize {
        let mut expired = 0;
        while let Some(due) = self.near_next() {
            if due > limit {
                break;
            }
            self.elapsed = due;
            let slot = (due % NEAR_SLOTS as u64) as usize;
            self.near_occupied &= !(1u128 << slot);
            let mut indices = std::mem::take(&mut self.near[slot]);
            let mut fired = 0;
            for (position, &index) in indices.iter().enumerate() {
                if let Some(&ahead) = indices.get(position + PREFETCH_AHEAD) {
                    store.prefetch(ahead);
                }
                debug_assert_eq!(
                    store.links(index).next,
                    IN_RING + slot as u32,
                    "entry {index} in the near slot of tick {due}"
                );
                store.links_mut(index).mark_unlinked();
                let deadline = store.deadline(index);
                let later = if deadline > due {
                    // Moved later since it was placed: place it again.
                    Some(deadline)
                } else {
                    on_expired(store, index, due)
                };
                match later {
                    None => fired += 1,
                    Some(tick) => {
                        debug_assert!(due < u64::MAX, "entry {index} sent back at the last tick");
                        self.link(store, index, tick.max(due.saturating_add(1)));
                    }
                }
            }
            self.len -= fired;
            expired += fired;
            // Keep the array's room for the slot's next tick.
            debug_assert!(
                self.near[slot].is_empty(),
                "near slot {slot} refilled while firing tick {due}"
            );
            indices.clear();
            self.near[slot] = indices;
        }
        self.elapsed = self.elapsed.max(limit);
        expired
    }

    /// Detaches far list `list`, due at `due`, as the cascading list, and moves the far cursor
    /// to `due`. Its entries are relinked by [`cascade`](Self::cascade).
    fn start_cascade<S: LinkStore>(&mut self, store: &mut S, due: u64, list: usize) {
        debug_assert_eq!(
            self.heads[CASCADING_LIST], NONE,
            "a cascade is already under way"
        );
        debug_assert_eq!(window_start(due), due, "cascade due mid-window at {due}");
        debug_assert!(
            due >= self.far_elapsed && (due >> SLOT_BITS) - (self.elapsed >> SLOT_BITS) <= 1,
            "cascade due at {due} with cursors at {} and {}",
            self.elapsed,
            self.far_elapsed
        );
        let first = self.take_list(list);
        debug_assert_ne!(first, NONE, "cascading the empty list {list}");
        store.links_mut(first).prev = FIRST_OF + CASCADING_LIST as u32;
        self.heads[CASCADING_LIST] = first;
        self.far_elapsed = due;
    }

    /// Relinks up to `budget` entries of the cascading list relative to the far cursor (into
    /// the near ring, a lower level, or the overflow list). Returns the entries moved.
    fn cascade<S: LinkStore>(&mut self, store: &mut S, budget: u64) -> u64 {
        let mut moved = 0;
        while moved < budget {
            let index = self.heads[CASCADING_LIST];
            if index == NONE {
                break;
            }
            let links = *store.links(index);
            self.heads[CASCADING_LIST] = links.next;
            if links.next != NONE {
                store.links_mut(links.next).prev = FIRST_OF + CASCADING_LIST as u32;
            }
            // At or after `far_elapsed`, unless the owner moved it earlier and will move it in
            // the wheel too: until then it waits in the ring.
            let deadline = store.deadline(index).max(self.elapsed);
            self.link(store, index, deadline);
            moved += 1;
        }
        moved
    }

    /// Work done ahead of time, after an advance: brings the far cursor to the start of the next
    /// window, cascading the lists due by then into the near ring. The number of entries moved
    /// is bounded, more so the more ticks are left before they are needed, so a crowded
    /// window is cascaded a slice per tick over the window before it instead of all at once.
    pub(crate) fn cascade_ahead<S: LinkStore>(&mut self, store: &mut S) {
        let Some(target) = window_start(self.elapsed).checked_add(WINDOW) else {
            return;
        };
        if self.far_elapsed >= target && self.heads[CASCADING_LIST] == NONE {
            return;
        }
        let ticks_left = (target - self.elapsed).clamp(1, WINDOW);
        let mut budget = CASCADE_BUDGET * WINDOW / ticks_left;
        loop {
            if self.heads[CASCADING_LIST] != NONE {
                budget = budget.saturating_sub(self.cascade(store, budget));
                if budget == 0 {
                    return;
                }
                continue;
            }
            if self.far_elapsed >= target {
                return;
            }
            match self.far_next_due() {
                Some((due, list)) if due <= target => self.start_cascade(store, due, list),
                _ => {
                    self.far_elapsed = target;
                    return;
                }
            }
        }
    }

    /// Gives back the near ring's spare room (its arrays keep their largest size otherwise,
    /// a few megabytes after a storm). Call when idle; the next entries grow them again.
    pub(crate) fn reclaim_memory(&mut self) {
        for slot in self.near.iter_mut() {
            if slot.is_empty() {
                *slot = Vec::new();
            } else {
                slot.shrink_to_fit();
            }
        }
    }

    /// Unlinks every stored entry, calling `on_removed(store, index)` for each (any order).
    pub(crate) fn drain<S: LinkStore>(
        &mut self,
        store: &mut S,
        mut on_removed: impl FnMut(&mut S, u32),
    ) {
        for slot in 0..NEAR_SLOTS {
            for index in std::mem::take(&mut self.near[slot]) {
                store.links_mut(index).mark_unlinked();
                self.len -= 1;
                on_removed(store, index);
            }
        }
        self.near_occupied = 0;
        self.far_occupied = [0; MAX_LEVELS];
        self.overflow_min = u64::MAX;
        for list in 0..LIST_COUNT {
            let mut cursor = std::mem::replace(&mut self.heads[list], NONE);
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
