//! What a payload may be: JSON whose text stays within reach of everyone who reads it.
//!
//! jsonb keeps a number as its digits and an exponent, and prints it whole: `1e131071` takes
//! a few bytes and prints as 131,072 characters. The security probe of 0.5.32 enqueued 131 KB
//! of such numbers, which print as over 1 GB: PostgreSQL cannot make that text, so the worker's
//! every step failed on it (no message of the database was delivered), every `outbox_claim`
//! of its topic failed, and so did `pg_dump`; one of 48 KB cost the worker 1.5 GB. A message
//! must be readable by whoever reads it, so the enqueue measures how long the payload prints
//! (walking it once, without printing it) and refuses one beyond these limits.

use crate::error::{raise, OutboxError};
use pgrx::pg_sys;

/// The longest a number may print. JSON numbers name amounts and identifiers; a reader's
/// double holds 17 significant digits and about 309 before the point.
pub const MAX_NUMBER_CHARACTERS: usize = 1000;

/// The longest a payload may print: what the largest jsonb holds (256 MB) printed, and a
/// quarter of the 1 GB PostgreSQL can make a text of.
pub const MAX_PAYLOAD_CHARACTERS: usize = 256 << 20;

/// Raises 22023 for a payload (the jsonb `payload`, argument `argument` of `function`) that
/// prints a number longer than [`MAX_NUMBER_CHARACTERS`] or prints longer than
/// [`MAX_PAYLOAD_CHARACTERS`] in all.
pub fn check(function: &'static str, argument: &'static str, payload: pg_sys::Datum) {
    // SAFETY: every caller passes a jsonb datum of its arguments (or of the elements of a
    // jsonb[] argument), valid while the call lasts.
    if let Err(problem) = unsafe { printed_length(payload) } {
        raise(OutboxError::invalid(function, argument, problem));
    }
}

/// How long a jsonb prints, at most, or why it may not be a payload.
///
/// # Safety
/// `payload` must be a jsonb datum.
unsafe fn printed_length(payload: pg_sys::Datum) -> Result<usize, String> {
    let mut length = 0usize;
    // SAFETY: a jsonb datum, detoasted, starts with its varlena header and the root container;
    // the iterator reads that container, in the current memory context, and each value it
    // returns points into it (a string's bytes, a numeric's header), valid while it is.
    unsafe {
        let jsonb = pg_sys::pg_detoast_datum(payload.cast_mut_ptr()) as *mut pg_sys::Jsonb;
        let mut iterator = pg_sys::JsonbIteratorInit(&mut (*jsonb).root);
        let mut value = pg_sys::JsonbValue::default();
        loop {
            let token = pg_sys::JsonbIteratorNext(&mut iterator, &mut value, false);
            length += match token {
                pg_sys::JsonbIteratorToken::WJB_DONE => break,
                // A key: its string, then ": "; and ", " before it or an element.
                pg_sys::JsonbIteratorToken::WJB_KEY => 4 + string_length(&value),
                pg_sys::JsonbIteratorToken::WJB_ELEM => 2 + scalar_length(&value)?,
                pg_sys::JsonbIteratorToken::WJB_VALUE => scalar_length(&value)?,
                _ => 1, // a bracket or a brace
            };
            if length > MAX_PAYLOAD_CHARACTERS {
                return Err(format!("prints as more than {MAX_PAYLOAD_CHARACTERS} characters of JSON"));
            }
        }
    }
    Ok(length)
}

/// A scalar's printed length (a container, begun by this token, counts by its own tokens).
///
/// # Safety
/// `value` is what JsonbIteratorNext returned with a WJB_ELEM or WJB_VALUE token.
unsafe fn scalar_length(value: &pg_sys::JsonbValue) -> Result<usize, String> {
    Ok(match value.type_ {
        pg_sys::jbvType::jbvString => string_length(value),
        pg_sys::jbvType::jbvNumeric => {
            // SAFETY: a numeric value points at a Numeric inside the container, whose header
            // (its varlena header, then the numeric's own) is in memory.
            let header = unsafe { numeric_header(value.val.numeric) };
            let printed = number_length(header);
            if printed > MAX_NUMBER_CHARACTERS {
                return Err(format!(
                    "holds a number that prints as {printed} characters (at most {MAX_NUMBER_CHARACTERS}; send a larger one as a string)"
                ));
            }
            printed
        }
        pg_sys::jbvType::jbvBool => 5,
        _ => 4, // null; a container opened here counts by its own tokens
    })
}

/// # Safety
/// `value` holds a key or a string value.
unsafe fn string_length(value: &pg_sys::JsonbValue) -> usize {
    // SAFETY: a string value's bytes are `len` bytes at `val`, inside the container.
    let bytes = unsafe { std::slice::from_raw_parts(value.val.string.val as *const u8, value.val.string.len as usize) };
    quoted_length(bytes)
}

