#!/usr/bin/env bash
# Records traces of >= 310 scheduled probe runs against one unchanged real
# vLLM server (CPU 0); the probe daemon and load generators on CPU 1.
# `record.sh [NAME...]` records the named ones (idle, waves, bursty,
# competing, quiet), all but quiet by default. `quiet` is idle on a machine
# that runs nothing else: start it only when nothing else is running.
set -u
# Run from the repository's root after `cargo build --release`; then
# `vllm-sentinel export --store $D/NAME.db --out NAME.jsonl && gzip -9 NAME.jsonl`.
D=${TRACES_DIR:-/tmp/traces}; mkdir -p "$D"
touch "$D/RECORDING"
trap 'rm -f "$D/RECORDING"' EXIT
PY=$HOME/.cache/real-vllm/venv/bin/python
export SERVER_CPUS=0
VLLM=$(../shared/real-vllm/serve.sh 8110) || { echo "vllm failed"; exit 1; }
echo "vllm pid $VLLM"
count() { $PY -c "import sqlite3,sys; c=sqlite3.connect('file:$D/$1.db?mode=ro',uri=True); print(c.execute(\"select count(*) from runs where outcome='ok'\").fetchone()[0])" 2>/dev/null || echo 0; }
record() { # name
  local name=$1
  sed -e "s#@EXPORT@#9470#; s#@DIR@#$D#; s#@NAME@#$name#" benches/traces/record/probe.toml.in > $D/$name.toml
  setsid taskset -c 1 target/release/vllm-sentinel serve --config $D/$name.toml > $D/$name.log 2>&1 &
  local pid=$!
  echo "$(date +%T) $name daemon $pid"
  while [ "$(count $name)" -lt 310 ]; do sleep 20; kill -0 $pid || break; done
  kill -TERM $pid; wait $pid
  echo "$(date +%T) $name done: $(count $name) completed runs"
}
with_load() { # name kind url seed
  setsid taskset -c 1 $PY benches/traces/record/load.py $2 $3 $4 > $D/$1-load.log 2>&1 & local L=$!
  record $1
  kill -- -$L 2>/dev/null; kill $L 2>/dev/null
}
sleep 30   # let the server settle
for name in ${*:-idle waves bursty competing}; do
  case $name in
    idle|quiet) record $name ;;
    waves) with_load waves waves http://127.0.0.1:8110 1 ;;
    bursty) with_load bursty bursty http://127.0.0.1:8110 2 ;;
    competing)
      OTHER=$(REAL_VLLM_LOG=$D/vllm-8111.log ../shared/real-vllm/serve.sh 8111) || { echo "second vllm failed"; exit 1; }
      with_load competing steady http://127.0.0.1:8111 3
      kill -- -$OTHER ;;
    *) echo "unknown trace $name"; exit 2 ;;
  esac
done
kill -- -$VLLM
echo "$(date +%T) all done"
