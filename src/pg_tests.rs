//! `#[pg_test]`s: each SQL function's behaviour inside one backend (the second layer of tests;
//! plain unit tests sit beside the pure logic they test, integration tests in tests/).

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    fn one<T: pgrx::datum::FromDatum + pgrx::datum::IntoDatum>(sql: &str) -> T {
        Spi::get_one::<T>(sql).expect("query failed").expect("query returned NULL")
    }

    fn run(sql: &str) {
        Spi::run(sql).expect("statement failed");
    }

    /// Seconds between the message's available_at and the clock.
    fn seconds_until_ready(id: i64) -> f64 {
        one(&format!("SELECT extract(epoch FROM available_at - clock_timestamp())::float8 FROM outbox WHERE id = {id}"))
    }

    fn make_ready(id: i64) {
        run(&format!("UPDATE outbox SET available_at = clock_timestamp() - interval '1 ms' WHERE id = {id}"));
    }

    fn claim_one_token(id: i64) -> pgrx::Uuid {
        one(&format!("SELECT lease_token FROM outbox_claim(10) WHERE id = {id}"))
    }

    #[pg_test]
    fn the_history_day_of_complete_is_the_one_of_outbox_attempt_log_slot() {
        // Around midnights, the epochs, and days before 1970 and far ahead.
        let timestamps: Vec<(i64, i32)> = Spi::connect(|client| {
            client
                .select(
                    "SELECT (extract(epoch FROM t - timestamptz '2000-01-01 00:00:00+00') * 1000000)::int8,
                            outbox_attempt_log_slot(t)
                       FROM (SELECT timestamptz '1969-12-30 00:00:00+00' + n * interval '11 hours 59 minutes 59.999999 seconds' AS t
                               FROM generate_series(0, 200) n
                             UNION ALL
                             SELECT d + offs FROM generate_series(timestamptz '1999-12-31 00:00:00+00', '2000-01-02', '1 day') d,
                                    unnest(ARRAY[interval '0', '-1 microsecond', '1 microsecond']) offs
                             UNION ALL
                             SELECT clock_timestamp() + n * interval '1 day' FROM generate_series(-40, 40) n) ts",
                    None,
                    &[],
                )
                .expect("select")
                .map(|row| (row.get::<i64>(1).unwrap().unwrap(), row.get::<i32>(2).unwrap().unwrap()))
                .collect()
        });
        assert!(timestamps.len() > 280);
        for (timestamp, slot) in timestamps {
            assert_eq!(crate::history::day_slot(timestamp) as i32, slot, "at {timestamp}");
        }
    }

    #[pg_test]
    fn enqueue_returns_a_pending_row_with_a_v7_public_id() {
        let id: i64 = one("SELECT (outbox_enqueue('booking.created', '{\"bookingId\": 7}')).id");
        assert_eq!(one::<String>(&format!("SELECT status::text FROM outbox WHERE id = {id}")), "PENDING");
        assert_eq!(one::<i32>(&format!("SELECT attempts FROM outbox WHERE id = {id}")), 0);
        assert_eq!(one::<String>(&format!("SELECT payload->>'bookingId' FROM outbox WHERE id = {id}")), "7");
        // Version nibble of a UUIDv7.
        assert_eq!(one::<String>(&format!("SELECT substr(public_id::text, 15, 1) FROM outbox WHERE id = {id}")), "7");
        assert!(one::<bool>(&format!("SELECT created_at = now() AND available_at <= clock_timestamp() FROM outbox WHERE id = {id}")));
    }

    #[pg_test]
    fn delay_schedules_for_later_and_claim_skips_it() {
        let id: i64 = one("SELECT (outbox_enqueue('reminder.due', '{}', interval '1 hour')).id");
        let wait = seconds_until_ready(id);
        assert!((3590.0..=3600.0).contains(&wait), "ready in {wait}s");
        assert_eq!(one::<i64>("SELECT count(*) FROM outbox_claim(10)"), 0);
    }

    #[pg_test]
    fn dedupe_key_returns_the_existing_message() {
        let first: i64 = one("SELECT (outbox_enqueue('booking.created', '{\"v\":1}', dedupe_key => 'booking-created:42')).id");
        let second: i64 = one("SELECT (outbox_enqueue('booking.created', '{\"v\":2}', dedupe_key => 'booking-created:42')).id");
        assert_eq!(first, second);
        assert_eq!(one::<i64>("SELECT count(*) FROM outbox"), 1);
        assert_eq!(one::<String>("SELECT payload->>'v' FROM outbox"), "1");
        let other: i64 = one("SELECT (outbox_enqueue('booking.created', '{}', dedupe_key => 'booking-created:43')).id");
        assert_ne!(first, other);
    }

    #[pg_test]
    fn claim_takes_ready_rows_oldest_first_within_topics_and_batch() {
        run("SELECT outbox_enqueue('a.happened', jsonb_build_object('n', n)) FROM generate_series(1, 5) n");
        run("SELECT outbox_enqueue('b.happened', '{}')");
        // Make readiness order the reverse of insertion order.
        run("UPDATE outbox SET available_at = clock_timestamp() - (id || ' seconds')::interval");
        let ns: Vec<i32> = Spi::connect(|client| {
            client
                .select("SELECT (payload->>'n')::int FROM outbox_claim(3, ARRAY['a.happened'])", None, &[])
                .unwrap()
                .map(|row| row.get::<i32>(1).unwrap().unwrap())
                .collect()
        });
        assert_eq!(ns, vec![5, 4, 3]);
        assert!(one::<bool>(
            "SELECT bool_and(attempts = 1 AND lease_token IS NOT NULL AND available_at > clock_timestamp() + interval '29 seconds') \
             FROM outbox WHERE (payload->>'n')::int IN (3, 4, 5)"
        ));
        // The claimed rows are leased: a second claim takes the rest, never them again.
        assert_eq!(one::<i64>("SELECT count(*) FROM outbox_claim(10)"), 3);
        assert_eq!(one::<i64>("SELECT count(*) FROM outbox_claim(10)"), 0);
    }

    #[pg_test]
    fn complete_with_the_lease_token_and_only_once() {
        let id: i64 = one("SELECT (outbox_enqueue('booking.created', '{}')).id");
        let token = claim_one_token(id);
        assert!(!one::<bool>(&format!("SELECT outbox_complete({id}, gen_random_uuid())")));
        assert!(one::<bool>(&format!("SELECT outbox_complete({id}, '{token}')")));
        assert!(!one::<bool>(&format!("SELECT outbox_complete({id}, '{token}')")));
        assert!(one::<bool>(&format!("SELECT status = 'DONE' AND processed_at IS NOT NULL FROM outbox WHERE id = {id}")));
    }

    #[pg_test]
    fn complete_batch_counts_what_it_completed() {
        run("SELECT outbox_enqueue('a.happened', '{}') FROM generate_series(1, 3)");
        run("CREATE TEMP TABLE c AS SELECT id, lease_token FROM outbox_claim(3)");
        // One stale token among three.
        let completed: i32 = one("SELECT outbox_complete(array_agg(id ORDER BY id), \
               array_agg(CASE WHEN id = (SELECT min(id) FROM c) THEN gen_random_uuid() ELSE lease_token END ORDER BY id)) FROM c");
        assert_eq!(completed, 2);
        assert_eq!(one::<i64>("SELECT count(*) FROM outbox WHERE status = 'DONE'"), 2);
    }

    #[pg_test]
    fn failures_follow_the_exact_schedule_then_dead_letter() {
        run("SET outbox.backoff_jitter = 0");
        run("SET outbox.backoff_base = '2s'");
        run("SET outbox.backoff_max = '256s'");
        let id: i64 = one("SELECT (outbox_enqueue('booking.created', '{}')).id");
        let mut delays = Vec::new();
        for attempt in 1..=8 {
            let token = claim_one_token(id);
            let status: String = one(&format!("SELECT outbox_fail({id}, 'smtp 451 try {attempt}', '{token}')"));
            if attempt < 8 {
                assert_eq!(status, "PENDING");
                delays.push(seconds_until_ready(id).round() as i64);
                make_ready(id);
            } else {
                assert_eq!(status, "DEAD");
            }
        }
        assert_eq!(delays, vec![2, 4, 8, 16, 32, 64, 128]);
        assert!(one::<bool>(&format!(
            "SELECT status = 'DEAD' AND attempts = 8 AND processed_at IS NOT NULL AND last_error = 'smtp 451 try 8' \
             FROM outbox WHERE id = {id}"
        )));
        // Dead letters are never claimed again.
        assert_eq!(one::<i64>("SELECT count(*) FROM outbox_claim(10)"), 0);
    }

    #[pg_test]
    fn the_cap_holds_past_the_essays_schedule() {
        run("SET outbox.backoff_jitter = 0");
        run("SET outbox.backoff_max = '256s'");
        assert_eq!(one::<String>("SELECT outbox_backoff(8)::text"), "00:04:16");
        assert_eq!(one::<String>("SELECT outbox_backoff(30)::text"), "00:04:16");
    }

    #[pg_test]
    fn jitter_stays_within_its_fraction_and_varies() {
        run("SET outbox.backoff_jitter = 0.5");
        run("SET outbox.backoff_base = '2s'");
        let (low, high, distinct): (f64, f64, i64) = Spi::get_three(
            "SELECT min(s), max(s), count(DISTINCT s) FROM \
               (SELECT extract(epoch FROM outbox_backoff(3))::float8 AS s FROM generate_series(1, 500)) d",
        )
        .map(|(a, b, c)| (a.unwrap(), b.unwrap(), c.unwrap()))
        .unwrap();
        assert!(low >= 8.0 && high < 12.0, "jittered delays in [{low}, {high}]");
        assert!(distinct > 100, "only {distinct} distinct delays");
    }

    #[pg_test]
    fn retry_in_overrides_the_backoff() {
        let id: i64 = one("SELECT (outbox_enqueue('webhook.sent', '{}')).id");
        let token = claim_one_token(id);
        let status: String = one(&format!("SELECT outbox_fail({id}, 'HTTP 429', '{token}', interval '90 seconds')"));
        assert_eq!(status, "PENDING");
        let wait = seconds_until_ready(id);
        assert!((89.0..=90.0).contains(&wait), "ready in {wait}s");
    }

    #[pg_test]
    fn a_stale_token_changes_nothing() {
        let id: i64 = one("SELECT (outbox_enqueue('booking.created', '{}')).id");
        let stale = claim_one_token(id);
        make_ready(id); // the lease runs out ...
        let fresh = claim_one_token(id); // ... and another consumer claims it
        assert_ne!(stale, fresh);
        let before: String = one(&format!("SELECT row_to_json(o)::text FROM outbox o WHERE id = {id}"));
        assert!(Spi::get_one::<String>(&format!("SELECT outbox_fail({id}, 'late', '{stale}')")).unwrap().is_none());
        assert!(!one::<bool>(&format!("SELECT outbox_complete({id}, '{stale}')")));
        let after: String = one(&format!("SELECT row_to_json(o)::text FROM outbox o WHERE id = {id}"));
        assert_eq!(before, after);
        assert!(one::<bool>(&format!("SELECT outbox_complete({id}, '{fresh}')")));
    }

    #[pg_test]
    fn a_message_whose_leases_keep_expiring_is_dead_lettered() {
        run("SET outbox.max_attempts = 3");
        let id: i64 = one("SELECT (outbox_enqueue('booking.created', '{}')).id");
        for _ in 0..3 {
            claim_one_token(id);
            make_ready(id); // the consumer "crashed": its lease runs out
        }
        assert_eq!(one::<i64>("SELECT count(*) FROM outbox_claim(10)"), 0);
        let (status, error): (String, String) = Spi::get_two(&format!("SELECT status::text, last_error FROM outbox WHERE id = {id}"))
            .map(|(s, e)| (s.unwrap(), e.unwrap()))
            .unwrap();
        assert_eq!(status, "DEAD");
        assert!(error.contains("lease expired without an outcome after 3 attempts"), "{error}");
    }

    #[pg_test]
    fn last_error_is_bounded() {
        let id: i64 = one("SELECT (outbox_enqueue('booking.created', '{}')).id");
        run(&format!("SELECT outbox_fail({id}, repeat('x', 100000))"));
        assert_eq!(one::<i32>(&format!("SELECT length(last_error) FROM outbox WHERE id = {id}")), 4096);
    }

    #[pg_test]
    fn batch_enqueue_keeps_the_order_of_its_payloads() {
        let ns: Vec<i32> = Spi::connect(|client| {
            client
                .select(
                    "SELECT (payload->>'n')::int FROM outbox_enqueue_batch('booking.created', \
                       ARRAY(SELECT jsonb_build_object('n', n) FROM generate_series(1, 50) n)) ORDER BY id",
                    None,
                    &[],
                )
                .unwrap()
                .map(|row| row.get::<i32>(1).unwrap().unwrap())
                .collect()
        });
        assert_eq!(ns, (1..=50).collect::<Vec<_>>());
        assert_eq!(one::<i64>("SELECT count(DISTINCT public_id) FROM outbox WHERE status = 'PENDING'"), 50);
    }

    #[pg_test]
    fn a_claim_without_lease_only_locks_and_fail_counts_the_attempt() {
        run("SET outbox.backoff_jitter = 0");
        run("SET outbox.max_attempts = 2");
        let id: i64 = one("SELECT (outbox_enqueue('booking.created', '{}')).id");
        let before: String = one(&format!("SELECT row_to_json(o)::text FROM outbox o WHERE id = {id}"));
        let (claimed, token_is_null): (i64, bool) = Spi::get_two("SELECT id, lease_token IS NULL FROM outbox_claim(10, lease => NULL)")
            .map(|(a, b)| (a.unwrap(), b.unwrap()))
            .unwrap();
        assert_eq!(claimed, id);
        assert!(token_is_null);
        let after: String = one(&format!("SELECT row_to_json(o)::text FROM outbox o WHERE id = {id}"));
        assert_eq!(before, after, "nothing written by a claim without lease");

        assert_eq!(one::<String>(&format!("SELECT outbox_fail({id}, 'smtp 451')")), "PENDING");
        assert_eq!(one::<i32>(&format!("SELECT attempts FROM outbox WHERE id = {id}")), 1);
        assert_eq!(seconds_until_ready(id).round() as i64, 2);
        make_ready(id);
        assert_eq!(one::<i64>(&format!("SELECT count(*) FROM outbox_claim(10, lease => NULL) WHERE id = {id}")), 1);
        assert_eq!(one::<String>(&format!("SELECT outbox_fail({id}, 'smtp 550')")), "DEAD");
        assert_eq!(one::<i32>(&format!("SELECT attempts FROM outbox WHERE id = {id}")), 2);
    }

    #[pg_test(error = "outbox_enqueue: topic \"booking created\" is not a valid event name")]
    fn ill_formed_topic_is_refused() {
        run("SELECT outbox_enqueue('booking created', '{}')");
    }

    #[pg_test(error = "outbox_claim: batch_size must be between 1 and 10000, got 0")]
    fn zero_batch_is_refused() {
        run("SELECT * FROM outbox_claim(0)");
    }
}
