//! The sharded engine: one wheel per shard, reached through lock-free inboxes.
//!
//! One file per stage of a timer's life: [`slot`] (the shared state word), [`message`] and
//! [`inbox`] (getting to the owner), [`shard`] (the owner's wheel and tasks), [`worker`]
//! (the owner's thread), [`executor`] (running expired tasks), [`handle`] (the user's side).

pub(crate) mod executor;
pub(crate) mod handle;
pub(crate) mod inbox;
pub(crate) mod message;
pub(crate) mod shard;
pub(crate) mod slot;
pub(crate) mod worker;

mod timer_engine;
pub(crate) use timer_engine::{Drive, Engine};
