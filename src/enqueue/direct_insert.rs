//! An enqueue without a `dedupe_key` writes its row without a plan, the way logical replication's
//! apply worker writes the rows it receives (`ExecSimpleRelationInsert`): the table's own column
//! defaults, NOT NULL checks and indexes, without a statement's executor start and end around
//! one row. With a kept SPI plan instead, an enqueue did 0.82 of the essay's hand-written INSERT;
//! this way, 0.96 – 1.10 in three runs (`bench/README.md`, 0.5.8).
//!
//! With an `ordering_key` (0.5.9) it does what insert_keyed.sql does under READ COMMITTED: the
//! producer holds the key, looks for the key's head with a snapshot taken then, and writes the
//! message behind the head, or as the head with ON CONFLICT's speculative insertion on
//! `outbox_key_head_idx` (two producers that start a key at once: the second waits for the
//! first, and queues behind its message if it commits). Under REPEATABLE READ or SERIALIZABLE,
//! where the key is held another way, and with a `dedupe_key`, the statements do it.
//!
//! What PostgreSQL would otherwise parse, compile or describe again for every row is kept for
//! the session: the column defaults (from `pg_attrdef`'s text), compiled; what the executor
//! needs of each B-tree index (its `IndexInfo`, which `ExecOpenIndices` builds again for every
//! statement, copying the index's columns, options and predicate from the relcache); and the
//! predicates of the partial indexes, compiled. They are dropped whenever the relcache says the
//! table or one of its indexes changed (`ALTER TABLE … SET DEFAULT`, `CREATE INDEX`, an index
//! becoming ready, and vacuum's statistics too, which is rare enough) and, as the plan cache
//! does, whenever a function or a type changes. A table with triggers or row-level security is
//! written with the INSERT statements instead, so that they act as for any INSERT.

use crate::{compat, ordering};
use pgrx::pg_sys;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

/// What is kept for the session, in its own memory context.
struct Kept {
    context: pg_sys::MemoryContext,
    /// Column number → its default, compiled.
    defaults: HashMap<i16, *mut pg_sys::ExprState>,
    /// Index → what the executor needs of it, for a B-tree index without expressions (None:
    /// described for each row, as `ExecOpenIndices` does; another access method may keep state
    /// of its own in the description, and expressions are compiled into it for one statement).
    indexes: HashMap<pg_sys::Oid, Option<*mut pg_sys::IndexInfo>>,
    /// Partial index → its predicate, compiled.
    predicates: HashMap<pg_sys::Oid, *mut pg_sys::ExprState>,
    /// What a write with an ordering key looks up, once.
    keyed: Option<Keyed>,
}

