//! A slot table for the loom models (`loom-tests`), which drive the reclaim protocol directly:
//! through the public API it needs thousands of timers. Compiled under `cfg(shardwheel_loom)` only; not
//! part of the API.

use super::{Reclaim, SlotTable};

/// A slot table for the loom models of its reclaim protocol. Not part of the API.
#[doc(hidden)]
#[derive(Debug)]
pub struct SlotTableHook(SlotTable);

impl Default for SlotTableHook {
    fn default() -> SlotTableHook {
        SlotTableHook(SlotTable::new())
    }
}

impl SlotTableHook {
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
