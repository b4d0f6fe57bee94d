//! Giving an idle shard's memory back: when, and how often to try again ([`IdleReclaim`]).
//! (A shard that holds timers, but few of its slots, compacts instead: `owner/compaction.rs`.)
//!
//! The owner gives its entry table's and the slot table's memory back once no timer has been
//! left in them for [`RECLAIM_DELAY`] (after a mass cancel, or the end of a storm): every entry
//! is vacant then, and a later schedule grows it again. The delay keeps the unmapping
//! (milliseconds for a large table) off the moment the last timers fire, when their tasks are
//! still running.
//!
//! The slot table can be reclaimed only once every slot is free, that is once every handle of
//! its timers is gone (the slot table's `try_reclaim`, whose protocol is documented with the
//! slot table). While some are held, the shard tries again after [`RECLAIM_DELAY`], twice that,
//! ... up to [`RECLAIM_RETRY_MAX`], walking the free list again only if it changed; once it has
//! not changed for a whole longest wait, the shard stops (an idle engine must not wake
//! forever), until a later turn finds it changed. Meanwhile producers keep no spare slots (see
//! `IdleReclaim::refuse_spares`), and each try first flushes those they kept.

use super::slot::{RECLAIM_ABOVE, Reclaim, SlotTable};
use crate::clock::TickClock;
use std::time::Duration;

/// How long a shard's entry table and slot table stay allocated after its last timer left;
/// also the first wait before trying the slot table again.
pub(crate) const RECLAIM_DELAY: Duration = Duration::from_millis(20);
/// The longest wait between tries to reclaim a slot table whose slots are still held.
pub(crate) const RECLAIM_RETRY_MAX: Duration = Duration::from_secs(1);

/// An entry table this small is kept. No larger than `RECLAIM_ABOVE`: `slots_seen` grows only
/// when a `Schedule` grows the entry table, so after a reclaim, a table that kept up to
/// `KEPT_ENTRIES` entries must still see every index above `RECLAIM_ABOVE`. Under loom none, so
/// that a model sees the table given back (as `KEPT_PAGES` in the slot table).
pub(crate) const KEPT_ENTRIES: usize = if cfg!(shardwheel_loom) { 0 } else { 4096 };
const _: () = assert!(KEPT_ENTRIES as u64 <= RECLAIM_ABOVE);

/// The owner's plan for giving idle memory back. See the [module documentation](self).
#[derive(Debug)]
pub(crate) struct IdleReclaim {
    /// The tick at which the entry table, empty since, is given back, or the slot table's
    /// reclaim is tried (again); `u64::MAX`: not planned.
    at: u64,
    /// One more than the highest slot index a `Schedule` grew the entry table to since the
    /// slot table was last reclaimed (so the shard knows, without reading the shared table,
    /// whether a reclaim is worth trying).
    pub(super) slots_seen: u64,
    /// Ticks to wait after the next failed try to reclaim the slot table (0: none failed yet).
    backoff: u64,
    /// The slot table's free-list head at the last failed try: while it has not changed, a
    /// new walk would fail the same way.
    failed_head: Option<u64>,
    /// Producers are told to keep no spare slots (see `refuse_spares`).
    refusing_spares: bool,
}

impl IdleReclaim {
    pub(crate) fn new() -> IdleReclaim {
        IdleReclaim {
            at: u64::MAX,
            slots_seen: 0,
            backoff: 0,
            failed_head: None,
            refusing_spares: false,
        }
    }

    /// From the plan of a slot-table try until it succeeds (or the shard holds timers again),
    /// producers free the slots they retract onto the free list, not into their spares
    /// ([`SlotTable::refuse_spares`]): a slot coming back then changes the list's head, which
    /// is what a try that failed waits for (a spare would change nothing the shard sees).
    fn refuse_spares(&mut self, slots: &SlotTable, refuse: bool) {
        if self.refusing_spares != refuse {
            self.refusing_spares = refuse;
            if refuse {
                slots.refuse_spares();
            } else {
                slots.allow_spares();
            }
        }
    }

    /// A `Schedule` grew the entry table to `len` entries.
    pub(crate) fn saw_entries(&mut self, len: u64) {
        self.slots_seen = self.slots_seen.max(len);
    }

    /// The tick of the next planned step (`u64::MAX`: none).
    pub(crate) fn at(&self) -> u64 {
        self.at
    }

    /// One turn's step at `now_tick`, for an owner holding `live` timers. `give_back_entries`
    /// is there if its entry table is larger than [`KEPT_ENTRIES`]: it is called when the
    /// entry table is to be given back. Then the slot table is tried if that is due, after
    /// `flush_spares` has moved the producers' spare slots onto its free list
    /// ([`SlotTable::flush_spares`]).
    pub(crate) fn step(
        &mut self,
        now_tick: u64,
        live: usize,
        slots: &SlotTable,
        clock: &TickClock,
        give_back_entries: Option<impl FnOnce()>,
        flush_spares: impl FnOnce(),
    ) {
        let entries_held = give_back_entries.is_some();
        if live != 0 {
            self.at = u64::MAX;
            self.backoff = 0;
            self.failed_head = None;
            self.refuse_spares(slots, false);
            return;
        }
        let slots_held = self.slots_seen > RECLAIM_ABOVE;
        self.refuse_spares(slots, slots_held);
        if !entries_held && !slots_held {
            self.at = u64::MAX;
            return;
        }
        if self.at == u64::MAX {
            if !entries_held && self.failed_head == Some(slots.free_head()) {
                // Gave up on the slot table, and nothing was freed since.
                return;
            }
            let delay = clock.ticks_in(RECLAIM_DELAY).max(1);
            self.at = now_tick.saturating_add(delay);
            return;
        }
        if now_tick < self.at {
            return;
        }
        if let Some(give_back_entries) = give_back_entries {
            give_back_entries();
        }
        self.at = u64::MAX;
        if !slots_held {
            return;
        }
        flush_spares();
        // How long the walk took, when there was one (it is O(slots), a cache miss a slot).
        let mut walk_nanos = 0;
        let outcome = match self.failed_head {
            Some(head) if head == slots.free_head() => Reclaim::Busy { head },
            _ => {
                let started = clock.now_nanos();
                let outcome = slots.try_reclaim();
                walk_nanos = clock.now_nanos().saturating_sub(started);
                outcome
            }
        };
        match outcome {
            Reclaim::Reclaimed | Reclaim::Nothing => {
                self.slots_seen = 0;
                self.backoff = 0;
                self.failed_head = None;
                self.refuse_spares(slots, false);
            }
            Reclaim::Busy { head } => {
                let unchanged = self.failed_head == Some(head);
                self.failed_head = Some(head);
                let longest = clock.ticks_in(RECLAIM_RETRY_MAX).max(1);
                if unchanged && self.backoff >= longest {
                    return; // Give up until a later turn finds the list changed.
                }
                let first = clock.ticks_in(RECLAIM_DELAY).max(1);
                // At least 20 times the walk's own time: an application that keeps many
                // handles and drops them slowly costs the idle shard at most 5% of a core.
                let walk_bound =
                    clock.ticks_in(Duration::from_nanos(walk_nanos.saturating_mul(20)));
                self.backoff = (self.backoff * 2).clamp(first, longest).max(walk_bound);
                self.at = now_tick.saturating_add(self.backoff);
            }
        }
    }
}
