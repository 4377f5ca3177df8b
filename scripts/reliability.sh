#!/usr/bin/env bash
# The reliability suite (tests/reliability/run.py): faults, load and hostile input, with a
# table of what was lost (must be 0), duplicated, and how long recovery took. About 15 minutes;
# `scripts/reliability.sh --short` (part of the test command) takes about two.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
scripts/setup.sh
require_pg
cargo pgrx install --release --pg-config "$PG_CONFIG" >/dev/null
exec .venv/bin/python tests/reliability/run.py "$@"
