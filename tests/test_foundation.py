"""The foundation's "done when", checked end to end through the CLI.

- ``scaleplan --help`` lists every subcommand; commands not built yet exit 2 and say so;
- ``scaleplan db upgrade`` creates the schema on SQLite and PostgreSQL; upgrade/downgrade round-trips;
- importing ../shared/recorded/dmlc-scaleplan lands every source row (row counts per file checked
  against the files read independently with pandas; sdpa.parquet carries two backends per row);
  importing twice adds nothing;
- every file in tests/data/bad_specs gives a one-line error naming the field path, exit 2.

(``pip install .`` putting only ``scaleplan`` into site-packages is checked by .ci/run, not here.)
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from sqlalchemy import func, select

from pace import budget
from scaleplan.cli import main
from scaleplan.db import models as m
from scaleplan.db import session as dbs
from scaleplan.errors import SpecError
from scaleplan.specs import load_spec

SUBCOMMANDS = ("db", "bench", "estimate", "layouts", "calibrate", "law", "search", "validate")
BAD_SPECS = sorted((Path(__file__).parent / "data" / "bad_specs").glob("*.yaml"))


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    """Run the CLI in-process; (exit status, stdout, stderr)."""
    try:
        main(list(argv))
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_help_lists_every_subcommand(capsys):
    code, out, err = cli(capsys, "--help")
    assert code == 0
    # click's plain help (the root app's rich_markup_mode=None, for start-up time): "Commands:" then
    # one "  name   short help" line per command
    section = out.split("Commands:", 1)[1]
    listed = {line.split()[0] for line in section.splitlines() if line.startswith("  ") and line.split()}
    assert set(SUBCOMMANDS) <= listed, (SUBCOMMANDS, listed)


@pytest.mark.parametrize("cmd", SUBCOMMANDS)
def test_subcommands_never_pretend(capsys, cmd):
    """Without arguments a command shows usage/help or refuses with exit 2; a stub says so."""
    code, out, err = cli(capsys, cmd)
    assert code in (0, 2), (code, out, err)
    assert "Traceback" not in out + err
    if "not implemented yet" in out + err:
        assert code == 2 and len(err.strip().splitlines()) == 1


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def empty_db(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'f.db'}"
    return request.getfixturevalue("pg_url")


def test_db_upgrade_status_and_round_trip(capsys, empty_db):
    code, out, _ = cli(capsys, "db", "status", "--db", empty_db, "--json")
    assert code == 0 and json.loads(out)["revision"] is None
    assert cli(capsys, "db", "upgrade", "--db", empty_db)[0] == 0
    st = json.loads(cli(capsys, "db", "status", "--db", empty_db, "--json")[1])
    assert st["up_to_date"] and st["revision"] == dbs.head_revision()
    assert {t.__tablename__ for t in m.MEASUREMENT_TABLES.values()} <= set(dbs.table_names(empty_db))
    assert cli(capsys, "db", "downgrade", "base", "--db", empty_db)[0] == 0
    assert set(dbs.table_names(empty_db)) <= {"alembic_version"}
    assert cli(capsys, "db", "upgrade", "--db", empty_db)[0] == 0
    assert json.loads(cli(capsys, "db", "status", "--db", empty_db, "--json")[1])["up_to_date"]


def _expected_points(recorded: Path) -> dict[str, int]:
    """Points per imported file, read independently: one per row, two per sdpa.parquet row (te, pt).

    A CSV beside a parquet of the same stem is the same table (the parquet is imported): it must
    not hold more rows than the parquet.
    """
    files = {p.name: p for p in recorded.iterdir() if p.suffix in (".parquet", ".csv")}
    out = {}
    for name, p in sorted(files.items()):
        if p.suffix == ".csv" and p.with_suffix(".parquet").name in files:
            csv, pq = pd.read_csv(p), pd.read_parquet(p.with_suffix(".parquet"))
            assert list(csv.columns) == list(pq.columns) and len(csv) <= len(pq), name
            continue
        n = len(pd.read_parquet(p) if p.suffix == ".parquet" else pd.read_csv(p))
        out[name] = 2 * n if name == "sdpa.parquet" else n
    return out


def _points_per_file(url: str) -> dict[str, int]:
    with dbs.session_scope(url) as s:
        counts: dict[str, int] = {}
        for t in m.MEASUREMENT_TABLES.values():
            for src, n in s.execute(select(m.BenchRun.source_file, func.count()).join(t, t.run_id == m.BenchRun.id)
                                    .group_by(m.BenchRun.source_file)).all():
                name = src.split("#", 1)[0]
                counts[name] = counts.get(name, 0) + n
        return counts


@pytest.mark.recorded
def test_import_recorded_counts_per_file_and_idempotent(capsys, empty_db, recorded_dir):
    expected = _expected_points(recorded_dir)
    code, out, err = cli(capsys, "db", "import-scaleplan", str(recorded_dir), "--db", empty_db, "--json")
    assert code == 0, err
    first = {r["file"]: r for r in json.loads(out)}
    assert {f: r["inserted"] for f, r in first.items()} == expected
    assert _points_per_file(empty_db) == expected
    code, out, err = cli(capsys, "db", "import-scaleplan", str(recorded_dir), "--db", empty_db, "--json")
    assert code == 0, err
    assert all(r["inserted"] == 0 for r in json.loads(out))
    assert _points_per_file(empty_db) == expected
    with dbs.session_scope(empty_db) as s:  # non-OK rows are kept with their status
        statuses = set(s.scalars(select(m.GemmPoint.status).distinct()))
    assert "OK" in statuses and statuses - {"OK"}


def _expected_field(path: Path) -> str:
    line = next(ln for ln in path.read_text(errors="replace").splitlines() if ln.startswith("# expect:"))
    return line.split(":", 1)[1].strip()


@pytest.mark.parametrize("path", BAD_SPECS, ids=[p.stem for p in BAD_SPECS])
def test_bad_spec_names_its_field(path):
    with pytest.raises(SpecError) as ei:
        load_spec(path)
    msg = str(ei.value)
    assert "\n" not in msg
    field = _expected_field(path)
    assert ei.value.field == field or ei.value.field.endswith(field), (field, msg)


@pytest.mark.parametrize("path", BAD_SPECS, ids=[p.stem for p in BAD_SPECS])
def test_bad_spec_cli_exit_2_one_line(capsys, tmp_path, path):
    """Through ``scaleplan estimate`` (which loads the spec before anything else)."""
    code, out, err = cli(capsys, "estimate", str(path), "--devices", "8", "--db", str(tmp_path / "e.db"))
    assert code == 2, (out, err)
    assert out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "error: " in err and _expected_field(path) in err.split("error: ", 1)[1].split(":")[0], err


def test_bad_specs_real_processes_no_traceback(tmp_path):
    """A few real processes (the installed entry point): exit 2, one stderr line, no traceback."""
    assert len(BAD_SPECS) >= 12
    exe = Path(sys.executable).with_name("scaleplan")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c", "from scaleplan.cli import main; main()"]
    for name in ("bad_yaml", "head_dim_zero", "unknown_field"):
        p = next(b for b in BAD_SPECS if b.stem == name)
        r = subprocess.run([*cmd, "estimate", str(p), "--devices", "8", "--db", str(tmp_path / "e.db")],
                           capture_output=True, text=True, timeout=budget(120))
        assert r.returncode == 2, (name, r.stderr)
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, (name, r.stderr)
        assert _expected_field(p) in r.stderr, (name, r.stderr)
