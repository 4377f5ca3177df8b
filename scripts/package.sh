#!/usr/bin/env bash
# Builds the Debian package of outbox_ext for the PostgreSQL major version chosen by PG
# (scripts/common.sh, default 15), from `cargo pgrx package`'s output:
#
#   target/packages/postgresql-PG-outbox-ext_VERSION_ARCH.deb   (e.g. PG=15 make package)
#
# It holds the library, the control file, the install script of this version and every
# upgrade script (sql/outbox_ext--A--B.sql), at the paths the version's pg_config reports:
#   15  Debian's server (/usr/lib/postgresql/15/lib, /usr/share/postgresql/15/extension);
#       Depends: postgresql-15
#   17, 18  the server built from source by scripts/build-postgres.sh under
#       /opt/outbox_ext/postgresql-NN (lib/, share/extension/); no Debian package provides that
#       server, so the package depends only on the libraries the extension links to
#   16  pgrx's own build of it (GitHub workflow), at the paths its pg_config reports
# Prints the package's path last. Install with `dpkg -i`, remove with `dpkg -r NAME`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
scripts/setup.sh
require_pg
install_debian_packages dpkg-dev binutils

version=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["packages"][0]["version"])')
arch=$(dpkg --print-architecture)
name="postgresql-$PG-outbox-ext"
out=target/packages
root="$out/build/$name"
deb="$out/${name}_${version}_${arch}.deb"
rm -rf "$root" "$deb"
mkdir -p "$root"

echo "package: cargo pgrx package for PostgreSQL $PG ($PG_CONFIG)"
cargo pgrx package --pg-config "$PG_CONFIG" --out-dir "$root" >/dev/null

# What pgrx laid out, checked against pg_config: the library and the extension's SQL files.
library="$root$PG_PKGLIBDIR/outbox_ext.so"
extension_dir="$root$PG_SHAREDIR/extension"
[ -f "$library" ] || { echo "package: no $library in cargo pgrx package's output" >&2; exit 1; }
for file in outbox_ext.control "outbox_ext--$version.sql" $(cd sql && ls outbox_ext--*--*.sql); do
    [ -f "$extension_dir/$file" ] || { echo "package: $file is missing from cargo pgrx package's output" >&2; exit 1; }
done
unexpected=$(cd "$root" && find . -type f | grep -v -e "^\.$PG_PKGLIBDIR/outbox_ext\.so$" -e "^\.$PG_SHAREDIR/extension/outbox_ext[.-]" || true)
[ -z "$unexpected" ] || { echo "package: unexpected files in cargo pgrx package's output: $unexpected" >&2; exit 1; }

# As Debian's packaging does (dh_strip): no debugging symbols or notes in the library.
strip --remove-section=.comment --remove-section=.note --strip-unneeded "$library"
find "$root" -type d -exec chmod 0755 {} +
find "$root" -type f -exec chmod 0644 {} +

# The shared libraries the extension links to, as package dependencies (dpkg-shlibdeps reads
# debian/control from the directory it runs in).
shlibs=$(
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    mkdir "$work/debian"
    printf 'Source: outbox-ext\n\nPackage: %s\nArchitecture: any\n' "$name" >"$work/debian/control"
    cd "$work" && dpkg-shlibdeps -O "$OLDPWD/$library" 2>/dev/null | sed -n 's/^shlibs:Depends=//p'
)
case "$PG" in
15) depends="postgresql-15, $shlibs" ;;
*) depends=$shlibs ;;
esac
case "$PG" in
15) server="For Debian's postgresql-15." ;;
*) server="For the PostgreSQL $PG installed under $("$PG_CONFIG" --bindir | sed 's|/bin$||') (the paths its pg_config reports); no Debian package provides that server." ;;
esac
# A long line of the description, folded as a control file wants it (a space before each line).
describe() { fold -s -w 74 <<<"$1" | sed 's/ *$//; s/^/ /'; }

mkdir -p "$root/DEBIAN"
cat >"$root/DEBIAN/control" <<CONTROL
Package: $name
Version: $version
Architecture: $arch
Maintainer: outbox_ext developers <outbox-ext@example.invalid>
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Depends: $depends
Section: database
Priority: optional
Description: transactional outbox for PostgreSQL $PG (outbox_ext $version)
$(describe "Enqueue messages in your transaction, claim them with SKIP LOCKED, retry with backoff, dead-letter, and deliver them as signed webhooks from a background worker (shared_preload_libraries = 'outbox_ext').")
 .
$(describe "$server The library, the control file, the install script of $version and every upgrade script: run CREATE EXTENSION outbox_ext, or ALTER EXTENSION outbox_ext UPDATE, after installing.")
CONTROL
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) >"$root/DEBIAN/md5sums"

dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "package: $(dpkg-deb -f "$deb" Package Version Depends | tr '\n' ' ')"
echo "$deb"
