"""Observed-run import: mfu_sweeps.csv as published, idempotent re-import, atomic rejection of bad rows."""
import json

import pytest
from scaleplan.calibrate.observations import add_runs, parse_runs_file
from sqlalchemy import func, select

from scaleplan.db import models as m
from scaleplan.db import session as dbs
from scaleplan.errors import SpecError

HEADER = "sweep,model,n_devices,gbs,seqlen,tp,cp,pp,ep,dp,mbs,real_mfu_pct_est"


def _count(url):
    with dbs.session_scope(url) as s:
        return s.scalar(select(func.count()).select_from(m.ObservedRun))


def test_mfu_sweeps_imports_every_row_and_reimport_adds_none(sqlite_url, validation_dir, validation_counts):
    csv, specs = validation_dir / "mfu_sweeps.csv", validation_dir / "models.yaml"
    n = sum(validation_counts.values())
    first = add_runs(sqlite_url, csv, specs)
    assert (first["rows"], first["inserted"]) == (n, n)
    assert first["sweeps"] == validation_counts
    again = add_runs(sqlite_url, csv, specs)
    assert (again["inserted"], again["already_present"]) == (0, n)
    assert _count(sqlite_url) == n


def test_mfu_sweeps_column_mapping(validation_dir):
    obs = parse_runs_file(validation_dir / "mfu_sweeps.csv", validation_dir / "models.yaml")
    o = obs[0]  # 700m-32dev,moe-700m,32,256,8192,1,1,2,8,16,1,0.910,0.882,6.48,6.27,4.927,4.740
    # the step time is the measurement; the MFU column has no declared FLOP count, so it is not kept
    assert o.measured_t_iter_s == pytest.approx(4.927)
    assert (o.measured_mfu, o.mfu_flops) == (None, None)
    assert o.extra["reference_step_s"] == pytest.approx(4.740)
    assert o.measured_mfu_norm == pytest.approx(0.910)
    assert o.reference_mfu == pytest.approx(0.0627)
    assert o.extra["reference_mfu_norm"] == pytest.approx(0.882)
    assert (o.layout["pp"], o.layout["ep"], o.layout["dp"], o.layout["ckpt"]) == (2, 8, 16, "full")
    assert o.profile == "p6-b200.48xlarge"
    # the stored spec carries the run's batch geometry
    assert (o.spec["data"]["gbs"], o.spec["data"]["seqlen"]) == (256, 8192)
    # every row got its own model's spec (models.yaml read here with yaml, not through the importer)
    import csv

    import yaml

    models = yaml.safe_load((validation_dir / "models.yaml").read_text())
    with open(validation_dir / "mfu_sweeps.csv", newline="") as f:
        names = [row["model"] for row in csv.DictReader(f)]
    assert len(set(names)) >= 3
    assert [o.spec["model"]["hidden_sz"] for o in obs] == [models[n]["model"]["hidden_sz"] for n in names]


def test_mfu_in_the_logged_count_gives_the_readmes_step_times(validation_dir):
    """--mfu-flops 6n turns real_mfu_pct_est back into real_step_s_est, which the validation README
    derived as 6 N gbs seqlen / (MFU N_dev 2.25e15) with its own N per model (to its 4 digits)."""
    import pandas as pd

    csv = validation_dir / "mfu_sweeps.csv"
    df = pd.read_csv(csv).drop(columns=["real_step_s_est"])
    obs = parse_runs_file(_write(csv.parent, df), validation_dir / "models.yaml", mfu_flops="6n")
    want = pd.read_csv(csv)["real_step_s_est"].to_numpy()
    got = [o.measured_t_iter_s for o in obs]
    assert got == pytest.approx(want, rel=5e-4)
    assert {o.mfu_flops for o in obs} == {"6n"} and obs[0].measured_mfu == pytest.approx(0.0648)


def _write(vdir, df):
    import tempfile
    from pathlib import Path

    p = Path(tempfile.mkdtemp()) / "runs.csv"
    df.to_csv(p, index=False)
    return p


