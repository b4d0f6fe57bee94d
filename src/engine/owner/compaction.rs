//! The owner's side of a [compaction](crate::engine::slot) (`slot::compact` holds the
//! protocol and why it is safe): when the shard holds few timers in many slots, it moves them
//! to fresh slots, with their entries, and gives the memory of the old ones back.
//!
//! The work is O(slots handed out), so it is done a piece at a time, one piece per turn
//! (turns follow each other at once meanwhile), and expiry goes on between pieces:
//!
//! | phase | each piece | ends with |
//! |-------|------------|-----------|
//! | `Waiting` | nothing: sparse for [`SPARSE_FOR`] first, without losing half its timers meanwhile (a storm's tail fires by itself, and the idle reclaim follows) | the survey's step 1 (the list taken) |
//! | `Surveying` | walks [`PIECE`] slots of the taken list (step 2), then classifies as many slots (step 3) | step 4, `retire`; or giving up |
//! | `Moving` | moves [`MOVES`] timers (step 5): slot, entry, place in the wheel | the retired slots' entries let go of |
//! | `Forgetting` | gives back the memory of [`PIECE`] retired slots (step 6) | done |
//!
//! A survey gives up when it finds a staged slot, or an allocation was under way; the shard
//! tries again after [`RECLAIM_DELAY`], twice that, ... up to [`RECLAIM_RETRY_MAX`] (waking up
//! for it [`WAKES`] times at most). From step 4 the entry table has two segments
//! ([`Entries`](super::entries::Entries)): the retired slots' entries below, the rest and the
//! moved timers' new ones on top. Messages and fires find a timer at its old slot before its
//! move and at its new one after ([`ShardOwner::current`]). One compaction at a time: the next
//! waits until the slot table is reclaimed whole (when the shard is idle and every handle
//! gone), which ends the retirement.

use super::{ShardOwner, Store};
use crate::clock::TickClock;
use crate::engine::reclaim::{RECLAIM_DELAY, RECLAIM_RETRY_MAX};
use crate::engine::slot::{COMPACT_ABOVE, SlotClass, SlotTable, Survey};
use std::time::Duration;

/// A shard compacts when it holds at most one in this many of the slots handed out.
const SPARSE: u64 = 8;
/// How long the shard must have been sparse before it compacts.
const SPARSE_FOR: Duration = Duration::from_millis(100);
/// Slots a piece of the survey walks (and classifies), or of the forgetting gives back.
const PIECE: u32 = 1 << 15;
/// Timers a piece of the moves moves.
const MOVES: usize = 1 << 11;
/// Failed surveys in a row after which the shard stops waking up to try again (it still tries
/// at turns it makes anyway).
const WAKES: u32 = 8;

/// Where a shard's compaction stands. See the [module documentation](self).
#[derive(Debug, Default)]
pub(super) struct Compaction {
    phase: Phase,
    /// The bound of the retirement in force (0: none).
    retired_below: u32,
    /// Ticks to wait after the next failed survey (0: none failed yet).
    backoff: u64,
    /// Failed surveys in a row.
    failures: u32,
}

#[derive(Debug, Default)]
enum Phase {
    /// Not sparse.
    #[default]
    Idle,
    /// Sparse: waiting until tick `at` (after a failed survey, `live` is 0).
    Waiting {
        at: u64,
        /// The timers held when the wait began.
        live: usize,
    },
    Surveying {
        survey: Survey,
        walked: bool,
        classified: u32,
        moved: Vec<u32>,
    },
    Moving {
        survey: Survey,
        moved: Vec<u32>,
        base: u32,
        done: usize,
    },
    Forgetting {
        from: u32,
    },
}

impl Compaction {
    /// The bound of the retirement in force (0: none): messages naming a slot below it may
    /// name a moved timer.
    pub(super) fn retired_below(&self) -> u32 {
        self.retired_below
    }

