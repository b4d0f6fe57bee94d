#!/usr/bin/env bash
# Where a timer's time goes inside the example server (examples/server.rs): CPU time per request in
# each of the timer's entry points, their callees included, from `perf record --call-graph dwarf` of
# the loaded server. server-bench.sh says how much a timer costs a request; this says which of its
# calls the cost is in.
#
#   bash examples/server-profile.sh                  # shardwheel, one worker: about 10 s
#   TIMER=tokio bash examples/server-profile.sh      # tokio's timer, for comparison
#
# The server runs one tokio worker pinned to CPU 0, wrk (one thread, C=256 keep-alive connections)
# on CPU 1 (with W=2: two workers and two wrk threads, unpinned, as server-bench.sh's two-core
# mode), and perf samples the server's threads (cpu-clock, F per second) for S seconds of the load.
# Each sample whose stack passes through the timer is counted for the outermost of the timer's
# frames in it (`<HyperTimer as Timer>::now`, `Sleep::reset_after`, ...): that entry point's
# inclusive time. Two entry points include work that is not the timer's, so they are listed but left
# out of the sum: a `Timeout`'s poll (the future it wraps) and, for tokio, the part of its time
# driver's park spent in the I/O driver's park, which it wraps (epoll, and waking the tasks whose
# sockets are ready); the time driver's own part (its lock, its wheel) counts. Samples in the vDSO's
# `clock_gettime` (`Instant::now`) have no call chain (perf cannot unwind it), so they are counted
# apart, the runtime's own reads included: a timer that reads `Instant::now` has the difference from
# another timer's run on top of its sum. Then, for each entry point, the functions its samples ended
# in (where the time went: `rdtsc`, a first load, `malloc`). Sampling, not counting: figures move by
# several ns per request from run to run; alternate runs of the two timers, in the same hour.
#
# Environment: TIMER (shardwheel), W (server workers, 1 or 2), S (seconds, 4), F (samples per
# second, 2000), C (256), PORT (18095), FRAMES (an awk regex of the timer's frames; by default
# shardwheel's, or tokio's time driver, sleeps and hyper-util's TokioTimer for TIMER=tokio). Needs
# perf and wrk (installed with apt-get if missing) and a kernel that lets perf sample this process
# (perf_event_paranoid at most 2, or root). Every process runs under `timeout`.
set -euo pipefail
cd "$(dirname "$0")/.."

TIMER=${TIMER:-shardwheel}
W=${W:-1}
S=${S:-4}
F=${F:-2000}
C=${C:-256}
PORT=${PORT:-18095}
case $TIMER in
  tokio) default_frames='tokio::time::|tokio::runtime::time::|TokioTimer|TokioSleep' ;;
  *) default_frames='shardwheel::|HyperTimer' ;;
esac
FRAMES=${FRAMES:-$default_frames}

. examples/need-tool.sh
need_tool perf linux-perf
need_tool wrk

timeout 1800 cargo build --release --quiet --features hyper --example server
server=target/release/examples/server
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

server_cpus=(taskset -c 0)
wrk_cpus=(taskset -c 1)
if [ "$W" != 1 ]; then
  server_cpus=()
  wrk_cpus=()
fi
timeout $((S + 60)) "${server_cpus[@]}" "$server" --timer "$TIMER" --workers "$W" \
  --addr "127.0.0.1:$PORT" --seconds $((S + 3)) >"$work/server.json" 2>"$work/server.err" &
timeout_pid=$!
sleep 0.7
# The server itself: `timeout`'s child (taskset, if any, runs the server in its process).
server_pid=$(pgrep -P "$timeout_pid")
timeout $((S + 60)) perf record -q -e cpu-clock -F "$F" --call-graph dwarf,16384 \
  -p "$server_pid" -o "$work/perf.data" -- sleep "$S" >/dev/null 2>&1 &
perf_pid=$!
sleep 0.2
timeout $((S + 60)) "${wrk_cpus[@]}" wrk -t"$W" -c"$C" -d$((S + 1))s "http://127.0.0.1:$PORT/" >"$work/wrk.txt"
wait "$perf_pid"
wait "$timeout_pid"
seconds=$(awk '/requests in/ { sub("s,", "", $4); print $4 }' "$work/wrk.txt")
requests=$(awk '/requests in/ { print $1 }' "$work/wrk.txt")
# The requests served while perf sampled: wrk's rate times perf's seconds.
sampled=$(awk -v r="$requests" -v s="$seconds" -v p="$S" 'BEGIN { printf "%d", r / s * p }')
echo "timer $TIMER, $W worker(s): $requests requests in ${seconds}s (about $sampled while sampled), $F samples/s"

timeout 600 perf script -i "$work/perf.data" -F ip,sym 2>/dev/null |
  awk -v frames="$FRAMES" -v n="$sampled" -v hz="$F" '
    function name(line) {
      sub(/^[ \t]*[0-9a-f]+ /, "", line); sub(/\+0x[0-9a-f]+.*$/, "", line); sub(/ \(.*$/, "", line)
      return line
    }
    function flush() {
      if (entry ~ /Driver::park_internal/) entry = entry (io ? " (in the I/O driver)" : " (its own)")
      if (entry != "") {
        inclusive[entry]++
        leaves[entry "\t" leaf]++
      } else if (leaf ~ /clock_gettime/) {
        vdso++
      }
      entry = ""; leaf = ""; depth = 0; io = 0
    }
    /^$/ { flush(); next }
    {
      depth++
      if (depth == 1) leaf = name($0)
      if ($0 ~ /tokio::runtime::io::/ && entry == "") io = 1
      if ($0 ~ frames) entry = name($0)
    }
    END {
      flush()
      per = 1e9 / hz / n
      for (e in inclusive) {
        printf "%8.1f ns/request  %s\n", inclusive[e] * per, e | "sort -rn"
        if (e !~ /Timeout<[A-Z]> as core::future::future::Future>::poll|in the I\/O driver/) sum += inclusive[e]
      }
      close("sort -rn")
      printf "%8.1f ns/request  in clock_gettime without a call chain (the vDSO'\''s cannot be unwound: the\n                    clock reads of Instant::now, for the timer or not, which the entry points above miss)\n", vdso * per
      printf "%8.1f ns/request  in all but a Timeout'\''s poll and the I/O driver\n\nwhere each entry point'\''s samples ended (over 2 ns/request):\n", sum * per
      for (k in leaves) {
        if (leaves[k] * per < 2) continue
        split(k, part, "\t")
        printf "%8.1f  %-60.60s  %s\n", leaves[k] * per, part[1], part[2] | "sort -rn"
      }
      close("sort -rn")
    }'
