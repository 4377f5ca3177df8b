#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine:
#   1. plain Rust unit tests and #[pg_test]s (cargo pgrx test, in pgrx's own test cluster)
#   2. the extension built in release mode and installed into the PostgreSQL chosen by PG
#      (scripts/common.sh: 15 by default; `PG=17 scripts/test.sh` or `PG=17 make test`)
#   3. integration tests over real client connections and the isolation specs, against a
#      scratch cluster started here on 127.0.0.1 and stopped at the end
#   4. a smoke run of the benchmark (bench/), so the harness cannot rot
#   5. the short reliability suite (tests/reliability/): faults, load and hostile input
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
scripts/setup.sh
require_pg

scratch=$(mktemp -d /tmp/outbox_ext-test.XXXXXX)
chown postgres: "$scratch" 2>/dev/null || true
cleanup() {
    scripts/cluster.sh stop "$scratch/cluster" || true
    rm -rf "$scratch"
}
trap cleanup EXIT

echo "== 1/5 Rust unit tests and #[pg_test]s"
mkdir -p "$scratch/pgrx" && chown postgres: "$scratch/pgrx" 2>/dev/null || true
cargo pgrx test "pg$PG" --runas postgres --pgdata "$scratch/pgrx/data"

echo "== 2/5 build and install the extension"
cargo pgrx install --release --pg-config "$PG_CONFIG" >/dev/null
# Released versions' install scripts, for the upgrade tests to create old versions from. The
# upgrade scripts themselves come from the ordinary install above, and only from it.
cp sql/versions/outbox_ext--*.sql "$PG_SHAREDIR/extension/"

echo "== 3/5 integration tests and isolation specs against a scratch cluster"
port=${OUTBOX_TEST_PORT:-25329}
# RUST_BACKTRACE=1, as a developer's environment often has it: errors must carry no backtrace
# even then (tests/integration/test_bad_input.py).
RUST_BACKTRACE=1 \
    scripts/cluster.sh start "$scratch/cluster" "$port"
OUTBOX_TEST_SERVER_LOG="$scratch/cluster/server.log" OUTBOX_PG_CONFIG="$PG_CONFIG" \
    PGHOST=127.0.0.1 PGPORT="$port" PGUSER=postgres \
    .venv/bin/pytest tests/integration -q "$@"
scripts/cluster.sh stop "$scratch/cluster"

echo "== 4/5 benchmark smoke run (figures too short to quote)"
.venv/bin/python bench/bench.py --smoke --output "$scratch/bench" >"$scratch/bench.log" 2>&1 || {
    cat "$scratch/bench.log"
    exit 1
}
grep '^bench:' "$scratch/bench.log" | cut -c1-120

echo "== 5/5 reliability suite, short run"
.venv/bin/python tests/reliability/run.py --short
