//! The plain enqueue (no `dedupe_key`, no `ordering_key`) writes its row without a plan, the way
//! logical replication's apply worker writes the rows it receives (`ExecSimpleRelationInsert`):
//! the table's own column defaults, NOT NULL checks and indexes, without a statement's executor
//! start and end around one row. With a kept SPI plan instead, an enqueue did 0.82 of the
//! essay's hand-written INSERT; this way, 0.96 – 1.10 in three runs (`bench/README.md`, 0.5.8).
//!
//! Two things PostgreSQL would otherwise parse and compile again for every row are kept for
//! the session: the column defaults (from `pg_attrdef`'s text), planned, and the predicates of
//! the partial indexes, compiled. They are dropped whenever the relcache says the table or one
//! of its indexes changed (`ALTER TABLE … SET DEFAULT`, `CREATE INDEX`, and vacuum's statistics
//! too, which is rare enough) and, as the plan cache does, whenever a function or a type
//! changes. A table with triggers or row-level security is written with the INSERT statement
//! instead, so that they act as for any INSERT.

use pgrx::pg_sys;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

/// What is kept for the session, in its own memory context.
struct Kept {
    context: pg_sys::MemoryContext,
    /// Column number → its default, planned.
    defaults: HashMap<i16, *mut pg_sys::Expr>,
    /// Partial index → its predicate, compiled.
    predicates: HashMap<pg_sys::Oid, *mut pg_sys::ExprState>,
}

thread_local! {
    static KEPT: RefCell<Option<Kept>> = const { RefCell::new(None) };
    /// The table and its indexes, whose relcache invalidations make what is kept stale.
    static WATCHED: RefCell<Vec<pg_sys::Oid>> = const { RefCell::new(Vec::new()) };
    /// Set by the relcache callback. What is kept is dropped before its next use, never while a
    /// row is being written with it.
    static STALE: Cell<bool> = const { Cell::new(false) };
}

/// Writes a message's row into `schema.outbox` with these columns (by name) and the table's
/// defaults for the others, and returns the whole row in the caller's memory context. `None`
/// when the table has triggers or row-level security: the caller runs the INSERT statement.
pub fn insert(schema: pg_sys::Oid, columns: &[(&str, pg_sys::Datum)]) -> Option<pg_sys::Datum> {
    // SAFETY: called from a SQL function, in a transaction; every pointer below comes from
    // PostgreSQL for the relation opened here and stays valid until it is closed.
    unsafe {
        let relation_id = pg_sys::get_relname_relid(c"outbox".as_ptr(), schema);
        let relation = pg_sys::table_open(relation_id, pg_sys::RowExclusiveLock as i32);
        if !(*relation).trigdesc.is_null() || (*(*relation).rd_rel).relrowsecurity {
            pg_sys::table_close(relation, pg_sys::NoLock as i32);
            return None;
        }
        // As SPI does before each statement: this row is written by a command of its own.
        pg_sys::CommandCounterIncrement();
        let estate = pg_sys::CreateExecutorState();
        let caller_context = pg_sys::MemoryContextSwitchTo((*estate).es_query_cxt);
        let target = pg_sys::palloc0(std::mem::size_of::<pg_sys::ResultRelInfo>()).cast::<pg_sys::ResultRelInfo>();
        (*target).type_ = pg_sys::NodeTag::T_ResultRelInfo;
        pg_sys::InitResultRelInfo(target, relation, 0, std::ptr::null_mut(), 0);
        (*estate).es_output_cid = pg_sys::GetCurrentCommandId(true);
        pg_sys::ExecOpenIndices(target, false);
        // (The locks are taken: the invalidations that came before them have been read.)
        KEPT.with(|kept| {
            let mut kept = kept.borrow_mut();
            let kept = current(&mut kept, relations(relation, target));
            use_kept_predicates(target, kept);
            let slot = row_slot(estate, relation, kept, columns);
            pg_sys::ExecSimpleRelationInsert(target, estate, slot);
            pg_sys::MemoryContextSwitchTo(caller_context);
            let row = pg_sys::ExecFetchSlotHeapTupleDatum(slot);
            pg_sys::ExecCloseIndices(target);
            pg_sys::ExecResetTupleTable((*estate).es_tupleTable, false);
            pg_sys::FreeExecutorState(estate);
            pg_sys::table_close(relation, pg_sys::NoLock as i32);
            Some(row)
        })
    }
}

/// The table and its indexes (opened in `target`).
unsafe fn relations(relation: pg_sys::Relation, target: *mut pg_sys::ResultRelInfo) -> Vec<pg_sys::Oid> {
    let indexes = (0..(*target).ri_NumIndices as usize).map(|n| (**(*target).ri_IndexRelationDescs.add(n)).rd_id);
    std::iter::once((*relation).rd_id).chain(indexes).collect()
}

