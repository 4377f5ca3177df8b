//! outbox_ext: a transactional outbox inside PostgreSQL.
//!
//! This file only wires the modules together. They follow a message's life:
//!
//! - `enqueue`, `claim`, `complete`, `fail`: the SQL API of each stage, each module with the
//!   statements it runs beside it (`*.sql`);
//! - `policy`: the one place that decides retries, the attempt limit and dead letters;
//! - `worker` and `webhook`: the background worker that sends messages to HTTP endpoints;
//! - `subscriptions`, `topic`: what an endpoint and a topic may look like;
//! - `spi`, `fmgr`, `text`, `interval`, `error`, `settings`, `compat`: the plumbing every
//!   stage shares.
//!
//! The schema and the SQL declarations are in `sql/` (loaded below, in order).

use pgrx::prelude::*;

mod array;
mod backend;
mod claim;
mod compat;
mod complete;
mod enqueue;
mod error;
mod fail;
mod fmgr;
mod history;
mod interval;
mod ordering;
mod pg_tests;
mod policy;
mod settings;
mod spi;
mod subscriptions;
mod text;
mod topic;
mod webhook;
mod worker;

::pgrx::pg_module_magic!(name, version);

extension_sql_file!("../sql/helpers.sql", name = "outbox_helpers");
extension_sql_file!("../sql/schema.sql", name = "outbox_schema", requires = ["outbox_helpers"]);
extension_sql_file!("../sql/api.sql", name = "outbox_api", requires = ["outbox_schema"]);
extension_sql_file!("../sql/subscriptions.sql", name = "outbox_subscriptions", requires = ["outbox_api"]);
extension_sql_file!("../sql/operations.sql", name = "outbox_operations", requires = ["outbox_subscriptions"]);
extension_sql_file!("../sql/privileges.sql", name = "outbox_privileges", finalize);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    // Errors raised in (or through) Rust must never carry a Rust backtrace to a client, even
    // when the server runs with RUST_BACKTRACE set: RUST_LIB_BACKTRACE=0 turns capturing off
    // for std::backtrace, which pgrx's panic handling uses. Set while the process has one
    // thread (the postmaster preloading us, or a backend loading us).
    // SAFETY: no other thread reads the environment at this point.
    unsafe { std::env::set_var("RUST_LIB_BACKTRACE", "0") };
    // SAFETY: reads a postmaster global.
    let preloading = unsafe { pg_sys::process_shared_preload_libraries_in_progress };
    settings::register();
    settings::register_worker(preloading);
    // The delivery worker exists only with shared_preload_libraries = 'outbox_ext'; without
    // it the SQL API works the same and nothing is delivered over HTTP.
    if preloading {
        settings::reserve_the_prefix();
        worker::registry::init();
        worker::launcher::register();
        worker::hooks::install();
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
