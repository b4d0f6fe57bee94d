//! Loom models of shardwheel (see tests/).
