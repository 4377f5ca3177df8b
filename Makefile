# The README's commands. Each installs what it needs first (scripts/setup.sh).
# PG chooses the PostgreSQL major version, 15 by default (scripts/common.sh): `PG=17 make test`
# or `make test PG=17`; make hands it to the scripts in their environment either way.
.PHONY: demo test setup bench reliability package install

demo:
	scripts/demo.sh

test:
	scripts/test.sh

setup:
	scripts/setup.sh

bench:
	bench/run.sh

reliability:
	scripts/reliability.sh

# The Debian package for PG's version: target/packages/postgresql-PG-outbox-ext_VERSION_ARCH.deb
# (scripts/package.sh; docs/versions.md).
package:
	scripts/package.sh

# Builds outbox_ext (release) and installs it into PG's server: `PG=18 make install`
# (cargo pgrx install --release --pg-config PG's pg_config; docs/versions.md).
install:
	scripts/setup.sh
	bash -c 'source scripts/common.sh && require_pg && cargo pgrx install --release --pg-config "$$PG_CONFIG"'