/// What a write with an ordering key needs of the table.
#[derive(Clone, Copy)]
struct Keyed {
    /// `outbox_key_head_idx`: one head per key.
    head_index: pg_sys::Oid,
    /// The column number of `ordering_key`.
    key_column: i16,
    /// `waiting_for`'s value for a message behind its key's head: the enum's 'ordering_key'.
    behind_head: pg_sys::Datum,
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
/// defaults for the others, and returns the whole row in the caller's memory context. With an
/// `ordering_key` (a text datum), the message is queued as insert_keyed.sql queues it
/// (`write_keyed`). `None` when the table has triggers or row-level security (or, with a key,
/// outside READ COMMITTED): the caller runs the statements.
pub fn insert(schema: pg_sys::Oid, columns: &[(&str, pg_sys::Datum)], ordering_key: Option<pg_sys::Datum>) -> Option<pg_sys::Datum> {
    // SAFETY: called from a SQL function, in a transaction; every pointer below comes from
    // PostgreSQL for the relation opened here and stays valid until it is closed; the key is a
    // text datum of the caller's.
    unsafe {
        let table = OpenTable::open(schema)?;
        match ordering_key {
            None => Some(write(table, columns)),
            Some(key) => write_keyed(table, schema, columns, key),
        }
    }
}

/// Writes the row.
unsafe fn write(table: OpenTable, columns: &[(&str, pg_sys::Datum)]) -> pg_sys::Datum {
    KEPT.with(|kept| {
        let mut kept = kept.borrow_mut();
        let kept = table.kept(&mut kept);
        let slot = row_slot(table.estate, table.relation, kept, columns);
        pg_sys::ExecSimpleRelationInsert(table.target, table.estate, slot);
        table.close(Some(slot)).expect("a row")
    })
}

/// Writes the row of a message with ordering key `key`: the producer holds the key
/// (src/ordering), then the message becomes the key's head when the key has none, and otherwise
/// waits behind it. Two producers that start a key at once meet on `outbox_key_head_idx`, as
/// `INSERT … ON CONFLICT` makes them meet: the second waits for the first's transaction, and
/// queues behind its message if it commits.
unsafe fn write_keyed(
    table: OpenTable,
    schema: pg_sys::Oid,
    columns: &[(&str, pg_sys::Datum)],
    key: pg_sys::Datum,
) -> Option<pg_sys::Datum> {
    let constraints = (*(*table.relation).rd_att).constr;
    let generated_columns = !constraints.is_null() && (*constraints).has_generated_stored;
    if generated_columns || !ordering::hold_key_in_read_committed(schema, key) {
        table.close(None);
        return None;
    }
    KEPT.with(|kept| {
        let mut kept = kept.borrow_mut();
        let kept = table.kept(&mut kept);
        let keyed = *kept.keyed.get_or_insert_with(|| look_up_keyed(table.relation, schema));
        loop {
            let mut row = columns.to_vec();
            row.push(("ordering_key", key));
            let behind_head = key_has_head(&table, keyed, key);
            if behind_head {
                row.push(("waiting_for", keyed.behind_head));
            }
            let slot = row_slot(table.estate, table.relation, kept, &row);
            if behind_head {
                pg_sys::ExecSimpleRelationInsert(table.target, table.estate, slot);
                return table.close(Some(slot));
            }
            if insert_unless_taken(&table, slot, keyed.head_index) {
                return table.close(Some(slot));
            }
            // Another producer's head committed meanwhile: this message queues behind it.
        }
    })
}

/// `outbox`, opened for one row written without a statement.
struct OpenTable {
    relation: pg_sys::Relation,
    estate: *mut pg_sys::EState,
    target: *mut pg_sys::ResultRelInfo,
    caller_context: pg_sys::MemoryContext,
}

impl OpenTable {
    /// `schema.outbox` and its indexes. `None` when the table has triggers or row-level security.
    unsafe fn open(schema: pg_sys::Oid) -> Option<OpenTable> {
        let relation_id = crate::spi::outbox_relation(schema);
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
        Some(OpenTable { relation, estate, target, caller_context })
    }

    /// Opens the table's indexes (locked as `ExecOpenIndices` locks them, in the same order).
    unsafe fn open_indexes(&self) -> Vec<pg_sys::Relation> {
        if !(*(*self.relation).rd_rel).relhasindex {
            return Vec::new();
        }
        let list = pg_sys::RelationGetIndexList(self.relation);
        let count = if list.is_null() { 0 } else { (*list).length as usize };
        let indexes = (0..count)
            .map(|n| pg_sys::index_open((*(*list).elements.add(n)).oid_value, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE))
            .collect();
        pg_sys::list_free(list);
        indexes
    }

