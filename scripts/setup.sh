#!/usr/bin/env bash
# Installs what building, testing and benchmarking outbox_ext needs on Debian 12, and nothing
# twice: Debian packages, the PostgreSQL version chosen by PG (default 15; see
# scripts/common.sh), cargo-pgrx 0.18.0 (pinned to match pgrx), pgrx's view of that version,
# and a Python virtualenv with the tests' and the benchmark's pinned libraries.
#   PG=15  Debian 12's postgresql-15 packages
#   PG=18  built from Debian's source package (scripts/build-postgres.sh, ~4.5 minutes once)
#   PG=17  likewise, but Debian's registry cannot serve its source files (as of 2026-11-30):
#          the build stops with that message; the GitHub workflow has pgrx download it
#   PG=16  only in the GitHub workflow, where pgrx downloads and builds it
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

# PostgreSQL's own build dependencies, for 16 and 17 built by pgrx (GitHub workflow; built from
# Debian's sources: scripts/build-postgres.sh).
postgres_build_packages=(gcc make perl bison flex bzip2 pkg-config libreadline-dev zlib1g-dev libicu-dev)

if [ "$PG" = 16 ] && [ -z "$PG_CONFIG" ] && [ "${GITHUB_ACTIONS:-}" != true ]; then
    echo "setup: PostgreSQL 16 is built only in the GitHub workflow (cargo pgrx init --pg16 download):" \
        "Debian has no package or source package of it for this machine. Use PG=15, PG=17 or PG=18 here." >&2
    exit 2
fi

# nginx and wrk: the benchmark's receiver and HTTP load generator (its smoke run is a test);
# gdb: tests that stop a server process at a breakpoint to place a commit in a race's instant
# (tests/support, PausedAt).
packages=(libclang-dev sudo nginx-light wrk gdb)
case "$PG" in
15) packages+=(postgresql-15 postgresql-server-dev-15) ;;
16 | 17) ! pgrx_downloads || [ -x "$PG_CONFIG" ] || packages+=("${postgres_build_packages[@]}") ;;
esac
python3 -c 'import venv, ensurepip' 2>/dev/null || packages+=(python3-venv)
install_debian_packages "${packages[@]}"

if [ "$PG" = 18 ] || { [ "$PG" = 17 ] && ! pgrx_downloads; }; then
    scripts/build-postgres.sh "$PG"
fi

# The server runs as postgres (it refuses root); Debian's packages create the user, a source
# build does not.
if ! id postgres >/dev/null 2>&1; then
    echo "setup: creating the system user postgres"
    useradd --system --user-group --home-dir /var/lib/postgresql --create-home --shell /bin/bash postgres
fi

if ! cargo pgrx --version 2>/dev/null | grep -q "0.18.0"; then
    echo "setup: installing cargo-pgrx 0.18.0 (takes several minutes)"
    cargo install cargo-pgrx --version 0.18.0 --locked
fi

# Point pgrx at the version's pg_config. Never a bare `cargo pgrx init`, which downloads and
# builds every version. `cargo pgrx init --pgNN PATH` adds or replaces that one entry of
# config.toml and keeps the other versions, but resets base_port and base_testing_port to
# pgrx's defaults unless given again: they are passed through. As root it runs no initdb.
init_options=()
for setting in base_port base_testing_port; do
    value=$(pgrx_config "$setting")
    [ -z "$value" ] || init_options+=("--${setting//_/-}" "$value")
done
if pgrx_downloads && ! [ -x "$PG_CONFIG" ]; then
    echo "setup: pgrx downloads and builds PostgreSQL $PG (GitHub workflow; takes several minutes)"
    cargo pgrx init "--pg$PG" download "${init_options[@]}"
    PG_CONFIG=$(pgrx_config configs "pg$PG")
fi
if ! load_pg_paths; then
    echo "setup: PostgreSQL $PG is not usable: ${PG_CONFIG:-no pg_config} does not work" >&2
    exit 1
fi
if [ "$(pgrx_config configs "pg$PG")" != "$PG_CONFIG" ]; then
    echo "setup: registering PostgreSQL $PG ($PG_CONFIG) with pgrx"
    cargo pgrx init "--pg$PG" "$PG_CONFIG" "${init_options[@]}" >/dev/null
fi

requirements=$(cat tests/requirements.txt bench/requirements.txt)
if [ ! -x .venv/bin/pytest ] || [ "$requirements" != "$(cat .venv/requirements.txt 2>/dev/null)" ]; then
    echo "setup: creating .venv for the tests and the benchmark"
    python3 -m venv .venv
    .venv/bin/pip install --quiet --disable-pip-version-check -r tests/requirements.txt -r bench/requirements.txt
    echo "$requirements" >.venv/requirements.txt
fi
