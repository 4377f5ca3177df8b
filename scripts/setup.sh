#!/usr/bin/env bash
# Installs what building, testing and benchmarking outbox_ext needs on Debian 12, and nothing
# twice: Debian packages, cargo-pgrx 0.18.0 (pinned to match pgrx), pgrx's view of
# PostgreSQL 15, and a Python virtualenv with the tests' and the benchmark's pinned libraries.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

need_packages=()
# nginx and wrk: the benchmark's receiver and HTTP load generator (its smoke run is a test).
for package in postgresql-15 postgresql-server-dev-15 libclang-dev sudo nginx-light wrk; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || need_packages+=("$package")
done
python3 -c 'import venv, ensurepip' 2>/dev/null || need_packages+=(python3-venv)
if [ ${#need_packages[@]} -gt 0 ]; then
    echo "setup: installing Debian packages: ${need_packages[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_packages[@]}" >/dev/null
fi

if ! cargo pgrx --version 2>/dev/null | grep -q "0.18.0"; then
    echo "setup: installing cargo-pgrx 0.18.0 (takes several minutes)"
    cargo install cargo-pgrx --version 0.18.0 --locked
fi

# Point pgrx at the installed server; never a bare `cargo pgrx init`, which downloads sources.
if ! grep -qs "pg15" "${PGRX_HOME:-$HOME/.pgrx}/config.toml"; then
    cargo pgrx init --pg15 "$PG_BIN/pg_config"
fi

requirements=$(cat tests/requirements.txt bench/requirements.txt)
if [ ! -x .venv/bin/pytest ] || [ "$requirements" != "$(cat .venv/requirements.txt 2>/dev/null)" ]; then
    echo "setup: creating .venv for the tests and the benchmark"
    python3 -m venv .venv
    .venv/bin/pip install --quiet --disable-pip-version-check -r tests/requirements.txt -r bench/requirements.txt
    echo "$requirements" >.venv/requirements.txt
fi
