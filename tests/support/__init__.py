"""Helpers shared by the integration tests, the reliability suite and the benchmark.

They reach the scratch cluster through the libpq environment (PGHOST, PGPORT, PGUSER) that
scripts/test.sh, tests/reliability/run.py and bench/bench.py set up.
"""

import os
import pathlib
import shutil
import time
import tomllib

import psycopg


ROOT = pathlib.Path(__file__).resolve().parents[2]
# The version the sources build (the SQL in the making).
CURRENT_VERSION = tomllib.loads((ROOT / "Cargo.toml").read_text())["package"]["version"]


def xdist_worker_index() -> int:
    """Which of pytest-xdist's workers runs this process: 0 for gw0, and without xdist (the
    reliability suite, the benchmark, OUTBOX_TEST_JOBS=1). Each worker has clusters of its own."""
    return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def released_versions() -> list[str]:
    """Every release, oldest first: a release freezes its install script in sql/versions/."""
    names = (p.name.removeprefix("outbox_ext--").removesuffix(".sql") for p in (ROOT / "sql/versions").glob("outbox_ext--*.sql"))
    return sorted(names, key=version_key)


def admin_connection(dbname: str = "postgres") -> psycopg.Connection:
    """An autocommit superuser connection (the scratch cluster's bootstrap user)."""
    return psycopg.connect(dbname=dbname, autocommit=True)


def eventually(check, timeout: float = 20.0, interval: float = 0.05, what: str = "condition"):
    """Polls check() until it returns something true, and returns that; fails after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def recreate_database(name: str, owner: str | None = None, encoding: str | None = None):
    """Drops (whatever is connected) and creates database `name`."""
    with admin_connection() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        options = ""
        if owner:
            options += f' OWNER "{owner}"'
        if encoding:
            options += f" ENCODING '{encoding}' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'"
        admin.execute(f'CREATE DATABASE "{name}"{options}')


WORKER_BACKEND = "outbox_ext delivery worker"


def worker_pid(database: str):
    """The pid of the delivery worker connected to `database`, or None."""
    with admin_connection() as admin:
        row = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = %s AND datname = %s", (WORKER_BACKEND, database)
        ).fetchone()
    return row and row[0]


def wait_for_worker(database: str, timeout: float = 30.0):
    """Waits until `database`'s delivery worker runs and has found the extension."""

    def ready():
        with admin_connection(database) as conn:
            conn.execute("SET search_path = pg_catalog")
            schema = conn.execute("SELECT quote_ident(n.nspname)::bytea FROM pg_extension e "
                                  "JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'outbox_ext'").fetchone()
            if not schema:
                return False
            states = conn.execute(f"SELECT state::bytea FROM {schema[0].decode()}.outbox_worker_status() "
                                  "WHERE database = current_database()").fetchall()
            return [bytes(s).decode() for (s,) in states] in (["idle"], ["delivering"])

    return eventually(ready, timeout=timeout, what=f"the delivery worker of {database}")


# Messages in every state a message can be in, written directly (as a superuser) so that any
# version's table takes them: the upgrade and pg_upgrade tests check each survives.
EVERY_STATE = """
INSERT INTO outbox (topic, payload, status, attempts, available_at, processed_at, last_error, dedupe_key, lease_token) VALUES
    ('booking.created', '{"state": "ready"}',        'PENDING', 0, clock_timestamp() - interval '1 second', NULL, NULL, 'k1', NULL),
    ('booking.created', '{"state": "leased"}',       'PENDING', 1, clock_timestamp() + interval '1 hour', NULL, NULL, 'k2', gen_random_uuid()),
    ('booking.created', '{"state": "backing off"}',  'PENDING', 2, clock_timestamp() + interval '1 hour', NULL, 'HTTP 503: busy', 'k3', NULL),
    ('booking.created', '{"state": "done"}',         'DONE',    1, clock_timestamp(), clock_timestamp(), NULL, 'k4', NULL),
    ('booking.created', '{"state": "dead"}',         'DEAD',    8, clock_timestamp(), clock_timestamp(), 'HTTP 500: boom', 'k5', NULL),
    ('reminder.due',    '{"state": "delayed", "ü": "ß"}', 'PENDING', 0, clock_timestamp() + interval '1 day', NULL, NULL, NULL, NULL)
"""


# What a database's messages are, row by row: compared before and after an update, a dump
# and restore, a pg_upgrade.
STATE = "SELECT id, public_id, topic, payload, status, attempts, last_error, dedupe_key, lease_token IS NOT NULL FROM outbox ORDER BY id"


