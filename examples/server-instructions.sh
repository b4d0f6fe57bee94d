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
# It also counts the atomic read-modify-write instructions (`lock`-prefixed, or `xchg` with
# memory) that the process ran per request, in every object objdump can read (the server, libc):
# callgrind counts each as one instruction, but an uncontended one takes the time of dozens
# (each waits for the core's pending stores), so they are where instructions and time part ways.
#
# Backends (see examples/server.rs): none (no timer), hyper-only (hyper's header-read timeout on
# a timer that never fires: what hyper itself adds once it has any timer), hyper-boxed (the same
# with each of those sleeps on the heap, as a real timer's), tokio, shardwheel.
# "above none" is a backend's count minus none's: its timer share. "above hyper-only" leaves out
# hyper's own part of it: the timer's own work.
#
# With CACHE=1, callgrind also simulates the caches (this machine's sizes; user space only, so
# without the kernel's evictions, which make real misses far more frequent) and each run adds its
# misses per request: instruction fetches that missed the first-level instruction cache, then
# data reads and data writes that missed the first-level data cache. They show the memory a
# timer adds to a request's path (its code, its data, the bytes it adds to futures the server
# moves) where time is too noisy to.
#
# CACHE=small simulates first-level caches of 8 KB each, fully associative (least recently
# used), standing in for the kernel, which runs most of a request's time between two of the
# server's turns and leaves little of the server's lines in the real ones; its runs add the sum
# of the three misses, the *lines* per request. With C=256 (server-bench.sh's load), a backend's
# lines above none tracked its user CPU time above none at about 1 ns a line, plus about 7 ns per
# locked instruction, across none, hyper-boxed, tokio and shardwheel (README, "Cache lines, not
# instructions"): the instrument for a timer's share that time cannot resolve. Full
# associativity keeps a change of layout from moving the count much (hyper-boxed's moved by 5
# across three builds; with 8-way sets, by up to 20), but compare backends of one build: a
# function that grows still moves its neighbours' lines by one or two each.
#
# With KEEP=DIR, each run's callgrind output is kept as DIR/TIMER-ROUND.callgrind and its request
# count as DIR/TIMER-ROUND.requests: `callgrind_annotate --show=Ir,I1mr,D1mr,D1mw` of the output
# gives each function's counts (divide by the requests), and the output has them per
# instruction too (it is written with --dump-instr=yes).
#
# Environment: R (rounds, 2), S (seconds of load per run, 10), C (connections, 32), PORT (18090),
# TIMERS ("none hyper-only tokio shardwheel"), CACHE (0, 1 or small), KEEP (unset). Needs
# valgrind, wrk and objdump (each installed with apt-get if missing). Every process runs under
# `timeout`.
set -euo pipefail
cd "$(dirname "$0")/.."

KEEP=${KEEP:-}
R=${R:-2}
S=${S:-10}
C=${C:-32}
PORT=${PORT:-18090}
TIMERS=${TIMERS:-none hyper-only tokio shardwheel}
CACHE=${CACHE:-0}
cache_sim=()
case $CACHE in
  0) ;;
  1) cache_sim=(--cache-sim=yes) ;;
  small) cache_sim=(--cache-sim=yes --I1=8192,128,64 --D1=8192,128,64) ;;
  *) echo "CACHE is 0, 1 or small" >&2; exit 2 ;;
esac

. examples/need-tool.sh
need_tool valgrind
need_tool wrk
need_tool objdump binutils

timeout 1800 cargo build --release --quiet --features hyper --example server
server=target/release/examples/server
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The atomic read-modify-write instructions executed in callgrind output $1 (written with
# --dump-instr=yes, uncompressed): their addresses from objdump, object by object, then the
# counts callgrind gives those addresses. The line after a `calls=` line is the call's
# inclusive cost, not an instruction's: skipped.
locked_instructions() {
  local out=$1 object
  : >"$work/locked"
  while read -r object; do
    [ -f "$object" ] || continue
    objdump -d --no-show-raw-insn "$object" |
      awk -v o="$object" '($2 == "lock" || ($2 == "xchg" && $3 ~ /\(/)) {
        a = $1; sub(":", "", a); sub(/^0+/, "", a); print o, a }' >>"$work/locked"
  done < <(sed -n 's/^ob=//p' "$out" | sort -u)
  awk 'NR == FNR { locked[$1 " " $2] = 1; next }
    /^ob=/ { object = substr($0, 4); next }
    /^calls=/ { skip = 1; next }
    /^0x/ {
      if (skip) { skip = 0; next }
      a = substr($1, 3); sub(/^0+/, "", a)
      if ((object " " a) in locked) n += $3
    }
    END { print n + 0 }' "$work/locked" "$out"
}

