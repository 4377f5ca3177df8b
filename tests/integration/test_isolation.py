"""Runs the isolation specs in tests/isolation with PostgreSQL's pg_isolation_regress against
the scratch cluster: interleavings of concurrent sessions whose every step output is fixed."""

import os
import pathlib
import subprocess
import tempfile

from conftest import pg_config

SPEC_DIR = pathlib.Path(__file__).resolve().parent.parent / "isolation"


def test_isolation_specs(database):
    specs = sorted(p.stem for p in (SPEC_DIR / "specs").glob("*.spec"))
    assert specs, "no isolation specs found"
    # Installed with PGXS (lib/pgxs/src/makefiles/pgxs.mk): lib/pgxs/src/test/isolation.
    isolation_regress = pathlib.Path(pg_config("--pgxs")).parents[1] / "test/isolation/pg_isolation_regress"
    with tempfile.TemporaryDirectory() as output:
        result = subprocess.run(
            [
                isolation_regress,
                f"--host={os.environ['PGHOST']}",
                f"--port={os.environ['PGPORT']}",
                "--user=postgres",
                "--dbname=outbox_isolation",
                f"--inputdir={SPEC_DIR}",
                f"--outputdir={output}",
                *specs,
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        diffs = pathlib.Path(output, "regression.diffs")
        report = diffs.read_text() if diffs.exists() else ""
        assert result.returncode == 0, result.stdout + result.stderr + report
