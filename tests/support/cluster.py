"""A scratch PostgreSQL cluster of its own (scripts/cluster.sh), for the tests that stop,
crash or reconfigure a server, and for the reliability suite and the benchmark."""

import os
import pathlib
import shutil
import subprocess
import tempfile
import time

import psycopg

from support import xdist_worker_index

ROOT = pathlib.Path(__file__).resolve().parents[2]


def pg_config(option: str) -> str:
    """A value of the chosen PostgreSQL version's pg_config (scripts/common.sh exports its path
    as OUTBOX_PG_CONFIG)."""
    path = os.environ.get("OUTBOX_PG_CONFIG")
    if not path:
        raise SystemExit("OUTBOX_PG_CONFIG is not set: run this through scripts/test.sh, bench/run.sh or scripts/reliability.sh")
    return subprocess.run([path, option], check=True, capture_output=True, text=True).stdout.strip()


def pg_program(name: str) -> pathlib.Path:
    """A program of the chosen PostgreSQL version (pg_ctl, pg_dump, pgbench, …)."""
    return pathlib.Path(os.environ.get("OUTBOX_PG_BIN") or pg_config("--bindir")) / name


def as_server_user(command: list) -> list:
    """`command`, run as the server's user when the tests run as root (PostgreSQL refuses root)."""
    return (["sudo", "-u", "postgres", "--"] if os.geteuid() == 0 else []) + command


# Apart from each other's: pytest-xdist's worker K puts its own clusters K * PORTS_APART higher.
PORTS_APART = 20
# The tests' own clusters are numbered from scripts/test.sh's default port; a suite started on
# another OUTBOX_TEST_PORT moves them as far, so that two suites on one machine do not meet.
DEFAULT_SUITE_PORT = 25329


def own_cluster_port(port: int) -> int:
    """Where a test's own cluster, numbered `port` for the default suite, listens in this one."""
    suite_port = int(os.environ.get("OUTBOX_TEST_PORT") or DEFAULT_SUITE_PORT)
    return port + (suite_port - DEFAULT_SUITE_PORT) + PORTS_APART * xdist_worker_index()


class ScratchCluster:
    """A cluster on 127.0.0.1:`port` (moved by `own_cluster_port`) that preloads outbox_ext;
    `conf` adds postgresql.conf lines."""

    def __init__(self, port: int, conf: str = ""):
        self.port = own_cluster_port(port)
        self.conf = conf
        self.dir = tempfile.mkdtemp(prefix="outbox_ext-scratch.")
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")

    def start(self):
        env = dict(os.environ, OUTBOX_CLUSTER_CONF=self.conf)
        env.pop("OUTBOX_WORKER_DATABASES", None)
        subprocess.run([ROOT / "scripts/cluster.sh", "start", self.dir, str(self.port)], check=True, env=env)
        return self

    def stop(self):
        subprocess.run([ROOT / "scripts/cluster.sh", "stop", self.dir], check=False)

    def remove(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def server_log(self) -> pathlib.Path:
        return pathlib.Path(self.dir) / "server.log"

    def pg_ctl(self, *args, timeout: float = 120):
        """Runs pg_ctl on the cluster as the server's user; returns how long it took."""
        started = time.monotonic()
        subprocess.run(as_server_user([pg_program("pg_ctl"), "-D", f"{self.dir}/data", "-l", f"{self.dir}/server.log", "-w", *args]),
                       check=True, capture_output=True, timeout=timeout)
        return time.monotonic() - started

    def connect(self, dbname: str = "postgres", **kwargs) -> psycopg.Connection:
        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=dbname, autocommit=True, **kwargs)

    def create_database(self, name: str, extension: bool = True):
        with self.connect("postgres") as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{name}"')
        if extension:
            with self.connect(name) as conn:
                conn.execute("CREATE EXTENSION outbox_ext")

    def configure(self, **settings):
        """ALTER SYSTEM + reload, as an operator changes the worker's settings."""
        with self.connect("postgres") as conn:
            for name, value in settings.items():
                conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
            conn.execute("SELECT pg_reload_conf()")

    def worker_pids(self) -> dict:
        """Delivery workers by database."""
        with self.connect("postgres") as conn:
            return dict(conn.execute("SELECT datname, pid FROM pg_stat_activity WHERE backend_type = 'outbox_ext delivery worker'").fetchall())
