//! A claim in a SERIALIZABLE transaction. PostgreSQL's serializable isolation records what
//! each transaction read as predicate locks, kept after its commit for as long as an older
//! serializable transaction that writes is open. A claim reads the ready queue from a little
//! before its head (head.rs): a dozen index pages, each a predicate lock. With one such
//! transaction open for a second, a consumer's claims filled the shared table of predicate
//! locks in about 1,000 transactions, and every claim then failed with 53200 "out of shared
//! memory" until that transaction ended; raising max_pred_locks_per_transaction barely helped
//! (stop 58's probe of isolation levels).
//!
//! So a serializable claim takes one predicate lock on the ready index instead of one per page,
//! as PostgreSQL itself does for a scan that reads a large part of an index. A lock
//! coarser than needed is always safe: at worst it reports a conflict where there was none
//! (40001, which a serializable client retries), never misses one.

use pgrx::pg_sys;

unsafe extern "C-unwind" {
    // storage/predicate.h (pgrx does not bind it): a predicate lock on the whole relation, if
    // the transaction is serializable and the snapshot needs one (else nothing). Called
    // through pg_guard_ffi_boundary: it may raise an ERROR.
    fn PredicateLockRelation(relation: pg_sys::Relation, snapshot: pg_sys::Snapshot);
}

/// Whether the caller's transaction is SERIALIZABLE.
fn is_serializable() -> bool {
    // SAFETY: XactIsoLevel is this backend's.
    unsafe { pg_sys::XactIsoLevel == pg_sys::XACT_SERIALIZABLE as i32 }
}

/// In a SERIALIZABLE transaction, one predicate lock on `outbox_ready_idx` (in `schema`), the
/// index a claim walks, before the claim reads it; nothing otherwise.
pub fn lock_the_ready_index_whole(schema: pg_sys::Oid) {
    if !is_serializable() {
        return;
    }
    // SAFETY: in a transaction (a function call); the index is opened with the lock a scan
    // takes on it anyway, kept to the transaction's end (closed with NoLock).
    unsafe {
        let index = pg_sys::get_relname_relid(c"outbox_ready_idx".as_ptr(), schema);
        if index == pg_sys::InvalidOid {
            return;
        }
        let snapshot = pg_sys::GetTransactionSnapshot();
        let relation = pg_sys::index_open(index, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        pg_sys::ffi::pg_guard_ffi_boundary(|| PredicateLockRelation(relation, snapshot));
        pg_sys::index_close(relation, pg_sys::NoLock as pg_sys::LOCKMODE);
    }
}
