//! Settings (GUCs). The core ones are `USERSET`: they can be set per session, per role
//! (`ALTER ROLE … SET`), per database (`ALTER DATABASE … SET`) or server-wide. The delivery
//! worker's are `SIGHUP`: a reload applies them. docs/settings.md has the table.

use crate::error::Problem;
use crate::policy::{BackoffPolicy, RetryPolicy};
use crate::webhook::destination::{self, Network};
use pgrx::{pg_guard, pg_sys, GucContext, GucFlags, GucRegistry, GucSetting};
use std::ffi::{c_char, c_void, CStr, CString};
use std::time::Duration;

pub static MAX_ATTEMPTS: GucSetting<i32> = GucSetting::<i32>::new(8);
pub static BACKOFF_BASE_MS: GucSetting<i32> = GucSetting::<i32>::new(2_000);
pub static BACKOFF_MAX_MS: GucSetting<i32> = GucSetting::<i32>::new(3_600_000);
pub static BACKOFF_JITTER: GucSetting<f64> = GucSetting::<f64>::new(0.2);

pub static WORKER_DATABASES: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c"*"));
pub static MAX_WORKERS: GucSetting<i32> = GucSetting::<i32>::new(8);
pub static WORKER_MEMORY_KB: GucSetting<i32> = GucSetting::<i32>::new(64 * 1024);
pub static WORKER_ENABLED: GucSetting<bool> = GucSetting::<bool>::new(true);
pub static COMPACTION: GucSetting<bool> = GucSetting::<bool>::new(true);
pub static POLL_INTERVAL_MS: GucSetting<i32> = GucSetting::<i32>::new(1_000);
pub static WORKER_BATCH_SIZE: GucSetting<i32> = GucSetting::<i32>::new(100);
pub static MAX_IN_FLIGHT: GucSetting<i32> = GucSetting::<i32>::new(8);
pub static HTTP_TIMEOUT_MS: GucSetting<i32> = GucSetting::<i32>::new(5_000);
pub static RETENTION_S: GucSetting<i32> = GucSetting::<i32>::new(7 * 24 * 3600);
pub static ALLOWED_NETWORKS: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c""));
/// outbox.endpoint_disable_after's default.
const DEFAULT_ENDPOINT_DISABLE_AFTER: &CStr = c"5 days";
pub static ENDPOINT_DISABLE_AFTER: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(DEFAULT_ENDPOINT_DISABLE_AFTER));

