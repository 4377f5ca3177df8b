"""Bad input is refused with a deliberate SQLSTATE and a message naming the argument, before
anything is written; the session and the server keep serving."""

import pytest
import psycopg

NULL_VALUE = "22004"
INVALID = "22023"
TOO_LONG = "22001"

CASES = [
    # (call, SQLSTATE, words the message must contain)
    ("outbox_enqueue(NULL, '{}')", NULL_VALUE, "topic"),
    ("outbox_enqueue('', '{}')", INVALID, "topic"),
    ("outbox_enqueue(repeat('a', 65), '{}')", TOO_LONG, "topic"),
    ("outbox_enqueue('booking created', '{}')", INVALID, "topic"),
    ("outbox_enqueue('café.opened', '{}')", INVALID, "topic"),
    ("outbox_enqueue(E'booking\\ncreated', '{}')", INVALID, "topic"),
    ("outbox_enqueue('booking.created', NULL)", NULL_VALUE, "payload"),
    ("outbox_enqueue('booking.created', '{}', NULL)", NULL_VALUE, "delay"),
    ("outbox_enqueue('booking.created', '{}', interval '-1 second')", INVALID, "delay"),
    # Judged by where it takes the clock: a month less 32 days goes back whatever the month.
    ("outbox_enqueue('booking.created', '{}', interval '1 month -32 days')", INVALID, "delay"),
    ("outbox_enqueue('booking.created', '{}', dedupe_key => '')", INVALID, "dedupe_key"),
    ("outbox_enqueue('booking.created', '{}', dedupe_key => repeat('k', 256))", TOO_LONG, "dedupe_key"),
    ("outbox_enqueue_batch(NULL, ARRAY['{}'::jsonb])", NULL_VALUE, "topic"),
    ("outbox_enqueue_batch('bad topic', ARRAY['{}'::jsonb])", INVALID, "topic"),
    ("outbox_enqueue_batch('booking.created', NULL)", NULL_VALUE, "payloads"),
    ("outbox_enqueue_batch('booking.created', ARRAY['{}'::jsonb, NULL])", NULL_VALUE, "payloads"),
    # A number of a few bytes that prints as 131,072 characters (0.5.32's hostile test: 131 KB
    # of them printed as over 1 GB, which nobody could read, the worker, pg_dump and consumers).
    ("outbox_enqueue('booking.created', '{\"n\": 1e131071}')", INVALID, "payload"),
    ("outbox_enqueue('booking.created', '[0.1, -1e-16383]')", INVALID, "payload"),
    ("outbox_enqueue_batch('booking.created', ARRAY['{}', '[1e1100]']::jsonb[])", INVALID, "payloads"),
    ("outbox_enqueue_batch('booking.created', ARRAY['{}'::jsonb], interval '-1 day')", INVALID, "delay"),
    ("outbox_claim(NULL)", NULL_VALUE, "batch_size"),
    ("outbox_claim(0)", INVALID, "batch_size"),
    ("outbox_claim(-5)", INVALID, "batch_size"),
    ("outbox_claim(1000000)", INVALID, "batch_size"),
    ("outbox_claim(10, ARRAY[NULL]::text[])", NULL_VALUE, "topics"),
    ("outbox_claim(10, ARRAY['booking.created', 'not a topic'])", INVALID, "topics"),
    ("outbox_claim(10, NULL, interval '0')", INVALID, "lease"),
    ("outbox_claim(10, NULL, interval '-5 seconds')", INVALID, "lease"),
    # (A month less 31 days: nowhere or back, whatever the month.)
    ("outbox_claim(10, NULL, interval '1 month -31 days')", INVALID, "lease"),
    ("outbox_complete(NULL::bigint)", NULL_VALUE, "id"),
    ("outbox_complete(NULL::bigint[])", NULL_VALUE, "ids"),
    ("outbox_complete(ARRAY[1, NULL]::bigint[])", NULL_VALUE, "ids"),
    ("outbox_complete(ARRAY[1, 2]::bigint[], ARRAY[gen_random_uuid()])", INVALID, "lease_tokens"),
    ("outbox_fail(NULL, 'boom')", NULL_VALUE, "id"),
    ("outbox_fail(1, NULL)", NULL_VALUE, "error"),
    ("outbox_fail(1, 'boom', NULL, interval '-1 second')", INVALID, "retry_in"),
    ("outbox_backoff(-1)", INVALID, "attempts"),
    # A payloads array of two dimensions (0.3.0: 0A000 without the function's name).
    ("outbox_enqueue_batch('booking.created', ARRAY[['{}','{}'],['{}','{}']]::jsonb[])", INVALID, "payloads"),
    ("outbox_complete_batch(NULL, NULL)", NULL_VALUE, "ids"),
    ("outbox_complete_batch(ARRAY[1, 2]::bigint[], ARRAY[gen_random_uuid()])", INVALID, "lease_tokens"),
    # Subscriptions: every header the worker sets is reserved, in any case (0.3.0 accepted
    # outbox-attempt, and the receiver got it twice), ports exist, header values are bounded.
    ("outbox_subscribe('t.x', 'http://127.0.0.1:9/', headers => '{\"outbox-attempt\": \"999\"}')", INVALID, "headers"),
    ("outbox_subscribe('t.x', 'http://127.0.0.1:9/', headers => '{\"Outbox-Topic\": \"x\"}')", INVALID, "headers"),
    ("outbox_subscribe('t.x', 'http://127.0.0.1:9/', headers => '{\"User-Agent\": \"x\"}')", INVALID, "headers"),
    ("outbox_subscribe('t.x', 'http://127.0.0.1:9/', headers => '{\"Connection\": \"close\"}')", INVALID, "headers"),
    # The body is the payload's JSON as stored: a receiver that believed these would fail on it.
    ("outbox_enqueue('booking.created', '{}', headers => '{\"Content-Encoding\": \"gzip\"}')", INVALID, "headers"),
    ("outbox_subscribe('t.x', 'http://127.0.0.1:9/', headers => '{\"content-range\": \"bytes 0-1/2\"}')", INVALID, "headers"),
    ("outbox_subscribe('t.x', 'http://127.0.0.1:9/', headers => jsonb_build_object('X-Big', repeat('v', 8193)))", INVALID, "headers"),
    ("outbox_subscribe('t.x', 'http://127.0.0.1:9/', headers => (SELECT jsonb_object_agg('X-H' || n, 'v') FROM generate_series(1, 17) n))", INVALID, "headers"),
    ("outbox_subscribe('t.x', 'http://127.0.0.1:99999/')", INVALID, "url"),
    ("outbox_subscribe('t.x', 'http://127.0.0.1:0/')", INVALID, "url"),
    # Accepted before 0.5.30, and the worker went elsewhere than the URL shown: to [::1]:80
    # (the text after the literal dropped), to port 80 ("+80" read as a number).
    ("outbox_subscribe('t.x', 'http://[::1]evil.example/')", INVALID, "url"),
    ("outbox_subscribe('t.x', 'http://hooks.example.test:+80/')", INVALID, "url"),
    # A header named twice in different cases: HTTP names ignore case, so both were sent (0.5.15).
    ("outbox_subscribe('t.x', 'http://127.0.0.1:9/', headers => '{\"X-Team\": \"7\", \"x-team\": \"8\"}')", INVALID, "headers"),
    ("outbox_enqueue('booking.created', '{}', headers => '{\"X-Team\": \"7\", \"X-TEAM\": \"8\"}')", INVALID, "headers"),
    # A producer may not set what a proxy in front of the receiver routes by (stop 58's probe).
    ("outbox_enqueue('booking.created', '{}', headers => '{\"X-Forwarded-Host\": \"internal.admin\"}')", INVALID, "headers"),
    ("outbox_enqueue('booking.created', '{}', headers => '{\"Forwarded\": \"host=internal\"}')", INVALID, "headers"),
    ("outbox_enqueue('booking.created', '{}', headers => '{\"X-HTTP-Method-Override\": \"DELETE\"}')", INVALID, "headers"),
    # Arrays of more than one dimension, which the error table refuses (0.5.15 took them flat,
    # or failed with PostgreSQL's 0A000 naming no function).
    ("outbox_claim(10, ARRAY[['booking.created'], ['invoice.paid']])", INVALID, "topics"),
    ("outbox_complete_batch(ARRAY[[1, 2], [3, 4]]::bigint[])", INVALID, "ids"),
    ("outbox_complete_batch(ARRAY[1, 2]::bigint[], ARRAY[[gen_random_uuid()], [gen_random_uuid()]])", INVALID, "lease_tokens"),
    ("outbox_complete(ARRAY[[1, 2]]::bigint[])", INVALID, "ids"),
    ("outbox_depth(ARRAY[['booking.created'], ['invoice.paid']])", INVALID, "topics"),
    ("outbox_redeliver(1, message_ids => ARRAY[[1], [2]]::bigint[])", INVALID, "message_ids"),
    # outbox_depth checks its topics as outbox_claim does (0.5.15 counted 0 for a bad one).
    ("outbox_depth(ARRAY['not a topic'])", INVALID, "topics"),
    # NULL is 22004 everywhere (0.5.15: 22023 for these), and a NULL element is not ignored.
    ("outbox_purge(interval '1 day', false, NULL)", NULL_VALUE, "max_rows"),
    ("outbox_archive(NULL)", NULL_VALUE, "max_rows"),
    ("outbox_compact(false, NULL)", NULL_VALUE, "max_live_rows"),
    ("outbox_redeliver(1, message_ids => ARRAY[1, NULL]::bigint[])", NULL_VALUE, "message_ids"),
    # The worker's and the operators' functions' own, callable by the worker's role: a NULL key
    # reached a pgrx panic (XX000), and arrays that did not pair up released nothing, silently.
    ("outbox_release_keys(ARRAY['booking:1', NULL])", NULL_VALUE, "keys"),
    ("outbox_release_delivery_keys(ARRAY[1]::bigint[], '{}'::text[])", INVALID, "keys"),
    ("outbox_release_delivery_keys(ARRAY[NULL]::bigint[], ARRAY['booking:1'])", NULL_VALUE, "subscriptions"),
    ("outbox_release_delivery_keys(ARRAY[1]::bigint[], ARRAY[NULL]::text[])", NULL_VALUE, "keys"),
    ("outbox_release_delivery_keys(ARRAY[[1], [2]]::bigint[], ARRAY[['a'], ['b']])", INVALID, "subscriptions"),
    # The SQL-language functions' checks, called without the names they report: ": : must not
    # be NULL" before 0.5.30.
    ("outbox_check_topic(NULL, NULL, NULL)", NULL_VALUE, "function"),
    ("outbox_check_interval(NULL, NULL, interval '20000 years')", NULL_VALUE, "function"),
    # Judged by where it takes the clock, as leases and delays: this one is 4 - 5 days ahead.
    ("outbox_purge(interval '-1 year +361 days')", INVALID, "older_than"),
    # Beyond what the clock may be moved by: PostgreSQL's 22008 (timestamp out of range, naming
    # nothing) or 22008 from outbox_fail's own arithmetic before 0.5.17.
    ("outbox_enqueue('booking.created', '{}', interval '1000000 years')", INVALID, "delay"),
    ("outbox_enqueue_batch('booking.created', ARRAY['{}'::jsonb], interval '1000000 years')", INVALID, "delay"),
    ("outbox_claim(10, NULL, interval '1000000 years')", INVALID, "lease"),
    ("outbox_fail(1, 'boom', NULL, interval '1000000 years')", INVALID, "retry_in"),
    ("outbox_purge(interval '1000000 years')", INVALID, "older_than"),
    # Back further than timestamps go (4713 BC): PostgreSQL's 22008 before 0.5.18 (stop 41's probe).
    ("outbox_enqueue('booking.created', '{}', interval '-9000 years')", INVALID, "delay"),
    ("outbox_enqueue_batch('booking.created', ARRAY['{}'::jsonb], interval '-9000 years')", INVALID, "delay"),
    ("outbox_claim(10, NULL, interval '-9000 years')", INVALID, "lease"),
    ("outbox_fail(1, 'boom', NULL, interval '-9000 years')", INVALID, "retry_in"),
    # The same with parts that disagree in sign (a day ahead, 9,999 years back): judged on the
    # clock, whose arithmetic then failed with PostgreSQL's 22008 before 0.5.30 (stop 53's probe).
    ("outbox_enqueue('booking.created', '{}', interval '-9999 years 1 day')", INVALID, "delay"),
    ("outbox_enqueue_batch('booking.created', ARRAY['{}'::jsonb], interval '-9999 years 1 day')", INVALID, "delay"),
    ("outbox_claim(10, NULL, interval '-3000000 days 1 microsecond')", INVALID, "lease"),
    ("outbox_fail(1, 'boom', NULL, interval '-9999 years 1 day')", INVALID, "retry_in"),
    # A timeout is sent as seconds (a year as 365.25 days), but was compared as an interval (a
    # year as 360 days): these passed as 5 seconds and became -5 days (every attempt timed out
    # at once) and 5 days (beyond the 10 minutes allowed).
    ("outbox_subscribe('t.x', 'http://127.0.0.1:9/', timeout => interval '-1 year 360 days 5 seconds')", INVALID, "timeout"),
    ("outbox_subscribe('t.x', 'http://127.0.0.1:9/', timeout => interval '1 year -360 days 5 seconds')", INVALID, "timeout"),
    # Judged by where it takes the clock (compared as an interval it passed, and ended the old
    # secret days ago).
    ("outbox_rotate_secret(outbox_subscribe('t.x', 'https://hooks.example.test/'), overlap => interval '-12 months 361 days')", INVALID, "overlap"),
    ("outbox_rotate_secret(outbox_subscribe('t.x', 'https://hooks.example.test/'), overlap => interval '-9000 years')", INVALID, "overlap"),
    # A reason is shown wherever the endpoint is (outbox_endpoint_stats, the monitoring view):
    # as bounded as the errors the worker records.
    ("outbox_disable_subscription(outbox_subscribe('t.x', 'https://hooks.example.test/'), repeat('r', 4097))", TOO_LONG, "reason"),
    # Shown as "why it is disabled": an empty one said nothing (NULL gives "disabled by <role>"),
    # and control characters acted on the terminal of whoever read it in psql (an audit).
    ("outbox_disable_subscription(outbox_subscribe('t.x', 'https://hooks.example.test/'), ' ')", INVALID, "reason"),
    ("outbox_disable_subscription(outbox_subscribe('t.x', 'https://hooks.example.test/'), E'migrating\\x1b[2J')", INVALID, "reason"),
    ("outbox_disable_subscription(outbox_subscribe('t.x', 'https://hooks.example.test/'), E'a\\nb')", INVALID, "reason"),
]


