//! shardwheel: a timer engine for servers that keep millions of timeouts in flight.
//!
//! The building block is [`wheel::Wheel`], a single-threaded hierarchical timing wheel with
//! O(1) insert and removal and O(levels) next-expiration.
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod wheel;
