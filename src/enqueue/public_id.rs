//! A message's `public_id`: a time-ordered UUID (version 7, RFC 9562), made at every enqueue.
//!
//! The 48-bit millisecond clock comes first, so new ids land at the right edge of public_id's
//! unique index instead of splitting its pages at random; the 74 bits left are random, from
//! the operating system's cryptographic source. Those are read 4 KiB at a time and handed out
//! ten bytes per id: one `getrandom` call per id cost 0.7 µs, most of what making an id cost
//! (the benchmark's enqueue, docs in bench/README.md). One process's ids sort in the order it
//! made them, within a millisecond too (RFC 9562's "monotonic random" method).

use std::cell::RefCell;

/// Random bytes each id takes (80, of which 74 are kept beside the version and variant).
const RANDOM_BYTES: usize = 10;
/// Bytes read from the operating system at once: 409 ids.
const POOL_BYTES: usize = 4096;

/// A UUIDv7's random part: 74 bits.
const RANDOM_PART: u128 = (1 << 74) - 1;

/// A UUIDv7 from the Unix time in milliseconds and its 74-bit random part: the time in the
/// first 48 bits, then the version (7), 12 bits of the random part, the variant (0b10) and its
/// other 62 bits.
fn layout(unix_millis: u64, random_part: u128) -> [u8; 16] {
    let rand_a = (random_part >> 62) & 0xfff;
    let rand_b = random_part & ((1 << 62) - 1);
    ((u128::from(unix_millis & 0xffff_ffff_ffff) << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b).to_be_bytes()
}

/// The time and the random part of a UUIDv7 made by [`layout`].
fn parts(id: &[u8; 16]) -> (u64, u128) {
    let n = u128::from_be_bytes(*id);
    ((n >> 80) as u64, (((n >> 64) & 0xfff) << 62) | (n & ((1 << 62) - 1)))
}

/// A UUIDv7 from the Unix time in milliseconds and ten random bytes (74 of their 80 bits).
pub fn uuid_v7(unix_millis: u64, random: &[u8; RANDOM_BYTES]) -> [u8; 16] {
    let mut wide = [0u8; 16];
    wide[6..].copy_from_slice(random);
    layout(unix_millis, u128::from_be_bytes(wide) & RANDOM_PART)
}

/// The id to make at `unix_millis` after `last`, this process's previous one: a new random one
/// in a later millisecond; else `last` plus a random step of up to 2^32 (the next millisecond
/// when its random part runs out), so that the process's ids sort in the order made, however
/// many fall in one millisecond and should the clock step back.
fn next_id(last: Option<[u8; 16]>, unix_millis: u64, random: &[u8; RANDOM_BYTES]) -> [u8; 16] {
    match last.map(|last| parts(&last)) {
        Some((last_millis, last_random)) if last_millis >= unix_millis => {
            let step = 1 + u128::from(u32::from_be_bytes([random[0], random[1], random[2], random[3]]));
            let random_part = last_random + step;
            if random_part > RANDOM_PART {
                layout(last_millis + 1, random_part & RANDOM_PART)
            } else {
                layout(last_millis, random_part)
            }
        }
        _ => uuid_v7(unix_millis, random),
    }
}

/// Random bytes read ahead from the operating system, for one process.
struct RandomPool {
    bytes: [u8; POOL_BYTES],
    /// How many of `bytes` were handed out already (POOL_BYTES: none left).
    used: usize,
    /// The process that read them: a process forked from this one must not hand out the
    /// same bytes (PostgreSQL forks its backends from the postmaster, which never makes an id,
    /// but a pool is cheap to refill).
    process: u32,
    /// The last id this process made.
    last: Option<[u8; 16]>,
}

impl RandomPool {
    const fn empty() -> Self {
        RandomPool { bytes: [0; POOL_BYTES], used: POOL_BYTES, process: 0, last: None }
    }

    fn take(&mut self, process: u32) -> [u8; RANDOM_BYTES] {
        if self.process != process || self.used + RANDOM_BYTES > POOL_BYTES {
            getrandom::fill(&mut self.bytes).expect("the operating system's random source is available");
            self.used = 0;
            if self.process != process {
                self.last = None;
            }
            self.process = process;
        }
        let mut taken = [0u8; RANDOM_BYTES];
        taken.copy_from_slice(&self.bytes[self.used..self.used + RANDOM_BYTES]);
        // (Handed out once: wiped so that nothing later in this process can read them again.)
        self.bytes[self.used..self.used + RANDOM_BYTES].fill(0);
        self.used += RANDOM_BYTES;
        taken
    }
}

thread_local! {
    static POOL: RefCell<RandomPool> = const { RefCell::new(RandomPool::empty()) };
}

/// A new public_id, now, made by process `process` (its pid: PostgreSQL's MyProcPid, which
/// costs nothing to read where `getpid` is a system call).
pub fn new_public_id(process: u32) -> [u8; 16] {
    let unix_millis = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_millis() as u64);
    POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        let random = pool.take(process);
        let id = next_id(pool.last, unix_millis, &random);
        pool.last = Some(id);
        id
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_time_comes_first_then_version_7_and_the_rfc_variant() {
        let id = uuid_v7(0x0123_4567_89ab, &[0xff; RANDOM_BYTES]);
        assert_eq!(&id[..6], &[0x01, 0x23, 0x45, 0x67, 0x89, 0xab]);
        assert_eq!(id[6] >> 4, 7, "version");
        assert_eq!(id[8] >> 6, 0b10, "variant");
        // Every other bit is the random input's.
        assert_eq!(id[6] & 0x0f, 0x0f);
        assert_eq!(id[8] & 0x3f, 0x3f);
        assert_eq!(&id[9..], &[0xff; 7]);
        let zeros = uuid_v7(0, &[0; RANDOM_BYTES]);
        assert_eq!(zeros, [0, 0, 0, 0, 0, 0, 0x70, 0, 0x80, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn ids_of_a_later_millisecond_sort_after_whatever_their_random_bits() {
        let earlier = uuid_v7(1_764_000_000_000, &[0xff; RANDOM_BYTES]);
        let later = uuid_v7(1_764_000_000_001, &[0; RANDOM_BYTES]);
        assert!(earlier < later);
    }

    #[test]
    fn the_pool_never_hands_out_the_same_bytes_twice_and_refills_for_another_process() {
        let mut pool = RandomPool::empty();
        let mut seen = std::collections::HashSet::new();
        // Three pools' worth: every refill reads new bytes.
        for _ in 0..3 * POOL_BYTES / RANDOM_BYTES {
            assert!(seen.insert(pool.take(1)), "80 random bits repeated");
        }
        let before = pool.used;
        pool.take(2);
        assert_eq!(pool.used, RANDOM_BYTES, "another process starts from a new read (was at {before})");
    }

    #[test]
    fn new_ids_are_distinct_and_in_the_order_made() {
        let ids: Vec<[u8; 16]> = (0..10_000).map(|_| new_public_id(1)).collect();
        let distinct: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len());
        assert!(ids.windows(2).all(|pair| pair[0] < pair[1]), "in the order made");
    }

    #[test]
    fn ids_of_one_millisecond_or_of_a_clock_stepped_back_follow_the_last() {
        let first = uuid_v7(1_764_000_000_000, &[0x55; RANDOM_BYTES]);
        let same = next_id(Some(first), 1_764_000_000_000, &[0; RANDOM_BYTES]);
        assert!(same > first && parts(&same) == (1_764_000_000_000, parts(&first).1 + 1), "a step of one at least");
        let back = next_id(Some(same), 1_763_999_999_000, &[0xff; RANDOM_BYTES]);
        assert!(back > same && parts(&back).0 == 1_764_000_000_000);
        assert_eq!((back[6] >> 4, back[8] >> 6), (7, 0b10), "still a UUIDv7");
        // A random part about to run out carries into the next millisecond.
        let full = layout(1_764_000_000_000, RANDOM_PART);
        let carried = next_id(Some(full), 1_764_000_000_000, &[0; RANDOM_BYTES]);
        assert!(carried > full && parts(&carried) == (1_764_000_000_001, 0));
        // A later millisecond starts from new random bits.
        assert_eq!(next_id(Some(first), 1_764_000_000_001, &[0xff; RANDOM_BYTES]), uuid_v7(1_764_000_000_001, &[0xff; RANDOM_BYTES]));
    }
}
