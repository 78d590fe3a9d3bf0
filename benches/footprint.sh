#!/usr/bin/env bash
# Footprint of the daemon with 10 targets x 6 scenarios (all against one
# simulated vLLM): resident memory and CPU while idle between schedule
# ticks, and /metrics scrape time. Usage: benches/footprint.sh [binary]
# HISTOGRAMS=off|coarse|fine sets [exporter] histograms (default: the
# daemon's default).
set -euo pipefail
# The shipped build (the `dist` profile, as in the container image).
bin=${1:-target/dist/vllm-sentinel}
[ -n "${1:-}" ] || cargo build -q --profile dist --bin vllm-sentinel
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
sim_port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
exp_port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
"$bin" sim --listen 127.0.0.1:$sim_port >/dev/null 2>&1 &
sleep 1
{
  echo "[exporter]"; echo "listen = \"127.0.0.1:$exp_port\""
  [ -n "${HISTOGRAMS:-}" ] && echo "histograms = \"$HISTOGRAMS\""
  echo "[store]"; echo "path = \"$dir/store.db\""
  echo "[scheduler]"; echo 'schedule = "0 * * * * *"'   # once a minute, at :00
  echo "[telemetry]"; echo 'scrape_interval = "15s"'
  for t in $(seq 1 10); do
    echo "[[targets]]"; echo "name = \"t$t\""; echo "base_url = \"http://127.0.0.1:$sim_port\""
  done
  for s in single-user-latency short-context-throughput long-context decode-stress mixed-traffic; do
    echo "[[scenarios]]"; echo "name = \"$s\""; echo "preset = \"$s\""; echo "scale = 0.01"; echo "num_requests = 2"; echo "warmup = 0"
  done
  echo "[[scenarios]]"; echo 'name = "scaling"'; echo 'input_len = 16'; echo 'output_len = 4'; echo 'concurrency = 2'; echo 'num_requests = 2'; echo 'warmup = 0'
} > "$dir/sentinel.toml"
"$bin" check-config --config "$dir/sentinel.toml"
RUST_LOG=warn "$bin" serve --config "$dir/sentinel.toml" &
pid=$!
# Wait for the first round of runs (the next :00), then let it settle.
now=$(date +%s); wait_s=$(( 60 - now % 60 + 15 ))
echo "waiting ${wait_s}s for the first round of 60 runs..."
sleep $wait_s
runs=$(curl -s "http://127.0.0.1:$exp_port/metrics" | grep -c '^sentinel_run_success{' || true)
series=$(curl -s "http://127.0.0.1:$exp_port/metrics" | grep -vc '^#')
ticks=$(getconf CLK_TCK)
cpu0=$(awk '{print $14+$15}' /proc/$pid/stat); t0=$(date +%s.%N)
sleep 30
cpu1=$(awk '{print $14+$15}' /proc/$pid/stat); t1=$(date +%s.%N)
rss_kb=$(awk '/VmRSS/{print $2}' /proc/$pid/status)
threads=$(awk '/^Threads/{print $2}' /proc/$pid/status)
anon_kb=$(awk '/^RssAnon/{print $2}' /proc/$pid/status)
file_kb=$(awk '/^RssFile/{print $2}' /proc/$pid/status)
times=$(for i in $(seq 1 50); do curl -s -o /dev/null -w '%{time_total}\n' "http://127.0.0.1:$exp_port/metrics"; done | sort -n)
median=$(echo "$times" | awk '{a[NR]=$1} END{print (a[25]+a[26])/2*1000}')
p90=$(echo "$times" | awk '{a[NR]=$1} END{print a[45]*1000}')
# Scrapes spaced like Prometheus', with the watchers running in between:
# the page is encoded again only when some value moved.
spaced=$(for i in $(seq 1 5); do sleep 16; curl -s -o /dev/null -w '%{time_total}\n' "http://127.0.0.1:$exp_port/metrics"; done | sort -n | awk '{printf "%.2f ", $1*1000}')
echo "pairs with a run: $runs / 60, series on /metrics: $series"
echo "resident memory: $((rss_kb / 1024)) MiB ($rss_kb kB): $anon_kb kB anonymous (heap, stacks), $file_kb kB file-backed (binary, libraries); $threads threads"
awk -v c0=$cpu0 -v c1=$cpu1 -v t0=$t0 -v t1=$t1 -v hz=$ticks 'BEGIN{printf "idle CPU: %.2f%% of one core over %.0f s\n", (c1-c0)/hz/(t1-t0)*100, t1-t0}'
echo "/metrics scrape: median ${median} ms, p90 ${p90} ms (50 back-to-back scrapes, curl total time)"
echo "/metrics scrape every 16 s (5 scrapes, ms, sorted): $spaced"
