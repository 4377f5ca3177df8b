#!/usr/bin/env bash
# Builds and installs outbox_ext, starts a scratch PostgreSQL with it (preloaded, so the
# delivery worker runs) and a local webhook receiver, runs a first session (examples/demo.sql)
# and stops both again. KEEP=1 leaves the cluster running.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
scripts/setup.sh
require_pg

echo "== building and installing outbox_ext"
cargo pgrx install --release --pg-config "$PG_CONFIG" >/dev/null

cluster=${OUTBOX_DEMO_DIR:-/tmp/outbox_ext-demo}
port=${OUTBOX_DEMO_PORT:-25330}
receiver_port=${OUTBOX_DEMO_RECEIVER_PORT:-8787}
receiver_log=$(mktemp /tmp/outbox_ext-demo-receiver.XXXXXX)
stop_all() {
    [ -n "${receiver_pid:-}" ] && kill "$receiver_pid" 2>/dev/null
    if [ "${KEEP:-0}" != 1 ]; then
        scripts/cluster.sh stop "$cluster"
        rm -rf "$cluster"
    fi
    rm -f "$receiver_log"
}
trap stop_all EXIT

scripts/cluster.sh start "$cluster" "$port"
echo "== scratch PostgreSQL on 127.0.0.1:$port (data in $cluster), outbox_ext preloaded: CREATE EXTENSION starts the delivery worker"
psql_args=(-h 127.0.0.1 -p "$port" -U postgres -X)
"$PG_BIN/psql" "${psql_args[@]}" -q -c "DROP DATABASE IF EXISTS outbox_demo" -c "CREATE DATABASE outbox_demo"
# Quick retries for the demo, applied as an operator would: ALTER SYSTEM and a reload.
"$PG_BIN/psql" "${psql_args[@]}" -q -c "ALTER SYSTEM SET outbox.backoff_base = '500ms'" -c "SELECT pg_reload_conf()" >/dev/null

python3 examples/webhook_receiver.py --port "$receiver_port" --fail-first 2 >"$receiver_log" 2>&1 &
receiver_pid=$!
for _ in $(seq 1 40); do grep -q listening "$receiver_log" && break; sleep 0.1; done
"$PG_BIN/psql" "${psql_args[@]}" -d outbox_demo --echo-queries -v receiver_url="http://127.0.0.1:$receiver_port/hooks" -f examples/demo.sql
echo
echo "== what the local webhook receiver got"
cat "$receiver_log"
if [ "${KEEP:-0}" = 1 ]; then
    echo "== still running: psql -h 127.0.0.1 -p $port -U postgres outbox_demo   (stop: scripts/cluster.sh stop $cluster)"
fi
