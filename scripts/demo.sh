#!/usr/bin/env bash
# Builds and installs outbox_ext, starts a scratch PostgreSQL with it, runs a first session
# (examples/demo.sql) and stops the cluster again. KEEP=1 leaves the cluster running.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
scripts/setup.sh

echo "== building and installing outbox_ext"
cargo pgrx install --release --pg-config "$PG_CONFIG" >/dev/null

cluster=${OUTBOX_DEMO_DIR:-/tmp/outbox_ext-demo}
port=${OUTBOX_DEMO_PORT:-54330}
if [ "${KEEP:-0}" != 1 ]; then
    trap 'scripts/cluster.sh stop "$cluster"; rm -rf "$cluster"' EXIT
fi
scripts/cluster.sh start "$cluster" "$port"
echo "== scratch PostgreSQL on 127.0.0.1:$port (data in $cluster)"
createdb_args=(-h 127.0.0.1 -p "$port" -U postgres)
"$PG_BIN/psql" "${createdb_args[@]}" -X -q -c "DROP DATABASE IF EXISTS outbox_demo" -c "CREATE DATABASE outbox_demo"
"$PG_BIN/psql" "${createdb_args[@]}" -X -d outbox_demo --echo-queries -f examples/demo.sql
if [ "${KEEP:-0}" = 1 ]; then
    echo "== still running: psql -h 127.0.0.1 -p $port -U postgres outbox_demo   (stop: scripts/cluster.sh stop $cluster)"
fi