    /// Whether a survey is under way or a retirement in force.
    #[inline]
    pub(super) fn is_on(&self) -> bool {
        self.retired_below != 0 || matches!(self.phase, Phase::Surveying { .. })
    }

    /// Whether a survey, the moves or the giving back are under way (the idle reclaim waits).
    pub(super) fn is_under_way(&self) -> bool {
        !matches!(self.phase, Phase::Idle | Phase::Waiting { .. })
    }

    /// The tick to wake up at for the compaction's next piece (0: at once), `u64::MAX` if none.
    pub(super) fn at(&self) -> u64 {
        match self.phase {
            Phase::Idle => u64::MAX,
            Phase::Waiting { .. } if self.failures > WAKES => u64::MAX,
            Phase::Waiting { at, .. } => at,
            _ => 0,
        }
    }

    /// A survey failed at `now_tick`: wait before the next.
    fn failed(&mut self, now_tick: u64, clock: &TickClock) {
        let max = clock.ticks_in(RECLAIM_RETRY_MAX).max(1);
        self.backoff = if self.backoff == 0 {
            clock.ticks_in(RECLAIM_DELAY).max(1)
        } else {
            self.backoff.saturating_mul(2).min(max)
        };
        self.failures = self.failures.saturating_add(1);
        self.phase = Phase::Waiting {
            at: now_tick.saturating_add(self.backoff),
            live: 0,
        };
    }
}

impl ShardOwner {
    /// Does the next piece of a compaction, starting one when the shard has been sparse long
    /// enough (see the [module documentation](self)). Runs no user code. True while one is
    /// under way (the shard should turn again at once).
    pub(crate) fn compact_if_sparse(&mut self, now_tick: u64) -> bool {
        let shared = self.shared.clone();
        let slots = &shared.slots;
        let phase = std::mem::take(&mut self.compaction.phase);
        // A wait of SPARSE_FOR from now, counting the timers held at its start.
        let live_now = self.live;
        let fresh_wait = || Phase::Waiting {
            at: now_tick.saturating_add(shared.clock.ticks_in(SPARSE_FOR).max(1)),
            live: live_now,
        };
        self.compaction.phase = match phase {
            Phase::Idle | Phase::Waiting { .. } if !self.is_sparse() => {
                self.compaction.backoff = 0;
                self.compaction.failures = 0;
                Phase::Idle
            }
            Phase::Idle => fresh_wait(),
            Phase::Waiting { at, live } if now_tick < at => Phase::Waiting { at, live },
            // Still losing timers fast: wait again (they may all go, and the table with them).
            Phase::Waiting { live, .. } if self.live < live / 2 => fresh_wait(),
            Phase::Waiting { .. } => {
                // Spare slots are FREE off the list: listed before the survey takes it, and
                // none kept until it ends.
                slots.refuse_spares();
                self.stages.flush_spares(&shared.stages, slots);
                match slots.survey(COMPACT_ABOVE) {
                    Some(survey) => Phase::Surveying {
                        survey,
                        walked: false,
                        classified: 0,
                        moved: Vec::with_capacity(self.live),
                    },
                    None => {
                        slots.allow_spares();
                        self.compaction.failed(now_tick, &shared.clock);
                        return false;
                    }
                }
            }
            Phase::Surveying {
                mut survey,
                walked: false,
                classified,
                moved,
            } => {
                let walked = slots.walk_survey(&mut survey, PIECE);
                Phase::Surveying {
                    survey,
                    walked,
                    classified,
                    moved,
                }
            }
            Phase::Surveying {
                mut survey,
                walked: true,
                mut classified,
                mut moved,
            } => {
                let end = survey.below().min(classified.saturating_add(PIECE));
                let staged = (classified..end).any(|index| {
                    match slots.classify(&mut survey, index) {
                        SlotClass::Movable => moved.push(index),
                        SlotClass::Staged => return true,
                        SlotClass::Free | SlotClass::Suspect => {}
                    }
                    false
                });
                classified = end;
                if staged {
                    slots.abandon(survey);
                    slots.allow_spares();
                    self.compaction.failed(now_tick, &shared.clock);
                    return false;
                }
                if classified < survey.below() {
                    Phase::Surveying {
                        survey,
                        walked: true,
                        classified,
                        moved,
                    }
                } else {
                    let retired = slots.retire(survey, &moved);
                    slots.allow_spares();
                    let Some((base, survey)) = retired else {
                        self.compaction.failed(now_tick, &shared.clock);
                        return false;
                    };
                    self.compaction.retired_below = survey.below();
                    self.compaction.backoff = 0;
                    self.compaction.failures = 0;
                    self.entries.split_at(survey.below());
                    // Room for the moved timers, touched only as they arrive.
                    self.entries.reserve(moved.len());
                    Phase::Moving {
                        survey,
                        moved,
                        base,
                        done: 0,
                    }
                }
            }
            Phase::Moving {
                survey,
                moved,
                base,
                done,
            } => {
                let end = moved.len().min(done + MOVES);
                for (rank, &index) in moved.iter().enumerate().take(end).skip(done) {
                    let stashed = survey.is_marked(index);
                    self.move_entry(slots, index, base + rank as u32, stashed);
                }
                if end < moved.len() {
                    Phase::Moving {
                        survey,
                        moved,
                        base,
                        done: end,
                    }
                } else {
                    let_go_of(self.entries.take_below());
                    Phase::Forgetting { from: 0 }
                }
            }
            Phase::Forgetting { from } => {
                let from = slots.forget_retired(from, PIECE);
                if from < self.compaction.retired_below {
                    Phase::Forgetting { from }
                } else {
                    Phase::Idle
                }
            }
        };
        !matches!(self.compaction.phase, Phase::Idle | Phase::Waiting { .. })
    }

