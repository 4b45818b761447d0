"""`scaleplan bench` commands: runs listing, export -> import-recorded round trip, plan, user errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest
import torch
import yaml
from sqlalchemy import select
from typer.testing import CliRunner

from pace import budget
from scaleplan import cli
from scaleplan.db import models as m
from scaleplan.db.recorded import PROVENANCE
from scaleplan.db.session import session_scope, upgrade

from .conftest import tiny_preset

SMALL = {
    "gemm": {"dtypes": ["fp32"], "m": [8, 16], "n": [8], "k": [8]},
    "vocab": {"dtypes": ["bf16"], "tokens": [8], "hidden": [16], "vocab": [64]},
    "sdpa": {
        "dtypes": ["fp32"],
        "seq_len": [16],
        "n_q_heads": [2],
        "n_kv_heads": [1],
        "head_dim": [8],
        "backends": ["math", "cudnn"],
    },
}


def invoke(*args):
    return CliRunner().invoke(cli.app, list(args))


@pytest.fixture(scope="module")
def db_with_runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    url = f"sqlite:///{d / 'b.db'}"
    preset = d / "small.yaml"
    preset.write_text(yaml.safe_dump(tiny_preset(SMALL)))
    res = invoke("bench", "run", "--preset", str(preset), "--db", url, "--device", "cpu", "--json")
    assert res.exit_code == 0, res.output
    return url, json.loads(res.stdout)


def test_run_json_is_one_document(db_with_runs):
    _, out = db_with_runs
    assert {r["suite"] for r in out["runs"]} == {"gemm", "vocab", "sdpa"}
    sd = next(r for r in out["runs"] if r["suite"] == "sdpa")
    assert sd["by_status"] == {"OK": 1, "UNSUPPORTED": 1}  # cudnn does not exist on CPU


def test_runs_lists_provenance_and_counts(db_with_runs):
    url, out = db_with_runs
    res = invoke("bench", "runs", "--db", url, "--json")
    assert res.exit_code == 0, res.output
    runs = {r["id"]: r for r in json.loads(res.stdout)["runs"]}
    for r in out["runs"]:
        listed = runs[r["run_id"]]
        assert listed["status"] == "complete" and listed["source"] == "measured"
        assert listed["points"] == r["points"] and listed["by_status"] == r["by_status"]
        assert listed["torch_version"] and listed["host"] and listed["profile"] == "cpu-local"
    human = invoke("bench", "runs", "--db", url)
    assert human.exit_code == 0 and "vocab" in human.stdout and "complete" in human.stdout


def _values(url, table, cols):
    with session_scope(url) as s:
        return sorted(map(tuple, s.execute(select(*[getattr(table, c) for c in cols])).all()), key=str)


def test_export_then_import_recorded_round_trip(db_with_runs, tmp_path):
    url, out = db_with_runs
    ids = [str(r["run_id"]) for r in out["runs"]]
    res = invoke("bench", "export", *ids, "--out", str(tmp_path / "rec"), "--db", url, "--json")
    assert res.exit_code == 0, res.output
    files = {f["path"].rsplit("/", 1)[-1]: f["rows"] for f in json.loads(res.stdout)["files"]}
    assert files == {"gemm.csv": 2, "vocab.csv": 2, "sdpa.csv": 2}
    df = pd.read_csv(tmp_path / "rec" / "gemm.csv")
    assert set(PROVENANCE) <= set(df.columns) and set(df["profile"]) == {"cpu-local"}

    url2 = f"sqlite:///{tmp_path / 'imported.db'}"
    upgrade(url2)
    res = invoke("db", "import-recorded", str(tmp_path / "rec"), "--db", url2)
    assert res.exit_code == 0, res.output
    with session_scope(url2) as s:  # provenance travels with the rows
        imported = s.scalars(select(m.BenchRun).where(m.BenchRun.suite == "gemm")).one()
        assert imported.source == "imported" and imported.torch_version == torch.__version__
        rev = df["git_rev"].iloc[0]
        assert imported.git_rev == (None if pd.isna(rev) else rev) and imported.host == df["host"].iloc[0]
    for table in (m.GemmPoint, m.VocabPoint, m.SdpaPoint):
        cols = [c for c in table.__table__.columns.keys() if c not in ("id", "run_id", "created_at")]

        assert _values(url, table, cols) == _values(url2, table, cols)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--preset", "no-such-preset"], "--preset"),
        (["--suite", "bogus"], "--suite"),
        (["--resume", "x1"], "--resume"),
        (["--resume", "999"], "no bench run"),
        (["--device", "cuda"], "--device"),
        (["--device", "tpu"], "--device"),
    ],
)
def test_user_errors_exit_2_with_one_line(args, needle, tmp_path, capsys):
    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "run", "--db", str(tmp_path / "e.db"), *args])
    err = capsys.readouterr()
    assert exc.value.code == 2, err.err
    assert needle in err.err and len(err.err.strip().splitlines()) == 1 and err.out == ""


def test_cli_import_does_not_load_torch():
    code = "import sys, scaleplan.cli, scaleplan.cli.bench; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], timeout=budget(60)).returncode == 0


TINY_SPEC = {
    "model": {
        "n_layers": 4,
        "hidden_sz": 64,
        "inter_sz": 128,
        "n_q_heads": 4,
        "n_kv_heads": 2,
        "head_dim": 16,
        "vocab_sz": 512,
        "precision": "bf16",
        "moe": {"n_experts": 4, "experts_per_token": 2, "expert_inter_sz": 32},
    },
    "search": {"num_devices": 2},
    "performance": {"activation_checkpointing_type": "full"},
    "optimizer": {"optimizer_type": "adamw"},
    "data": {"gbs": 8, "seqlen": 64, "microbatch_sz": 1},
    "hardware": {"node_type": "p6-b200.48xlarge"},
    "parallelism": {"tp": 1, "ep": 2, "pp": 1},
}


def test_plan_lists_and_measures_the_lookups(tmp_path, sqlite_url):
    pytest.importorskip("scaleplan.estimator")
    from scaleplan.bench import plan
    from scaleplan.bench.store import key_of
    from scaleplan.bench.suites import get_suite

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(TINY_SPEC))
    res = invoke("bench", "plan", str(spec), "--devices", "2", "--db", sqlite_url, "--json")
    assert res.exit_code == 0, res.output
    listed = json.loads(res.stdout)["lookups"]
    assert {"gemm", "sdpa", "grouped_gemm"} <= set(listed)
    # measure the in-process suites (collectives and the 512-GEMM dispatch chain are covered elsewhere)
    subset = {k: v for k, v in listed.items() if k in ("gemm", "grouped_gemm", "router", "vocab", "sdpa")}
    results = plan.run_lookups(subset, spec, sqlite_url, device="cpu")
    with session_scope(sqlite_url) as s:
        for r in results:
            mod = get_suite(r.suite)
            stored = {
                key_of(row._asdict(), mod.KEY)
                for row in s.execute(
                    select(*[getattr(mod.TABLE, k) for k in mod.KEY]).where(mod.TABLE.run_id == r.run_id)
                )
            }
            for p in listed[r.suite]:
                if r.suite == "sdpa":  # every CPU backend is measured for a looked-up attention shape
                    assert {key_of({**p, "backend": b}, mod.KEY) for b in ("math", "flash")} <= stored
                else:
                    assert key_of(p, mod.KEY) in stored
