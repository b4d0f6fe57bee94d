//! A slot table for the loom models (`loom-tests`), which drive the reclaim protocol directly:
//! through the public API it needs thousands of timers. Compiled under `cfg(shardwheel_loom)` only; not
//! part of the API.

use super::{Reclaim, SlotTable, Spares};

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
    /// [`SlotTable::try_reclaim`] whatever the table's size; true iff it reclaimed.
    pub fn try_reclaim(&self) -> bool {
        self.0.try_reclaim_above(0) == Reclaim::Reclaimed
    }
}
