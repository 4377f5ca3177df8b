//! Statements that need a database without connections (`DROP DATABASE`, `ALTER DATABASE …
//! RENAME` or `SET TABLESPACE`, `CREATE DATABASE … TEMPLATE`) would otherwise wait for, and then
//! fail because of, the database's delivery worker; `DROP EXTENSION outbox_ext` would meet the
//! worker's locks in the other order (a deadlock, which PostgreSQL breaks by failing one). A
//! utility hook, in every backend of a server that preloads the library, asks that worker to
//! leave first, keeps a new one away until the statement's transaction ends, and lets it back
//! then (if the database, or the extension, is still there).

use super::registry;
use crate::compat;
use pgrx::pg_sys;
use pgrx::{register_xact_callback, PgList, PgXactCallbackEvent};
use std::ffi::CStr;

static mut PREVIOUS: pg_sys::ProcessUtility_hook_type = None;

/// How long, at most, a paused database keeps its worker away (should the statement's backend
/// die before it lets the worker back).
const PAUSE_SECONDS: i64 = 60;

/// Installs the hook (while preloading).
pub fn install() {
    // SAFETY: runs in the postmaster while preloading, before any backend exists.
    unsafe {
        PREVIOUS = pg_sys::ProcessUtility_hook;
        pg_sys::ProcessUtility_hook = Some(process_utility);
    }
}

/// The databases (oids) `statement` needs without connections, of those the current role may
/// run it on. Whoever may not gets PostgreSQL's error after this hook: they must not stop a
/// worker on the way (a request in flight would be sent again).
unsafe fn databases_to_pause(statement: *mut pg_sys::Node) -> Vec<pg_sys::Oid> {
    // SAFETY: `statement` is a valid utility statement node; each branch reads the node type
    // its tag names.
    unsafe {
        let names: Vec<*const std::ffi::c_char> = match (*statement).type_ {
            pg_sys::NodeTag::T_DropdbStmt => vec![(*(statement as *mut pg_sys::DropdbStmt)).dbname],
            pg_sys::NodeTag::T_RenameStmt => {
                let rename = statement as *mut pg_sys::RenameStmt;
                if (*rename).renameType == pg_sys::ObjectType::OBJECT_DATABASE {
                    vec![(*rename).subname]
                } else {
                    vec![]
                }
            }
            pg_sys::NodeTag::T_AlterDatabaseStmt => {
                let alter = statement as *mut pg_sys::AlterDatabaseStmt;
                if option(&(*alter).options, "tablespace").is_some() {
                    vec![(*alter).dbname]
                } else {
                    vec![]
                }
            }
            pg_sys::NodeTag::T_CreatedbStmt => {
                let create = statement as *mut pg_sys::CreatedbStmt;
                // TEMPLATE DEFAULT names none: template1, as without the option (a template has no worker).
                match option(&(*create).options, "template") {
                    Some(element) if !(*element).arg.is_null() => vec![pg_sys::defGetString(element).cast_const()],
                    _ => vec![],
                }
            }
            pg_sys::NodeTag::T_DropStmt if drops_this_extension(statement as *mut pg_sys::DropStmt) => {
                let extension = pg_sys::get_extension_oid(c"outbox_ext".as_ptr(), true);
                if extension == pg_sys::InvalidOid || !compat::owns_extension(extension) {
                    return vec![];
                }
                return vec![crate::backend::database_id()];
            }
            _ => vec![],
        };
        names
            .into_iter()
            .filter(|name| !name.is_null())
            .map(|name| pg_sys::get_database_oid(name, true))
            // Dropping, renaming or moving a database takes its owner; so does copying one
            // that is not a template (a template has no worker to stop).
            .filter(|&oid| oid != pg_sys::InvalidOid && compat::owns_database(oid))
            .collect()
    }
}

/// Whether `drop` is `DROP EXTENSION … outbox_ext …`.
unsafe fn drops_this_extension(drop: *mut pg_sys::DropStmt) -> bool {
    // SAFETY: a DropStmt; for extensions its objects are String nodes (their names).
    unsafe {
        (*drop).removeType == pg_sys::ObjectType::OBJECT_EXTENSION
            && PgList::<pg_sys::Node>::from_pg((*drop).objects).iter_ptr().any(|object| {
                (*object).type_ == pg_sys::NodeTag::T_String
                    && !(*(object as *mut pg_sys::String)).sval.is_null()
                    && CStr::from_ptr((*(object as *mut pg_sys::String)).sval).to_bytes() == b"outbox_ext"
            })
    }
}

/// The option `name` of a statement's option list.
unsafe fn option(options: &*mut pg_sys::List, name: &str) -> Option<*mut pg_sys::DefElem> {
    // SAFETY: a List of DefElem nodes (or NIL).
    unsafe {
        PgList::<pg_sys::DefElem>::from_pg(*options)
            .iter_ptr()
            .find(|&element| !(*element).defname.is_null() && CStr::from_ptr((*element).defname).to_bytes() == name.as_bytes())
    }
}

#[pgrx::pg_guard]
#[allow(clippy::too_many_arguments)]
unsafe extern "C-unwind" fn process_utility(
    statement: *mut pg_sys::PlannedStmt,
    query: *const std::ffi::c_char,
    read_only_tree: bool,
    context: pg_sys::ProcessUtilityContext::Type,
    params: pg_sys::ParamListInfo,
    environment: *mut pg_sys::QueryEnvironment,
    destination: *mut pg_sys::DestReceiver,
    completion: *mut pg_sys::QueryCompletion,
) {
    // SAFETY: the arguments are PostgreSQL's, passed on unchanged.
    unsafe {
        let paused = databases_to_pause((*statement).utilityStmt);
        if !paused.is_empty() {
            // Let the worker back when the transaction ends, not when the statement does: the
            // launcher, woken at once, would still see the database under its old name (or at
            // all, after a DROP) and start a worker that fails to connect.
            for event in [PgXactCallbackEvent::Commit, PgXactCallbackEvent::Abort] {
                let paused = paused.clone();
                register_xact_callback(event, move || {
                    for &oid in &paused {
                        registry::resume(oid.to_u32());
                    }
                });
            }
        }
        for &oid in &paused {
            registry::pause(oid.to_u32(), PAUSE_SECONDS);
        }
        match PREVIOUS {
            Some(previous) => previous(statement, query, read_only_tree, context, params, environment, destination, completion),
            None => {
                pg_sys::standard_ProcessUtility(statement, query, read_only_tree, context, params, environment, destination, completion)
            }
        }
    }
}
