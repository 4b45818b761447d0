"""Fresh install (empty DB): analytic fallback with labels and banner; CLI JSON contract; no torch."""
import json
import subprocess
import sys

import pytest
import yaml
from pace import budget
from scaleplan.estimator import Estimator

from scaleplan.specs import Layout, parse_spec

from .conftest import moe_spec

RESULT_KEYS = {"layout", "mfu", "mfu_validation", "hfu", "t_iter_s", "t_analytic_s", "chi_sys", "chi_inputs",
               "tokens_per_s", "mem_per_device_gb", "mem_breakdown_gb", "n_act", "n_tot", "breakdown_s", "sources",
               "feasible", "reason", "warnings", "n_clamped", "composed_share", "mem_allocated_gb", "mem_reserved_gb",
               "mem_stage",
               "extrapolated_collectives", "geometry", "provenance"}  # the CLI adds the model's geometry and the answer's provenance
CHI_KEYS = {"t_a2a_s", "ep_nodes", "pp_nodes", "deep_pp_in_node", "gpus_per_node"}


def _cli(*args):
    code = "import sys; from scaleplan.cli import main; main(sys.argv[1:])"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=budget(120))


@pytest.fixture()
def spec_file(tmp_path):
    d = moe_spec(parallelism={"pp": 2, "ep": 8})
    p = tmp_path / "moe.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def test_empty_db_is_analytic_and_labelled(sqlite_url):
    est = Estimator("p6-b200.48xlarge", db_url=sqlite_url)
    r = est.estimate(parse_spec(moe_spec()), 32, [Layout(pp=2, ep=8)])[0]
    assert est.tables.empty
    for comp in ("attn_proj", "sdpa", "experts", "router", "ep_a2a", "vocab"):
        assert r.sources[comp] == "analytic", comp
    assert 0 < r.mfu < 1 and r.t_iter_s > 0 and r.feasible
    assert any("analytic" in w for w in r.warnings)
    best = est.best_plan(parse_spec(moe_spec()).model, 32, 256, 8192, "adamw")
    assert best is not None and best.feasible


def test_estimate_json_contract_and_banner(spec_file, sqlite_url):
    p = _cli("estimate", str(spec_file), "--devices", "32", "--db", sqlite_url, "--json",
             "--layout", "pp=2,ep=8,mbs=1", "--layout", "pp=1,ep=4,mbs=2,ckpt=selective")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert isinstance(out, list) and len(out) == 2
    for r in out:
        assert set(r) == RESULT_KEYS
        assert set(r["chi_inputs"]) == CHI_KEYS
        assert set(r["layout"]) == {"tp", "cp", "pp", "dp", "ep", "etp", "vpp", "mbs", "ckpt"}
        assert set(r["sources"]) == set(r["breakdown_s"])
        assert set(r["sources"].values()) <= {"measured", "interpolated", "clamped", "composed", "analytic"}
    assert out[1]["layout"]["ckpt"] == "selective" and out[1]["layout"]["dp"] == 32
    assert "scaleplan bench" in p.stderr  # the analytic banner, on stderr only


def test_layouts_json_and_human(spec_file, sqlite_url):
    p = _cli("layouts", str(spec_file), "--devices", "32", "--db", sqlite_url, "--json", "--top", "3",
             "--mbs", "1,2")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert len(out["ranked"]) == 3 and out["infeasible_counts"]
    mfus = [r["mfu"] for r in out["ranked"]]
    assert mfus == sorted(mfus, reverse=True)
    h = _cli("layouts", str(spec_file), "--devices", "32", "--db", sqlite_url, "--top", "2")
    assert h.returncode == 0 and "MFU" in h.stdout


def test_user_errors_are_one_line_exit_2(spec_file, sqlite_url, tmp_path):
    bad = _cli("estimate", str(spec_file), "--devices", "32", "--db", sqlite_url, "--layout", "pp=3")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    bad = _cli("estimate", str(spec_file), "--devices", "32", "--db", sqlite_url, "--layout", "ep=16,pp=4")
    assert bad.returncode == 2 and "ep" in bad.stderr
    missing = _cli("estimate", str(tmp_path / "nope.yaml"), "--devices", "32", "--db", sqlite_url)
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1


def test_out_of_range_is_one_line_exit_2(recorded_db, tmp_path):
    long = tmp_path / "long.yaml"
    long.write_text(yaml.safe_dump(moe_spec(data={"seqlen": 65536, "gbs": 256}, parallelism={"pp": 2, "ep": 8})))
    p = _cli("estimate", str(long), "--devices", "32", "--db", recorded_db, "--extrapolate", "error")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    assert "outside the measured range" in p.stderr
    ok = _cli("estimate", str(long), "--devices", "32", "--db", recorded_db, "--extrapolate", "clamp", "--json")
    assert ok.returncode == 0 and json.loads(ok.stdout)[0]["n_clamped"] > 0


def test_planner_commands_do_not_import_torch(spec_file, sqlite_url):
    code = ("import sys; from scaleplan.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    for cmd in (["estimate", str(spec_file), "--devices", "32"], ["layouts", str(spec_file), "--devices", "32"]):
        p = subprocess.run([sys.executable, "-c", code, *cmd, "--db", sqlite_url, "--json"], capture_output=True,
                           text=True, timeout=budget(120))
        assert p.returncode == 0, p.stderr
