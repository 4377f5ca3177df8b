# Shared settings and helpers for the scripts; sourced, not run.
#
# PG chooses the PostgreSQL major version (default 15), e.g. `PG=18 make test`
# (docs/versions.md):
#   15  Debian 12's packages (/usr/lib/postgresql/15)
#   16  only in the GitHub workflow, where pgrx downloads and builds it (cargo pgrx init --pg16
#       download); used wherever pgrx already has a pg16 in its config.toml
#   17  in the GitHub workflow likewise (cargo pgrx init --pg17 download, pgrx's config.toml);
#       elsewhere built from Debian's source package like 18, which fails while the registry
#       lists trixie's postgresql-17 but cannot serve its files (so here as of 2026-11-30)
#   18  built from Debian's source package (sid) by scripts/build-postgres.sh into
#       $OUTBOX_PG_ROOT/postgresql-18 (default /opt/outbox_ext/postgresql-18)
# PG_CONFIG, PG_BIN, PG_PKGLIBDIR and PG_SHAREDIR come from that version's pg_config and are
# exported as OUTBOX_PG, OUTBOX_PG_CONFIG, OUTBOX_PG_BIN, OUTBOX_PG_PKGLIBDIR and
# OUTBOX_PG_SHAREDIR for the Python tests and the benchmark. Before scripts/setup.sh has
# installed the version, PG_CONFIG is set but the directories are empty.
PG=${PG:-15}
case "$PG" in
15 | 16 | 17 | 18) ;;
*)
    echo "PG=$PG: unsupported PostgreSQL major version (choose 15, 16, 17 or 18)" >&2
    return 2
    ;;
esac
OUTBOX_PG_ROOT=${OUTBOX_PG_ROOT:-/opt/outbox_ext}
PGRX_CONFIG_TOML="${PGRX_HOME:-$HOME/.pgrx}/config.toml"

# A value from pgrx's config.toml, e.g. `pgrx_config configs pg16` (the pg_config it uses for
# PostgreSQL 16) or `pgrx_config base_port`; empty if it has none.
pgrx_config() {
    [ -f "$PGRX_CONFIG_TOML" ] || return 0
    python3 - "$PGRX_CONFIG_TOML" "$@" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    value = tomllib.load(f)
for key in sys.argv[2:]:
    value = value.get(key, "") if isinstance(value, dict) else ""
print(value)
PY
}

case "$PG" in
# OUTBOX_PG15_CONFIG: another PostgreSQL 15 (the pg_upgrade test unpacks Debian's previous
# release of 15 and runs a cluster of it).
15) PG_CONFIG=${OUTBOX_PG15_CONFIG:-/usr/lib/postgresql/15/bin/pg_config} ;;
16) PG_CONFIG=$(pgrx_config configs pg16) ;;
17)
    # pgrx's download where it has one (the GitHub workflow), else the source build.
    PG_CONFIG=$(pgrx_config configs pg17)
    case "$PG_CONFIG" in
    "" | "$OUTBOX_PG_ROOT"/*) PG_CONFIG="$OUTBOX_PG_ROOT/postgresql-$PG/bin/pg_config" ;;
    esac
    ;;
*) PG_CONFIG="$OUTBOX_PG_ROOT/postgresql-$PG/bin/pg_config" ;;
esac
# Whether pgrx downloads and builds PG's version here: 16 always, 17 in the GitHub workflow
# (Debian's source package of 17 cannot be had).
pgrx_downloads() {
    [ "$PG" = 16 ] || { [ "$PG" = 17 ] && [ "${GITHUB_ACTIONS:-}" = true ]; }
}

# Fills PG_BIN, PG_PKGLIBDIR and PG_SHAREDIR from PG_CONFIG; fails if it is not installed or
# is another major version.
load_pg_paths() {
    local version
    if [ -z "$PG_CONFIG" ] || ! version=$("$PG_CONFIG" --version 2>/dev/null); then
        return 1
    fi
    case "$version" in
    "PostgreSQL $PG."* | "PostgreSQL ${PG}beta"* | "PostgreSQL ${PG}rc"*) ;;
    *)
        echo "$PG_CONFIG is $version, not PostgreSQL $PG" >&2
        return 1
        ;;
    esac
    PG_BIN=$("$PG_CONFIG" --bindir)
    PG_PKGLIBDIR=$("$PG_CONFIG" --pkglibdir)
    PG_SHAREDIR=$("$PG_CONFIG" --sharedir)
    export OUTBOX_PG_BIN="$PG_BIN" OUTBOX_PG_PKGLIBDIR="$PG_PKGLIBDIR" OUTBOX_PG_SHAREDIR="$PG_SHAREDIR"
}

# For the scripts that need the server: stops with a hint if PG's version is not installed.
require_pg() {
    if ! load_pg_paths; then
        echo "PostgreSQL $PG is not installed (no working ${PG_CONFIG:-pg_config}): run PG=$PG scripts/setup.sh" >&2
        exit 1
    fi
}

PG_BIN= PG_PKGLIBDIR= PG_SHAREDIR=
load_pg_paths 2>/dev/null || true
export PG OUTBOX_PG="$PG" OUTBOX_PG_CONFIG="$PG_CONFIG"

# Postgres refuses to run as root: run server commands as the postgres user when we are root.
as_server_user() {
    if [ "$(id -u)" = 0 ]; then
        sudo -u postgres -- "$@"
    else
        "$@"
    fi
}

# Installs the Debian packages given that are not installed yet (apt-get update first).
install_debian_packages() {
    local package missing=()
    for package in "$@"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
    done
    [ ${#missing[@]} -gt 0 ] || return 0
    echo "setup: installing Debian packages: ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
