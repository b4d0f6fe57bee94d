#!/usr/bin/env bash
# The example server (examples/server.rs) under wrk on loopback: requests/s and server CPU per
# request for each timer backend, at one and at two server cores.
#
#   bash examples/server-bench.sh            # R=3 rounds of S=10 s runs: about 3 min
#   R=1 S=5 bash examples/server-bench.sh    # a quick look
#
# Each round runs every backend once (none, tokio, shardwheel; the order rotates from round to
# round), first in mode "1 core" (server pinned to CPU 0 with one tokio worker, wrk pinned to
# CPU 1 with one thread), then in mode "2 cores" (server unpinned with two workers, wrk unpinned
# with two threads). wrk keeps C=256 keep-alive connections busy for S seconds. The server
# reports its own CPU time (user + system) and requests served; CPU per request is their ratio.
# "timer share" is a backend's CPU per request minus none's in the same round: what its timer
# costs; the medians of its user and system parts follow the ratios. "busy" is CPU time over the
# S seconds of load (1.00 = one core): a server that is not busy on its core(s) was paced by wrk,
# not by its own cost.
#
# Environment: R (rounds, 3), S (seconds per run, 10), C (connections, 256), PORT (18080),
# TIMERS ("none tokio shardwheel"; the floors hyper-only and hyper-boxed may be added: see
# examples/server.rs), MODES ("1 2"), KEEP (a file to copy the runs' lines to, one per run:
# mode timer round requests_per_s cpu_us_per_request server_busy wrk_busy user_us_per_request
# system_us_per_request). Needs wrk (installed with apt-get if missing),
# taskset (util-linux) and two CPUs for mode 1. Every process runs under `timeout`.
set -euo pipefail
cd "$(dirname "$0")/.."

R=${R:-3}
S=${S:-10}
C=${C:-256}
PORT=${PORT:-18080}
TIMERS=${TIMERS:-none tokio shardwheel}
MODES=${MODES:-1 2}
KEEP=${KEEP:-}

. examples/need-tool.sh
need_tool wrk
if [ "$(nproc)" -lt 2 ]; then
  echo "mode 1 pins the server and wrk to CPUs 0 and 1: needs 2 CPUs, skipping it" >&2
  MODES=${MODES//1/}
fi

timeout 1800 cargo build --release --quiet --features hyper --example server
server=target/release/examples/server
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
results=$work/results

# One run: mode ($1: 1 or 2), timer ($2), round ($3). Appends a line to $results:
# mode timer round requests_per_s cpu_us_per_request server_busy wrk_busy user_us_per_request
# system_us_per_request
run_one() {
  local mode=$1 timer=$2 round=$3 pin_server=() pin_wrk=() workers threads
  if [ "$mode" = 1 ]; then
    pin_server=(taskset -c 0) pin_wrk=(taskset -c 1) workers=1 threads=1
  else
    workers=2 threads=2
  fi
  # The server outlives wrk by a little (start-up, the last responses), then stops by itself.
  local server_seconds=$((S + 1))
  timeout -k 5 $((S + 60)) "${pin_server[@]}" "$server" --timer "$timer" --workers "$workers" \
    --addr "127.0.0.1:$PORT" --seconds "$server_seconds" >"$work/server.json" 2>"$work/server.err" &
  local pid=$!
  local ready=""
  for _ in $(seq 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then ready=1; break; fi
    sleep 0.1
  done
  if [ -z "$ready" ]; then
    echo "server ($timer) did not start listening on port $PORT:" >&2
    cat "$work/server.err" >&2
    kill "$pid" 2>/dev/null || true
    return 1
  fi
  local TIMEFORMAT='%U %S'
  { time timeout -k 5 $((S + 30)) "${pin_wrk[@]}" wrk -t"$threads" -c"$C" -d"${S}s" --timeout 5s \
      "http://127.0.0.1:$PORT/" >"$work/wrk.out"; } 2>"$work/wrk.time"
  if ! wait "$pid"; then
    echo "server ($timer) failed:" >&2
    cat "$work/server.err" >&2
    return 1
  fi
  local rps errors wrk_cpu requests user_us system_us
  rps=$(awk '/^Requests\/sec:/ {print $2}' "$work/wrk.out")
  errors=$(grep -E 'Socket errors|Non-2xx' "$work/wrk.out" || true)
  [ -z "$errors" ] || echo "  warning: $mode core(s) $timer round $round: wrk saw $errors" >&2
  wrk_cpu=$(awk '{print $1 + $2}' "$work/wrk.time")
  requests=$(sed -E 's/.*"requests":([0-9]+).*/\1/' "$work/server.json")
  read -r user_us system_us < <(sed -E \
    's/.*"cpu_user_us":([0-9]+),"cpu_system_us":([0-9]+).*/\1 \2/' "$work/server.json")
  awk -v m="$mode" -v t="$timer" -v r="$round" -v rps="$rps" -v n="$requests" -v u="$user_us" \
    -v k="$system_us" -v wrk="$wrk_cpu" -v s="$S" \
    'BEGIN { printf "%s %s %s %.0f %.3f %.2f %.2f %.3f %.3f\n", m, t, r, rps, (u + k) / n,
      (u + k) / 1e6 / s, wrk / s, u / n, k / n }' >>"$results"
  printf '  %s core(s)  %-10s round %s: %s\n' "$mode" "$timer" "$round" "$(tail -n 1 "$results" |
    awk '{printf "%8d req/s  %7.2f us CPU/req  server busy %.2f  wrk busy %.2f", $4, $5, $6, $7}')" >&2
}