@pytest.mark.parametrize("call,sqlstate,argument", CASES, ids=[c[0] for c in CASES])
def test_bad_argument_is_refused_with_its_sqlstate(db, call, sqlstate, argument):
    db.execute("SELECT outbox_enqueue('booking.created', '{}')")
    before = db.execute("SELECT count(*), sum(attempts), max(id) FROM outbox").fetchone()
    with pytest.raises(psycopg.Error) as caught:
        db.execute(f"SELECT * FROM {call}")
    assert caught.value.sqlstate == sqlstate, caught.value
    message = caught.value.diag.message_primary
    assert argument in message and message.startswith(call.split("(")[0]), message
    # Nothing half-written, and the session keeps serving.
    assert db.execute("SELECT count(*), sum(attempts), max(id) FROM outbox").fetchone() == before


def test_the_status_column_admits_only_the_three_states(db):
    # The table has no CHECK constraints (they cost a fifth of the enqueue rate, see
    # sql/schema.sql): the functions keep the other invariants, the enum keeps this one even
    # for the owner writing directly.
    with pytest.raises(psycopg.errors.InvalidTextRepresentation):
        db.execute("INSERT INTO outbox (topic, payload, status) VALUES ('a.b', '{}', 'LOST')")
    with pytest.raises(psycopg.errors.InvalidTextRepresentation):
        db.execute("UPDATE outbox SET status = 'done'")