/// The numeric's own header: its first two 16-bit words after the varlena header (short or
/// long, `numeric.c`'s layout).
///
/// # Safety
/// `numeric` points at a Numeric, not compressed (a jsonb's numerics are stored inline).
unsafe fn numeric_header(numeric: pg_sys::Numeric) -> [u16; 2] {
    // SAFETY: a Numeric inside a jsonb is a whole varlena (with a 1- or 4-byte header, as it
    // came), then at least its 16-bit header word; a long one has its weight after it. A short
    // one may end after its first word: the second is read only from a long one.
    unsafe {
        let words = pgrx::varlena::vardata_any(numeric as *const pg_sys::varlena) as *const u16;
        let first = words.read_unaligned();
        let second = if is_short(first) { 0 } else { words.add(1).read_unaligned() };
        [first, second]
    }
}

const NUMERIC_SIGN_MASK: u16 = 0xC000;
const NUMERIC_SHORT: u16 = 0x8000;

fn is_short(first: u16) -> bool {
    first & NUMERIC_SIGN_MASK == NUMERIC_SHORT
}

/// How long a finite numeric prints, at most, from its header: its minus sign, 4 digits per
/// base-10000 digit before the point (at least "0"), and the point and `dscale` digits after it.
pub fn number_length([first, second]: [u16; 2]) -> usize {
    let (negative, weight, dscale) = if is_short(first) {
        // (NUMERIC_SHORT_SIGN_MASK 0x2000, _DSCALE_MASK 0x1F80, _WEIGHT_SIGN_MASK 0x0040,
        // _WEIGHT_MASK 0x003F)
        let weight = if first & 0x0040 != 0 { (first & 0x003F) as i32 - 64 } else { (first & 0x003F) as i32 };
        (first & 0x2000 != 0, weight, ((first & 0x1F80) >> 7) as usize)
    } else {
        // Long: the sign (NUMERIC_NEG 0x4000) and dscale (0x3FFF), then the weight.
        (first & NUMERIC_SIGN_MASK == 0x4000, second as i16 as i32, (first & 0x3FFF) as usize)
    };
    let integer_digits = if weight >= 0 { 4 * (weight as usize + 1) } else { 1 };
    usize::from(negative) + integer_digits + if dscale > 0 { 1 + dscale } else { 0 }
}

/// How long a string prints in JSON: its quotes, and each byte jsonb escapes at its longest
/// (`\u0001`).
pub fn quoted_length(bytes: &[u8]) -> usize {
    2 + bytes.len() + 5 * bytes.iter().filter(|&&b| b < 0x20 || b == b'"' || b == b'\\').count()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header words of a short numeric of `weight` and `dscale`.
    fn short(weight: i32, dscale: u16) -> [u16; 2] {
        [NUMERIC_SHORT | (dscale << 7) | ((weight as u16) & 0x007F), 0]
    }

    /// Of a long one.
    fn long(weight: i16, dscale: u16) -> [u16; 2] {
        [dscale & 0x3FFF, weight as u16]
    }

    #[test]
    fn a_number_prints_four_digits_per_base_10000_digit_before_the_point_and_its_scale_after() {
        assert_eq!(number_length(short(0, 0)), 4, "1 to 9999");
        assert_eq!(number_length([short(0, 0)[0] | 0x2000, 0]), 5, "-1 to -9999");
        assert_eq!(number_length(short(1, 2)), 8 + 1 + 2, "12345.67");
        assert_eq!(number_length(short(-1, 4)), 1 + 1 + 4, "0.0001");
        assert_eq!(number_length(short(-64, 0)), 1);
        // 1e131071 (weight 32767 in base 10000) and -1e-16383 (scale 16383): long numerics.
        assert_eq!(number_length(long(32767, 0)), 4 * 32768);
        assert_eq!(number_length([long(-4096, 16383)[0] | 0x4000, (-4096i16) as u16]), 1 + 1 + 1 + 16383);
        assert_eq!(number_length(long(249, 0)), MAX_NUMBER_CHARACTERS, "1e999: a thousand digits");
        assert!(number_length(long(250, 0)) > MAX_NUMBER_CHARACTERS);
    }

    #[test]
    fn a_string_prints_quoted_with_its_escapes() {
        assert_eq!(quoted_length(b"abc"), 5);
        assert_eq!(quoted_length("ü".as_bytes()), 4, "UTF-8 as it is");
        assert_eq!(quoted_length(b"\x01"), 8, "\\u0001 in quotes");
        assert_eq!(quoted_length(b"a\"b\\"), 2 + 4 + 10);
    }
}
