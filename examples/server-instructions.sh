#!/usr/bin/env bash
# The example server (examples/server.rs) under valgrind's callgrind: user-space instructions per
# request for each timer backend. Unlike time, the count hardly moves from run to run, whatever
# else the machine is doing, so it settles comparisons that server-bench.sh's noise cannot.
#
#   bash examples/server-instructions.sh          # R=2 rounds of S=10 s of load: about 5 min
#
# Each run starts the server under callgrind (one tokio worker), loads it with wrk (one thread,
# C=32 keep-alive connections) for S seconds, and divides the instructions the whole process ran
# (every thread: tokio's, the shard's) by the requests it served. Start-up and shutdown add about
# 5 instructions per request at these counts. Kernel work (system calls, context switches) is
# not counted: the wake-ups a timer causes show in server-bench.sh, not here.
#
# Backends (see examples/server.rs): none (no timer), hyper-only (hyper's header-read timeout on
# a timer that never fires: what hyper itself adds once it has any timer), tokio, shardwheel.
# "above none" is a backend's count minus none's: its timer share. "above hyper-only" leaves out
# hyper's own part of it: the timer's own work.
#
# Environment: R (rounds, 2), S (seconds of load per run, 10), C (connections, 32), PORT (18090),
# TIMERS ("none hyper-only tokio shardwheel"). Needs valgrind and wrk (each installed with
# apt-get if missing). Every process runs under `timeout`.
set -euo pipefail
cd "$(dirname "$0")/.."

R=${R:-2}
S=${S:-10}
C=${C:-32}
PORT=${PORT:-18090}
TIMERS=${TIMERS:-none hyper-only tokio shardwheel}

. examples/need-tool.sh
need_tool valgrind
need_tool wrk

timeout 1800 cargo build --release --quiet --features hyper --example server
server=target/release/examples/server
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One run of backend $1: prints "requests instructions".
run_one() {
  local timer=$1
  # Valgrind starts slowly: the server waits 4 s for wrk, and outlives it by 2 s.
  timeout -k 5 $((S + 120)) valgrind --tool=callgrind --callgrind-out-file="$work/out" \
    "$server" --timer "$timer" --workers 1 --addr "127.0.0.1:$PORT" --seconds $((S + 6)) \
    >"$work/server.json" 2>"$work/valgrind.err" &
  local pid=$!
  sleep 4
  timeout -k 5 $((S + 30)) wrk -t1 -c"$C" -d"${S}s" "http://127.0.0.1:$PORT/" >/dev/null
  wait "$pid"
  local requests instructions
  requests=$(grep -o '"requests":[0-9]*' "$work/server.json" | cut -d: -f2)
  instructions=$(awk '/^summary:/ {print $2}' "$work/out")
  echo "$requests $instructions"
}

printf '%-11s %-5s %10s %14s %14s\n' timer round requests instructions per_request
for round in $(seq 1 "$R"); do
  for timer in $TIMERS; do
    read -r requests instructions < <(run_one "$timer")
    per=$(awk -v i="$instructions" -v r="$requests" 'BEGIN {printf "%.0f", i / r}')
    printf '%-11s %-5s %10s %14s %14s\n' "$timer" "$round" "$requests" "$instructions" "$per"
    echo "$timer $per" >>"$work/results"
  done
done

echo
echo "instructions per request: min / median / max over $R rounds"
median() { sort -n | awk '{v[NR] = $1} END {printf "%d / %d / %d", v[1], v[int((NR + 1) / 2)], v[NR]}'; }
per_of() { awk -v t="$1" '$1 == t {print $2}' "$work/results"; }
middle() { per_of "$1" | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
for timer in $TIMERS; do
  line="$(per_of "$timer" | median)"
  floors="none hyper-only"
  [ "$timer" = hyper-only ] && floors=none
  [ "$timer" = none ] && floors=""
  for floor in $floors; do
    if grep -q "^$floor " "$work/results"; then
      line="$line; above $floor (medians): $(($(middle "$timer") - $(middle "$floor")))"
    fi
  done
  printf '%-11s %s\n' "$timer" "$line"
done