    /// Gives `target` the open `indexes` with their descriptions: kept ones for the B-tree
    /// indexes without expressions (with what a speculative insert needs for the unique ones,
    /// built once too), new ones for the others.
    unsafe fn describe_indexes(&self, indexes: &[pg_sys::Relation], kept: &mut Kept) {
        let count = indexes.len();
        (*self.target).ri_NumIndices = count as i32;
        if count == 0 {
            return;
        }
        let descriptors = pg_sys::palloc(std::mem::size_of_val(indexes)).cast::<pg_sys::Relation>();
        std::ptr::copy_nonoverlapping(indexes.as_ptr(), descriptors, count);
        let infos = pg_sys::palloc(count * std::mem::size_of::<*mut pg_sys::IndexInfo>()).cast::<*mut pg_sys::IndexInfo>();
        for (n, &index) in indexes.iter().enumerate() {
            let context = kept.context;
            let kept_info = *kept.indexes.entry((*index).rd_id).or_insert_with(|| {
                if (*(*index).rd_rel).relam != pg_sys::BTREE_AM_OID {
                    return None;
                }
                let previous = pg_sys::MemoryContextSwitchTo(context);
                let info = pg_sys::BuildIndexInfo(index);
                if (*info).ii_Unique {
                    pg_sys::BuildSpeculativeIndexInfo(index, info);
                }
                pg_sys::MemoryContextSwitchTo(previous);
                // (The executor compiles an index's expressions into its description, for one
                // statement.)
                (*info).ii_Expressions.is_null().then_some(info)
            });
            let info = kept_info.unwrap_or_else(|| pg_sys::BuildIndexInfo(index));
            *infos.add(n) = info;
        }
        (*self.target).ri_IndexRelationDescs = descriptors;
        (*self.target).ri_IndexRelationInfo = infos;
    }

    /// The open index `index_id`, and what the executor knows of it.
    unsafe fn index(&self, index_id: pg_sys::Oid) -> (pg_sys::Relation, *mut pg_sys::IndexInfo) {
        let count = (*self.target).ri_NumIndices as usize;
        let indexes = std::slice::from_raw_parts((*self.target).ri_IndexRelationDescs, count);
        let n = indexes.iter().position(|index| (**index).rd_id == index_id).expect("an index of outbox");
        (indexes[n], *(*self.target).ri_IndexRelationInfo.add(n))
    }

    /// Opens the indexes and returns what is kept for this table, its index descriptions and
    /// predicates given to `target`. (What is kept is looked at once every lock is taken: the
    /// invalidations that came before them have been read.)
    unsafe fn kept<'a>(&self, kept: &'a mut Option<Kept>) -> &'a mut Kept {
        let indexes = self.open_indexes();
        let relations = std::iter::once((*self.relation).rd_id).chain(indexes.iter().map(|index| (**index).rd_id)).collect();
        let kept = current(kept, relations);
        self.describe_indexes(&indexes, kept);
        use_kept_predicates(self.target, kept);
        kept
    }

    /// Closes everything; returns the row written in `slot`, in the caller's memory context.
    unsafe fn close(self, slot: Option<*mut pg_sys::TupleTableSlot>) -> Option<pg_sys::Datum> {
        pg_sys::MemoryContextSwitchTo(self.caller_context);
        let row = slot.map(|slot| pg_sys::ExecFetchSlotHeapTupleDatum(slot));
        pg_sys::ExecCloseIndices(self.target);
        pg_sys::ExecResetTupleTable((*self.estate).es_tupleTable, false);
        pg_sys::FreeExecutorState(self.estate);
        pg_sys::table_close(self.relation, pg_sys::NoLock as i32);
        row
    }
}

/// Whether ordering key `key` has a head (a PENDING message not waiting): an index scan of the
/// head index with a snapshot taken now, which sees what committed before the key was held.
unsafe fn key_has_head(table: &OpenTable, keyed: Keyed, key: pg_sys::Datum) -> bool {
    let relation = table.relation;
    // (The key is compared with the index's collation, as a query's would be.)
    let collation = *(*table.index(keyed.head_index).0).rd_indcollation;
    let mut scan_key = std::mem::zeroed::<pg_sys::ScanKeyData>();
    pg_sys::ScanKeyEntryInitialize(
        &mut scan_key,
        0,
        keyed.key_column,
        pg_sys::BTEqualStrategyNumber as u16,
        pg_sys::InvalidOid,
        collation,
        pg_sys::Oid::from(pg_sys::F_TEXTEQ),
        key,
    );
    pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    let scan = pg_sys::systable_beginscan(relation, keyed.head_index, true, pg_sys::GetActiveSnapshot(), 1, &mut scan_key);
    let found = !pg_sys::systable_getnext(scan).is_null();
    pg_sys::systable_endscan(scan);
    pg_sys::PopActiveSnapshot();
    found
}

