//! What differs between the PostgreSQL versions outbox_ext supports (15 to 18), in one place.

/// Flags for a background worker's connection. From PostgreSQL 17 a worker may connect as a
/// role without LOGIN (the worker's role is NOLOGIN there); before, it may not (sql/privileges.sql
/// gives the role LOGIN on 15 and 16, without a password).
#[cfg(any(feature = "pg15", feature = "pg16"))]
pub const BGWORKER_CONNECT_FLAGS: u32 = 0;
#[cfg(not(any(feature = "pg15", feature = "pg16")))]
pub const BGWORKER_CONNECT_FLAGS: u32 = pgrx::pg_sys::BGWORKER_BYPASS_ROLELOGINCHECK;

/// `ExecInsertIndexTuples` for a speculative insert (`noDupErr`): `conflict` tells whether an
/// arbiter index found the key taken. PostgreSQL 16 added `onlySummarizing`.
///
/// # Safety
/// As `ExecInsertIndexTuples`: the slot holds a row just inserted into `target`'s relation, whose
/// indexes are open.
pub unsafe fn insert_index_tuples_speculatively(
    target: *mut pgrx::pg_sys::ResultRelInfo,
    slot: *mut pgrx::pg_sys::TupleTableSlot,
    estate: *mut pgrx::pg_sys::EState,
    conflict: &mut bool,
    arbiters: *mut pgrx::pg_sys::List,
) {
    #[cfg(feature = "pg15")]
    pgrx::pg_sys::ExecInsertIndexTuples(target, slot, estate, false, true, conflict, arbiters);
    #[cfg(not(feature = "pg15"))]
    pgrx::pg_sys::ExecInsertIndexTuples(target, slot, estate, false, true, conflict, arbiters, false);
}

/// `ExecCheckIndexConstraints` for a row not written yet (ON CONFLICT's pre-check): false when
/// an arbiter index has the key. PostgreSQL 18 added `tupleid`, a row to leave out (none here).
///
/// # Safety
/// As `ExecCheckIndexConstraints`: `target`'s indexes are open, the arbiters with what a
/// speculative insert needs (`BuildSpeculativeIndexInfo`).
pub unsafe fn index_constraints_hold(
    target: *mut pgrx::pg_sys::ResultRelInfo,
    slot: *mut pgrx::pg_sys::TupleTableSlot,
    estate: *mut pgrx::pg_sys::EState,
    arbiters: *mut pgrx::pg_sys::List,
) -> bool {
    let mut conflict = pgrx::pg_sys::ItemPointerData::default();
    #[cfg(not(feature = "pg18"))]
    return pgrx::pg_sys::ExecCheckIndexConstraints(target, slot, estate, &mut conflict, arbiters);
    #[cfg(feature = "pg18")]
    return pgrx::pg_sys::ExecCheckIndexConstraints(target, slot, estate, &mut conflict, std::ptr::null_mut(), arbiters);
}

/// Whether the current role owns database `oid` (or is a superuser): PostgreSQL 16 replaced the
/// per-kind ownership checks with `object_ownercheck`.
pub fn owns_database(oid: pgrx::pg_sys::Oid) -> bool {
    // SAFETY: catalog lookups by oid, in a transaction.
    unsafe {
        #[cfg(feature = "pg15")]
        return pgrx::pg_sys::pg_database_ownercheck(oid, pgrx::pg_sys::GetUserId());
        #[cfg(not(feature = "pg15"))]
        return pgrx::pg_sys::object_ownercheck(pgrx::pg_sys::DatabaseRelationId, oid, pgrx::pg_sys::GetUserId());
    }
}

/// Whether the current role owns extension `oid` (or is a superuser).
pub fn owns_extension(oid: pgrx::pg_sys::Oid) -> bool {
    // SAFETY: catalog lookups by oid, in a transaction.
    unsafe {
        #[cfg(feature = "pg15")]
        return pgrx::pg_sys::pg_extension_ownercheck(oid, pgrx::pg_sys::GetUserId());
        #[cfg(not(feature = "pg15"))]
        return pgrx::pg_sys::object_ownercheck(pgrx::pg_sys::ExtensionRelationId, oid, pgrx::pg_sys::GetUserId());
    }
}
