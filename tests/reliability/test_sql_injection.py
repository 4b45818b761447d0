"""Names that look like SQL go in as data: through the importer (file name, cell values) and the CLI.

After each attempt every table still exists with its rows, and the hostile text is stored verbatim
where it was accepted (parameterised queries store it; string-built SQL would execute it).
"""
from __future__ import annotations

import shutil

import pandas as pd
import pytest
from sqlalchemy import func, inspect, select

from scaleplan.db import models as m
from scaleplan.db import session as dbs
from scaleplan.db.importers import import_scaleplan_dir

PAYLOADS = ["x'; DROP TABLE gemm_point;--", 'x"); DROP TABLE bench_run;--', "x' OR '1'='1",
            "x'); DELETE FROM vocab_point; --"]


def _census(url: str) -> dict[str, int]:
    eng = dbs.get_engine(url)
    with eng.connect() as c:
        return {t: c.execute(select(func.count()).select_from(m.Base.metadata.tables[t])).scalar()
                for t in inspect(eng).get_table_names() if t in m.Base.metadata.tables}


@pytest.fixture()
def loaded_db(any_db, recorded_dir) -> str:
    """A database of each dialect with two small recorded tables imported."""
    dbs.upgrade(any_db)
    d = recorded_dir
    with dbs.session_scope(any_db) as s:
        for name in ("vocab_gemm_ce_b200.parquet", "dispatch_gap_b200.parquet"):
            from scaleplan.db.importers import import_file

            import_file(s, d / name)
    return any_db


def test_hostile_file_names_and_cells_are_stored_verbatim(loaded_db, recorded_dir, tmp_path, record):
    url = loaded_db
    before = _census(url)
    src = pd.read_parquet(recorded_dir / "vocab_gemm_ce_b200.parquet")
    for i, payload in enumerate(PAYLOADS):
        d = tmp_path / f"in{i}"
        d.mkdir()
        df = src.copy()
        df["op"] = payload[:32]  # a key column (String(32))
        df["model_tag"] = payload  # lands in the note
        name = f"vocab_gemm_ce_{payload.replace('/', '_')}.csv"
        df.to_csv(d / name, index=False)
        shutil.copy(recorded_dir / "topk_a100.csv", d / f"topk_{payload.replace('/', '_')}.csv")
        with dbs.session_scope(url) as s:
            res = import_scaleplan_dir(s, d)
        assert sorted(r.inserted for r in res) == sorted([240, len(src)])
        record("injection_attempts")
    after = _census(url)
    assert set(after) == set(before)  # no table dropped
    assert all(after[t] >= before[t] for t in before)  # nothing deleted
    with dbs.session_scope(url) as s:
        ops = set(s.scalars(select(m.VocabPoint.op).distinct()))
        files = set(s.scalars(select(m.BenchRun.source_file)))
    assert {p[:32] for p in PAYLOADS} <= ops
    assert all(any(p.replace("/", "_") in f for f in files) for p in PAYLOADS)


@pytest.mark.parametrize("payload", PAYLOADS)
def test_hostile_cli_values_leave_tables_intact(cli, loaded_db, tmp_path, payload, record):
    url = loaded_db
    before = _census(url)
    spec = tmp_path / "s.yaml"
    spec.write_text("model: {n_layers: 2, hidden_sz: 256, inter_sz: 512, n_q_heads: 4, n_kv_heads: 4, "
                    "head_dim: 64, vocab_sz: 4096}\nhardware: {node_type: p5.48xlarge}\n")
    attempts = [
        ["estimate", str(spec), "--devices", "8", "--profile", payload, "--db", url],
        ["bench", "runs", "--profile", payload, "--db", url],
        ["calibrate", "list", "--profile", payload, "--db", url],
        ["calibrate", "report", "--profile", payload, "--sweep", payload, "--db", url],
        ["law", "eval", "--n-tot", "1e9", "--s", "0.5", "--d", "1e10", "--law", payload, "--db", url],
        ["db", "stats", "--db", url],
    ]
    for argv in attempts:
        code, out, err = cli(*argv)
        assert "Traceback" not in out + err, (argv, err)
        assert code in (0, 1, 2), (argv, code, err)
        record("injection_attempts")
    assert _census(url) == before
