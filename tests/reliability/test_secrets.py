"""Database passwords are never printed: status output, error messages and the env-var path mask them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import URL, make_url

from pace import budget
from scaleplan.db.session import mask_url, resolve_url
from scaleplan.errors import SpecError

SECRET = "S3cretPw0rd"
REFUSED = f"postgresql+psycopg://planner:{SECRET}@127.0.0.1:1/calib"  # port 1: connection refused


ARGVS = [["db", "status"], ["db", "status", "--json"], ["db", "upgrade"], ["db", "stats"],
         ["db", "import-scaleplan", "."], ["bench", "runs"]]
# the CLI in a child process where `import psycopg` fails, as in an install without the postgres extra
_NO_PSYCOPG = """
import json, sys
sys.modules["psycopg"] = None  # an ImportError for psycopg and everything under it
from tests.reliability.conftest import run_cli
print(json.dumps([run_cli(*a) for a in json.loads(sys.argv[1])]))
"""


@pytest.fixture(scope="module")
def without_psycopg() -> dict:
    """{argv: (exit status, stdout, stderr)} of every ARGVS command against REFUSED, psycopg blocked."""
    argvs = [[*a, "--db", REFUSED] for a in ARGVS]
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", _NO_PSYCOPG, json.dumps(argvs)], capture_output=True, text=True,
                       cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    return {" ".join(a): tuple(res) for a, res in zip(ARGVS, json.loads(r.stdout))}


@pytest.mark.parametrize("driver", ["installed", "absent"])
@pytest.mark.parametrize("argv", ARGVS, ids=lambda a: " ".join(a))
def test_connection_errors_mask_the_password(cli, argv, driver, request):
    """With psycopg installed the connection is refused; without it the driver is missing. Either way
    the error is one line (or one JSON object naming --db) with the password masked."""
    if driver == "installed":
        pytest.importorskip("psycopg", reason="the postgres extra is not installed")
        code, out, err = cli(*argv, "--db", REFUSED)
    else:
        code, out, err = request.getfixturevalue("without_psycopg")[" ".join(argv)]
        assert "postgres extra" in out + err, (out, err)
    assert code == 2, (out, err)
    assert SECRET not in out + err
    if "--json" in argv:  # the error is a JSON object on stdout, nothing on stderr
        e = json.loads(out)["error"]
        assert "planner:***@127.0.0.1" in e["message"] and e["field"] == "--db" and not err.strip(), (out, err)
        return
    assert "planner:***@127.0.0.1" in err and len(err.strip().splitlines()) == 1, err


def test_status_shows_the_masked_url_of_a_reachable_server(cli, migrated_db):
    if not migrated_db.startswith("postgresql"):
        code, out, _ = cli("db", "status", "--db", migrated_db, "--json")
        assert code == 0 and json.loads(out)["url"] == migrated_db  # no password: shown as is
        return
    url = make_url(migrated_db).set(password=SECRET)  # same server and port as the fixture's
    code, out, err = cli("db", "status", "--db", url.render_as_string(hide_password=False), "--json")
    assert code == 0, err  # trust auth accepts any password
    assert SECRET not in out + err and json.loads(out)["url"].startswith("postgresql+psycopg://postgres:***@")
    code, out, err = cli("db", "status", "--db", url.render_as_string(hide_password=False))
    assert SECRET not in out + err and "postgres:***@" in out


def test_env_var_url_masked_in_a_real_process(tmp_path):
    env = {**os.environ, "SCALEPLAN_DB": REFUSED}
    exe = Path(sys.executable).with_name("scaleplan")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c", "from scaleplan.cli import main; main()"]
    r = subprocess.run([*cmd, "db", "status"], capture_output=True, text=True, env=env, timeout=budget(60))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert SECRET not in r.stdout + r.stderr and "***" in r.stderr


def test_unencoded_at_in_password_is_refused_not_half_printed(cli):
    url = "postgresql+psycopg://u:hunter@two@127.0.0.1:1/x"
    code, out, err = cli("db", "status", "--db", url)
    assert code == 2 and "hunter" not in err and "two" not in err and "%40" in err, err
    with pytest.raises(SpecError):
        resolve_url(url)


_PW = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=4, max_size=24)


@settings(max_examples=150, deadline=None)
@given(pw=_PW, raw=st.booleans())
def test_mask_url_never_shows_the_password(record, pw, raw):
    record("fuzz_examples")
    if raw:  # as a user might type it, unencoded (only the parseable ones matter)
        url = f"postgresql+psycopg://user:{pw}@db.example:5432/calib"
    else:
        url = URL.create("postgresql+psycopg", username="user", password=pw, host="db.example", port=5432,
                         database="calib").render_as_string(hide_password=False)
    masked = mask_url(url)
    skeleton = "postgresql+psycopg://user:***@db.example:5432/calib <unparseable database URL>"
    if pw not in skeleton:
        assert pw not in masked, (url, masked)
