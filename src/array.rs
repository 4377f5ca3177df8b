//! Arrays of text and jsonb taken apart into their elements: one place for deconstruct_array.

use pgrx::datum::FromDatum;
use pgrx::pg_sys;

/// The elements of `array` (None for a NULL element), in order, and its number of dimensions.
///
/// # Safety
/// `array` must be an array datum whose elements are of `element_type`, a varlena type aligned
/// as int (text, jsonb). The element datums are palloc'd: valid in the current memory context.
pub unsafe fn varlena_elements(array: pg_sys::Datum, element_type: pg_sys::Oid) -> (Vec<Option<pg_sys::Datum>>, i32) {
    // SAFETY: as the caller promises; deconstruct_array fills palloc'd arrays of `count` datums
    // and null flags.
    unsafe {
        let array = pg_sys::pg_detoast_datum(array.cast_mut_ptr()) as *mut pg_sys::ArrayType;
        let (mut elements, mut nulls, mut count) = (std::ptr::null_mut(), std::ptr::null_mut(), 0);
        pg_sys::deconstruct_array(
            array,
            element_type,
            -1,
            false,
            pg_sys::TYPALIGN_INT as std::ffi::c_char,
            &mut elements,
            &mut nulls,
            &mut count,
        );
        let values = (0..count as usize).map(|i| (!*nulls.add(i)).then(|| *elements.add(i))).collect();
        (values, (*array).ndim)
    }
}

/// The number of dimensions of an array (0 when empty).
///
/// # Safety
/// `array` must be an array datum.
pub unsafe fn dimensions(array: pg_sys::Datum) -> i32 {
    // SAFETY: as the caller promises; detoasted, the datum starts with ArrayType's header.
    unsafe { (*(pg_sys::pg_detoast_datum(array.cast_mut_ptr()) as *mut pg_sys::ArrayType)).ndim }
}

/// The elements of a `text[]` (None for a NULL element) as UTF-8, in order, and its number of
/// dimensions.
///
/// # Safety
/// `array` must be a `text[]` datum.
pub unsafe fn text_elements(array: pg_sys::Datum) -> (Vec<Option<String>>, i32) {
    // SAFETY: as the caller promises; each element is a text datum, whose bytes pgrx reads as it
    // reads a bytea's (both are varlenas).
    unsafe {
        let (elements, dimensions) = varlena_elements(array, pg_sys::TEXTOID);
        let as_text =
            |element: pg_sys::Datum| <&[u8]>::from_polymorphic_datum(element, false, pg_sys::TEXTOID).map(crate::text::from_server);
        (elements.into_iter().map(|element| element.and_then(as_text)).collect(), dimensions)
    }
}
