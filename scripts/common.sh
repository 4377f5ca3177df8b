# Shared paths and helpers for the scripts; sourced, not run.
PG_BIN=/usr/lib/postgresql/15/bin
PG_CONFIG="$PG_BIN/pg_config"
PGXS_DIR=/usr/lib/postgresql/15/lib/pgxs
ISOLATION_REGRESS="$PGXS_DIR/src/test/isolation/pg_isolation_regress"

# Postgres refuses to run as root: run server commands as the postgres user when we are root.
as_server_user() {
    if [ "$(id -u)" = 0 ]; then
        sudo -u postgres -- "$@"
    else
        "$@"
    fi
}
