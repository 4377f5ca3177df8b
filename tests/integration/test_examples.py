"""The examples in examples/ (Python with psycopg 3, Node.js with pg, Rust with tokio-postgres)
run against the scratch cluster: each producer writes bookings and the emails they owe in one
transaction, two consumers of the same language send every email exactly once (failures are
retried), and both stop cleanly on SIGTERM."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from conftest import DATABASE

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
BOOKINGS = 30
FLAKY = {n for n in range(BOOKINGS) if n % 10 == 0}  # their first attempt fails


@pytest.fixture(scope="session")
def rust_example():
    manifest = EXAMPLES / "rust" / "Cargo.toml"
    subprocess.run(["cargo", "build", "--release", "--quiet", "--manifest-path", manifest], check=True, timeout=900)
    return [str(EXAMPLES / "rust" / "target" / "release" / "outbox-ext-rust-example")]


@pytest.fixture(scope="session")
def node_example():
    subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--silent"], cwd=EXAMPLES / "node", check=True, timeout=300)
    return ["node", str(EXAMPLES / "node" / "outbox_example.js")]


@pytest.fixture(scope="session")
def python_example():
    return [sys.executable, str(EXAMPLES / "python" / "outbox_example.py")]


def run_example(db, command, language):
    db.execute("DROP TABLE IF EXISTS bookings, sent_emails")
    db.execute((EXAMPLES / "schema.sql").read_text())
    env = dict(os.environ, PGDATABASE=DATABASE, OUTBOX_BACKOFF_BASE="100ms")
    subprocess.run(command + ["produce", str(BOOKINGS)], env=env, check=True, timeout=120)
    assert db.execute("SELECT count(*) FROM bookings").fetchone()[0] == BOOKINGS
    assert db.execute("SELECT count(*) FROM outbox").fetchone()[0] == BOOKINGS

    consumers = [subprocess.Popen(command + ["consume"], env=env) for _ in range(2)]
    try:
        deadline = time.monotonic() + 60
        while db.execute("SELECT count(*) FROM outbox WHERE status = 'DONE'").fetchone()[0] < BOOKINGS:
            assert time.monotonic() < deadline, "the consumers did not handle every message in 60 s"
            assert all(c.poll() is None for c in consumers), "a consumer died"
            time.sleep(0.1)
    finally:
        for consumer in consumers:
            consumer.send_signal(signal.SIGTERM)
        exit_codes = [consumer.wait(timeout=20) for consumer in consumers]
    assert exit_codes == [0, 0], "both consumers stop cleanly on SIGTERM"

    sent = db.execute(
        "SELECT count(*), count(DISTINCT booking_id), min(sent_by), max(sent_by) FROM sent_emails"
    ).fetchone()
    assert sent == (BOOKINGS, BOOKINGS, language, language), "every email sent exactly once"
    retried = db.execute(
        "SELECT b.room, o.attempts, o.last_error FROM outbox o JOIN bookings b ON b.id = (o.payload->>'bookingId')::bigint"
        " WHERE o.attempts > 0 ORDER BY b.room"
    ).fetchall()
    assert [(room, attempts, error) for room, attempts, error in retried] == [
        (n, 1, "SMTP 451: try again later") for n in sorted(FLAKY)
    ], "the failing first attempts were recorded and retried"


def test_python_example(db, python_example):
    run_example(db, python_example, "python")


def test_node_example(db, node_example):
    run_example(db, node_example, "node")


def test_rust_example(db, rust_example):
    run_example(db, rust_example, "rust")
