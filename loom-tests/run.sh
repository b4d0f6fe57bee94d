#!/usr/bin/env bash
# Runs the loom models of loom-tests/ with fixed bounds.
#
# Each model explores every interleaving of its threads with at most LOOM_MAX_PREEMPTIONS
# preemptions. Measured on the 2-core CI machine (release build, bound 2), see the times
# printed at the end of each run; the whole run must stay well under 15 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}"
# Models that drive the engine through its message queue take more than loom's default 1,000
# branches per execution (each push is several atomic steps): not a spin, just length.
export LOOM_MAX_BRANCHES="${LOOM_MAX_BRANCHES:-5000}"
export RUSTFLAGS="--cfg shardwheel_loom ${RUSTFLAGS:-}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/loom}"
# Keep the engine's debug_assert! invariants on in the optimized loom build.
export CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true
cargo test --release -p loom-tests --test models -- --test-threads=1 "$@"