pub fn register() {
    GucRegistry::define_int_guc(
        c"outbox.max_attempts",
        c"Deliveries of a message before it is dead-lettered.",
        c"A message whose delivery fails (or whose lease runs out) this many times becomes DEAD.",
        &MAX_ATTEMPTS,
        1,
        1_000,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"outbox.backoff_base",
        c"Delay before retrying after the first failed attempt.",
        c"The n-th failure waits backoff_base * 2^(n-1), capped by outbox.backoff_max, plus jitter.",
        &BACKOFF_BASE_MS,
        1,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"outbox.backoff_max",
        c"Longest delay between two attempts, before jitter.",
        c"Caps the exponential growth of outbox.backoff_base.",
        &BACKOFF_MAX_MS,
        1,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_float_guc(
        c"outbox.backoff_jitter",
        c"Random stretch of each retry delay, as a fraction of it (0 makes delays exact).",
        c"A delay d becomes a uniform random value in [d, d * (1 + jitter)).",
        &BACKOFF_JITTER,
        0.0,
        1.0,
        GucContext::Userset,
        GucFlags::default(),
    );
}

/// Refuses `outbox.*` names that are not settings (`SET outbox.max_attempt = 3`: 42602), and
/// warns of those in the configuration files, instead of keeping them as placeholders nothing
/// reads. Only when preloaded: then every setting is defined. A library loaded by a session
/// (no worker) leaves the prefix open, so that the worker's settings can be written before the
/// restart that preloads it.
pub fn reserve_the_prefix() {
    // SAFETY: called from _PG_init while the postmaster preloads us, after the definitions;
    // PostgreSQL copies the name into its own memory.
    unsafe { pg_sys::MarkGUCPrefixReserved(c"outbox".as_ptr()) };
}

/// The delivery worker's settings (defined only while the library is preloaded: without it
/// there is no worker).
pub fn register_worker(preloading: bool) {
    if !preloading {
        return;
    }
    // SAFETY: the hook is #[pg_guard]ed and only reads the value it is given.
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"outbox.worker_databases",
            c"Databases that get a delivery worker: '*' for every database with outbox_ext, or a comma-separated list.",
            c"A database must also have the extension. A reload applies a change.",
            &WORKER_DATABASES,
            GucContext::Sighup,
            GucFlags::default(),
            Some(check_worker_databases),
            None,
            None,
        );
    }
    GucRegistry::define_int_guc(
        c"outbox.max_workers",
        c"Delivery workers (one per database) that may run at once.",
        c"Databases beyond it wait, named in a WARNING and in outbox_worker_status(). Each worker is a background worker: max_worker_processes must leave room.",
        &MAX_WORKERS,
        1,
        crate::worker::registry::SLOTS as i32,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"outbox.worker_enabled",
        c"Whether the delivery worker delivers (off: it idles, messages stay pending).",
        c"",
        &WORKER_ENABLED,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"outbox.compaction",
        c"Whether the delivery worker compacts the hot tables while vacuum is held back (outbox_compact).",
        c"",
        &COMPACTION,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"outbox.poll_interval",
        c"How long an idle delivery worker waits before looking for ready messages again.",
        c"A committed outbox_enqueue wakes it earlier; the poll finds messages whose backoff or delay ran out.",
        &POLL_INTERVAL_MS,
        10,
        3_600_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"outbox.worker_batch_size",
        c"Ready messages the delivery worker picks up at a time (each gets a delivery per endpoint).",
        c"",
        &WORKER_BATCH_SIZE,
        1,
        crate::claim::MAX_BATCH_SIZE,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"outbox.max_in_flight",
        c"HTTP requests a delivery worker may have in flight at once, shared between its endpoints.",
        c"Each endpoint with work gets an equal share (at least one): a slow endpoint holds only its own.",
        &MAX_IN_FLIGHT,
        1,
        256,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"outbox.worker_memory",
        c"Payload bytes a delivery worker holds in requests at once.",
        c"A request starts only while the payloads in flight stay under it (a single larger payload still goes, alone).",
        &WORKER_MEMORY_KB,
        64,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_KB,
    );
    GucRegistry::define_int_guc(
        c"outbox.http_timeout",
        c"Longest wait for an endpoint: connecting, sending and reading the answer together.",
        c"A subscription's own timeout overrides it; no request lasts longer than 9 min 55 s.",
        &HTTP_TIMEOUT_MS,
        100,
        600_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    // SAFETY: the hooks are #[pg_guard]ed and only read the value they are given.
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"outbox.allowed_networks",
            c"Networks the delivery worker may connect to beyond public addresses (comma-separated CIDRs).",
            c"Loopback, private, link-local, unspecified and multicast addresses are refused unless listed, e.g. '127.0.0.1/32' for a local receiver.",
            &ALLOWED_NETWORKS,
            GucContext::Sighup,
            GucFlags::default(),
            Some(check_allowed_networks),
            None,
            None,
        );
        GucRegistry::define_string_guc_with_hooks(
            c"outbox.endpoint_disable_after",
            c"How long an endpoint may fail every attempt before the delivery worker disables it ('0': never).",
            c"Its deliveries are then parked until outbox_enable_subscription. An interval such as '5 days', '12h' or '30s'.",
            &ENDPOINT_DISABLE_AFTER,
            GucContext::Sighup,
            GucFlags::default(),
            Some(check_endpoint_disable_after),
            None,
            None,
        );
    }
    GucRegistry::define_int_guc(
        c"outbox.retention",
        c"How long DONE messages (and the attempt log) are kept before the delivery worker purges them (0: never).",
        c"DEAD messages are kept until requeued or discarded.",
        &RETENTION_S,
        0,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
}

/// The databases `outbox.worker_databases` names (see [`database_names`]), or `None` for '*'
/// (every database with the extension).
pub fn worker_databases() -> Option<Vec<String>> {
    let raw = WORKER_DATABASES.get().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    if raw.trim() == "*" {
        return None;
    }
    // (The check hook refused a list that does not read.)
    Some(database_names(&raw).unwrap_or_default())
}

fn check_database_names(list: &str) -> Result<(), Problem> {
    database_names(list).map(|_| ())
}

