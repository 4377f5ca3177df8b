//! The advisory lock of each ordering key, tagged (outbox's oid as an int4, `hashtext(key)`).
//! A producer queuing a message behind a key holds it shared until it commits; whoever
//! releases the key takes it exclusively first, so it waits for those producers and then sees
//! their messages, and a producer that comes later waits for the release and sees its outcome.
//!
//! A producer takes its keys in the order its transaction enqueues, which may be any order. A
//! release of several keys therefore never waits for one while it holds another it took:
//! holding `a` while it waited for `b`, it waited in a circle with a producer that held `b` and
//! then enqueued with `a`, and PostgreSQL failed one of the two with 40P01 after
//! deadlock_timeout, the producer's business transaction maybe.

use crate::spi::{Spi, Statement};
use pgrx::pg_sys::{self, BuiltinOid::*};

static KEY_HASHES: Statement = Statement::new(include_str!("key_hashes.sql"), &[TEXTARRAYOID]);

/// The first half of the tag of every key's advisory lock: outbox's oid as an int4, as SQL's
/// `'outbox'::regclass::oid::int4` makes it (the same bits). Passed to statements as a value:
/// a statement must not name the schema inside a literal, where a schema renamed to a name with
/// a quote would end the literal. (The worker's pick-up tries the keys' locks: pick_up.sql.)
pub fn key_lock_space(schema: pg_sys::Oid) -> i32 {
    super::lock_space(schema, c"outbox")
}

/// A producer's hold on ordering key `key` (a text datum): its lock, shared, until the
/// transaction ends.
pub fn hold_for_producer(schema: pg_sys::Oid, key: pg_sys::Datum) {
    KeyLock::new(key_lock_space(schema), hash_of(key)).wait(Mode::Shared);
}

/// Takes the locks of the ordering keys `keys` (a text[] datum) exclusively until the
/// transaction ends, waiting for the producers holding them, and never holding one of them
/// while it waits for another (see above). It tries them all; when one is held, it gives back
/// those it took, waits for that one alone, and tries the others again holding it. (Keys this
/// transaction took before, in an earlier statement, it keeps holding: a lock taken twice is
/// given back once.)
pub fn lock_keys(spi: &mut Spi, schema: pg_sys::Oid, keys: Option<pg_sys::Datum>) {
    if keys.is_none() {
        return;
    }
    let hashes: Vec<i32> = spi.execute(&KEY_HASHES, schema, &[keys]).get(0, 1).unwrap_or_default();
    let space = key_lock_space(schema);
    let locks: Vec<KeyLock> = hashes.into_iter().map(|hash| KeyLock::new(space, hash)).collect();
    if let [only] = locks.as_slice() {
        only.wait(Mode::Exclusive); // nothing else of this call to hold while it waits
        return;
    }
    take_all_waiting_for_one_at_a_time(
        locks.len(),
        |index| locks[index].wait(Mode::Exclusive),
        |index| locks[index].try_take(Mode::Exclusive),
        |index| locks[index].give_back(Mode::Exclusive),
    );
}

/// Takes locks `0..count` with `wait` (waits for the lock's holders), `try_take` (takes it if
/// nobody holds it) and `give_back`, never waiting while it holds one it took: it tries them
/// all; when one is held, it gives back those it took, waits for that one alone, and tries the
/// others again holding it.
fn take_all_waiting_for_one_at_a_time(count: usize, wait: impl Fn(usize), try_take: impl Fn(usize) -> bool, give_back: impl Fn(usize)) {
    let mut waited_for: Option<usize> = None;
    loop {
        if let Some(index) = waited_for {
            wait(index);
        }
        let mut taken = Vec::with_capacity(count);
        let held = (0..count).filter(|&index| Some(index) != waited_for).find(|&index| {
            let got = try_take(index);
            if got {
                taken.push(index);
            }
            !got
        });
        let Some(held) = held else { return };
        for index in taken.into_iter().chain(waited_for) {
            give_back(index);
        }
        waited_for = Some(held);
    }
}

/// How a key's lock is held: shared by producers, exclusively by whoever releases the key.
#[derive(Clone, Copy)]
enum Mode {
    Shared,
    Exclusive,
}

impl Mode {
    fn lock_mode(self) -> pg_sys::LOCKMODE {
        (match self {
            Mode::Shared => pg_sys::ShareLock,
            Mode::Exclusive => pg_sys::ExclusiveLock,
        }) as pg_sys::LOCKMODE
    }
}

/// The advisory lock of one key, until the transaction ends: the one
/// `pg_advisory_xact_lock(space, hash)` takes, and `pg_locks` shows, in this database.
struct KeyLock(pg_sys::LOCKTAG);