def test_mixed_sign_intervals_that_move_the_clock_ahead_are_accepted(db):
    # A month less 27 days is 1 to 4 days, depending on the month it starts in (never less).
    delayed, expected = db.execute(
        "SELECT available_at - clock_timestamp(), (now() + interval '1 month -27 days') - now() "
        "FROM outbox_enqueue('booking.created', '{}', interval '1 month -27 days')").fetchone()
    assert expected.total_seconds() >= 86400
    assert expected.total_seconds() - 60 < delayed.total_seconds() <= expected.total_seconds()
    assert db.execute("SELECT count(*) FROM outbox_claim(10, NULL, interval '1 month -27 days')").fetchone()[0] == 0


@pytest.mark.parametrize("call, argument", [
    ("outbox_claim(10, NULL, interval '-1 year +361 days')", "lease"),
    ("outbox_enqueue('booking.created', '{}', interval '-1 year +361 days')", "delay"),
    # (0.5.16 judged retry_in alone with 30-day months, and took this one.)
    ("outbox_fail(1, 'boom', NULL, interval '-1 year +361 days')", "retry_in"),
])
def test_an_interval_above_zero_that_moves_the_clock_back_is_refused(db, call, argument):
    """'-1 year +361 days' is more than zero as PostgreSQL compares intervals (a month as 30
    days), but added to the clock it goes back 4 or 5 days: a lease of it had run out when it
    was given (another consumer got the message at once), a delay of it dated the message in
    the past. Both were accepted."""
    db.execute("SELECT outbox_enqueue('booking.created', '{}')")
    with pytest.raises(psycopg.Error) as caught:
        db.execute(f"SELECT * FROM {call}")
    assert caught.value.sqlstate == INVALID
    assert argument in caught.value.diag.message_primary


