# Shared paths and helpers for the scripts; sourced, not run.
PG_BIN=/usr/lib/postgresql/15/bin
PG_CONFIG="$PG_BIN/pg_config"

# Postgres refuses to run as root: run server commands as the postgres user when we are root.
as_server_user() {
    if [ "$(id -u)" = 0 ]; then
        sudo -u postgres -- "$@"
    else
        "$@"
    fi
}