class PausedAt:
    """Stops a server process at its next call of the C function `function` (a debugger's
    breakpoint), so that a test can do something at exactly that moment, then lets it go on:

        with PausedAt(pid, "pg_try_advisory_xact_lock_int4") as paused:
            paused.wait()        # the process is inside that call now
            ...                  # what must happen at that moment
        # the process goes on

    For a race of a few microseconds that sleeps cannot place. Needs gdb (on every machine
    this project builds on) and the right to trace the process (root, as the tests run).
    With `only_that_thread`, the process's other threads (the delivery worker's helper
    threads, sending requests) go on meanwhile: gdb's non-stop mode. With `after`, it stops only
    at a call that comes after one of `after` (another breakpoint's spec), where the process is
    first held `linger` seconds (for a time the test needs to pass right there)."""

    def __init__(self, pid: int, function: str, timeout: float = 30.0, only_that_thread: bool = False,
                 after: str | None = None, linger: float = 0.0):
        import subprocess
        import tempfile

        self.timeout = timeout
        self.signals = pathlib.Path(tempfile.mkdtemp(prefix="outbox-paused-"))
        stopped, go, script_file = self.signals / "stopped", self.signals / "go", self.signals / "pause.gdb"
        # What to do at the breakpoint runs only there: should gdb fail to attach or to set it,
        # `stopped` never appears and wait() says why.
        attached = ["python", "if not gdb.selected_inferior().pid: gdb.execute('quit 1')", "end"]
        script = ["set pagination off", "set confirm off", *attached]
        if after:  # breakpoint 1, which lets breakpoint 2 (`function`) stop the process
            script += [f"break {after}", "commands", "silent", f"shell sleep {linger}", "enable 2", "continue", "end"]
        script += [f"break {function}", "commands",
                   f"shell touch {stopped}", f"shell while [ ! -e {go} ]; do sleep 0.02; done",
                   "delete", "detach", "quit", "end"]
        if after:
            script += ["disable 2"]
        armed = self.signals / "armed"
        script += [f"shell touch {armed}"]
        if only_that_thread:
            # Non-stop: `continue -a` lets every thread go, and the breakpoint stops only the
            # thread that reaches it. Threads that stop otherwise (attaching stops each, some a
            # moment later) are let go again. gdb then reads its input (kept open) until the
            # breakpoint's commands end it: not --batch, which would end with the script.
            script += ["python",
                       "def let_go(event):",
                       "    if not isinstance(event, gdb.BreakpointEvent):",
                       "        gdb.post_event(lambda: gdb.execute('continue -a'))",
                       "gdb.events.stop.connect(let_go)",
                       "end", "continue -a"]
            arguments = ["gdb", "--nx", "-iex", "set non-stop on", "-p", str(pid), "-x", str(script_file)]
        else:
            script += ["continue"]
            arguments = ["gdb", "--nx", "--batch", "-p", str(pid), "-x", str(script_file)]
        script_file.write_text("\n".join(script + [""]))
        self.stopped, self.go, self.armed = stopped, go, armed
        self.gdb = subprocess.Popen(arguments, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def __enter__(self):
        return self

    def wait(self):
        """Returns once the process is stopped in the function."""
        self._wait_for(self.stopped)

    def wait_until_armed(self):
        """Returns once the breakpoints are set (the process goes on until it reaches them)."""
        self._wait_for(self.armed)

    def _wait_for(self, signal):
        deadline = time.monotonic() + self.timeout
        while not signal.exists():
            if self.gdb.poll() is not None or time.monotonic() > deadline:
                self.gdb.kill()
                output = self.gdb.communicate()[0]
                if "ptrace: Operation not permitted" in output:
                    import pytest  # (only the tests use this helper)

                    pytest.skip("this machine does not let gdb attach to a server process (ptrace)")
                raise AssertionError(f"the process never called the function: {output}")
            time.sleep(0.02)

    def __exit__(self, error_type, *_):
        self.go.touch()
        output = self.gdb.communicate(timeout=self.timeout)[0]
        shutil.rmtree(self.signals, ignore_errors=True)
        if error_type is None:  # (else gdb was killed in wait(), and its error is on its way)
            assert self.gdb.returncode == 0, output


def cpu_seconds(pid) -> float:
    """The CPU time a server process has used so far (user and system), from /proc: what tests
    of a worker that must sleep while it waits read."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_share(pid, seconds: float = 3.0) -> float:
    """The share of one CPU the process uses over the next `seconds`."""
    before, started = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) / (time.monotonic() - started)


def fresh_database(name):
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {name}")
    return psycopg.connect(dbname=name, autocommit=True)


def disabled_endpoint(conn, topic="history.test"):
    """The id of an endpoint of `topic` that the worker leaves alone (disabled), for tests that
    give messages deliveries by hand."""
    return conn.execute(
        """INSERT INTO outbox_subscription (topic, url, enabled) VALUES (%s, 'http://127.0.0.1:9/', false)
           ON CONFLICT (topic, url) DO UPDATE SET enabled = false RETURNING id""", (topic,)
    ).fetchone()[0]


class ServerLog:
    """What the test cluster's server log (OUTBOX_TEST_SERVER_LOG) gains from now on."""

    def __init__(self):
        self.path = pathlib.Path(os.environ["OUTBOX_TEST_SERVER_LOG"])
        self.start = self.path.stat().st_size

    def since(self) -> str:
        with self.path.open("rb") as log:
            log.seek(self.start)
            return log.read().decode(errors="replace")