def test_an_overlap_that_moves_the_clock_ahead_keeps_the_old_secret(db):
    """'12 months -361 days' moves the clock 4 or 5 days ahead, though it compares below zero
    (a month as 30 days): the old secret was dropped at once (stop 41's review)."""
    subscription = db.execute("SELECT outbox_subscribe('booking.created', 'https://hooks.example.test/', "
                              "secret => outbox_generate_secret())").fetchone()[0]
    old = db.execute("SELECT secret FROM outbox_subscription WHERE id = %s", (subscription,)).fetchone()[0]
    db.execute("SELECT outbox_rotate_secret(%s, overlap => interval '12 months -361 days')", (subscription,))
    kept, until = db.execute("SELECT previous_secret, previous_secret_until - now() FROM outbox_subscription "
                             "WHERE id = %s", (subscription,)).fetchone()
    assert kept == old and until.days >= 3


@pytest.mark.parametrize("retry_in", ["1 year -362 days", "1 month", "1 year"])
def test_a_retry_in_moves_the_clock_as_a_delay_does(db, retry_in):
    """retry_in is judged by where it takes the clock, as a delay is, but was then waited as a
    duration with 30-day months: '1 year -362 days' (three days ahead on the calendar) was
    retried at once, '1 month' after 30 days (stop 48's review of bad input)."""
    db.execute("SELECT outbox_enqueue('booking.created', '{}')")
    (message,) = db.execute("SELECT id FROM outbox_claim(1, lease => NULL)").fetchone()
    assert db.execute("SELECT outbox_fail(%s, 'boom', NULL, %s::interval)", (message, retry_in)).fetchone()[0] == "PENDING"
    off_by = db.execute("SELECT available_at - (clock_timestamp() + %s::interval) FROM outbox WHERE id = %s",
                        (retry_in, message)).fetchone()[0]
    assert abs(off_by.total_seconds()) < 60, off_by


