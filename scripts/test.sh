#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine:
#   1. rust         `cargo fmt --check`, `cargo clippy` without warnings, then plain Rust unit
#                   tests and #[pg_test]s (cargo pgrx test, in pgrx's own test cluster)
#   2. install      the extension built in release mode and installed into the PostgreSQL
#                   chosen by PG (scripts/common.sh: 15 by default; `PG=18 scripts/test.sh` or
#                   `PG=18 make test`)
#   3. integration  integration tests over real client connections, the isolation specs, the
#                   pg_regress suite and pg_upgrade from 15 (tests/integration), against a
#                   scratch cluster started here on 127.0.0.1 and stopped at the end
#   4. bench        a smoke run of the benchmark (bench/), so the harness cannot rot
#   5. reliability  the short reliability suite (tests/reliability/): faults, load and hostile
#                   input
#   6. package      `make package`'s Debian package installed with dpkg, used, removed
#                   (tests/packaging/test_package.sh), then step 2's install put back
# OUTBOX_TEST_STEPS chooses steps by name (comma- or space-separated; default: all), e.g.
#   OUTBOX_TEST_STEPS=rust,install,integration PG=18 scripts/test.sh
# (what .ci/run runs on PostgreSQL 18). Steps 3 to 6 use the extension that step 2 installs.
# Arguments go to pytest (step 3), e.g. `scripts/test.sh -k upgrade`. Step 3 runs its tests in
# OUTBOX_TEST_JOBS pytest-xdist workers (default 2; 1 runs them in one process), each against a
# scratch cluster of its own, on ports OUTBOX_TEST_PORT (default 25329), OUTBOX_TEST_PORT + 1, …
# (tests/integration/conftest.py). Most tests wait on a worker or a receiver, not on a core.
# Tests that start clusters of their own put them 12 to 19 ports above OUTBOX_TEST_PORT, 20
# more per worker (tests/support/cluster.py): suites run side by side on one machine need
# OUTBOX_TEST_PORTs 20 x OUTBOX_TEST_JOBS apart.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
scripts/setup.sh
require_pg

all_steps="rust install integration bench reliability package"
steps=${OUTBOX_TEST_STEPS:-$all_steps}
steps=" ${steps//,/ } "
for step in $steps; do
    case " $all_steps " in
    *" $step "*) ;;
    *)
        echo "test.sh: OUTBOX_TEST_STEPS: unknown step '$step' (steps: $all_steps)" >&2
        exit 2
        ;;
    esac
done
# run STEP: whether OUTBOX_TEST_STEPS has STEP.
run() { [[ "$steps" == *" $1 "* ]]; }
# banner TEXT: a step's title, with the time since the start.
banner() { echo "== $1 [$(((SECONDS - started) / 60))m$(((SECONDS - started) % 60))s]"; }
started=$SECONDS

scratch=$(mktemp -d /tmp/outbox_ext-test.XXXXXX)
chown postgres: "$scratch" 2>/dev/null || true
jobs=${OUTBOX_TEST_JOBS:-2}
case "$jobs" in
'' | *[!0-9]* | 0)
    echo "test.sh: OUTBOX_TEST_JOBS must be a number of workers, 1 or more (got '$jobs')" >&2
    exit 2
    ;;
esac
# stop_clusters: step 3's scratch clusters, one per test worker.
stop_clusters() {
    for ((k = 0; k < jobs; k++)); do
        scripts/cluster.sh stop "$scratch/cluster$k"
    done
}
cleanup() {
    stop_clusters || true
    rm -rf "$scratch"
}
trap cleanup EXIT

if run rust; then
    banner "1/6 cargo fmt, clippy, Rust unit tests and #[pg_test]s"
    cargo fmt --check
    cargo clippy --features "pg$PG pg_test" --no-default-features --all-targets -- -D warnings
    mkdir -p "$scratch/pgrx" && chown postgres: "$scratch/pgrx" 2>/dev/null || true
    cargo pgrx test "pg$PG" --runas postgres --pgdata "$scratch/pgrx/data"
fi

# install_extension: the release build installed into PG's directories, with released
# versions' install scripts for the upgrade tests to create old versions from. The upgrade
# scripts themselves come from the ordinary install, and only from it.
install_extension() {
    cargo pgrx install --release --pg-config "$PG_CONFIG" >/dev/null
    cp sql/versions/outbox_ext--*.sql "$PG_SHAREDIR/extension/"
}
if run install; then
    banner "2/6 build and install the extension"
    install_extension
fi

if run integration; then
    banner "3/6 integration tests, isolation specs, pg_regress suite, pg_upgrade, against a scratch cluster"
    port=${OUTBOX_TEST_PORT:-25329}
    # RUST_BACKTRACE=1, as a developer's environment often has it: errors must carry no backtrace
    # even then (tests/integration/test_bad_input.py).
    for ((k = 0; k < jobs; k++)); do
        RUST_BACKTRACE=1 scripts/cluster.sh start "$scratch/cluster$k" $((port + k))
    done
    parallel=()
    # One group's tests run in one worker: test_pg_upgrade.py's install into the other versions.
    [ "$jobs" -gt 1 ] && parallel=(-n "$jobs" --dist loadgroup)
    # In CI the slowest tests are listed (what to trim when the run nears its hour).
    OUTBOX_TEST_SERVER_LOG="$scratch/cluster0/server.log" OUTBOX_PG_CONFIG="$PG_CONFIG" OUTBOX_TEST_PORT="$port" \
        PGHOST=127.0.0.1 PGPORT="$port" PGUSER=postgres \
        .venv/bin/pytest tests/integration -q "${parallel[@]}" ${CI:+--durations=25} "$@"
    stop_clusters
fi

if run bench; then
    banner "4/6 benchmark smoke run (figures too short to quote)"
    .venv/bin/python bench/bench.py --smoke --output "$scratch/bench" >"$scratch/bench.log" 2>&1 || {
        cat "$scratch/bench.log"
        exit 1
    }
    grep '^bench:' "$scratch/bench.log" | cut -c1-120
fi

if run reliability; then
    banner "5/6 reliability suite, short run"
    .venv/bin/python tests/reliability/run.py --short
fi

if run package; then
    banner "6/6 the Debian package: built, installed with dpkg, used, removed"
    tests/packaging/test_package.sh
    # dpkg -r removed the files step 2 had installed: they are put back for what runs next.
    install_extension
fi
banner "done: steps${steps% }"
