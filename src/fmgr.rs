//! The extension's SQL functions written as C-language functions: the [`sql_function!`] macro
//! declares one, and [`Args`] reads its arguments (text converted from the database's
//! encoding, NULLs as `None`). The SQL declarations are in `sql/*.sql`
//! (`LANGUAGE c … AS 'MODULE_PATHNAME', '<name>'`).
//!
//! Why not `#[pg_extern]`: these functions take text in any database encoding (pgrx's `&str`
//! insists on UTF-8), and their SQL declarations (SECURITY DEFINER, defaults, grants) are
//! written by hand in the SQL files with the rest of the schema.

use crate::error::{raise, OutboxError};
use crate::text;
use pgrx::datum::{Array, FromDatum, Interval};
use pgrx::pg_sys;

/// Declares a C-language SQL function `$name` (with its `pg_finfo_<name>` record, which
/// PostgreSQL looks up by that name) whose body gets the call's [`Args`] and returns a
/// `Datum`. Its SQL declaration is in `sql/*.sql`.
macro_rules! sql_function {
    ($name:ident, $finfo:ident, |$args:ident| $body:block) => {
        #[unsafe(no_mangle)]
        #[doc(hidden)]
        pub extern "C" fn $finfo() -> &'static ::pgrx::pg_sys::Pg_finfo_record {
            const V1_API: ::pgrx::pg_sys::Pg_finfo_record = ::pgrx::pg_sys::Pg_finfo_record { api_version: 1 };
            &V1_API
        }

        #[::pgrx::pg_guard]
        #[unsafe(no_mangle)]
        pub unsafe extern "C-unwind" fn $name(fcinfo: ::pgrx::pg_sys::FunctionCallInfo) -> ::pgrx::pg_sys::Datum {
            // SAFETY: PostgreSQL calls this with a valid fcinfo for the declared arguments.
            let $args = unsafe { $crate::fmgr::Args::new(fcinfo) };
            $body
        }
    };
}
pub(crate) use sql_function;

/// The arguments of one call of a C-language function.
pub struct Args {
    fcinfo: pg_sys::FunctionCallInfo,
}

impl Args {
    /// # Safety
    /// `fcinfo` must be the valid call information PostgreSQL passed to the function.
    pub unsafe fn new(fcinfo: pg_sys::FunctionCallInfo) -> Self {
        Args { fcinfo }
    }

    pub fn fcinfo(&self) -> pg_sys::FunctionCallInfo {
        self.fcinfo
    }

    /// Whether the function was called by the name `name` (for C code that serves two SQL
    /// functions, one of them a deprecated name, and names the one called in its errors).
    pub fn called_as(&self, name: &str) -> bool {
        // SAFETY: flinfo is set for every call through fmgr; get_func_name returns a palloc'd
        // name, or NULL for an oid that is not a function.
        unsafe {
            let flinfo = (*self.fcinfo).flinfo;
            if flinfo.is_null() {
                return false;
            }
            let called = pg_sys::get_func_name((*flinfo).fn_oid);
            !called.is_null() && std::ffi::CStr::from_ptr(called).to_bytes() == name.as_bytes()
        }
    }

    /// Argument `n` as a raw datum, `None` when NULL.
    pub fn datum(&self, n: usize) -> Option<pg_sys::Datum> {
        // SAFETY: `n` is within the function's declared arguments (callers pass constants that
        // match the SQL declaration), and fcinfo is valid for the call.
        unsafe {
            let fcinfo = &*self.fcinfo;
            assert!(n < fcinfo.nargs as usize, "argument {n} of a function with {} arguments", fcinfo.nargs);
            let argument = *fcinfo.args.as_slice(fcinfo.nargs as usize).get(n)?;
            (!argument.isnull).then_some(argument.value)
        }
    }

    pub fn is_null(&self, n: usize) -> bool {
        self.datum(n).is_none()
    }

    /// Argument `n` converted by pgrx (numbers, booleans, intervals, uuids, arrays of them).
    pub fn get<T: FromDatum>(&self, n: usize) -> Option<T> {
        // SAFETY: the datum is of the argument's declared SQL type, which the caller names by T.
        self.datum(n).and_then(|datum| unsafe { T::from_polymorphic_datum(datum, false, pg_sys::InvalidOid) })
    }

    /// Text argument `n`, as UTF-8.
    pub fn text(&self, n: usize) -> Option<String> {
        self.text_bytes(n).map(text::from_server)
    }

    /// Text argument `n`'s bytes in the database's encoding (for limits and for passing on).
    /// pgrx reads them as it reads a bytea's: text, varchar and bytea are all varlenas.
    pub fn text_bytes(&self, n: usize) -> Option<&[u8]> {
        self.get::<&[u8]>(n)
    }

    /// jsonb argument `n`, as its text (UTF-8).
    pub fn jsonb_text(&self, n: usize) -> Option<String> {
        // SAFETY: the argument is declared jsonb; jsonb_out returns a palloc'd C string.
        self.datum(n).map(|datum| unsafe {
            let shown = pgrx::direct_function_call::<pg_sys::Datum>(pg_sys::jsonb_out, &[Some(datum)]).expect("jsonb_out returns text");
            text::from_server(std::ffi::CStr::from_ptr(shown.cast_mut_ptr()).to_bytes())
        })
    }

