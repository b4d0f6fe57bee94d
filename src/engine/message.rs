//! The messages other threads send a shard's owner through its inbox (`inbox.rs`).

use crate::task::Task;

/// One request to the shard that owns slot `index`.
#[derive(Debug)]
pub(crate) enum Message {
    /// Store the timer in slot `index` (already PENDING in the slot table) at `deadline`. A
    /// handle may have moved the slot's deadline since: later is found when the entry comes
    /// due, earlier comes with a `Relocate` message, queued after this one (the handle exists
    /// only once this message is pushed).
    Schedule {
        /// Slot of the new timer.
        index: u32,
        /// Deadline tick at scheduling (so the shard need not read the slot's line).
        deadline: u64,
        /// What to run.
        task: Task,
    },
    /// The timer in slot `index` was cancelled: drop its task and links now, if the shard
    /// still holds them (a repeating timer cancelled during a run is ended by its `Rearm`,
    /// which may come first: see "Who counts a timer's end" in `engine/slot/mod.rs`).
    Cancel {
        /// Slot of the cancelled timer.
        index: u32,
        /// Generation of the timer: the shard may have let go of the slot already.
        generation: u32,
    },
    /// A one-shot timer's deadline moved earlier in its slot: move its entry in the wheel.
    Relocate {
        /// Slot of the timer.
        index: u32,
        /// Generation of the timer: the slot may have been reused since.
        generation: u32,
        /// The deadline tick the reset set (the slot's may have moved again since): only
        /// for deciding whether the message must wake the shard.
        deadline: u64,
    },
    /// Move the repeating timer in slot `index` to `deadline` (one reset counted in its state
    /// word).
    Reset {
        /// Slot of the timer.
        index: u32,
        /// Generation of the timer: the slot may have been reused if the timer was cancelled.
        generation: u32,
        /// New deadline tick.
        deadline: u64,
    },
    /// A repeating timer's run is over: re-arm it at `deadline` with `task`, or end it
    /// (`task: None`, it stopped or panicked).
    Rearm {
        /// Slot of the timer (RUNNING: the shard still holds it, so the slot cannot be reused
        /// before this message is applied; checked against the slot's word when applied).
        index: u32,
        /// Deadline tick of the next run.
        deadline: u64,
        /// The task, back from its run.
        task: Option<Task>,
    },
}

impl Message {
    /// The tick by which the shard must have applied this message (`u64::MAX`: no hurry),
    /// which decides whether it must wake a parked shard (see `inbox.rs`).
    pub(crate) fn deadline_tick(&self) -> u64 {
        match self {
            Message::Schedule { deadline, .. }
            | Message::Relocate { deadline, .. }
            | Message::Reset { deadline, .. }
            | Message::Rearm { deadline, .. } => *deadline,
            Message::Cancel { .. } => u64::MAX,
        }
    }
}
