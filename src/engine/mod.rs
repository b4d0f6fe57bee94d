//! The sharded engine: one wheel per shard, reached through lock-free inboxes.
//!
//! One file per stage of a timer's life, in the order data flows:
//!
//! | file | stage |
//! |------|-------|
//! | [`timer_engine`] | the [`Engine`]: start, submit, drive by hand, shutdown, statistics |
//! | [`placement`] | which shard a thread schedules on; per-thread numbers |
//! | [`handle`] | the user's [`TimerHandle`](handle::TimerHandle): cancel, reset, state |
//! | [`lease`] | keeping an owned timer's engine alive for its sleeps, on striped counts |
//! | [`shared`] | what other threads see of a shard: slot table, inbox, `send`, pending limit |
//! | [`slot`] | the slot table: each timer's shared state word |
//! | [`stage`] | new one-shot timers on their way to the owner: a ring per submitting thread |
//! | [`message`], [`queue`], [`inbox`] | everything else getting to the owner, and waking it |
//! | [`owner`] | the shard's owner: entries, applying messages, expiry, one turn, shutdown |
//! | [`reclaim`] | giving an idle shard's memory back |
//! | [`worker`] | the owner's thread: turns and parking |
//! | [`time_slice`] | short scheduler turns and exact wake-ups for the engine's threads |
//! | [`handoff`] | expired work on its way to the executor; unfired timers |
//! | [`executor`] | where tasks run, and how user code is contained |

pub(crate) mod executor;
pub(crate) mod handle;
pub(crate) mod handoff;
pub(crate) mod inbox;
pub(crate) mod lease;
pub(crate) mod message;
pub(crate) mod owner;
pub(crate) mod placement;
pub(crate) mod queue;
pub(crate) mod reclaim;
pub(crate) mod shared;
pub(crate) mod slot;
pub(crate) mod stage;
pub(crate) mod time_slice;
pub(crate) mod timer_engine;
pub(crate) mod worker;

pub(crate) use timer_engine::{Engine, Settings};
