#!/usr/bin/env bash
# The daemon at scale: TARGETS targets (default 100) x 6 scenarios, all
# against one simulated vLLM, every pair once a minute. The six scenarios
# are due at :00, :10, ... :50, so every ten seconds all targets come due
# at once. Prints series per pair, resident memory, CPU, /metrics scrape
# time (cached, and encoded again after runs) and the run start delay.
# Usage: benches/scale.sh [binary]; TARGETS=N, HISTOGRAMS=off|coarse|fine.
set -euo pipefail
# The shipped build (the `dist` profile, as in the container image).
bin=${1:-target/dist/vllm-sentinel}
[ -n "${1:-}" ] || cargo build -q --profile dist --bin vllm-sentinel
targets=${TARGETS:-100}
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
sim_port=$(free_port)
exp_port=$(free_port)
url="http://127.0.0.1:$exp_port/metrics"
"$bin" sim --listen 127.0.0.1:$sim_port >/dev/null 2>&1 &
sleep 1
{
  echo "[exporter]"; echo "listen = \"127.0.0.1:$exp_port\""
  [ -n "${HISTOGRAMS:-}" ] && echo "histograms = \"$HISTOGRAMS\""
  echo "[store]"; echo "path = \"$dir/store.db\""
  echo "[telemetry]"; echo 'scrape_interval = "15s"'
  for t in $(seq 1 "$targets"); do
    echo "[[targets]]"; echo "name = \"t$t\""; echo "base_url = \"http://127.0.0.1:$sim_port\""
  done
  second=0
  for s in single-user-latency short-context-throughput long-context decode-stress mixed-traffic; do
    echo "[[scenarios]]"; echo "name = \"$s\""; echo "preset = \"$s\""; echo "scale = 0.01"
    echo "num_requests = 2"; echo "warmup = 0"; echo "schedule = \"$second * * * * *\""
    second=$((second + 10))
  done
  echo "[[scenarios]]"; echo 'name = "scaling"'; echo 'input_len = 16'; echo 'output_len = 4'
  echo 'concurrency = 2'; echo 'num_requests = 2'; echo 'warmup = 0'; echo "schedule = \"$second * * * * *\""
} > "$dir/sentinel.toml"
"$bin" check-config --config "$dir/sentinel.toml" | tail -1
RUST_LOG=warn "$bin" serve --config "$dir/sentinel.toml" &
pid=$!
# A full minute of runs (every pair once), starting at the next :00.
now=$(date +%s); wait_s=$(( 60 - now % 60 + 62 ))
echo "waiting ${wait_s}s for a full minute of $((targets * 6)) runs..."
sleep $wait_s
page=$(curl -s "$url")
series=$(echo "$page" | grep -vc '^#')
with_run=$(echo "$page" | grep -c '^sentinel_run_success{' || true)
pair=$(echo "$page" | grep -v '^#' | grep 'target="t1"' | grep -c 'scenario="decode-stress"' || true)
target_only=$(echo "$page" | grep -v '^#' | grep 'target="t1"' | grep -vc 'scenario=' || true)
ticks=$(getconf CLK_TCK)
cpu0=$(awk '{print $14+$15}' /proc/$pid/stat); t0=$(date +%s.%N)
# Scrapes spaced like Prometheus' (15 s), each after a wave of runs: the
# families those runs moved are encoded again.
spaced=$(for i in 1 2 3 4; do sleep 15; curl -s -o /dev/null -w '%{time_total}\n' "$url"; done | sort -n | awk '{printf "%.1f ", $1*1000}')
cpu1=$(awk '{print $14+$15}' /proc/$pid/stat); t1=$(date +%s.%N)
cached=$(for i in $(seq 1 21); do curl -s -o /dev/null -w '%{time_total}\n' "$url"; done | sort -n | awk '{a[NR]=$1} END{printf "%.1f", a[11]*1000}')
# A minute without scrapes: every pair ran, so the whole page is new.
sleep 60
full=$(curl -s -o /dev/null -w '%{time_total}' "$url" | awk '{printf "%.1f", $1*1000}')
rss_kb=$(awk '/VmRSS/{print $2}' /proc/$pid/status)
threads=$(awk '/^Threads/{print $2}' /proc/$pid/status)
anon_kb=$(awk '/^RssAnon/{print $2}' /proc/$pid/status)
file_kb=$(awk '/^RssFile/{print $2}' /proc/$pid/status)
delays=$(curl -s "$url" | grep '^sentinel_scheduler_start_delay_seconds_bucket')
echo "pairs with a run: $with_run / $((targets * 6)); series on /metrics: $series"
echo "series per pair: $pair with its scenario label, plus $target_only per target (shared by its 6 pairs)"
echo "resident memory: $((rss_kb / 1024)) MiB ($rss_kb kB): $anon_kb kB anonymous (heap, stacks), $file_kb kB file-backed (binary, libraries); $threads threads"
awk -v c0=$cpu0 -v c1=$cpu1 -v t0=$t0 -v t1=$t1 -v hz=$ticks 'BEGIN{printf "CPU: %.1f%% of one core over %.0f s (four waves of %d runs included)\n", (c1-c0)/hz/(t1-t0)*100, t1-t0, '"$targets"'}'
echo "/metrics cached: median ${cached} ms (21 back-to-back scrapes, curl total time)"
echo "/metrics every 15 s, after a wave of runs (ms, sorted): $spaced"
echo "/metrics after a minute without scrapes (every family new): ${full} ms"
echo "$delays" | awk '
  { match($0, /le="[^"]*"/); le = substr($0, RSTART + 4, RLENGTH - 5); n[NR] = $NF; b[NR] = le }
  END {
    total = n[NR]
    for (i = 1; i <= NR; i++) if (n[i] >= 0.99 * total) { p99 = b[i]; break }
    for (i = 1; i <= NR; i++) if (b[i] == "2") under2 = n[i]
    printf "run start delay: p99 <= %s s; %d of %d runs started within 2 s\n", p99, under2, total
  }'