    /// Whether the shard holds few timers in many slots (and no retirement is in force: one
    /// at a time, until the slot table is next reclaimed).
    fn is_sparse(&self) -> bool {
        let end = self.entries.end();
        self.compaction.retired_below == 0
            && self.live > 0
            && end > COMPACT_ABOVE
            && self.live as u64 * SPARSE <= end
    }

    /// Moves timer `index` to slot `new` (step 5): its slot, its entry if the shard holds it,
    /// and its place in the wheel. `stashed`: see [`SlotTable::move_slot`].
    fn move_entry(&mut self, slots: &SlotTable, index: u32, new: u32, stashed: bool) {
        let moved = slots.move_slot(index, new, stashed);
        self.entries.grow_to_hold(new);
        if !moved || !self.entries.holds(index) {
            // Freed before its move (its entry vacant), or ended with handles: no entry.
            return;
        }
        let mut store = Store::new(&mut self.entries, slots);
        let linked = self.wheel.remove(&mut store, index);
        let task = self.entries.task(index).take();
        let deferred = self.entries.links_mut(index).take_deferred();
        *self.entries.task(new) = task;
        if deferred {
            self.entries.links_mut(new).set_deferred();
        }
        if linked {
            let deadline = slots.deadline(new);
            let mut store = Store::new(&mut self.entries, slots);
            self.wheel.insert(&mut store, new, deadline);
        }
    }
}

/// Lets go of what a compaction no longer needs (the retired slots' entries, all vacant) on a
/// thread of its own: giving back that much memory takes milliseconds the shard's timers
/// should not wait for.
fn let_go_of<T: Send + 'static>(memory: T) {
    #[cfg(not(shardwheel_loom))]
    {
        // Without a thread (the process at its limit), the closure, and the memory with it, is
        // let go of here.
        let _ = std::thread::Builder::new()
            .name("shardwheel-compaction".into())
            .spawn(move || drop(memory));
    }
    #[cfg(shardwheel_loom)]
    drop(memory);
}
