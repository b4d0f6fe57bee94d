//! A slot table for the loom models (`loom-tests`), which drive the reclaim and compaction
//! protocols directly: through the public API they need thousands of timers. Compiled under `cfg(shardwheel_loom)` only; not
//! part of the API.

use super::{FireOutcome, LazyReset, Reclaim, SlotClass, SlotTable, Spares};

/// A slot table for the loom models of its reclaim protocol, with one producer's spare slots.
/// Not part of the API.
#[doc(hidden)]
#[derive(Debug)]
pub struct SlotTableHook(SlotTable, Spares);

impl Default for SlotTableHook {
    fn default() -> SlotTableHook {
        SlotTableHook(SlotTable::new(), Spares::default())
    }
}

impl SlotTableHook {
    /// [`SlotTable::begin_staged`] of a timer due at tick 1.
    pub fn begin_staged(&self, index: u32, generation: u32) {
        self.0.begin_staged(index, generation, 1);
    }
    /// [`SlotTable::retract`] by the producer of the spares.
    pub fn retract(&self, index: u32, generation: u32) -> bool {
        self.0.retract(index, generation, &self.1)
    }
    /// [`SlotTable::take_spare`] by the producer of the spares.
    pub fn take_spare(&self) -> Option<(u32, u32)> {
        self.0.take_spare(&self.1)
    }
    /// The shard's reclaim as `IdleReclaim` makes it: spares refused and flushed, the table
    /// tried whatever its size, spares allowed again if it reclaimed. True iff it did.
    pub fn reclaim_with_spares(&self) -> bool {
        self.0.refuse_spares();
        self.0.flush_spares([&self.1]);
        let reclaimed = self.0.try_reclaim_above(0) == Reclaim::Reclaimed;
        if reclaimed {
            self.0.allow_spares();
        }
        reclaimed
    }
    /// [`SlotTable::allocate`].
    pub fn allocate(&self) -> Option<(u32, u32)> {
        self.0.allocate()
    }
    /// [`SlotTable::begin`] of a one-shot timer due at tick 1.
    pub fn begin(&self, index: u32, generation: u32) {
        self.0.begin(index, generation, 1, false);
    }
    /// [`SlotTable::cancel`].
    pub fn cancel(&self, index: u32, generation: u32) -> bool {
        self.0.cancel(index, generation)
    }
    /// [`SlotTable::is_pending`].
    pub fn is_pending(&self, index: u32, generation: u32) -> bool {
        self.0.is_pending(index, generation)
    }
    /// [`SlotTable::let_go`].
    pub fn let_go(&self, index: u32) {
        self.0.let_go(index);
    }
    /// [`SlotTable::drop_handle`].
    pub fn drop_handle(&self, index: u32) {
        self.0.drop_handle(index);
    }
    /// A whole compaction as the shard makes it (`SlotTable::survey` to `move_slot`), with no
    /// turns between its pieces, whatever the table's size: the moves made, `(old, new)`, or
    /// `None` if it gave up.
    pub fn compact(&self) -> Option<Vec<(u32, u32)>> {
        let table = &self.0;
        let mut survey = table.survey(0)?;
        while !table.walk_survey(&mut survey, u32::MAX) {}
        let mut moved = Vec::new();
        for index in 0..survey.below() {
            match table.classify(&mut survey, index) {
                SlotClass::Movable => moved.push(index),
                SlotClass::Staged => {
                    table.abandon(survey);
                    return None;
                }
                SlotClass::Free | SlotClass::Suspect => {}
            }
        }
        let (base, survey) = table.retire(survey, &moved)?;
        let mut moves = Vec::new();
        for (rank, &old) in moved.iter().enumerate() {
            let new = base + rank as u32;
            if table.move_slot(old, new, survey.is_marked(old)) {
                moves.push((old, new));
            }
        }
        table.forget_retired(0, survey.below());
        Some(moves)
    }
    /// [`SlotTable::current`]: where the shard finds the timer of slot `index` now.
    pub fn current(&self, index: u32) -> u32 {
        self.0.current(index)
    }
    /// [`SlotTable::reset_lazy`] of a one-shot timer: true iff done.
    pub fn reset_lazy(&self, index: u32, generation: u32, deadline: u64) -> bool {
        matches!(
            self.0.reset_lazy(index, generation, deadline),
            LazyReset::Done { .. }
        )
    }
    /// [`SlotTable::fire`] of the one-shot timer the shard holds in slot `index` at tick
    /// `due`: `Ok(())` if it fired, `Err(tick)` if its deadline is later, `Err(0)` if cancelled.
    pub fn fire(&self, index: u32, due: u64) -> Result<(), u64> {
        match self.0.fire(index, due, false) {
            FireOutcome::Fire { free } => {
                if free {
                    self.0.free_fired(index);
                }
                Ok(())
            }
            FireOutcome::Later(tick) => Err(tick),
            _ => Err(0),
        }
    }
    /// [`SlotTable::try_reclaim`] whatever the table's size; true iff it reclaimed.
    pub fn try_reclaim(&self) -> bool {
        self.0.try_reclaim_above(0) == Reclaim::Reclaimed
    }
}
