#!/usr/bin/env bash
# The benchmark in one command: installs what it needs, builds and installs outbox_ext (release),
# then bench/bench.py starts its own scratch cluster and receiver, measures, writes
# bench/results/latest.{md,png,json} and cleans up. `bench/run.sh --smoke` takes a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
scripts/setup.sh
require_pg
cargo pgrx install --release --pg-config "$PG_CONFIG" >/dev/null
exec .venv/bin/python bench/bench.py "$@"