impl KeyLock {
    fn new(space: i32, hash: i32) -> KeyLock {
        // As PostgreSQL's SET_LOCKTAG_INT32 makes it (field4 2: two int4 keys, not one int8).
        KeyLock(pg_sys::LOCKTAG {
            locktag_field1: u32::from(crate::backend::database_id()),
            locktag_field2: space as u32,
            locktag_field3: hash as u32,
            locktag_field4: 2,
            locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
            locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
        })
    }

    /// Takes it, waiting for whoever holds it in a conflicting mode.
    fn wait(&self, mode: Mode) {
        // SAFETY: a transaction-level lock of the advisory lock method, as pg_advisory_xact_lock
        // takes it (it raises an ERROR on a deadlock, a timeout or a cancel).
        unsafe { pg_sys::LockAcquire(&self.0, mode.lock_mode(), false, false) };
    }

    /// Takes it if nobody holds it in a conflicting mode; returns whether it did.
    fn try_take(&self, mode: Mode) -> bool {
        // SAFETY: as in `wait`, without waiting (pg_try_advisory_xact_lock).
        unsafe { pg_sys::LockAcquire(&self.0, mode.lock_mode(), false, true) != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL }
    }

    /// Gives back one taking of it by this call (the transaction may hold it from before).
    fn give_back(&self, mode: Mode) {
        // SAFETY: releases a transaction-level lock this call took, in the same resource owner
        // (PostgreSQL releases its relation locks early the same way).
        unsafe { pg_sys::LockRelease(&self.0, mode.lock_mode(), false) };
    }
}

/// The hash that names the lock of ordering key `key` (a text datum): `hashtext(key)`, with the
/// collation SQL's `hashtext($1)` gives it.
fn hash_of(key: pg_sys::Datum) -> i32 {
    // SAFETY: hashtext(text) called through fmgr with a text datum.
    let hash = unsafe {
        pg_sys::OidFunctionCall1Coll(
            pg_sys::Oid::from(pg_sys::F_HASHTEXT),
            pg_sys::Oid::from(pg_sys::BuiltinOid::DEFAULT_COLLATION_OID),
            key,
        )
    };
    hash.value() as i32
}

#[cfg(test)]
mod tests {
    use super::take_all_waiting_for_one_at_a_time;
    use std::cell::RefCell;
    use std::collections::BTreeSet;

    /// Locks that others hold, and what happens while one of ours is waited for: `on_wait`
    /// gives, for each wait, the lock others take meanwhile (besides giving the awaited one up).
    struct Others {
        holding: BTreeSet<usize>,
        on_wait: Vec<Option<usize>>,
    }

    /// Runs the taking over `count` locks against `others`; returns what we hold at the end
    /// and the locks waited for, in order. Fails if we ever wait while holding a lock.
    fn take(count: usize, holding: &[usize], on_wait: &[Option<usize>]) -> (BTreeSet<usize>, Vec<usize>) {
        let others = RefCell::new(Others { holding: holding.iter().copied().collect(), on_wait: on_wait.to_vec() });
        let ours = RefCell::new(BTreeSet::new());
        let waits = RefCell::new(Vec::new());
        take_all_waiting_for_one_at_a_time(
            count,
            |index| {
                assert!(ours.borrow().is_empty(), "waited for {index} holding {:?}", ours.borrow());
                waits.borrow_mut().push(index);
                let mut others = others.borrow_mut();
                others.holding.remove(&index);
                if let Some(Some(next)) = (!others.on_wait.is_empty()).then(|| others.on_wait.remove(0)) {
                    others.holding.insert(next);
                }
                ours.borrow_mut().insert(index);
            },
            |index| !others.borrow().holding.contains(&index) && ours.borrow_mut().insert(index),
            |index| assert!(ours.borrow_mut().remove(&index), "gave back {index}, not held"),
        );
        (ours.into_inner(), waits.into_inner())
    }

    #[test]
    fn takes_every_lock_nobody_holds_without_waiting() {
        assert_eq!(take(4, &[], &[]), ((0..4).collect(), vec![]));
    }

    #[test]
    fn waits_for_a_held_lock_holding_none_of_the_others() {
        assert_eq!(take(4, &[2], &[]), ((0..4).collect(), vec![2]));
    }

    #[test]
    fn waits_again_for_a_lock_taken_meanwhile_giving_back_the_one_it_waited_for() {
        // Others hold 1; while we wait for it they take 3, then, while we wait for 3, nothing.
        assert_eq!(take(4, &[1], &[Some(3), None]), ((0..4).collect(), vec![1, 3]));
    }
}
