"""Runs the pg_regress suite in tests/regress (the SQL contract: states, what each function
returns, errors with their SQLSTATEs) against the scratch cluster."""

import os
import pathlib
import subprocess
import tempfile

from conftest import pg_config

REGRESS_DIR = pathlib.Path(__file__).resolve().parent.parent / "regress"


def test_the_sql_contract(database):
    tests = sorted(p.stem for p in (REGRESS_DIR / "sql").glob("*.sql"))
    assert tests
    pg_regress = pathlib.Path(pg_config("--pgxs")).parents[1] / "test/regress/pg_regress"
    with tempfile.TemporaryDirectory() as output:
        result = subprocess.run(
            [pg_regress, f"--host={os.environ['PGHOST']}", f"--port={os.environ['PGPORT']}", "--user=postgres",
             "--dbname=outbox_regress", f"--inputdir={REGRESS_DIR}", f"--outputdir={output}", *tests],
            capture_output=True, text=True,
        )
        diffs = pathlib.Path(output) / "regression.diffs"
        assert result.returncode == 0, result.stdout + (diffs.read_text() if diffs.exists() else "")