echo "server-bench: R=$R rounds x S=${S}s, C=$C connections, timers: $TIMERS, modes: $MODES" >&2
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
read -r -a timers <<<"$TIMERS"
for mode in $MODES; do
  for round in $(seq "$R"); do
    # Rotate the order so no backend always runs first.
    for i in $(seq 0 $((${#timers[@]} - 1))); do
      run_one "$mode" "${timers[$(((i + round - 1) % ${#timers[@]}))]}" "$round"
    done
  done
done

# min / median / max of the numbers on stdin.
spread() {
  sort -g | awk '{v[NR] = $1} END {
    if (NR == 0) { print "-"; exit }
    m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf "%s / %s / %s", fmt(v[1]), fmt(m), fmt(v[NR]) }
    function fmt(x) { return (x >= 1000 || x <= -1000) ? sprintf("%.0f", x) : sprintf("%.2f", x) }'
}
median() { spread | awk -F' / ' '{print $2}'; }
column_of() { awk -v m="$1" -v t="$2" -v c="$3" '$1 == m && $2 == t {print $c}' "$results"; }
# CPU per request (or column $3: 8, its user part; 9, its system part) minus none's, round by
# round.
share_of() {
  awk -v m="$1" -v t="$2" -v c="${3:-5}" '$1 == m && $2 == "none" {floor[$3] = $c}
    $1 == m && $2 == t {cpu[$3] = $c}
    END {for (r in cpu) if (r in floor) print cpu[r] - floor[r]}' "$results"
}

echo
printf '%-8s %-11s %-28s %-24s %-24s %-20s %s\n' mode timer "requests/s (min/med/max)" \
  "CPU us/request" "timer share us/request" "server busy" "wrk busy"
for mode in $MODES; do
  for timer in "${timers[@]}"; do
    share="-"
    [ "$timer" = none ] || share=$(share_of "$mode" "$timer" | spread)
    printf '%-8s %-11s %-28s %-24s %-24s %-20s %s\n' "$mode core$([ "$mode" = 1 ] || echo s)" \
      "$timer" "$(column_of "$mode" "$timer" 4 | spread)" "$(column_of "$mode" "$timer" 5 | spread)" \
      "$share" "$(column_of "$mode" "$timer" 6 | spread)" "$(column_of "$mode" "$timer" 7 | spread)"
  done
  if [[ " ${timers[*]} " == *" shardwheel "* && " ${timers[*]} " == *" tokio "* ]]; then
    awk -v m="$mode" -v rs="$(column_of "$mode" shardwheel 4 | median)" \
      -v rt="$(column_of "$mode" tokio 4 | median)" \
      -v cs="$(column_of "$mode" shardwheel 5 | median)" -v ct="$(column_of "$mode" tokio 5 | median)" \
      -v ss="$(share_of "$mode" shardwheel | median)" -v st="$(share_of "$mode" tokio | median)" \
      -v su="$(share_of "$mode" shardwheel 8 | median)" -v tu="$(share_of "$mode" tokio 8 | median)" \
      -v sk="$(share_of "$mode" shardwheel 9 | median)" -v tk="$(share_of "$mode" tokio 9 | median)" \
      'BEGIN { printf "%-8s shardwheel/tokio (medians): requests/s %.3fx, CPU/request %.3fx", "", rs / rt, cs / ct
        if (st + 0 > 0) printf ", timer share %.2fx", ss / st
        printf "\n%-8s timer share, user time: %s against %s us/request; system time: %s against %s\n",
          "", su, tu, sk, tk }'
  fi
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
[ -z "$KEEP" ] || cp "$results" "$KEEP"
awk '$1 == 1 && $6 < 0.9 {n++} END {if (n) printf "note: %d run(s) at 1 core had the server busy < 0.90: another process took CPU, or wrk set the pace\n", n}' "$results"