# One run of backend $1: prints "requests instructions locked_instructions", then with CACHE on
# the misses "I1mr D1mr D1mw" (whole run).
run_one() {
  local timer=$1
  # Valgrind starts slowly: the server waits 4 s for wrk, and outlives it by 2 s.
  timeout -k 5 $((S + 120)) valgrind --tool=callgrind --callgrind-out-file="$work/out" \
    --dump-instr=yes --compress-pos=no --compress-strings=no "${cache_sim[@]}" \
    "$server" --timer "$timer" --workers 1 --addr "127.0.0.1:$PORT" --seconds $((S + 6)) \
    >"$work/server.json" 2>"$work/valgrind.err" &
  local pid=$!
  sleep 4
  timeout -k 5 $((S + 30)) wrk -t1 -c"$C" -d"${S}s" "http://127.0.0.1:$PORT/" >/dev/null
  wait "$pid"
  local requests instructions
  requests=$(grep -o '"requests":[0-9]*' "$work/server.json" | cut -d: -f2)
  instructions=$(awk '/^summary:/ {print $2}' "$work/out")
  local misses=""
  # The summary's columns follow its `events:` line: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw.
  [ "$CACHE" != 0 ] && misses=$(awk '/^summary:/ {print $5, $6, $7}' "$work/out")
  echo "$requests $instructions $(locked_instructions "$work/out") $misses"
}

printf '%-11s %-5s %10s %14s %14s %8s' timer round requests instructions per_request locked
[ "$CACHE" != 0 ] && printf ' %9s %14s %15s %7s' I1_misses D1_read_misses D1_write_misses lines
echo
for round in $(seq 1 "$R"); do
  for timer in $TIMERS; do
    read -r requests instructions locked i1 d1r d1w < <(run_one "$timer")
    if [ -n "$KEEP" ]; then
      mkdir -p "$KEEP"
      cp "$work/out" "$KEEP/$timer-$round.callgrind"
      echo "$requests" >"$KEEP/$timer-$round.requests"
    fi
    per=$(awk -v i="$instructions" -v r="$requests" 'BEGIN {printf "%.0f", i / r}')
    locked_per=$(awk -v l="$locked" -v r="$requests" 'BEGIN {printf "%.2f", l / r}')
    printf '%-11s %-5s %10s %14s %14s %8s' "$timer" "$round" "$requests" "$instructions" "$per" \
      "$locked_per"
    misses=""
    if [ "$CACHE" != 0 ]; then
      misses=$(awk -v r="$requests" -v a="$i1" -v b="$d1r" -v c="$d1w" \
        'BEGIN {printf "%.1f %.1f %.1f %.1f", a / r, b / r, c / r, (a + b + c) / r}')
      printf ' %9s %14s %15s %7s' $misses
    fi
    echo
    echo "$timer $per $locked_per $misses" >>"$work/results"
  done
done

echo
echo "per request: min / median / max over $R rounds; \"above\": the difference of the medians"
# min / median / max of column $2 of backend $1's results (the lower middle of an even count).
spread() {
  awk -v t="$1" -v c="$2" '$1 == t {print $c}' "$work/results" | sort -g |
    awk '{v[NR] = $1} END {printf "%s / %s / %s", v[1], v[int((NR + 1) / 2)], v[NR]}'
}
middle() { spread "$1" "$2" | awk -F' / ' '{print $2}'; }
columns="2 3"
[ "$CACHE" != 0 ] && columns="2 3 4 5 6 7"
for timer in $TIMERS; do
  for column in $columns; do
    case $column in
      2) what=instructions ;;
      3) what="locked instructions" ;;
      4) what="I1 misses" ;;
      5) what="D1 read misses" ;;
      6) what="D1 write misses" ;;
      7) what="lines" ;;
    esac
    line="$(spread "$timer" "$column")"
    floors="none hyper-only"
    [ "$timer" = hyper-only ] && floors=none
    [ "$timer" = none ] && floors=""
    for floor in $floors; do
      if grep -q "^$floor " "$work/results"; then
        line="$line; above $floor: $(awk -v a="$(middle "$timer" "$column")" \
          -v b="$(middle "$floor" "$column")" -v c="$column" \
          'BEGIN {printf (c == 2 ? "%.0f" : "%.2f"), a - b}')"
      fi
    done
    printf '%-11s %-20s %s\n' "$timer" "$what" "$line"
  done
done
