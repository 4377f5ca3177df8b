#!/usr/bin/env bash
# The Debian package of `make package` (scripts/package.sh), for the PostgreSQL chosen by PG:
# its contents and control file; `dpkg -i` into the server's directories alone makes a working
# extension (CREATE EXTENSION, the delivery worker, enqueue, claim, complete in a scratch
# cluster); `dpkg -r` leaves none of its files behind.
#
# It removes the extension's files from the server's directories first (those `cargo pgrx
# install` put there), so run it where nothing else uses them: scripts/test.sh runs it last
# (step 6) and installs the extension again afterwards. Needs root (dpkg). The scratch cluster
# listens on 127.0.0.1:$OUTBOX_TEST_PORT (default 25329).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/common.sh
require_pg
[ "$(id -u)" = 0 ] || { echo "test_package.sh: dpkg needs root" >&2; exit 2; }

port=${OUTBOX_TEST_PORT:-25329}
passed=0
failed=0
what=""
check() { # check WHAT COMMAND...: one assertion
    if "$@"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "FAILED: $what" >&2
    fi
}
fail() { echo "test_package.sh: $*" >&2; exit 1; }

deb=$(scripts/package.sh | tail -n 1)
[ -f "$deb" ] || fail "scripts/package.sh made no package"
name=$(dpkg-deb -f "$deb" Package)
version=$(dpkg-deb -f "$deb" Version)

scratch=$(mktemp -d /tmp/outbox_ext-package.XXXXXX)
chown postgres: "$scratch"
cleanup() {
    scripts/cluster.sh stop "$scratch/cluster" >/dev/null 2>&1 || true
    if dpkg-query -W -f='${Status}' "$name" 2>/dev/null | grep -q installed; then dpkg -r "$name" >/dev/null || true; fi
    rm -rf "$scratch"
}
trap cleanup EXIT

# -- contents: the library, the control file, this version's install script, every upgrade
# script, at pg_config's paths, owned by root, and nothing else.
dpkg-deb -c "$deb" >"$scratch/contents"
files=$(awk '$1 !~ /^d/ {print $6}' "$scratch/contents" | sed 's|^\./|/|' | sort)
expected=$({
    echo "$PG_PKGLIBDIR/outbox_ext.so"
    echo "$PG_SHAREDIR/extension/outbox_ext.control"
    echo "$PG_SHAREDIR/extension/outbox_ext--$version.sql"
    for script in sql/outbox_ext--*--*.sql; do echo "$PG_SHAREDIR/extension/$(basename "$script")"; done
} | sort)
what="the package holds exactly the library, the control file and the SQL scripts" check [ "$files" = "$expected" ]
[ "$files" = "$expected" ] || diff <(echo "$expected") <(echo "$files") >&2 || true
what="every file is root's" check [ -z "$(awk '$2 != "root/root"' "$scratch/contents")" ]
for script in sql/outbox_ext--*--*.sql; do
    what="$(basename "$script") is packaged unchanged" check \
        cmp -s "$script" <(dpkg-deb --fsys-tarfile "$deb" | tar -xOf - ".$PG_SHAREDIR/extension/$(basename "$script")")
done
what="Package names the version" check [ "$name" = "postgresql-$PG-outbox-ext" ]
what="Version is Cargo.toml's" check grep -q "^version = \"$version\"" Cargo.toml
depends=$(dpkg-deb -f "$deb" Depends)
if [ "$PG" = 15 ]; then
    what="Depends on postgresql-15 ($depends)" check grep -Eq '(^|, )postgresql-15(,|$)' <<<"$depends"
else
    # shellcheck disable=SC2016 # $1 is the inner shell's
    what="no server package in Depends for a source-built PostgreSQL $PG ($depends)" check \
        bash -c '! grep -q postgresql <<<"$1"' _ "$depends"
fi
what="Depends on libc6" check grep -q 'libc6' <<<"$depends"

# -- install: only the package's files, none left by an earlier `cargo pgrx install`.
rm -f "$PG_PKGLIBDIR"/outbox_ext.so "$PG_SHAREDIR"/extension/outbox_ext.control "$PG_SHAREDIR"/extension/outbox_ext--*.sql
dpkg -i "$deb" >/dev/null
what="dpkg reports the package installed" check bash -c "dpkg-query -W -f='\${Status}' $name | grep -q 'install ok installed'"
for file in $files; do
    what="$file is installed" check [ -f "$file" ]
done

# -- use: a scratch cluster preloading the library (scripts/cluster.sh), the extension created,
# its delivery worker started, a message enqueued, claimed and completed.
scripts/cluster.sh start "$scratch/cluster" "$port"
psql() { "$PG_BIN/psql" -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres "$@"; }
psql -d postgres -c "CREATE DATABASE outbox_package"
psql -d outbox_package -c "CREATE EXTENSION outbox_ext"
what="the extension's version is $version" check \
    [ "$(psql -d outbox_package -c "SELECT extversion FROM pg_extension WHERE extname = 'outbox_ext'")" = "$version" ]
worker_state=""
for _ in $(seq 1 150); do
    worker_state=$(psql -d outbox_package -c "SELECT state FROM outbox_worker_status() WHERE database = current_database()")
    case "$worker_state" in idle | delivering) break ;; esac
    sleep 0.2
done
what="the delivery worker runs (state '$worker_state')" check grep -Eqx 'idle|delivering' <<<"$worker_state"
id=$(psql -d outbox_package -c "SELECT (outbox_enqueue('package.smoke', '{\"n\": 1}')).id")
completed=$(psql -d outbox_package -c \
    "SELECT outbox_complete(id, lease_token) FROM outbox_claim(1, ARRAY['package.smoke']) WHERE id = $id")
what="a message is enqueued, claimed and completed" check [ "$completed" = t ]
what="the message is DONE" check [ "$(psql -d outbox_package -c "SELECT status FROM outbox WHERE id = $id")" = DONE ]
scripts/cluster.sh stop "$scratch/cluster"

# -- remove: nothing of the package left behind, the server's directories still there (dpkg
# warns that it keeps them for a server no package installed, as for 18: not shown).
dpkg -r "$name" >/dev/null 2> >(grep -v "not empty so not removed" >&2)
what="dpkg reports the package removed" check bash -c "! dpkg-query -W -f='\${Status}' $name 2>/dev/null | grep -q 'ok installed'"
for file in $files; do
    what="$file is removed" check [ ! -e "$file" ]
done
what="no outbox_ext library is left in $PG_PKGLIBDIR" check \
    [ -z "$(find "$PG_PKGLIBDIR" -maxdepth 1 -name 'outbox_ext*')" ]
what="no outbox_ext control file or script is left in $PG_SHAREDIR/extension" check \
    [ -z "$(find "$PG_SHAREDIR/extension" -maxdepth 1 -name 'outbox_ext*')" ]
what="the server's directories remain" check test -d "$PG_PKGLIBDIR" -a -d "$PG_SHAREDIR/extension"

echo "package $(basename "$deb"):"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
