//! Text at the edges. PostgreSQL keeps text in the database's encoding (UTF-8, LATIN1,
//! SQL_ASCII, …); Rust strings, HTTP headers and webhook bodies are UTF-8. Every string that
//! crosses from one to the other goes through here.
//!
//! - Reading: text in a UTF-8 database is used as it is; in SQL_ASCII, where PostgreSQL does not
//!   know what the bytes mean, bytes that are not UTF-8 become U+FFFD; in any other encoding
//!   PostgreSQL converts it to UTF-8, a character with no UTF-8 equivalent becoming U+FFFD.
//! - Writing text into the database (an endpoint's error): converted to its encoding, a
//!   character the encoding cannot hold escaped (`\u{20ac}` in LATIN1).
//! - Writing messages for the server log or a client: in a database that is not UTF-8,
//!   characters outside ASCII are escaped (`\u{e9}`), so a message never holds bytes its
//!   encoding cannot show.
//! - What the worker reads only to hand back to SQL (an ordering key) is not converted at all:
//!   [`ServerText`] keeps the database's bytes.

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
        // SAFETY: `bytes` is valid for its length; a transaction is open (catalog lookups).
        Encoding::Other if unsafe { pg_sys::IsTransactionState() } => unsafe { to_utf8_replacing(bytes) },
        Encoding::Other => {
            // (Outside a transaction, where PostgreSQL cannot look a conversion up: it returns
            // the bytes as they are.)
            // SAFETY: `bytes` is valid for its length; pg_server_to_any returns either its
            // argument (no conversion needed: then only `bytes.len()` bytes are ours to read)
            // or a NUL-terminated palloc'd copy.
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

/// The longest piece a [`Conversion`] converts at once.
const PIECE: usize = 1 << 20;

/// A conversion between the database's encoding and UTF-8, as PostgreSQL converts but without
/// its ERROR for a character it cannot convert (`noError`: it stops there, and the caller
/// decides). In pieces of at most [`PIECE`] bytes, cut between characters by the caller, so that
/// the buffer (4 bytes for each byte converted, PostgreSQL's bound) stays small.
struct Conversion {
    function: pg_sys::Oid,
    from: i32,
    to: i32,
    buffer: Vec<u8>,
}

impl Conversion {
    const MAX_GROWTH: usize = 4;

    /// The conversion from `from` to `to`, for a text of `length` bytes; None when PostgreSQL
    /// has none.
    ///
    /// # Safety
    /// A transaction is open (the lookup reads pg_conversion).
    unsafe fn find(from: i32, to: i32, length: usize) -> Option<Conversion> {
        // SAFETY: as the caller promises.
        let function = unsafe { pg_sys::FindDefaultConversionProc(from, to) };
        (function != pg_sys::InvalidOid).then(|| Conversion {
            function,
            from,
            to,
            buffer: vec![0; length.min(PIECE) * Self::MAX_GROWTH + 1],
        })
    }

    /// Converts `piece` (at most [`PIECE`] bytes, and no longer than the text it was found
    /// for): how many of its bytes it converted (up to the first character it cannot), and
    /// what they became.
    fn convert(&mut self, piece: &[u8]) -> (usize, &[u8]) {
        assert!(piece.len() <= PIECE && piece.len() * Self::MAX_GROWTH < self.buffer.len());
        // (What a conversion that converts nothing leaves.)
        self.buffer[0] = 0;
        // SAFETY: the conversion reads the piece's bytes, writes at most MAX_GROWTH times as many
        // and a NUL into the buffer (checked above), and with noError returns how many bytes it
        // converted.
        let converted = unsafe {
            pg_sys::pg_do_encoding_conversion_buf(
                self.function,
                self.from,
                self.to,
                piece.as_ptr().cast_mut(),
                piece.len() as i32,
                self.buffer.as_mut_ptr(),
                self.buffer.len() as i32,
                true,
            )
        };
        let converted = (converted.max(0) as usize).min(piece.len());
        (converted, CStr::from_bytes_until_nul(&self.buffer).map_or(&[][..], CStr::to_bytes))
    }
}

/// Server bytes (not ASCII, in an encoding other than UTF-8 and SQL_ASCII) as UTF-8, a character
/// with no UTF-8 equivalent (WIN1252's 0x81, EUC_JP's user-defined ones: PostgreSQL stores them)
/// becoming U+FFFD. Before 0.5.34 PostgreSQL's ERROR for such a character failed the worker's
/// step, every time (stop 57's probe of encodings).
///
/// # Safety
/// A transaction is open.
unsafe fn to_utf8_replacing(bytes: &[u8]) -> String {
    // SAFETY: as the caller promises.
    let server = unsafe { pg_sys::GetDatabaseEncoding() };
    let Some(mut conversion) = (unsafe { Conversion::find(server, pg_sys::pg_enc::PG_UTF8 as i32, bytes.len()) }) else {
        return String::from_utf8_lossy(bytes).into_owned();
    };
    let mut utf8_text = String::with_capacity(bytes.len() + bytes.len() / 2);
    let mut rest = bytes;
    while !rest.is_empty() {
        let piece = if rest.len() <= PIECE {
            rest.len()
        } else {
            // SAFETY: `rest` is valid for its length, a text value's bytes (no NUL).
            (unsafe { pg_sys::pg_mbcliplen(rest.as_ptr().cast(), rest.len() as i32, PIECE as i32) }.max(1)) as usize
        };
        let (converted, written) = conversion.convert(&rest[..piece]);
        utf8_text.push_str(&String::from_utf8_lossy(written));
        rest = &rest[converted..];
        if converted < piece {
            // The character there has no UTF-8 equivalent.
            utf8_text.push('\u{FFFD}');
            // SAFETY: `rest` is not empty; pg_mblen reads its first character's leading bytes.
            let length = unsafe { pg_sys::pg_mblen(rest.as_ptr().cast()) }.max(1) as usize;
            rest = &rest[length.min(rest.len())..];
        }
    }
    utf8_text
}

/// `text` (UTF-8) as the database's bytes, for text written into it (an endpoint's error):
/// converted as PostgreSQL converts, a character the encoding cannot hold escaped (`\u{20ac}`
/// in LATIN1), so that writing never fails. Until 0.5.35 every character outside ASCII was
/// escaped in such a database (LATIN1's `ü` too).
pub fn to_server(text: &str) -> ServerText {
    match database_encoding() {
        Encoding::Utf8 | Encoding::SqlAscii => ServerText(text.as_bytes().to_vec()),
        Encoding::Other if text.is_ascii() => ServerText(text.as_bytes().to_vec()),
        // SAFETY: a transaction is open (the conversion's lookup reads pg_conversion).
        Encoding::Other if unsafe { pg_sys::IsTransactionState() } => unsafe { from_utf8_escaping(text) },
        // (Outside a transaction, where PostgreSQL cannot look a conversion up, as from_server.)
        Encoding::Other => ServerText(escape_non_ascii(text).into_bytes()),
    }
}

/// UTF-8 as the database's bytes (an encoding other than UTF-8 and SQL_ASCII), a character the
/// encoding cannot hold escaped.
///
/// # Safety
/// A transaction is open.
unsafe fn from_utf8_escaping(text: &str) -> ServerText {
    // SAFETY: as the caller promises.
    let server = unsafe { pg_sys::GetDatabaseEncoding() };
    let Some(mut conversion) = (unsafe { Conversion::find(pg_sys::pg_enc::PG_UTF8 as i32, server, text.len()) }) else {
        return ServerText(escape_non_ascii(text).into_bytes());
    };
    let mut server_text = Vec::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        let mut piece = rest.len().min(PIECE);
        while !rest.is_char_boundary(piece) {
            piece -= 1;
        }
        let (mut converted, written) = conversion.convert(&rest.as_bytes()[..piece]);
        server_text.extend_from_slice(written);
        while !rest.is_char_boundary(converted) {
            converted -= 1;
        }
        rest = &rest[converted..];
        if converted < piece {
            // The character there has no equivalent in the database's encoding.
            let c = rest.chars().next().expect("not empty");
            server_text.extend_from_slice(escape_non_ascii(c.encode_utf8(&mut [0; 4])).as_bytes());
            rest = &rest[c.len_utf8()..];
        }
    }
    ServerText(server_text)
}

