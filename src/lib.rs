//! outbox_ext: a transactional outbox inside PostgreSQL.
//!
//! This file only wires the modules together. The SQL API itself lives in `sql/*.sql`
//! (loaded by `api`); Rust supplies settings, the retry policy and message ids, and the
//! optional delivery worker (`worker`, `delivery`).

use pgrx::prelude::*;

mod api;
mod backoff;
mod delivery;
mod hot_path;
mod errors;
mod settings;
mod subscriptions;
mod topic;
mod worker;

::pgrx::pg_module_magic!(name, version);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    let preloading = unsafe { pg_sys::process_shared_preload_libraries_in_progress };
    settings::register();
    settings::register_worker(preloading);
    // The delivery worker exists only with shared_preload_libraries = 'outbox_ext'; without
    // it the SQL API works the same and nothing is delivered over HTTP.
    if preloading {
        worker::registry::init();
        worker::register_background_workers();
    }
}

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
