#!/usr/bin/env bash
# The daemon fed a file_sd file of ENTRIES (default 10000) replicas that
# refuse connections (127.x.y.z:9), probed every ten seconds: resident
# memory, WARN lines per second, series on /metrics and the status page's
# size after SECONDS (default 60). With `max_replicas` (default 256) only
# that many are probed; the rest are counted in sentinel_replicas_dropped.
# Usage: benches/file_sd_flood.sh [binary]; ENTRIES=N, SECONDS_RUN=N.
set -euo pipefail
bin=${1:-target/release/vllm-sentinel}
[ -n "${1:-}" ] || cargo build -q --release --bin vllm-sentinel
entries=${ENTRIES:-10000}
seconds=${SECONDS_RUN:-60}
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
python3 - "$entries" > "$dir/replicas.json" <<'EOF'
import json, sys
n = int(sys.argv[1])
print(json.dumps([{"targets": [f"127.{1 + i // 62500}.{i // 250 % 250}.{i % 250 + 1}:9" for i in range(n)]}]))
EOF
cat > "$dir/sentinel.toml" <<EOF
[exporter]
listen = "127.0.0.1:$port"
[store]
path = "$dir/store.db"
[scheduler]
schedule = "*/10 * * * * *"
[telemetry]
nvml = false
[[targets]]
name = "fleet"
base_url = "http://127.0.0.1:9"
server_metrics = false
[targets.replicas]
file_sd = "$dir/replicas.json"
probe = "replicas"
refresh = "5s"
max_parallel = 8
[[scenarios]]
name = "s"
input_len = 16
output_len = 4
num_requests = 1
warmup = 0
EOF
"$bin" serve --config "$dir/sentinel.toml" > "$dir/log" 2>&1 &
pid=$!
sleep 5
warn_before=$(grep -c ' WARN ' "$dir/log" || true)
sleep "$((seconds - 5))"
warn_after=$(grep -c ' WARN ' "$dir/log" || true)
rss=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")
hwm=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
series=$(curl -s "http://127.0.0.1:$port/metrics" | grep -vc '^#' || true)
status=$(curl -s "http://127.0.0.1:$port/" | wc -c)
echo "entries $entries, after ${seconds} s:"
echo "  resident $((rss / 1024)) MiB (peak $((hwm / 1024)) MiB)"
echo "  WARN lines: $warn_after in all, $(( (warn_after - warn_before) / (seconds - 5) )) per second from 5 s on"
echo "  series on /metrics: $series; status page: $status bytes"
echo "  log: $(wc -l < "$dir/log") lines, $(wc -c < "$dir/log") bytes; longest line $(awk '{ if (length($0) > m) m = length($0) } END { print m }' "$dir/log") bytes"
grep ' WARN ' "$dir/log" | sed -E 's/^[^ ]+ +WARN +//' | cut -c1-60 | sort | uniq -c | sort -rn | head -5
