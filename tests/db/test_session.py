"""--db values the drivers would choke on are refused as one-line --db errors (scaleplan/db/session.py)."""
from __future__ import annotations

import subprocess
import sys

import pytest
from scaleplan.db.session import resolve_url
from scaleplan.errors import SpecError


@pytest.mark.parametrize("host", ["h\x80st", "a..b", "x" * 64])
def test_a_host_name_lookup_would_refuse_is_a_db_error(host):
    # user:password@127.0.0.1 after a '/' is path, so the host is what precedes it
    with pytest.raises(SpecError, match="host name") as e:
        resolve_url(f"postgresql+psycopg://{host}/u:p@127.0.0.1:5/d")
    assert e.value.field == "--db"


def test_argv_bytes_of_no_utf8_text_are_a_db_error(tmp_path):
    argv = [sys.executable, "-m", "scaleplan", "db", "status", "--db", bytes(tmp_path) + b"/x\x80.db"]
    r = subprocess.run(argv, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--db" in r.stderr and "UTF-8" in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []  # nothing created


def test_read_back_names_the_rows_a_new_connection_does_not_see(tmp_path):
    from scaleplan.db.models import ObservedRun
    from scaleplan.db.session import ensure_schema, read_back
    from scaleplan.errors import ScaleplanError

    url = f"sqlite:///{tmp_path / 'rb.db'}"
    ensure_schema(url)
    read_back(url, ObservedRun, [])  # nothing to check
    with pytest.raises(ScaleplanError, match=r"observed_run rows \[7\]"):
        read_back(url, ObservedRun, [7])
