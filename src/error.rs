//! Typed errors of the engine.

use std::fmt;

/// Why [`Builder::build`](crate::Builder::build) refused a configuration.
#[derive(Debug)]
#[non_exhaustive]
pub enum BuildError {
    /// `shards(0)`: at least one shard is needed.
    NoShards,
    /// `shards(n)` above [`Builder::MAX_SHARDS`](crate::Builder::MAX_SHARDS).
    TooManyShards {
        /// The shard count asked for.
        shards: usize,
    },
    /// `tick(Duration::ZERO)`: the tick must be positive.
    ZeroTick,
    /// `levels(n)` outside `1..=MAX_LEVELS`.
    InvalidLevels {
        /// The level count asked for.
        levels: usize,
    },
    /// A shard thread could not be started.
    Spawn(std::io::Error),
    /// The default rayon pool could not be built. No longer returned: the pool starts with the
    /// first closure task, and failing that is [`ScheduleError::ExecutorUnavailable`].
    #[deprecated(note = "never returned: see ScheduleError::ExecutorUnavailable")]
    ThreadPool(String),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::NoShards => write!(f, "a timer needs at least one shard"),
            BuildError::TooManyShards { shards } => write!(
                f,
                "a timer has at most {} shards, not {shards}",
                crate::Builder::MAX_SHARDS
            ),
            BuildError::ZeroTick => write!(f, "the tick must be longer than zero"),
            BuildError::InvalidLevels { levels } => write!(
                f,
                "a wheel needs 1 to {} levels, not {levels}",
                crate::wheel::MAX_LEVELS
            ),
            BuildError::Spawn(error) => write!(f, "could not start a shard thread: {error}"),
            #[allow(deprecated)]
            BuildError::ThreadPool(error) => {
                write!(f, "could not build the executor pool: {error}")
            }
        }
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BuildError::Spawn(error) => Some(error),
            _ => None,
        }
    }
}

/// Why [`set_default_timer`](crate::set_default_timer) did not build the default timer.
#[derive(Debug)]
#[non_exhaustive]
pub enum DefaultTimerError {
    /// The default timer was already built (by an earlier `set_default_timer`, or at its first
    /// use): it is left as it is.
    AlreadyBuilt,
    /// The builder's configuration was refused.
    Build(BuildError),
}

impl fmt::Display for DefaultTimerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DefaultTimerError::AlreadyBuilt => {
                write!(
                    f,
                    "the default timer is already built: configure it before its first use"
                )
            }
            DefaultTimerError::Build(error) => {
                write!(f, "could not build the default timer: {error}")
            }
        }
    }
}

impl std::error::Error for DefaultTimerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DefaultTimerError::Build(error) => Some(error),
            DefaultTimerError::AlreadyBuilt => None,
        }
    }
}

/// Why a timer was not scheduled. Its task never runs and no counter moved (except
/// [`Stats::panicked`](crate::Stats::panicked), if dropping the task panicked). The task is
/// dropped before `schedule` returns, except when the schedule lost a race with `shutdown()` or
/// with the failure of its shard: then it is dropped by the time `shutdown()` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The engine is shut down.
    Shutdown,
    /// `max_pending` timers are pending (or a shard's 2^32 - 2 slots are all in use).
    Full,
    /// A repeating timer or interval with a zero period.
    ZeroPeriod,
    /// The shard this schedule was routed to has failed: its thread died (an engine bug; see
    /// [`ShardStats::failed`](crate::ShardStats::failed)).
    ShardFailed,
    /// The engine's executor pool could not be started (no threads to be had). The next
    /// closure schedule tries again.
    ExecutorUnavailable,
}

impl fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScheduleError::Shutdown => write!(f, "the timer engine is shut down"),
            ScheduleError::Full => {
                write!(f, "the timer engine holds its maximum of pending timers")
            }
            ScheduleError::ZeroPeriod => {
                write!(f, "a repeating timer needs a period longer than zero")
            }
            ScheduleError::ShardFailed => {
                write!(f, "the timer engine's shard for this schedule has failed")
            }
            ScheduleError::ExecutorUnavailable => {
                write!(f, "the executor pool could not be started")
            }
        }
    }
}

impl std::error::Error for ScheduleError {}