def test_intervals_reach_ten_thousand_years_and_no_further(db):
    """Every interval the clock is moved by (delay, lease, retry_in, older_than, overlap) is
    finite and at most 10,000 years. Beyond, PostgreSQL's arithmetic overflowed with 22008
    naming nothing; an infinite one (PostgreSQL 17 and later) was taken: a lease that never runs
    out, a message never due, an old secret never retired (found by stop 40's probe)."""
    db.execute("SELECT outbox_enqueue('booking.created', '{}', interval '10000 years')")
    db.execute("SELECT outbox_claim(10, NULL, interval '10000 years')")
    # Nothing finished before 4713 BC, where timestamps begin: there is nothing to purge (22008
    # before 0.5.18).
    assert db.execute("SELECT outbox_purge(interval '7000 years'), outbox_purge(interval '10000 years')").fetchone() == (0, 0)
    subscription = db.execute("SELECT outbox_subscribe('booking.created', 'https://hooks.example.test/', "
                              "secret => outbox_generate_secret())").fetchone()[0]
    unsigned = db.execute("SELECT outbox_subscribe('booking.created', 'https://other.example.test/')").fetchone()[0]
    too_far = ["interval '1000000 years'"]
    if db.info.server_version >= 170000:
        too_far += ["interval 'infinity'", "interval '-infinity'"]
    for value in too_far:
        for call, argument in [
            (f"outbox_enqueue('booking.created', '{{}}', {value})", "delay"),
            (f"outbox_claim(10, NULL, {value})", "lease"),
            (f"outbox_fail(1, 'boom', NULL, {value})", "retry_in"),
            (f"outbox_purge({value})", "older_than"),
            # With or without a secret to retire (0.5.16 took it when there was none).
            (f"outbox_rotate_secret({subscription}, overlap => {value})", "overlap"),
            (f"outbox_rotate_secret({unsigned}, overlap => {value})", "overlap"),
        ]:
            with pytest.raises(psycopg.Error) as caught:
                db.execute(f"SELECT * FROM {call}")
            assert caught.value.sqlstate == INVALID, (call, caught.value)
            assert caught.value.diag.message_primary.startswith(call.split("(")[0] + f": {argument} must be finite"), caught.value