/// Inserts the row in `slot` as its key's head, as `INSERT … ON CONFLICT DO NOTHING` does with
/// `head_index` as its arbiter: false, with nothing written, when the key has a head after all
/// (another producer's, committed after the look in `key_has_head`; one still in progress is
/// waited for).
unsafe fn insert_unless_taken(table: &OpenTable, slot: *mut pg_sys::TupleTableSlot, head_index: pg_sys::Oid) -> bool {
    let (relation, target, estate) = (table.relation, table.target, table.estate);
    // What ON CONFLICT's check needs of its arbiter (kept with a kept description; built here,
    // for this row, in the other case).
    let (index, info) = table.index(head_index);
    if (*info).ii_UniqueOps.is_null() {
        pg_sys::BuildSpeculativeIndexInfo(index, info);
    }
    if !(*(*relation).rd_att).constr.is_null() {
        pg_sys::ExecConstraints(target, slot, estate);
    }
    let arbiters = pg_sys::lappend_oid(std::ptr::null_mut(), head_index);
    if !compat::index_constraints_hold(target, slot, estate, arbiters) {
        return false;
    }
    // A head may still appear between that check and the insert: the insert is speculative,
    // and undone if the index finds one.
    let transaction = pg_sys::GetCurrentTransactionId();
    let token = pg_sys::SpeculativeInsertionLockAcquire(transaction);
    pg_sys::table_tuple_insert_speculative(relation, slot, (*estate).es_output_cid, 0, std::ptr::null_mut(), token);
    let mut taken = false;
    compat::insert_index_tuples_speculatively(target, slot, estate, &mut taken, arbiters);
    pg_sys::table_tuple_complete_speculative(relation, slot, token, !taken);
    pg_sys::SpeculativeInsertionLockRelease(transaction);
    !taken
}

/// What a write with an ordering key needs of `schema.outbox` (`relation`).
unsafe fn look_up_keyed(relation: pg_sys::Relation, schema: pg_sys::Oid) -> Keyed {
    let table = (*relation).rd_id;
    let waiting_for = pg_sys::get_attnum(table, c"waiting_for".as_ptr());
    Keyed {
        head_index: pg_sys::get_relname_relid(c"outbox_key_head_idx".as_ptr(), schema),
        key_column: pg_sys::get_attnum(table, c"ordering_key".as_ptr()),
        behind_head: pg_sys::OidFunctionCall2Coll(
            pg_sys::Oid::from(pg_sys::F_ENUM_IN),
            pg_sys::InvalidOid,
            pg_sys::Datum::from(c"ordering_key".as_ptr()),
            pg_sys::Datum::from(pg_sys::get_atttype(table, waiting_for)),
        ),
    }
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
        *kept = Some(Kept { context, defaults: HashMap::new(), indexes: HashMap::new(), predicates: HashMap::new(), keyed: None });
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
            // (A default cannot hold a subquery: compiled without a plan, it is evaluated in
            // any row's expression context.)
            let context = kept.context;
            let compiled = *kept.defaults.entry(default.adnum).or_insert_with(|| {
                let previous = pg_sys::MemoryContextSwitchTo(context);
                let planned = pg_sys::expression_planner(pg_sys::stringToNode(default.adbin).cast());
                let compiled = pg_sys::ExecInitExpr(planned, std::ptr::null_mut());
                pg_sys::MemoryContextSwitchTo(previous);
                compiled
            });
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
