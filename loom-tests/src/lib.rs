//! Loom models of shardwheel (see tests/), and the helper that runs them.

/// Runs `test` as a loom model: every interleaving of its threads within the bounds loom reads
/// from the environment (`LOOM_MAX_PREEMPTIONS`, set by `loom-tests/run.sh`). The same call as
/// the crate's internal `sync::model` under `--cfg shardwheel_loom`, so the crate's `sync` shim stays
/// private.
#[cfg(shardwheel_loom)]
pub fn model<F>(test: F)
where
    F: Fn() + Sync + Send + 'static,
{
    loom::model(test);
}
