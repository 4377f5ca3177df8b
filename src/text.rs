//! Text at the edges. PostgreSQL keeps text in the database's encoding (UTF-8, LATIN1,
//! SQL_ASCII, …); Rust strings, HTTP headers and webhook bodies are UTF-8. Every string that
//! crosses from one to the other goes through here.
//!
//! - Reading: text in a UTF-8 database is used as it is; in SQL_ASCII, where PostgreSQL does not
//!   know what the bytes mean, bytes that are not UTF-8 become U+FFFD; in any other encoding
//!   PostgreSQL converts it to UTF-8.
//! - Writing messages for the server: in a database that is not UTF-8, characters outside
//!   ASCII are escaped (`\u{e9}`), so a message never holds bytes its encoding cannot show.

use pgrx::pg_sys;
use std::borrow::Cow;
use std::ffi::CStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Utf8,
    SqlAscii,
    Other,
}

fn database_encoding() -> Encoding {
    // SAFETY: reads a backend global set at connection time.
    let encoding = unsafe { pg_sys::GetDatabaseEncoding() } as u32;
    match encoding {
        pg_sys::pg_enc::PG_UTF8 => Encoding::Utf8,
        pg_sys::pg_enc::PG_SQL_ASCII => Encoding::SqlAscii,
        _ => Encoding::Other,
    }
}

/// The bytes of a text value in the database's encoding, as UTF-8.
pub fn from_server(bytes: &[u8]) -> String {
    match database_encoding() {
        Encoding::Utf8 | Encoding::SqlAscii => String::from_utf8_lossy(bytes).into_owned(),
        Encoding::Other if bytes.is_ascii() => String::from_utf8_lossy(bytes).into_owned(),
        Encoding::Other => {
            // SAFETY: `bytes` is valid for its length; pg_server_to_any returns either its
            // argument (no conversion needed: then only `bytes.len()` bytes are ours to read)
            // or a NUL-terminated palloc'd copy. A character it cannot convert raises an ERROR.
            unsafe {
                let length = i32::try_from(bytes.len()).unwrap_or(i32::MAX);
                let converted = pg_sys::pg_server_to_any(bytes.as_ptr().cast(), length, pg_sys::pg_enc::PG_UTF8 as i32);
                if converted.cast_const() == bytes.as_ptr().cast() {
                    String::from_utf8_lossy(bytes).into_owned()
                } else {
                    CStr::from_ptr(converted).to_string_lossy().into_owned()
                }
            }
        }
    }
}

/// A text datum holding `text` (UTF-8), in the database's encoding. Characters the encoding
/// cannot hold are escaped (`\u{20ac}`), so that writing never fails.
pub fn to_datum(text: &str) -> pg_sys::Datum {
    let owned;
    let text = if text.is_ascii() || database_encoding() != Encoding::Other {
        text
    } else {
        owned = escape_non_ascii(text);
        &owned
    };
    // (A copy of the bytes into a palloc'd text value, as cstring_to_text_with_len makes.)
    pgrx::datum::IntoDatum::into_datum(text).expect("a text value")
}

/// How many characters the bytes of a server-encoded string hold.
pub fn server_chars(bytes: &[u8]) -> usize {
    if bytes.is_ascii() {
        return bytes.len();
    }
    // SAFETY: reads `bytes.len()` bytes of `bytes`.
    unsafe { pg_sys::pg_mbstrlen_with_len(bytes.as_ptr().cast(), i32::try_from(bytes.len()).unwrap_or(i32::MAX)) as usize }
}

/// A message for the server log or a client: escaped outside ASCII unless the database is UTF-8.
pub fn for_server_message(message: &str) -> Cow<'_, str> {
    if message.is_ascii() || database_encoding() == Encoding::Utf8 {
        Cow::Borrowed(message)
    } else {
        Cow::Owned(escape_non_ascii(message))
    }
}

/// `"Müller"` → `"M\u{fc}ller"`.
pub fn escape_non_ascii(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            escaped.push(c);
        } else {
            escaped.push_str(&format!("\\u{{{:x}}}", c as u32));
        }
    }
    escaped
}

#[cfg(test)]
mod unit_tests {
    use super::*;

    #[test]
    fn escapes_only_what_is_not_ascii() {
        assert_eq!(escape_non_ascii("kunde-müller"), "kunde-m\\u{fc}ller");
        assert_eq!(escape_non_ascii("plain"), "plain");
        assert_eq!(escape_non_ascii("€"), "\\u{20ac}");
    }
}