@pytest.mark.parametrize("function", ["outbox_complete", "outbox_complete_batch"])
def test_the_batch_completion_names_the_function_called(db, function):
    """The deprecated outbox_complete(ids, lease_tokens) shares its code with
    outbox_complete_batch, whose name its errors gave (found by stop 40's probe)."""
    for call in [f"{function}(ARRAY[1, NULL]::bigint[])", f"{function}(ARRAY[1, 2]::bigint[], ARRAY[gen_random_uuid()])"]:
        with pytest.raises(psycopg.Error) as caught:
            db.execute(f"SELECT {call}")
        assert caught.value.diag.message_primary.startswith(f"{function}: "), caught.value


def test_unknown_ids_are_answers_not_errors(db):
    assert db.execute("SELECT outbox_complete(424242)").fetchone()[0] is False
    assert db.execute("SELECT outbox_fail(424242, 'boom')").fetchone()[0] is None
    assert db.execute("SELECT outbox_complete(ARRAY[424242, 424243]::bigint[])").fetchone()[0] == 0


def test_errors_carry_no_rust_backtrace(db):
    """scripts/test.sh starts the scratch cluster with RUST_BACKTRACE=1 in its environment, as
    a developer's server often runs; 0.3.0 then put ~20 frames in DETAIL. (PostgreSQL rewrites
    its processes' environment area for their titles, so the test cannot check it from here.)"""
    # A batch too long for the statement's time: cancelled by PostgreSQL while Rust writes it.
    db.execute("CREATE TEMP TABLE big AS SELECT array_agg('{}'::jsonb) AS payloads FROM generate_series(1, 300000)")
    for call, sqlstate, timeout in [
        ("outbox_enqueue_batch('a.b', (SELECT payloads FROM big))", "57014", "100ms"),  # raised by PostgreSQL inside Rust
        ("outbox_claim(0)", INVALID, "0"),                                               # raised by Rust
        ("outbox_fail(1, NULL)", NULL_VALUE, "0"),
    ]:
        db.execute(f"SET statement_timeout = '{timeout}'")
        with pytest.raises(psycopg.Error) as caught:
            db.execute(f"SELECT * FROM {call}")
        db.execute("RESET statement_timeout")
        assert caught.value.sqlstate == sqlstate, caught.value
        assert not caught.value.diag.message_detail, caught.value.diag.message_detail


