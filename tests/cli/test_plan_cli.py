"""`scaleplan plan` through the CLI: one-line refusals (bad prices, node counts, targets; an unreachable target
names the binding constraint and the best loss reachable), the JSON's prices, evidence and uncertainty, a fixed
model's windows, and the chosen point's launchable outputs."""
from __future__ import annotations

import json
import re

import pytest

B200, GB200 = "p6-b200.48xlarge", "p6e-gb200.36xlarge"
SMALL = ["--q", "8,10", "--experts", "16,32,64", "--topk", "1,2,4", "--g", "1,2", "--workers", "1"]


def _one_line_error(code: int, err: str, *phrases: str) -> str:
    assert code == 2, err
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    for ph in phrases:
        assert ph in lines[0], (ph, lines[0])
    return lines[0]


@pytest.mark.parametrize("args, phrases", [
    (["--target-loss", "1.4", "--price", f"{B200}=-1"], ["--price", "USD per GPU-hour"]),
    (["--target-loss", "1.4", "--price", f"{B200}=cheap"], ["--price", "PROFILE=USD"]),
    (["--target-loss", "1.4", "--price", "p9.nothing=3"], ["--price", "a platform of the request"]),
    (["--target-loss", "1.4", "--nodes", "0"], ["--nodes", "got 0"]),
    (["--target-loss", "1.4", "--nodes", f"{B200}=4,x"], ["--nodes", "positive integers"]),
    (["--target-loss", "1.4", "--nodes", "p9.nothing=4"], ["--nodes", "a platform of the request"]),
    (["--target-loss", "1.4", "--nodes", f"{B200}=100000"], ["--nodes", "node counts 1 to"]),
    (["--target-loss", "-1"], ["--target-loss"]),
    (["--target-loss", "nan"], ["--target-loss"]),
    (["--tokens", "1e12"], ["--spec/--tokens", "both"]),
    ([], ["target", "--target-loss"]),
    (["--target-loss", "1.4", "--max-cost", "1e6"], ["--price", "p5en.48xlarge"]),
    (["--target-loss", "1.4", "--pick", "somewhere"], ["--pick", "PROFILE@NODES"]),
    (["--target-loss", "1.4", "--platforms", "cpu-local"], ["--platforms", "GPU node types"]),
    (["--target-loss", "1.4", "--platforms", "p9.nothing"], ["profile", "p9.nothing"]),
    (["--target-loss", "1.4", "--calibration", "3"], ["--calibration", "an id belongs to one profile"]),
    (["--target-loss", "1.4", "--failure-rate", "-1"], ["--failure-rate"]),
    (["--target-loss", "1.4", "--max-gpus", "4", "--platforms", B200], ["--max-gpus"]),
    (["--target-loss", "1.4", "--confidence", "1.5"], ["--confidence", "a probability in [0.5, 1)"]),
    (["--target-loss", "1.4", "--confidence", "0.3"], ["--confidence", "a probability in [0.5, 1)"]),
    (["--target-loss", "1.4", "--confidence", "nan"], ["--confidence", "a probability in [0.5, 1)"]),
    (["--target-loss", "1.4", "--confidence", "0.9", "--samples", "0"], ["--confidence", "--samples > 0"]),
    (["--target-loss", "1.4", "--stack", "bogus=1"], ["--stack", "key=value"]),
    (["--target-loss", "1.4", "--stack", "fp8_recipe=mxfp8"], ["stack.fp8_recipe", "model.precision fp8"]),
])
def test_bad_input_is_one_line_naming_the_option(run, args, phrases):
    code, _, err = run("plan", *args)
    _one_line_error(code, err, *phrases)


