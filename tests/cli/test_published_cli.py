"""`scaleplan spec published` lists the published runs and prints one's spec; `scaleplan estimate ID` prints the
run's measured step beside the prediction for the run itself (its layout, stack and batch) and for nothing else."""
from __future__ import annotations

from scaleplan.estimator import Estimator

from scaleplan import published
from scaleplan.specs import Layout, load_spec, parse_spec

SMALL = "qwen3-30b-a3b-fp8-published-stack"  # 8 B200: the recorded B200 tables cost it


def test_spec_published_lists_every_run_and_prints_one(run, run_json, tmp_path):
    assert [x["id"] for x in run_json("spec", "published")["runs"]] == [r.id for r in published.runs()]
    code, out, err = run("spec", "published", SMALL)
    assert code == 0 and "measured" in out.splitlines()[0], err
    (tmp_path / "run.yaml").write_text(out)
    assert load_spec(tmp_path / "run.yaml") == load_spec(SMALL)  # the printed spec is the run's
    code, out, err = run("spec", "published", "nope")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "nope" in err
    ids = [x["id"] for x in run_json("spec", "published", "--model", "Qwen/Qwen3-235B-A22B")["runs"]]
    assert ids == [r.id for r in published.runs() if r.model == "qwen3-235b-a22b"] and ids
    code, out, err = run("spec", "published", "--model", "llama")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "llama" in err


def test_estimate_of_a_run_prints_its_measured_step_for_its_own_layout_only(run, run_json, recorded_db):
    ran = published.find(SMALL)
    want = Estimator(ran.system, recorded_db, use_calibration=False).estimate(
        parse_spec(ran.doc), ran.devices, [Layout(**ran.layout)])[0].t_iter_s
    own, other = run_json("estimate", SMALL, "--db", recorded_db, "--calibration", "none",
                          "--layout", "mbs=4", "--layout", "mbs=2")
    assert own["t_iter_s"] == want
    assert own["measured"] == {"id": ran.id, "group": ran.group, "step_s": ran.published_step_s}
    assert "measured" not in other
    (changed,) = run_json("estimate", SMALL, "--db", recorded_db, "--calibration", "none", "--stack",
                          "dispatcher=alltoall")
    assert "measured" not in changed
    code, out, err = run("estimate", SMALL, "--db", recorded_db, "--calibration", "none")
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("measured:"))
    assert f"predicted / measured {want / ran.published_step_s:.2f}" in line
