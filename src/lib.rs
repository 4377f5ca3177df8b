//! outbox_ext: a transactional outbox inside PostgreSQL.
//!
//! This file only wires the modules together. The SQL API itself lives in `sql/*.sql`
//! (loaded by `api`); Rust supplies settings, the retry policy and message ids.

use pgrx::prelude::*;

mod api;
mod topic;
mod backoff;
mod errors;
mod settings;

::pgrx::pg_module_magic!(name, version);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    settings::register();
}

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