@pytest.mark.recorded
def test_unreachable_within_the_deadline_names_it_and_the_best_loss(run, run_json, recorded_db):
    # --goodput 1: the search's (no failure model), so the forward search is the same question
    nodes = ["--platforms", B200, "--nodes", "4,8,16,32", "--goodput", "1", "--db", recorded_db, *SMALL]
    fwd = run_json("search", "--profile", B200, "--nodes", "4,8,16,32", "--days", "2", "--samples", "0",
                   "--no-extend-edges", "--db", recorded_db, *SMALL)
    best = min(r["best"]["loss"] for r in fwd["sweep"] if r["best"])
    target = run_json("search", "--profile", B200, "--nodes", "16", "--days", "20", "--samples", "0",
                      "--no-extend-edges", "--db", recorded_db, *SMALL)["best"]["loss"]
    code, _, err = run("plan", "--target-loss", f"{target:.6f}", "--max-days", "2", "--samples", "0", *nodes)
    line = _one_line_error(code, err, "--target-loss", "the deadline binds", "--max-days 2",
                           "the best loss reachable within them")
    assert float(re.search(r"reachable within them is ([0-9.]+)", line).group(1)) == pytest.approx(best, abs=6e-5)
    code, _, err = run("plan", "--target-loss", f"{target:.6f}", "--max-gpu-hours", "2000", "--samples", "0", *nodes)
    _one_line_error(code, err, "the budget binds", "GPU-hours")
    code, _, err = run("plan", "--target-loss", "1.0", "--samples", "0", *nodes)
    _one_line_error(code, err, "the law's range binds", "TPP 150")


@pytest.mark.recorded
def test_json_prices_evidence_and_uncertainty(run_json, recorded_db):
    out = run_json("plan", "--target-loss", "1.45", "--platforms", f"p5.48xlarge,{B200},{GB200}", "--max-gpus", "256",
                   "--nodes", f"{GB200}=16,32,64", "--price", f"{B200}=6.1", "--samples", "100", "--db", recorded_db,
                   *SMALL)
    pl = {p["profile"]: p for p in out["platforms"]}
    # prices: the profile's default with its date and source, --price's as given, none for GB200
    assert pl["p5.48xlarge"]["price"]["date"] and "AWS" in pl["p5.48xlarge"]["price"]["source"]
    assert pl[B200]["price"] == {"usd_per_gpu_hour": 6.1, "source": "--price", "date": None}
    assert pl[GB200]["price"] is None and out["overall"]["by"] == "gpu-hours"
    # each component measured, composed or analytic per platform; GB200 has no table of its own: its kernels are
    # the B200's rows scaled to it (composed), its fabric analytic, drawn wider
    assert not pl[GB200]["evidence"]["analytic_platform"] and not pl[B200]["evidence"]["analytic_platform"]
    assert "gemm" in pl[B200]["evidence"]["measured"] and pl[GB200]["evidence"]["measured"] == []
    assert {"gemm", "grouped_gemm", "sdpa"} <= set(pl[GB200]["evidence"]["composed"])
    assert pl[B200]["evidence"]["composed"] == [] and "collectives" in pl[GB200]["evidence"]["analytic"]
    b, g = (next(p for p in pl[k]["points"] if p["n_devices"] == 128) for k in (B200, GB200))
    assert g["plan"]["evidence_sigma"] > b["plan"]["evidence_sigma"]
    width = lambda p: p["days_p95"] / p["days_p05"]  # noqa: E731
    assert width(g) > width(b)
    for p in (b, g):
        assert 0 < p["p_reach"] < 1 and p["days_p05"] < p["days"] < p["days_p95"]
        assert p["cost_usd"] == (pytest.approx(p["gpu_hours"] * 6.1) if p is b else None)
        assert p["gpu_hours"] == pytest.approx(128 * p["days"] * 24)


@pytest.mark.recorded
def test_fixed_model_window_and_its_emitted_spec(run, run_json, recorded_db, spec_file, tmp_path):
    """A spec and --tokens: each window is D / (tokens/s x eta_good) under the best layout; the chosen point's
    --emit-spec is that model and layout, which `estimate` predicts at the same tokens/s."""
    out_spec = tmp_path / "chosen.yaml"
    out = run_json("plan", "--spec", spec_file, "--tokens", "2e11", "--platforms", B200, "--nodes", "4,8",
                   "--samples", "50", "--emit-spec", out_spec, "--db", recorded_db)
    pts = out["platforms"][0]["points"]
    chosen = out["chosen"]
    assert (chosen["nodes"], chosen["days"]) == min(((p["nodes"], p["days"]) for p in pts),
                                                    key=lambda t: t[0] * 8 * t[1])
    est = run_json("estimate", out_spec, "--db", recorded_db)
    r = est[0]
    for p in pts:
        assert p["days"] * 86400 * p["plan"]["tokens_per_s"] * p["eta_good"] == pytest.approx(2e11, rel=1e-9)
    assert r["tokens_per_s"] == pytest.approx(chosen["plan"]["tokens_per_s"], rel=1e-9)
    code, text, err = run("plan", "--spec", spec_file, "--tokens", "2e11", "--platforms", B200, "--nodes", "4,8",
                          "--samples", "0", "--emit", "megatron", "--db", recorded_db)
    assert code == 0, err
    assert "--num-experts 128" in text and "--train-samples" in text
    code, _, err = run("plan", "--spec", spec_file, "--tokens", "2e13", "--platforms", B200, "--nodes", "4,8",
                       "--samples", "0", "--max-days", "5", "--db", recorded_db)
    _one_line_error(code, err, "--tokens", "the deadline binds", "the most tokens within them")