@pytest.mark.parametrize("count,ratio,tol", [("eq-mfu", 0.77e9 / 1.8269e9, 1e-2), ("megatron", None, 1e-3)])
def test_the_declared_count_sets_the_step_time(validation_dir, count, ratio, tol):
    """The same logged MFU read in another count is another step time: eq:mfu's N_act (0.77e9 for
    the 700M, README table, two digits) against the logged N; Megatron's from its formula written out here."""
    import pandas as pd

    csv = validation_dir / "mfu_sweeps.csv"
    df = pd.read_csv(csv).drop(columns=["real_step_s_est"]).head(1)
    o = parse_runs_file(_write(csv.parent, df), validation_dir / "models.yaml", mfu_flops=count)[0]
    if ratio is None:  # Megatron: per token 6 [h (3 d_sh + 3 d_exp K) n_moe + 3 h d_ff + L (h(q+2kv) + q s + q h) + h V_pad]
        h, L, s, q, kv, vpad = 2048, 16, 8192, 2048, 2048, 257664
        per_tok = 6 * (h * (3 * 1280 + 3 * 1280 * 3) * 15 + h * 3 * 5120 + L * (h * (q + 2 * kv) + q * s + q * h)
                       + h * vpad)
        ratio = per_tok / 6 / 1.8269e9
    assert o.measured_t_iter_s == pytest.approx(4.927 * ratio, rel=tol)


def test_an_mfu_without_its_count_is_refused(tmp_path, sqlite_url, validation_dir):
    p = tmp_path / "runs.csv"
    p.write_text(HEADER + "\ns,moe-700m,32,256,8192,1,1,2,8,16,1,6.0\n")
    with pytest.raises(SpecError) as e:
        add_runs(sqlite_url, p, validation_dir / "models.yaml")
    assert "column mfu_pct" in str(e.value) and "--mfu-flops" in str(e.value) and "\n" not in str(e.value)
    assert _count(sqlite_url) == 0
    with pytest.raises(SpecError, match="mfu_flops"):
        add_runs(sqlite_url, p, validation_dir / "models.yaml", mfu_flops="7n")


@pytest.mark.parametrize("row,col", [
    ("s,moe-700m,32,256,8192,1,1,2,8,8,1,6.0", "dp"),          # tp*cp*pp*dp != n_devices
    ("s,moe-700m,32,256,8192,1,1,2,3,16,1,6.0", "ep"),         # ep does not divide dp
    ("s,moe-700m,32,256,8192,1,1,2,8,16,1,150", "mfu_pct"),    # > 100 %
    ("s,moe-700m,32,256,8192,1,1,two,8,16,1,6.0", "pp"),       # not an integer
    ("s,moe-9b,32,256,8192,1,1,2,8,16,1,6.0", "model"),        # unknown model key
    ("s,moe-700m,32,256,8192,1,1,2,8,16,1,", "measured_t_iter_s"),  # no measurement at all
    ("s,moe-700m,32,256,8192,1,1,2,8,16,1,inf", "mfu_pct"),   # not finite
])
def test_bad_row_names_row_and_column_and_writes_nothing(tmp_path, sqlite_url, validation_dir, row, col):
    good = "s,moe-700m,32,256,8192,1,1,2,8,16,1,6.0"
    p = tmp_path / "runs.csv"
    p.write_text("\n".join([HEADER, good, row]) + "\n")
    with pytest.raises(SpecError) as e:
        add_runs(sqlite_url, p, validation_dir / "models.yaml", mfu_flops="6n")
    msg = str(e.value)
    assert "row 2" in msg and f"column {col}" in msg
    assert "\n" not in msg
    assert _count(sqlite_url) == 0  # the good first row was not written either


def test_json_records_and_spec_path(tmp_path, sqlite_url, validation_dir):
    import yaml

    spec = yaml.safe_load((validation_dir / "models.yaml").read_text())["moe-700m"]
    (tmp_path / "m700.yaml").write_text(yaml.safe_dump(spec))
    recs = [{"sweep": "v", "spec": "m700.yaml", "n_devices": 8, "gbs": 64, "seqlen": 4096, "tp": 1, "cp": 1,
             "pp": 1, "ep": 8, "dp": 8, "mbs": 1, "measured_t_iter_s": 2.5, "peak_mem_gb": 61.0}]
    (tmp_path / "runs.json").write_text(json.dumps({"runs": recs}))
    out = add_runs(sqlite_url, tmp_path / "runs.json")
    assert out["inserted"] == 1
    with dbs.session_scope(sqlite_url) as s:
        r = s.scalars(select(m.ObservedRun)).one()
        assert (r.measured_t_iter_s, r.measured_peak_mem_gb, r.measured_mfu, r.seqlen) == (2.5, 61.0, None, 4096)
        assert r.spec["model"]["n_layers"] == 16


def test_profile_override_must_exist(validation_dir):
    with pytest.raises(SpecError, match="--profile"):
        parse_runs_file(validation_dir / "mfu_sweeps.csv", validation_dir / "models.yaml", profile="no-such-node")
