#!/usr/bin/env bash
# A scratch cluster of the PostgreSQL chosen by PG (scripts/common.sh, default 15) for the demo
# and the tests, on 127.0.0.1 and a Unix socket inside its own directory only. Use a port below
# 32768: the kernel hands ports above it to outgoing connections (the worker's, to a receiver),
# which can hold the one you want.
#
#   scripts/cluster.sh start DIR PORT   initdb (if needed) and start; prints nothing else
#   scripts/cluster.sh stop DIR         stop (fast) if running
#
# The cluster preloads outbox_ext, so every database with the extension gets its delivery
# worker (OUTBOX_WORKER_DATABASES, when set, limits them), and lets it connect to loopback. OUTBOX_CLUSTER_CONF holds extra
# postgresql.conf lines, which override the defaults below (the benchmark turns fsync back on).
# OUTBOX_INITDB_OPTIONS adds initdb options (the pg_upgrade test: --no-data-checksums on 18).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
require_pg

command=${1:?usage: cluster.sh start DIR PORT | stop DIR}
dir=${2:?cluster directory}

case "$command" in
start)
    port=${3:?port}
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres: "$dir"
    if [ ! -f "$dir/data/PG_VERSION" ]; then
        # shellcheck disable=SC2086 # options, split on spaces
        as_server_user "$PG_BIN/initdb" -D "$dir/data" -U postgres -A trust --no-sync ${OUTBOX_INITDB_OPTIONS:-} >"$dir/initdb.log"
        cat >>"$dir/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
fsync = off
max_connections = 100
# Room for a prepared transaction (the compaction tests leave one, as a forgotten one pins vacuum).
max_prepared_transactions = 4
# Room for the outbox_ext launcher and up to outbox.max_workers (8) delivery workers.
max_worker_processes = 16
log_min_messages = warning
shared_preload_libraries = 'outbox_ext'
# The receivers of the demo and the tests run on this machine: open loopback to the worker
# (refused by default, docs/security.md).
outbox.allowed_networks = '127.0.0.1/32, ::1/128'
${OUTBOX_CLUSTER_CONF:-}
CONF
        if [ -n "${OUTBOX_WORKER_DATABASES:-}" ]; then
            echo "outbox.worker_databases = '$OUTBOX_WORKER_DATABASES'" >>"$dir/data/postgresql.conf"
        fi
    fi
    # sudo drops the environment; RUST_BACKTRACE is passed on to the server (the tests use it).
    if ! as_server_user env RUST_BACKTRACE="${RUST_BACKTRACE:-0}" \
        "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null; then
        echo "cluster.sh: the server did not start; the end of $dir/server.log:" >&2
        tail -n 20 "$dir/server.log" >&2
        exit 1
    fi
    ;;
stop)
    if [ -f "$dir/data/postmaster.pid" ]; then
        as_server_user "$PG_BIN/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
    fi
    ;;
*)
    echo "cluster.sh: unknown command $command" >&2
    exit 2
    ;;
esac