/// What is kept, for these relations: emptied first when it is stale or was kept for others.
unsafe fn current(kept: &mut Option<Kept>, relations: Vec<pg_sys::Oid>) -> &mut Kept {
    let same_relations = WATCHED.with(|watched| *watched.borrow() == relations);
    if kept.is_none() || STALE.get() || !same_relations {
        // (Once per process: a callback lives as long as the process.)
        thread_local!(static REGISTERED: Cell<bool> = const { Cell::new(false) });
        if !REGISTERED.replace(true) {
            pg_sys::CacheRegisterRelcacheCallback(Some(relation_changed), pg_sys::Datum::from(0));
            // Planning a default fills in its functions' default arguments and inlines SQL
            // functions: as PostgreSQL's plan cache does, forget it when any function or type
            // changes.
            for catalog in [pg_sys::SysCacheIdentifier::PROCOID, pg_sys::SysCacheIdentifier::TYPEOID] {
                pg_sys::CacheRegisterSyscacheCallback(catalog as i32, Some(catalog_changed), pg_sys::Datum::from(0));
            }
        }
        let context = match kept.take() {
            Some(old) => {
                pg_sys::MemoryContextReset(old.context);
                old.context
            }
            None => pg_sys::AllocSetContextCreateInternal(
                pg_sys::TopMemoryContext,
                c"outbox_ext enqueue".as_ptr(),
                pg_sys::ALLOCSET_SMALL_MINSIZE as usize,
                pg_sys::ALLOCSET_SMALL_INITSIZE as usize,
                pg_sys::ALLOCSET_SMALL_MAXSIZE as usize,
            ),
        };
        WATCHED.with(|watched| *watched.borrow_mut() = relations);
        STALE.set(false);
        *kept = Some(Kept { context, defaults: HashMap::new(), predicates: HashMap::new() });
    }
    kept.as_mut().expect("set above")
}

/// Gives each partial index of `target` its kept, compiled predicate (ExecInsertIndexTuples
/// compiles the ones it is not given, for every statement).
unsafe fn use_kept_predicates(target: *mut pg_sys::ResultRelInfo, kept: &mut Kept) {
    for n in 0..(*target).ri_NumIndices as usize {
        let info = *(*target).ri_IndexRelationInfo.add(n);
        if (*info).ii_Predicate.is_null() {
            continue;
        }
        let index_id = (**(*target).ri_IndexRelationDescs.add(n)).rd_id;
        let context = kept.context;
        (*info).ii_PredicateState = *kept.predicates.entry(index_id).or_insert_with(|| {
            let previous = pg_sys::MemoryContextSwitchTo(context);
            let planned = pg_sys::expression_planner((*info).ii_Predicate.cast());
            let compiled = pg_sys::ExecInitQual(planned.cast(), std::ptr::null_mut());
            pg_sys::MemoryContextSwitchTo(previous);
            compiled
        });
    }
}

/// The row to write: `columns` by name, the other columns' defaults evaluated, NULL for the rest.
unsafe fn row_slot(
    estate: *mut pg_sys::EState,
    relation: pg_sys::Relation,
    kept: &mut Kept,
    columns: &[(&str, pg_sys::Datum)],
) -> *mut pg_sys::TupleTableSlot {
    let descriptor = (*relation).rd_att;
    let slot = pg_sys::ExecInitExtraTupleSlot(estate, descriptor, &pg_sys::TTSOpsVirtual);
    let attributes = pgrx::PgTupleDesc::from_pg_unchecked(descriptor);
    let count = attributes.len();
    let values = std::slice::from_raw_parts_mut((*slot).tts_values, count);
    let nulls = std::slice::from_raw_parts_mut((*slot).tts_isnull, count);
    let constraints = (*descriptor).constr;
    let defaults: &[pg_sys::AttrDefault] = if constraints.is_null() || (*constraints).num_defval == 0 {
        &[]
    } else {
        std::slice::from_raw_parts((*constraints).defval, (*constraints).num_defval as usize)
    };
    let econtext = pg_sys::MakePerTupleExprContext(estate);
    for (n, attribute) in attributes.iter().enumerate() {
        values[n] = pg_sys::Datum::from(0);
        nulls[n] = true;
        if attribute.attisdropped {
            continue;
        }
        let name = std::ffi::CStr::from_ptr(attribute.attname.data.as_ptr()).to_bytes();
        if let Some((_, value)) = columns.iter().find(|(column, _)| column.as_bytes() == name) {
            values[n] = *value;
            nulls[n] = false;
        } else if let Some(default) = defaults.iter().find(|d| d.adnum as usize == n + 1) {
            let context = kept.context;
            let planned = *kept.defaults.entry(default.adnum).or_insert_with(|| {
                let previous = pg_sys::MemoryContextSwitchTo(context);
                let planned = pg_sys::expression_planner(pg_sys::stringToNode(default.adbin).cast());
                pg_sys::MemoryContextSwitchTo(previous);
                planned
            });
            let compiled = pg_sys::ExecInitExpr(planned, std::ptr::null_mut());
            values[n] = pg_sys::ExecEvalExprSwitchContext(compiled, econtext, &mut nulls[n]);
        }
    }
    pg_sys::ExecStoreVirtualTuple(slot);
    slot
}

/// The syscache callback: a function or a type changed.
unsafe extern "C-unwind" fn catalog_changed(_argument: pg_sys::Datum, _catalog: std::ffi::c_int, _hash: u32) {
    STALE.set(true);
}

/// The relcache callback: `relation` changed (`InvalidOid`: any may have). It runs while other
/// code may be reading the relcache, so it only marks what is kept as stale.
unsafe extern "C-unwind" fn relation_changed(_argument: pg_sys::Datum, relation: pg_sys::Oid) {
    let concerned =
        relation == pg_sys::InvalidOid || WATCHED.with(|watched| watched.try_borrow().map_or(true, |watched| watched.contains(&relation)));
    if concerned {
        STALE.set(true);
    }
}
