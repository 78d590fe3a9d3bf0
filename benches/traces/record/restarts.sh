#!/usr/bin/env bash
# Records the `restarts` trace: one unchanged real vLLM server (CPU 0),
# restarted with the same configuration `RESTARTS` times (default 8), the
# probe daemon (CPU 1) running throughout, until each start has served
# `RUNS_PER_START` (default 12) completed runs. Every run records the
# server's `process_start_time_seconds` in its load readings, so each
# start's first runs (a freshly started server's cold ones) can be told.
# Run from the repository's root after `cargo build --release`; then
# `vllm-sentinel export --store $D/restarts.db --out restarts.jsonl && gzip -9 restarts.jsonl`,
# kept as benches/traces/restarts/restarts.jsonl.gz (not a detection-table trace).
set -u
D=${TRACES_DIR:-/tmp/traces}; mkdir -p "$D"
RESTARTS=${RESTARTS:-8}; RUNS_PER_START=${RUNS_PER_START:-12}
PY=$HOME/.cache/real-vllm/venv/bin/python
export SERVER_CPUS=0
count() { $PY -c "import sqlite3; c=sqlite3.connect('file:$D/restarts.db?mode=ro',uri=True); print(c.execute(\"select count(*) from runs where outcome='ok'\").fetchone()[0])" 2>/dev/null || echo 0; }
VLLM=$(../shared/real-vllm/serve.sh 8110) || { echo "vllm failed"; exit 1; }
sed -e "s#@EXPORT@#9470#; s#@DIR@#$D#; s#@NAME@#restarts#" benches/traces/record/probe.toml.in > $D/restarts.toml
setsid taskset -c 1 ${SENTINEL:-target/release/vllm-sentinel} serve --config $D/restarts.toml > $D/restarts.log 2>&1 &
DAEMON=$!
echo "$(date +%T) daemon $DAEMON, vllm $VLLM"
for start in $(seq 0 "$RESTARTS"); do
  want=$(( $(count) + RUNS_PER_START ))
  while [ "$(count)" -lt "$want" ]; do sleep 3; kill -0 $DAEMON || exit 1; done
  echo "$(date +%T) start $start: $(count) completed runs"
  kill -- -$VLLM; sleep 5
  [ "$start" -lt "$RESTARTS" ] || break
  VLLM=$(../shared/real-vllm/serve.sh 8110) || { echo "vllm failed"; kill $DAEMON; exit 1; }
done
kill -TERM $DAEMON; wait $DAEMON
echo "$(date +%T) done: $(count) completed runs"
