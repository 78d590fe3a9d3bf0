#!/usr/bin/env bash
# The self-test, several times, alternating the default (simulator isolated
# on its own core at real-time priority) with --no-isolation, so both are
# measured side by side under the same machine noise; prints the median and
# every run of each figure. Usage: benches/selftest.sh [runs] [binary]
set -euo pipefail
runs=${1:-5}
bin=${2:-target/release/vllm-sentinel}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for i in $(seq 1 "$runs"); do
  "$bin" selftest --json "$dir/isolated-$i.json" >/dev/null
  "$bin" selftest --no-isolation --json "$dir/shared-$i.json" >/dev/null
done
python3 - "$dir" <<'PY'
import glob, json, statistics, sys
for mode in ("isolated", "shared"):
    rows = {}
    for path in sorted(glob.glob(f"{sys.argv[1]}/{mode}-*.json")):
        report = json.load(open(path))
        for c in report["capacity"]:
            rows.setdefault(f"requests/s at c={c['concurrency']}", []).append(c["requests_per_s"])
        for t in report["timing"]:
            for key in ("ttft_error", "itl_error", "request_delivery", "ttft_client_error", "itl_client_error"):
                rows.setdefault(f"{t['name']} {key} p99|e| ms", []).append(t[key]["p99_abs_ms"])
    print(f"== {mode}: {report['placement']}")
    for name, values in rows.items():
        shown = ", ".join(f"{v:.0f}" if v >= 1000 else f"{v:.3f}" for v in values)
        print(f"{name:42} median {statistics.median(values):10.3f}   runs {shown}")
PY