@pytest.mark.recorded
def test_chosen_point_emits_the_search_outputs(run, run_json, recorded_db, tmp_path):
    spec = tmp_path / "plan.yaml"
    out = run_json("plan", "--target-loss", "1.45", "--platforms", B200, "--nodes", "4,8,16", "--samples", "0",
                   "--pick", "fastest", "--emit-spec", spec, "--db", recorded_db, *SMALL)
    c = out["chosen"]
    assert c == out["overall"]["fastest"] and c["nodes"] == 16
    est = run_json("estimate", spec, "--db", recorded_db)
    r = est[0]
    assert r["mfu"] == pytest.approx(c["plan"]["mfu"], rel=1e-9)
    assert json.loads(json.dumps(c))["plan"]["geometry"]["n_experts"] == c["plan"]["n_experts"]


@pytest.mark.recorded
def test_the_confidence_and_the_flags_in_text_json_and_html(run, run_json, runtime_fitted_db, tmp_path):
    """--confidence 0.9 on the recorded tables with the published B200 runs observed: the JSON says what it planned
    to, every point reaches the target in >= 90% of the draws, the cheapest carries where its plan lies beyond the
    runs and the law's data (its MFU drawn wider than the calibration's sigma); the table, the line under it and the
    HTML show the same; an unreachable target at 0.9 names the loss reachable in 90% of the draws."""
    import html as h

    db = runtime_fitted_db[0]
    page = tmp_path / "plan.html"
    args = ["plan", "--target-loss", "1.45", "--platforms", B200, "--nodes", "4,8,16", "--confidence", "0.9",
            "--samples", "100", "--db", db, *SMALL]
    out = run_json(*args, "--html", page)
    assert out["confidence"] == out["question"]["confidence"] == 0.9 and "90%" in out["planned_to"]
    pl = out["platforms"][0]
    assert all(p["p_reach"] >= 0.9 for p in pl["points"] if p.get("plan"))
    c = pl["cheapest"]
    assert c["plan"]["beyond"] and c["plan"]["perf_doublings"] > 0
    assert c["mfu_sigma"] > pl["evidence"]["mfu_error"]["sigma"] and pl["evidence"]["observed_runs"]["n"] == 24
    text = page.read_text()
    assert "a confidence of 90%" in text and all(h.escape(f) in text for f in c["plan"]["beyond"])
    code, shown, err = run(*args)
    assert code == 0, err
    assert "planned to a confidence of 90%" in shown and " beyond " in shown
    assert f"cheapest ({c['nodes']} nodes) lies beyond what was measured: {c['plan']['beyond'][0]}" in shown
    code, _, err = run("plan", "--target-loss", "1.0", *args[3:])
    _one_line_error(code, err, "the law's range binds", "in 90% of the draws")


@pytest.mark.recorded
def test_a_fixed_model_is_planned_on_its_spec_stack_or_on_stack(run_json, recorded_db, tmp_path):
    """plan --spec costs the spec's own stack block (as estimate does), --stack over it; the ladder's plans take
    --stack too. A stock HybridEP stack and the paper's stack plan the same model to different windows."""
    import yaml

    from .conftest import SPEC

    stock = {"permute_fusion": True, "router_fusion": True, "dispatcher": "hybridep"}
    with_stack, bare = tmp_path / "stack.yaml", tmp_path / "bare.yaml"
    with_stack.write_text(yaml.safe_dump({**SPEC, "stack": stock}))
    bare.write_text(yaml.safe_dump(SPEC))
    args = ["--tokens", "2e11", "--platforms", B200, "--nodes", "4", "--samples", "0", "--db", recorded_db]

    def days(spec, *more):
        return run_json("plan", "--spec", spec, *args, *more)["platforms"][0]["points"][0]["days"]

    on_stack = days(with_stack)
    assert on_stack == pytest.approx(days(bare, "--stack", ",".join(f"{k}={v}".lower() for k, v in stock.items())))
    assert on_stack != pytest.approx(days(bare), rel=1e-3)
