#!/usr/bin/env bash
# Builds PostgreSQL 18 (or 17) from Debian's source package and installs it, with what the tests
# need (the server headers and PGXS, pg_regress, pg_isolation_regress and isolationtester,
# pgbench, and the contrib modules btree_gist, amcheck and auto_explain), into
# $OUTBOX_PG_ROOT/postgresql-VERSION (default /opt/outbox_ext/postgresql-VERSION), outside the
# repository. Debian 12 ships only PostgreSQL 15's server: 17's source comes from trixie, 18's
# from sid, through deb-src entries in a sources file of its own. 17's cannot be had here as of
# 2026-11-30 (the registry lists postgresql-17 17.12 but answers 404 for its files): the build
# stops saying so, and the GitHub workflow has pgrx download 17 instead (docs/versions.md).
#
#   scripts/build-postgres.sh VERSION
#
# Idempotent: once a build has installed (its marker file, written last, names the version and
# the contrib modules) a second run does nothing; a build without one of the modules is redone.
# About 4.5 minutes on 2 cores (nice'd, make -j2); the build log is
# $OUTBOX_PG_ROOT/build/postgresql-VERSION.log, and its end is shown if a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: scripts/build-postgres.sh VERSION (17 or 18)}
case "$version" in
17) suite=trixie ;;
18) suite=sid ;;
15)
    echo "build-postgres.sh: PostgreSQL 15 comes from Debian 12's packages (PG=15 scripts/setup.sh), not from a source build" >&2
    exit 2
    ;;
16)
    echo "build-postgres.sh: PostgreSQL 16 is built only in the GitHub workflow (cargo pgrx init --pg16 download): Debian has no source package of it to build here" >&2
    exit 2
    ;;
*)
    echo "build-postgres.sh: PostgreSQL $version: no such version to build (17 or 18)" >&2
    exit 2
    ;;
esac
PG=$version
source scripts/common.sh

prefix="$OUTBOX_PG_ROOT/postgresql-$version"
marker="$prefix/.outbox_ext-installed"
contrib_modules="btree_gist amcheck auto_explain"
built() { [ "$(sed -n 2p "$marker" 2>/dev/null)" = "contrib: $contrib_modules" ] && load_pg_paths 2>/dev/null; }
built && exit 0

build_root="$OUTBOX_PG_ROOT/build"
work="$build_root/postgresql-$version"
log="$build_root/postgresql-$version.log"
mkdir -p "$build_root"
# One build of a version at a time (two sessions may run the scripts at once).
exec 9>"$build_root/postgresql-$version.lock"
flock 9
built && exit 0

# fail WHAT [LINES]: stops, naming the version and the step, with LINES or else the log's end.
fail() {
    echo "build-postgres.sh: PostgreSQL $version: $1 failed; from $log:" >&2
    if [ -n "${2:-}" ]; then echo "$2"; else tail -n 15 "$log"; fi | sed 's/^/  /' >&2
    exit 1
}
# step WHAT COMMAND...: runs the command quietly (into the log), stops with WHAT if it fails.
step() {
    local what=$1
    shift
    echo "== $what" >>"$log"
    "$@" >>"$log" 2>&1 </dev/null || fail "$what"
}

started=$(date +%s)
: >"$log"
echo "build-postgres.sh: building PostgreSQL $version from Debian's source package (log: $log)"

# The deb-src entries; apt-get update once when they are new.
sources=/etc/apt/sources.list.d/outbox-ext-postgres-src.sources
sources_text="# outbox_ext (scripts/build-postgres.sh): the source packages of PostgreSQL 17 (trixie)
# and 18 (sid), which it builds; no binary packages come from here.
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: trixie sid
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg"
if [ "$(cat "$sources" 2>/dev/null)" != "$sources_text" ]; then
    echo "$sources_text" >"$sources"
    step "apt-get update (with $sources)" apt-get update
fi

# Compiler and libraries: the minimal set for a server without LLVM, docs or extra libraries.
export DEBIAN_FRONTEND=noninteractive
build_packages=(gcc make perl bison flex bzip2 pkg-config libreadline-dev zlib1g-dev libicu-dev)
step "installing the build dependencies (${build_packages[*]})" install_debian_packages "${build_packages[@]}"

# The source package: the pristine upstream tarball (.orig.tar) is what gets built, without
# Debian's packaging patches (they move directories and sockets to Debian's layout).
download() {
    rm -rf "$work" && mkdir -p "$work" && cd "$work" &&
        apt-get source --download-only -t "$suite" "postgresql-$version" &&
        ls postgresql-"$version"_*.orig.tar.*
}
if ! (download >>"$log" 2>&1); then
    # The lists may be older than the archive (a newer upload replaced the file): refresh once.
    step "apt-get update" apt-get update
    if ! (download >>"$log" 2>&1); then
        if grep -q '404 *Not Found' "$log"; then
            fail "fetching the source package postgresql-$version (apt-get source, suite $suite)" \
                "Debian's registry lists postgresql-$version but cannot serve its source files (404 Not Found):
PostgreSQL $version cannot be built on this machine. It is tested in the GitHub workflow (pgrx
downloads it there); here use PG=15 or PG=18 (docs/versions.md).
$(grep '^E: ' "$log" | sort -u)"
        fi
        fail "fetching the source package postgresql-$version (apt-get source, suite $suite)" "$(grep '^E: ' "$log" | sort -u)"
    fi
fi
tarball=$(ls "$work"/postgresql-"$version"_*.orig.tar.*)
step "unpacking $(basename "$tarball")" tar -xf "$tarball" -C "$work"
source_dir=$(find "$work" -mindepth 1 -maxdepth 1 -type d -name "postgresql-$version*" | head -n 1)
[ -n "$source_dir" ] || fail "unpacking $(basename "$tarball") (no postgresql-$version* directory in it)"

# A half-finished earlier install is removed first; other versions' directories are untouched.
rm -rf "$prefix"
cd "$source_dir"
step "configure" nice -n 10 ./configure --prefix="$prefix" --without-llvm --with-icu
step "make" nice -n 10 make -j2
# install: server, client programs, headers, PGXS, and src/test/regress and src/test/isolation
# (pg_regress, pg_isolation_regress, isolationtester under lib/pgxs/src/test, as Debian's
# postgresql-server-dev packages have them).
step "make install" make install
for module in $contrib_modules; do
    step "contrib/$module" nice -n 10 make -j2 -C "contrib/$module" install
done
load_pg_paths >>"$log" 2>&1 || fail "checking the installed $prefix/bin/pg_config"
[ -x "$PG_PKGLIBDIR/pgxs/src/test/isolation/pg_isolation_regress" ] || fail "installing pg_isolation_regress"
{ "$PG_CONFIG" --version && echo "contrib: $contrib_modules"; } >"$marker"

cd /
rm -rf "$work"
echo "build-postgres.sh: installed $(head -n 1 "$marker") into $prefix in $(($(date +%s) - started)) s"
