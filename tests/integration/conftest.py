"""Fixtures for tests over real client connections.

scripts/test.sh starts a scratch cluster with the extension installed and exports PGHOST,
PGPORT and PGUSER; each test gets a fresh database state (the extension dropped and created).
"""

import os
import pathlib
import subprocess
import time

import psycopg
import pytest

from support import xdist_worker_index
from support.receiver import Receiver

DATABASE = "outbox_integration"

# pytest-xdist's worker K tests against scripts/test.sh's K-th scratch cluster: port PGPORT + K,
# its server log in cluster<K>/ beside cluster0/'s. (Server-wide settings, ALTER SYSTEM, keep
# workers from sharing a cluster.)
if (worker := xdist_worker_index()) and "PGPORT" in os.environ:
    os.environ["PGPORT"] = str(int(os.environ["PGPORT"]) + worker)
    first_log = pathlib.Path(os.environ["OUTBOX_TEST_SERVER_LOG"])
    os.environ["OUTBOX_TEST_SERVER_LOG"] = str(first_log.parent.with_name(f"cluster{worker}") / first_log.name)


def connect(**kwargs) -> psycopg.Connection:
    """A new client connection to the test database (not autocommit: transactions are explicit)."""
    return psycopg.connect(dbname=DATABASE, **kwargs)


@pytest.fixture(scope="session", autouse=True)
def database():
    for var in ("PGHOST", "PGPORT"):
        if var not in os.environ:
            pytest.exit(f"{var} is not set: run the integration tests through scripts/test.sh", 2)
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DATABASE}")
    yield DATABASE


@pytest.fixture()
def db(database):
    """An autocommit connection on a freshly created extension."""
    with connect(autocommit=True) as conn:
        # (The database's delivery worker leaves before DROP EXTENSION takes its locks:
        # src/worker/hooks.rs. Every test starting here checks that it does.)
        conn.execute("DROP EXTENSION IF EXISTS outbox_ext CASCADE")
        conn.execute("CREATE EXTENSION outbox_ext")
        yield conn


def enqueue_many(conn, count: int, topic: str = "booking.created") -> list[int]:
    rows = conn.execute(
        "SELECT (outbox_enqueue(%s, jsonb_build_object('n', n))).id FROM generate_series(1, %s) n",
        (topic, count),
    ).fetchall()
    return [row[0] for row in rows]


def pg_config(option: str) -> str:
    """A setting of the PostgreSQL version under test (PG), from its pg_config, whose path
    scripts/common.sh exports as OUTBOX_PG_CONFIG."""
    path = os.environ.get("OUTBOX_PG_CONFIG")
    if not path:
        pytest.fail("OUTBOX_PG_CONFIG is not set: run the integration tests through scripts/test.sh")
    return subprocess.run([path, option], check=True, capture_output=True, text=True).stdout.strip()


def pg_program(name: str) -> str:
    """The path of a program of the PostgreSQL version under test, e.g. pg_dump
    (OUTBOX_PG_BIN, exported with OUTBOX_PG_CONFIG, is its bin directory)."""
    return os.path.join(os.environ.get("OUTBOX_PG_BIN") or pg_config("--bindir"), name)


def configure_worker(settings: dict):
    """ALTER SYSTEM and a reload, as an operator changes the delivery worker's settings (they are
    SIGHUP); applied at the worker's next wake-up."""
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        for name, value in settings.items():
            admin.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        admin.execute("SELECT pg_reload_conf()")
    time.sleep(0.5)


def reset_worker_settings():
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute("ALTER SYSTEM RESET ALL")
        admin.execute("SELECT pg_reload_conf()")


# Quick retries and short waits for the tests that watch the worker deliver.
FAST_WORKER = {
    "outbox.backoff_base": "100ms",
    "outbox.backoff_jitter": "0",
    "outbox.max_attempts": "3",
    "outbox.http_timeout": "2s",
    "outbox.poll_interval": "200ms",
}


@pytest.fixture()
def fast_worker(db):
    """The test database, its delivery worker on FAST_WORKER settings (reset afterwards)."""
    configure_worker(FAST_WORKER)
    yield db
    reset_worker_settings()


@pytest.fixture()
def receivers():
    """Starts local webhook receivers on demand (receivers()), stopped after the test."""
    started = []

    def start():
        receiver = Receiver().start()
        started.append(receiver)
        return receiver

    yield start
    for receiver in started:
        receiver.stop()