/// The names in a comma-separated list, trimmed, without empties or repeats, each as written
/// (database names keep their case). A name with a comma, or spaces at its ends, is written in
/// double quotes, a double quote in it doubled, as in SQL: `shop, "Odd ""DB"", x"`. Refuses a
/// list whose double quotes do not close, or close before more than spaces (`"a"b`): read as it
/// could be, it named other databases than meant, and the workers of the others stopped
/// without a word (stop 56's probe: `'postgres, "lat'`).
fn database_names(list: &str) -> Result<Vec<String>, Problem> {
    let mut names: Vec<String> = Vec::new();
    let mut chars = list.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut name = String::new();
        if chars.next_if_eq(&'"').is_some() {
            loop {
                match chars.next() {
                    None => return Err("has a double quote that does not close (write a \" in a name as \"\")".into()),
                    Some('"') if chars.next_if_eq(&'"').is_none() => break,
                    Some(c) => name.push(c),
                }
            }
            while chars.next_if(|c| c.is_whitespace()).is_some() {}
            if chars.next_if(|&c| c != ',').is_some() {
                return Err("has a name in double quotes followed by more than spaces before the next comma".into());
            }
        } else {
            while let Some(c) = chars.next_if(|&c| c != ',') {
                name.push(c);
            }
            name.truncate(name.trim_end().len());
        }
        if !name.is_empty() && !names.contains(&name) {
            names.push(name);
        }
        if chars.next().is_none() {
            return Ok(names);
        }
    }
}

/// A string setting's check hook: `check` judges the new value; a refusal's reason becomes
/// the error's DETAIL (PostgreSQL reports SQLSTATE 22023, naming the setting).
///
/// # Safety
/// `newval` is the pointer PostgreSQL passes a string check hook.
unsafe fn check_string_setting(newval: *mut *mut c_char, check: impl Fn(&str) -> Result<(), Problem>) -> bool {
    // SAFETY: as the caller promises, `*newval` is NULL or a string that lives while the hook
    // runs; GUC_check_errdetail_string takes a palloc'd string, as GUC_check_errdetail does.
    unsafe {
        let value = if (*newval).is_null() { "".into() } else { CStr::from_ptr(*newval).to_string_lossy() };
        match check(&value) {
            Ok(()) => true,
            Err(why) => {
                let detail = CString::new(why.0.replace('\0', "")).unwrap_or_default();
                pg_sys::GUC_check_errdetail_string = pg_sys::pstrdup(detail.as_ptr());
                false
            }
        }
    }
}

/// Defines `$hook`, a string setting's check hook (#[pg_guard]ed) that judges values with
/// `$check` through check_string_setting.
macro_rules! string_check_hook {
    ($hook:ident, $check:expr) => {
        #[pg_guard]
        unsafe extern "C-unwind" fn $hook(newval: *mut *mut c_char, _extra: *mut *mut c_void, _source: pg_sys::GucSource::Type) -> bool {
            // SAFETY: PostgreSQL calls a string check hook with `newval` as check_string_setting needs.
            unsafe { check_string_setting(newval, $check) }
        }
    };
}

string_check_hook!(check_allowed_networks, |value| destination::parse_allowed_networks(value).map(drop));
string_check_hook!(check_endpoint_disable_after, |value| parse_duration(value).map(drop));
string_check_hook!(check_worker_databases, check_database_names);

/// The networks `outbox.allowed_networks` opens (read by name: in a session whose library was
/// not preloaded, the setting is only a placeholder).
pub fn allowed_networks() -> Vec<Network> {
    // SAFETY: reads a setting by name (missing_ok); its value is NULL or a NUL-terminated
    // string that lives until the setting changes, and is copied at once.
    let value = unsafe {
        let raw = pg_sys::GetConfigOption(c"outbox.allowed_networks".as_ptr(), true, false);
        if raw.is_null() {
            String::new()
        } else {
            CStr::from_ptr(raw).to_string_lossy().into_owned()
        }
    };
    destination::parse_allowed_networks(&value).unwrap_or_default()
}

/// `outbox.endpoint_disable_after`: `None` never disables.
pub fn endpoint_disable_after() -> Option<Duration> {
    let default = DEFAULT_ENDPOINT_DISABLE_AFTER.to_string_lossy();
    let raw = ENDPOINT_DISABLE_AFTER.get().map_or_else(|| default.to_string(), |s| s.to_string_lossy().into_owned());
    // The check hook lets only durations through, and the default is one.
    parse_duration(&raw).or_else(|_| parse_duration(&default)).unwrap_or(None)
}