@pytest.mark.parametrize("call,function", [
    ("outbox_enqueue(NULL, '{}')", "outbox_enqueue"),                    # a NULL
    ("outbox_claim(0)", "outbox_claim"),                                 # a value out of range
    ("outbox_enqueue('booking.created', '{}', dedupe_key => repeat('k', 256))", "outbox_enqueue"),
])
def test_an_errors_location_names_the_function_and_the_line_that_refused_it(db, call, function):
    """What `\\set VERBOSITY verbose` shows as LOCATION: the SQL function and the place in the
    source that refused the value (0.5.25 gave every error an empty function name and the one
    line of error.rs that raises them all)."""
    with pytest.raises(psycopg.Error) as caught:
        db.execute(f"SELECT * FROM {call}")
    diag = caught.value.diag
    assert diag.source_function == function, diag.source_function
    assert diag.source_file.endswith(".rs") and not diag.source_file.endswith("error.rs"), diag.source_file
    assert int(diag.source_line) > 0


@pytest.mark.parametrize("statement", [
    "SET outbox.max_attempt = 3",
    "SELECT set_config('outbox.backof_base', '1s', false)",
    "ALTER ROLE CURRENT_USER SET outbox.http_timout = '1s'",
    "ALTER DATABASE postgres SET outbox.max_inflight = 2",
])
def test_a_misspelled_setting_is_refused(db, statement):
    """With the library preloaded every outbox.* setting is defined, so a name that is none of
    them is a mistake: before 0.5.32 `SET outbox.max_attempt = 3` was kept as a placeholder
    that nothing reads, and the retries went on with outbox.max_attempts' value."""
    with pytest.raises(psycopg.errors.InvalidName) as caught:
        with db.transaction():
            db.execute(statement)
    assert "outbox." in str(caught.value)
    assert '"outbox" is a reserved prefix' in (caught.value.diag.message_detail or "")


@pytest.mark.parametrize("databases", ['postgres, "lat', '"shop"x, billing'])
def test_a_list_of_worker_databases_whose_quotes_do_not_close_is_refused(db, databases):
    """Read as it could be, `'postgres, "lat'` named postgres and lat, and the workers of every
    other database stopped without a word (stop 56's probe)."""
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="outbox.worker_databases") as caught:
        db.execute(f"ALTER SYSTEM SET outbox.worker_databases = '{databases}'")
    assert "double quote" in (caught.value.diag.message_detail or "")


def test_a_payload_prints_within_reach_of_its_readers(db):
    """Numbers a reader can read go in, up to about a thousand digits; a payload that prints
    as more than 256 MB of JSON, however small it is stored, does not, and nothing of it is
    written."""
    huge = "1" + "0" * 990
    row = db.execute(f"SELECT payload FROM outbox_enqueue('booking.created', '{{\"amount\": {huge}, \"tiny\": 1e-990}}')").fetchone()
    assert row[0]["amount"] == int(huge)
    # 280,000 numbers of 991 digits: 2.5 MB stored, about 278 MB printed.
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"outbox_enqueue: payload prints as more than 268435456 characters"):
        db.execute("SELECT outbox_enqueue('booking.created', ('[' || repeat('1e990,', 280000) || '1]')::jsonb)")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"holds a number that prints as 131072 characters"):
        db.execute("SELECT outbox_enqueue('booking.created', '[1e131071]')")
    assert db.execute("SELECT count(*) FROM outbox").fetchone()[0] == 1