    pub fn interval(&self, n: usize) -> Option<Interval> {
        self.get::<Interval>(n)
    }

    /// Refuses array argument `n` (of any element type) when it has more than one dimension
    /// (see [`require_one_dimension`]); for arrays not read through `text_array` or
    /// `jsonb_array`, which count the dimensions themselves.
    #[track_caller]
    pub fn check_one_dimension(&self, n: usize, function: &'static str, argument: &'static str) {
        let Some(datum) = self.datum(n) else { return };
        // SAFETY: the caller names an argument declared as an array.
        require_one_dimension(unsafe { crate::array::dimensions(datum) }, function, argument);
    }

    /// Array argument `n` (`None` when NULL), refused when it has more than one dimension or a
    /// NULL element.
    #[track_caller]
    pub fn array_without_nulls<'a, T: pgrx::datum::UnboxDatum>(
        &self,
        n: usize,
        function: &'static str,
        argument: &'static str,
    ) -> Option<Array<'a, T>> {
        let array = self.get::<Array<'a, T>>(n)?;
        self.check_one_dimension(n, function, argument);
        if array.contains_nulls() {
            raise(OutboxError::null_element(function, argument));
        }
        Some(array)
    }

    /// A `text[]` argument as UTF-8 strings (an element `None` when NULL), with its number of
    /// dimensions.
    pub fn text_array(&self, n: usize) -> Option<(Vec<Option<String>>, i32)> {
        let datum = self.datum(n)?;
        // SAFETY: the argument is declared text[].
        Some(unsafe { crate::array::text_elements(datum) })
    }

    /// A `jsonb[]` argument's elements (an element `None` when NULL), with its number of
    /// dimensions.
    pub fn jsonb_array(&self, n: usize) -> Option<(Vec<Option<pg_sys::Datum>>, i32)> {
        let datum = self.datum(n)?;
        // SAFETY: the argument is declared jsonb[].
        Some(unsafe { crate::array::varlena_elements(datum, pg_sys::JSONBOID) })
    }
}

/// Refuses an array argument of `dimensions` when more than one: PostgreSQL would read it flat,
/// while a caller who wrote one meant something else.
#[track_caller]
pub fn require_one_dimension(dimensions: i32, function: &'static str, argument: &'static str) {
    if dimensions > 1 {
        raise(OutboxError::invalid(function, argument, format!("must be a one-dimensional array, got {dimensions} dimensions")));
    }
}

/// `value`, or a NULL-argument error naming `function` and `argument`.
#[track_caller]
pub fn required<T>(value: Option<T>, function: &'static str, argument: &'static str) -> T {
    match value {
        Some(value) => value,
        None => raise(OutboxError::null(function, argument)),
    }
}

/// A NULL result.
pub fn null_result(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: fcinfo is the call's valid information.
    unsafe { (*fcinfo).isnull = true };
    pg_sys::Datum::from(0)
}

/// The rows a set-returning function returns, kept in a tuplestore PostgreSQL reads after the
/// function has returned (materialize mode).
pub struct SetResult {
    store: *mut pg_sys::Tuplestorestate,
    descriptor: pg_sys::TupleDesc,
}

impl SetResult {
    /// Starts the result of a function declared `RETURNS SETOF <composite>`.
    pub fn begin(args: &Args) -> SetResult {
        // SAFETY: the function is set-returning, so fcinfo carries a ReturnSetInfo;
        // InitMaterializedSRF sets up its tuplestore in the query's memory context.
        unsafe {
            pg_sys::InitMaterializedSRF(args.fcinfo(), 0);
            let info = (*args.fcinfo()).resultinfo as *mut pg_sys::ReturnSetInfo;
            SetResult { store: (*info).setResult, descriptor: (*info).setDesc }
        }
    }

    /// Appends a whole-row datum of the result's type (the tuplestore copies it).
    pub fn push_row(&mut self, row: pg_sys::Datum) {
        // SAFETY: `row` is a composite datum; inside an SPI result it may be stored with a
        // short header, so it is expanded first.
        unsafe {
            let header = pg_sys::pg_detoast_datum(row.cast_mut_ptr()) as pg_sys::HeapTupleHeader;
            let mut tuple = pg_sys::HeapTupleData {
                t_len: pgrx::varlena::varsize_any(header as *const pg_sys::varlena) as u32,
                t_data: header,
                ..Default::default()
            };
            pg_sys::tuplestore_puttuple(self.store, &mut tuple);
        }
    }

    /// Appends a row given column by column (`None`: NULL), for a function declared with
    /// `RETURNS TABLE (…)`.
    pub fn push_values(&mut self, values: &[Option<pg_sys::Datum>]) {
        let mut datums: Vec<pg_sys::Datum> = values.iter().map(|v| v.unwrap_or(pg_sys::Datum::from(0))).collect();
        let mut nulls: Vec<bool> = values.iter().map(Option::is_none).collect();
        // SAFETY: the values match the result's descriptor (the SQL declaration); the tuplestore
        // copies them.
        unsafe { pg_sys::tuplestore_putvalues(self.store, self.descriptor, datums.as_mut_ptr(), nulls.as_mut_ptr()) };
    }

    /// What a set-returning function in materialize mode returns.
    pub fn finish(self) -> pg_sys::Datum {
        pg_sys::Datum::from(0)
    }
}
