//! A producer and a consumer of outbox_ext with tokio-postgres.
//!
//!     outbox-ext-rust-example produce N   # N bookings, each with the email it owes
//!     outbox-ext-rust-example consume     # send the emails until SIGTERM
//!
//! Connection settings come from the usual PG* environment variables (PGHOST, PGPORT, PGUSER,
//! PGDATABASE). A guest whose address contains "flaky" makes the first attempt fail, to show
//! retries.

use serde_json::json;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use tokio_postgres::{Client, NoTls};

const BATCH_SIZE: i32 = 20;

fn connection_string() -> String {
    let var = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_string());
    format!(
        "host={} port={} user={} dbname={}",
        var("PGHOST", "127.0.0.1"),
        var("PGPORT", "5432"),
        var("PGUSER", "postgres"),
        var("PGDATABASE", "postgres")
    )
}

async fn produce(client: &mut Client, count: i32) -> Result<(), tokio_postgres::Error> {
    for n in 0..count {
        let guest = if n % 10 == 0 { format!("flaky{n}@example.test") } else { format!("guest{n}@example.test") };
        // The booking and the email it owes: both, or neither.
        let transaction = client.transaction().await?;
        let booking_id: i64 = transaction
            .query_one("INSERT INTO bookings (room, guest_email) VALUES ($1, $2) RETURNING id", &[&n, &guest])
            .await?
            .get(0);
        transaction
            .execute(
                "SELECT id FROM outbox_enqueue('booking.created', $1, dedupe_key => $2)",
                &[&json!({"bookingId": booking_id, "guestEmail": guest}), &format!("booking-created:{booking_id}")],
            )
            .await?;
        transaction.commit().await?;
    }
    Ok(())
}

/// Idempotent: the email is recorded under the message's public_id in the same transaction as
/// the outcome, so a redelivery finds it and sends nothing twice.
async fn send_email(
    transaction: &tokio_postgres::Transaction<'_>,
    public_id: uuid::Uuid,
    payload: &serde_json::Value,
    attempts: i32,
) -> Result<(), String> {
    let guest = payload["guestEmail"].as_str().ok_or("payload without guestEmail")?;
    let booking_id = payload["bookingId"].as_i64().ok_or("payload without bookingId")?;
    if guest.contains("flaky") && attempts == 0 {
        return Err("SMTP 451: try again later".into());
    }
    transaction
        .execute(
            "INSERT INTO sent_emails (message_id, booking_id, guest_email, sent_by) VALUES ($1, $2, $3, 'rust') \
             ON CONFLICT (message_id) DO NOTHING",
            &[&public_id, &booking_id, &guest],
        )
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

async fn consume(client: &mut Client) -> Result<(), tokio_postgres::Error> {
    let mut terminate = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut idle = Duration::from_millis(100);
    loop {
        let mut transaction = client.transaction().await?;
        // No lease: the rows stay locked until this transaction ends; other consumers skip them.
        let messages = transaction
            .query(
                "SELECT id, public_id, payload, attempts FROM outbox_claim($1, ARRAY['booking.created'], lease => NULL)",
                &[&BATCH_SIZE],
            )
            .await?;
        for message in &messages {
            let (id, public_id, payload, attempts): (i64, uuid::Uuid, serde_json::Value, i32) =
                (message.get(0), message.get(1), message.get(2), message.get(3));
            // A savepoint: one failure does not undo the others.
            let savepoint = transaction.savepoint("message").await?;
            match send_email(&savepoint, public_id, &payload, attempts).await {
                Ok(()) => {
                    savepoint.commit().await?;
                    // $1::bigint: with an untyped parameter the batch form (bigint[]) is a candidate too.
                    transaction.execute("SELECT outbox_complete($1::bigint)", &[&id]).await?;
                }
                Err(error) => {
                    savepoint.rollback().await?;
                    transaction.execute("SELECT outbox_fail($1::bigint, $2)", &[&id, &error]).await?;
                }
            }
        }
        transaction.commit().await?;
        // The batch is committed; only now may a SIGTERM stop us. Back off while the queue is empty.
        idle = if messages.is_empty() { (idle * 2).min(Duration::from_secs(2)) } else { Duration::from_millis(100) };
        let pause = if messages.is_empty() { idle } else { Duration::ZERO };
        tokio::select! {
            biased; // a pending SIGTERM wins over going on
            _ = terminate.recv() => return Ok(()),
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (mut client, connection) = tokio_postgres::connect(&connection_string(), NoTls).await?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            eprintln!("connection error: {error}");
        }
    });
    if let Ok(base) = std::env::var("OUTBOX_BACKOFF_BASE") {
        // The retry delay, for demos and tests.
        client.execute("SELECT set_config('outbox.backoff_base', $1, false)", &[&base]).await?;
    }
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("produce") => produce(&mut client, args.get(2).and_then(|n| n.parse().ok()).unwrap_or(10)).await?,
        Some("consume") => consume(&mut client).await?,
        _ => eprintln!("usage: outbox-ext-rust-example produce N | consume"),
    }
    Ok(())
}