/// A duration setting: "5 days", "12h", "1 hour 30 min", "90" (seconds); "0" is `None`.
pub fn parse_duration(text: &str) -> Result<Option<Duration>, Problem> {
    let bad = || format!("\"{}\" is not a duration such as '5 days', '12h' or '30s'", text.trim());
    let mut total = 0f64;
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad().into());
    }
    while !rest.is_empty() {
        let number_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let number: f64 = rest[..number_end].parse().map_err(|_| bad())?;
        rest = rest[number_end..].trim_start();
        let unit_end = rest.find(|c: char| !c.is_ascii_alphabetic()).unwrap_or(rest.len());
        let seconds = match rest[..unit_end].to_ascii_lowercase().as_str() {
            "" | "s" | "sec" | "secs" | "second" | "seconds" => 1.0,
            "us" => 1e-6,
            "ms" => 1e-3,
            "min" | "mins" | "minute" | "minutes" => 60.0,
            "h" | "hour" | "hours" => 3600.0,
            "d" | "day" | "days" => 86_400.0,
            "w" | "week" | "weeks" => 604_800.0,
            _ => return Err(bad().into()),
        };
        total += number * seconds;
        rest = rest[unit_end..].trim_start();
    }
    if total == 0.0 {
        Ok(None)
    } else if total.is_finite() && total < 1e10 {
        Ok(Some(Duration::from_secs_f64(total)))
    } else {
        Err(bad().into())
    }
}

pub fn max_workers() -> usize {
    MAX_WORKERS.get() as usize
}

/// The worker's settings as they are now (re-read after every reload).
#[derive(Debug, Clone, Copy)]
pub struct WorkerSettings {
    pub enabled: bool,
    pub poll_interval: Duration,
    pub batch_size: i32,
    pub max_in_flight: usize,
    pub max_payload_bytes: usize,
    pub http_timeout: Duration,
    /// `None`: keep DONE messages forever.
    pub retention: Option<Duration>,
    /// Whether to call `outbox_compact` every second.
    pub compaction: bool,
    /// `None`: never disable a failing endpoint.
    pub endpoint_disable_after: Option<Duration>,
}

pub fn worker_settings() -> WorkerSettings {
    WorkerSettings {
        enabled: WORKER_ENABLED.get(),
        poll_interval: Duration::from_millis(POLL_INTERVAL_MS.get() as u64),
        batch_size: WORKER_BATCH_SIZE.get(),
        max_in_flight: MAX_IN_FLIGHT.get() as usize,
        max_payload_bytes: WORKER_MEMORY_KB.get() as usize * 1024,
        http_timeout: Duration::from_millis(HTTP_TIMEOUT_MS.get() as u64),
        retention: match RETENTION_S.get() {
            0 => None,
            seconds => Some(Duration::from_secs(seconds as u64)),
        },
        compaction: COMPACTION.get(),
        endpoint_disable_after: endpoint_disable_after(),
    }
}

/// The retry policy as the current settings define it.
pub fn retry_policy() -> RetryPolicy {
    RetryPolicy {
        max_attempts: MAX_ATTEMPTS.get(),
        backoff: BackoffPolicy {
            base: Duration::from_millis(BACKOFF_BASE_MS.get() as u64),
            max: Duration::from_millis(BACKOFF_MAX_MS.get() as u64),
            jitter: BACKOFF_JITTER.get(),
        },
    }
}

#[cfg(test)]
mod unit_tests {
    use super::{check_database_names, database_names, parse_duration};
    use std::time::Duration;

    #[test]
    fn database_names_split_on_commas_outside_double_quotes() {
        assert_eq!(database_names(" shop, billing ,,shop"), Ok(vec!["shop".into(), "billing".into()]));
        assert_eq!(database_names("Shop,shop"), Ok(vec!["Shop".into(), "shop".into()]));
        assert_eq!(
            database_names(r#"shop, "Odd ""DB"", x", " padded ""#),
            Ok(vec!["shop".into(), r#"Odd "DB", x"#.into(), " padded ".into()])
        );
        assert_eq!(database_names(""), Ok(vec![]));
    }

    #[test]
    fn a_list_of_databases_whose_quotes_do_not_close_is_refused() {
        for good in ["*", "", " shop, billing ,,shop", r#"shop, "Odd ""DB"", x", " padded " "#] {
            assert_eq!(check_database_names(good), Ok(()), "{good}");
        }
        for bad in [r#"postgres, "lat"#, r#""a"b, c"#, r#""a"""#] {
            assert!(check_database_names(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(parse_duration("5 days"), Ok(Some(Duration::from_secs(5 * 86_400))));
        assert_eq!(parse_duration("12h"), Ok(Some(Duration::from_secs(12 * 3600))));
        assert_eq!(parse_duration("1 hour 30 min"), Ok(Some(Duration::from_secs(5400))));
        assert_eq!(parse_duration(" 3s "), Ok(Some(Duration::from_secs(3))));
        assert_eq!(parse_duration("90"), Ok(Some(Duration::from_secs(90))));
        assert_eq!(parse_duration("1.5s"), Ok(Some(Duration::from_millis(1500))));
        assert_eq!(parse_duration("0"), Ok(None));
        for bad in ["", "soon", "5 fortnights", "-1 day", "1e400 s", "s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