/// A text datum holding `text` (UTF-8), in the database's encoding (see [`to_server`]).
pub fn to_datum(text: &str) -> pg_sys::Datum {
    pgrx::datum::IntoDatum::into_datum(to_server(text)).expect("a text value")
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

/// A text value kept as the database's bytes: an ordering key, which the worker reads from one
/// statement and passes to the next. Read as UTF-8 and written back, a key in a database that
/// is not UTF-8 became another key (LATIN1: `ü` read back as `Ã¼`), one the encoding refuses
/// (EUC_JP: every step of the database failed), or lost its bytes (SQL_ASCII: U+FFFD); its next
/// message then waited for ever (stop 57's probe of encodings).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServerText(Vec<u8>);

impl ServerText {
    /// A text datum's bytes, copied.
    ///
    /// # Safety
    /// `datum` is a text value (a varlena, possibly toasted or short).
    pub unsafe fn from_datum(datum: pg_sys::Datum) -> ServerText {
        use pgrx::datum::FromDatum;
        // SAFETY: as the caller promises; pgrx reads a text's bytes as it reads a bytea's (both
        // are varlenas), detoasting as needed.
        let bytes = unsafe { <&[u8]>::from_polymorphic_datum(datum, false, pg_sys::TEXTOID) };
        ServerText(bytes.unwrap_or_default().to_vec())
    }

    #[cfg(test)]
    pub fn from_bytes(bytes: &[u8]) -> ServerText {
        ServerText(bytes.to_vec())
    }
}

impl pgrx::datum::IntoDatum for ServerText {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        let length = i32::try_from(self.0.len()).expect("a text value is under 1 GB");
        // SAFETY: cstring_to_text_with_len copies `length` bytes into a palloc'd text value.
        Some(pg_sys::Datum::from(unsafe { pg_sys::cstring_to_text_with_len(self.0.as_ptr().cast(), length) }))
    }

    fn type_oid() -> pg_sys::Oid {
        pg_sys::TEXTOID
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
