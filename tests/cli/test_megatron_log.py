"""`scaleplan calibrate add --megatron-log FILE...` reads a Megatron-LM training log as Megatron-LM prints it.

Fixtures: tests/data/megatron/5p4b_tp4_pp2_ep8.log (its header says where each part comes from: the argument block is
Megatron-LM core_v0.19.0's own _print_args output) and logs written here with Megatron-LM's format strings:
``_print_args`` (megatron/training/arguments.py: ``'  {} {} {}'.format(arg, '.' * (48 - len(arg)), value)``, sorted
case-insensitively, between ``---- arguments ----`` and ``---- end of arguments ----`` lines), ``training_log``
(megatron/training/training.py: ``' iteration {:8d}/{:8d} |'``, ``' elapsed time per iteration (ms): {:.1f} |'``,
``' number of skipped iterations: {:3d} |'``, ...) and ``report_memory`` (megatron/training/utils).
"""
from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest
import yaml

from . import mlm
from .conftest import SMALL_SEARCH

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "megatron" / "5p4b_tp4_pp2_ep8.log"


def _dump(ns: dict) -> str:
    """_print_args' block of a namespace."""
    rows = ["  {} {} {}".format(k, "." * (48 - len(k)), v) for k, v in ns.items()]
    return ("------------------------ arguments ------------------------\n"
            + "\n".join(sorted(rows, key=lambda x: x.lower()))
            + "\n-------------------- end of arguments ---------------------\n")


def _iterations(times_s: list[float], gbs: int, skipped: dict[int, int] | None = None) -> str:
    out = []
    for it, t in enumerate(times_s, 1):
        s = f" iteration {it:8d}/{len(times_s):8d} |"
        s += f" consumed samples: {it * gbs:12d} |"
        s += f" elapsed time per iteration (ms): {t * 1000.0:.1f} |"
        s += f" learning rate: {1e-4:.6E} |"
        s += f" global batch size: {gbs:5d} |"
        s += f" lm loss: {10.0:.6E} |"
        s += f" loss scale: {1.0:.1f} |"
        s += f" number of skipped iterations: {(skipped or {}).get(it, 0):3d} |"
        s += f" number of nan iterations: {0:3d} |"
        out.append(s)
    return "\n".join(out) + "\n"


def _log_of(emitted: str, world: int, times_s: list[float]) -> str:
    """A log of the run `--emit megatron` describes: argparse's namespace under the flag table, the values
    validate_args derives that the dump shows (world_size, data_parallel_size, virtual pipeline size)."""
    ns, _ = mlm.parse(mlm.argv(emitted))
    mlm.validate(ns, world)
    ns.setdefault("virtual_pipeline_model_parallel_size", None)
    ns.update(world_size=world, rank=0, data_parallel_size=world // (
        ns["tensor_model_parallel_size"] * ns["pipeline_model_parallel_size"] * ns["context_parallel_size"]))
    return "startup text Megatron-LM prints before the arguments\n" + _dump(ns) + _iterations(times_s,
                                                                                                ns["global_batch_size"])


def _stored(db: str) -> list[dict]:
    from sqlalchemy import select

    from scaleplan.db import models as m
    from scaleplan.db import session as dbs

    dbs.ensure_schema(db)
    with dbs.session_scope(db) as s:
        return [{c: getattr(r, c) for c in ("source", "sweep", "spec", "n_devices", "tp", "cp", "pp", "dp", "ep",
                                            "etp", "vpp", "mbs", "ckpt", "measured_t_iter_s",
                                            "measured_peak_mem_gb", "extra")}
                for r in s.scalars(select(m.ObservedRun))]


def _fixture_numbers() -> tuple[list[tuple[int, float, int]], float]:
    """(iteration, step s, skipped) of the fixture's iteration lines and its largest 'max reserved' (MiB), read
    with plain string splits."""
    rows, mem = [], 0.0
    for ln in FIXTURE.read_text().splitlines():
        if " iteration " in ln and "elapsed time per iteration (ms):" in ln:
            it = int(ln.split(" iteration ")[1].split("/")[0])
            ms = float(ln.split("elapsed time per iteration (ms):")[1].split("|")[0])
            sk = int(ln.split("number of skipped iterations:")[1].split("|")[0])
            rows.append((it, ms / 1000, sk))
        if "max reserved:" in ln:
            mem = max(mem, float(ln.split("max reserved:")[1].split("|")[0]))
    return rows, mem


def test_fixture_log_is_one_observed_run(run, sqlite_url, validation_dir):
    code, out, err = run("calibrate", "add", "--megatron-log", FIXTURE, "--db", sqlite_url, "--json")
    assert code == 0, err
    [r] = _stored(sqlite_url)
    rows, mem_mib = _fixture_numbers()
    kept = [t for it, t, sk in rows if it > 10 and not sk]
    assert len(kept) == 19  # iterations 11-30 but the skipped 17
    assert r["measured_t_iter_s"] == pytest.approx(statistics.median(kept), rel=1e-12)
    assert r["measured_peak_mem_gb"] == pytest.approx(mem_mib * 2**20 / 1e9, rel=1e-9)
    assert (r["n_devices"], r["tp"], r["cp"], r["pp"], r["dp"], r["ep"], r["vpp"], r["mbs"], r["ckpt"]) == \
        (64, 4, 1, 2, 8, 8, 1, 1, "selective")
    # the spec is the 5.4B validation model the arguments were emitted for
    want = yaml.safe_load((validation_dir / "models.yaml").read_text())["moe-5p4b"]["model"]
    got = r["spec"]["model"]
    assert {k: got[k] for k in want if k != "moe"} == {k: v for k, v in want.items() if k != "moe"}
    assert {k: got["moe"][k] for k in want["moe"]} == want["moe"]
    assert got["moe"]["first_dense_layers"] == 1 and r["spec"]["optimizer"]["optimizer_type"] == "muon"
    prov = r["extra"]["megatron_log"]
    import hashlib

    assert prov["sha256"] == hashlib.sha256(FIXTURE.read_bytes()).hexdigest() and prov["file"] == FIXTURE.name
    assert prov["iterations"] == [11, 30] and prov["step_s_min"] == min(kept) and prov["step_s_max"] == max(kept)
    assert r["source"] == f"megatron-log:{FIXTURE.name}"
    doc = json.loads(out)
    assert doc["inserted"] == 1 and doc["runs"][0]["tflops_per_gpu"] > 0


def test_round_trip_search_emit_log_calibrate(recorded_db, run, tmp_path):
    """search --emit megatron -> a log of that run -> calibrate add --megatron-log -> the same spec and layout."""
    spec_path = tmp_path / "opt.yaml"
    code, emitted, err = run(*SMALL_SEARCH, "--db", recorded_db, "--emit", "megatron", "--emit-spec", spec_path)
    assert code == 0, err
    log = tmp_path / "run.log"
    log.write_text(_log_of(emitted, 32, [9.0, 7.0] + [5.0 + 0.01 * i for i in range(20)]))
    db = f"sqlite:///{tmp_path / 'obs.db'}"
    code, _, err = run("calibrate", "add", "--megatron-log", log, "--db", db)
    assert code == 0, err
    [r] = _stored(db)
    from scaleplan.specs import load_spec, parse_spec

    planned, got = load_spec(spec_path), parse_spec(r["spec"])
    # the paper's head-wise gate has no Megatron-LM flag: the run has no gate, and the log says so
    assert planned.model.attn_gate is True and got.model.attn_gate is False
    assert got.model.model_copy(update={"attn_gate": True}) == planned.model
    assert got.default_layout() == planned.default_layout() and got.data == planned.data
    assert r["measured_t_iter_s"] == pytest.approx(statistics.median([5.0 + 0.01 * i for i in range(8, 20)]))


def _truncations() -> dict[str, str]:
    text = FIXTURE.read_text()
    cut = text.index("  num_layers ")
    first_iter = text.index(" [2026-08-20")  # the first iteration line
    return {"cut inside the argument dump": text[:cut],
            "no argument dump": text[first_iter:],
            "no iteration after warm-up": text[:text.index(" iteration        9/")],
            "garbled iteration line": text.replace("elapsed time per iteration (ms): ", "elapsed time per iteration "
                                                   "(ms): x", 1),
            # an iteration line after warm-up whose '|' separators are lost must not be skipped (that gave exit 0,
            # one interval fewer, another median)
            "iteration line without separators": _unseparated(text)}


def _unseparated(text: str) -> str:
    at = text.index(" iteration       20/")
    end = text.index("\n", at)
    return text[:at] + text[at:end].replace("|", " ") + text[end:]


@pytest.mark.parametrize("what", list(_truncations()))
def test_bad_log_is_one_line_and_stores_nothing(run, sqlite_url, tmp_path, what):
    bad = tmp_path / "bad.log"
    bad.write_text(_truncations()[what])
    # the good fixture first on the command line: nothing of it is stored either
    code, _, err = run("calibrate", "add", "--megatron-log", FIXTURE, "--megatron-log", bad, "--db", sqlite_url)
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: bad.log")
    assert _stored(sqlite_url) == []
    if what == "iteration line without separators":  # the error names the line it could not read
        n = 1 + _truncations()[what][:_truncations()[what].index(" iteration       20/")].count("\n")
        assert err.startswith(f"error: bad.log: line {n}:"), err


def test_fp8_run_keeps_attention_in_bf16(run, sqlite_url, tmp_path):
    """Megatron-LM has no command-line flag for FP8 attention (core_v0.19.0's arguments.py leaves
    fp8_dot_product_attention out of the TransformerConfig arguments), so an --fp8 run's attention is bf16."""
    fp8 = tmp_path / "fp8.log"
    fp8.write_text(FIXTURE.read_text().replace("  fp8 ............................................. None",
                                               "  fp8 ............................................. hybrid", 1))
    code, _, err = run("calibrate", "add", "--megatron-log", fp8, "--db", sqlite_url)
    assert code == 0, err
    [r] = _stored(sqlite_url)
    assert (r["spec"]["model"]["precision"], r["spec"]["model"]["sdpa_precision"]) == ("fp8", "bf16")


def test_runs_file_or_log_not_both(run, sqlite_url):
    code, _, err = run("calibrate", "add", "--db", sqlite_url)
    assert code == 2 and "--megatron-log" in err


def test_moe_layer_pattern_back_to_spec_fields():
    from scaleplan.megatron.args import moe_layer_pattern
    from scaleplan.megatron.log import _pattern_shape

    for L, first, freq in ((16, 1, 1), (24, 3, 2), (10, 0, 3), (7, 6, 1)):
        assert _pattern_shape(moe_layer_pattern(L, first, freq), "x") == (first, freq)
    with pytest.raises(Exception, match="moe_layer_freq"):
        _pattern_shape([0, 1, 0, 1, 1, 1], "x")


def test_log_line_regexes_take_megatron_formats():
    """The per-iteration line as Megatron-LM formats it (with and without its timestamp) parses field by field."""
    from scaleplan.megatron.log import parse_iterations

    line = _iterations([1.2345], 256, {1: 1}).strip()
    [iv] = parse_iterations([line, " [2026-08-20 12:00:00.000000]" + line], "x")[:1]
    assert iv.iteration == 1 and iv.step_s == pytest.approx(1.2345, abs=1e-4) and iv.bad
    assert re.search(r"iteration\s+1/\s+1 \|", line)


def test_calibrate_fit_uses_the_logged_runs(recorded_db, run, tmp_path):
    """The run read from the fixture log is what `calibrate fit --sweep` fits: one observation, and its step-time
    error before the fit is the estimator's own for the stored spec and layout."""
    import shutil

    db_file = tmp_path / "rec.db"
    shutil.copy(recorded_db.removeprefix("sqlite:///"), db_file)
    db = f"sqlite:///{db_file}"
    code, _, err = run("calibrate", "add", "--megatron-log", FIXTURE, "--db", db)
    assert code == 0, err
    [r] = _stored(db)
    spec_path = tmp_path / "logged.yaml"
    spec_path.write_text(yaml.safe_dump(r["spec"]))
    code, out, err = run("estimate", spec_path, "--db", db, "--calibration", "none", "--json")
    assert code == 0, err
    t_est = json.loads(out)[0]["t_iter_s"]
    code, out, err = run("calibrate", "fit", "--sweep", FIXTURE.stem, "--db", db, "--json")
    assert code == 0, err
    fit = json.loads(out)
    assert fit["n_obs"] == 1
    assert fit["step_time_mape"]["before"] == pytest.approx(abs(t_est - r["measured_t_iter_s"])
                                                            / r["measured_t_iter_s"], rel=1e-6)


def test_a_stack_round_trips_through_emit_and_log(run, tmp_path, validation_dir):
    """A spec's training stack -> `estimate --emit megatron` -> a log of that run -> `calibrate add --megatron-log`
    -> the same stack: the calibration fitted on that run carries its stack."""
    from scaleplan.specs import parse_spec

    doc = yaml.safe_load((validation_dir / "models.yaml").read_text())["moe-5p4b"]
    doc = {**doc, "model": {**doc["model"], "precision": "fp8"}, "data": {**doc["data"], "gbs": 256},
           "stack": {"fp8_recipe": "mxfp8", "permute_fusion": True, "router_fusion": True, "dispatcher": "hybridep",
                     "cuda_graphs": ["attn", "moe_router", "moe_preprocess"], "fp8_param": True,
                     "grads_fp32": False, "nan_check": False, "router_dtype": "model"}}
    emitted, r = _emit_and_read_back(run, tmp_path, doc)
    assert "--moe-router-dtype" not in emitted  # unset: the probabilities in the activations' dtype
    for flag in ("--fp8-recipe mxfp8", "--moe-permute-fusion", "--moe-router-fusion",
                 "--moe-token-dispatcher-type flex", "--moe-flex-dispatcher-backend hybridep",
                 "--cuda-graph-impl transformer_engine", "--cuda-graph-modules attn moe_router moe_preprocess",
                 "--fp8-param-gather", "--grad-reduce-in-bf16", "--no-check-for-nan-in-loss-and-grad"):
        assert flag in emitted, flag
    planned = parse_spec(doc)
    assert parse_spec(r["spec"]).stack == planned.stack
    assert parse_spec(r["spec"]).stack.key("fp8") == planned.stack.key("fp8") != "megatron"


def test_a_captured_step_round_trips_through_emit_and_log(run, tmp_path, validation_dir):
    """cuda_graphs full_iteration: emitted as --cuda-graph-impl full_iteration without modules (Megatron-LM refuses
    them beside it), read back from the run's log as the same stack."""
    from scaleplan.specs import parse_spec

    doc = yaml.safe_load((validation_dir / "models.yaml").read_text())["moe-5p4b"]
    doc = {**doc, "data": {**doc["data"], "gbs": 256},
           "stack": {"cuda_graphs": ["full_iteration"], "nan_check": False, "dispatcher": "hybridep"}}
    emitted, r = _emit_and_read_back(run, tmp_path, doc)
    assert "--cuda-graph-impl full_iteration" in emitted and "--cuda-graph-modules" not in emitted
    assert "full-iteration CUDA graph: the step must read no token count on the host" in emitted  # a comment line
    ns, _ = mlm.parse(mlm.argv(emitted))  # the flags against Megatron-LM's flag table of the targeted version
    assert ns["cuda_graph_impl"] == "full_iteration" and ns["check_for_nan_in_loss_and_grad"] is False
    assert ns["moe_flex_dispatcher_backend"] == "hybridep"
    assert parse_spec(r["spec"]).stack == parse_spec(doc).stack


def test_recompute_modules_the_loss_and_the_shared_expert_round_trip(run, tmp_path, validation_dir):
    """A stack naming its own --recompute-modules (selective = core_attn and moe_act), TE's cross-entropy and the
    shared expert not overlapped: emitted as Megatron-LM's flags, read back from the run's log as the same stack."""
    from scaleplan.specs import parse_spec

    doc = yaml.safe_load((validation_dir / "models.yaml").read_text())["moe-5p4b"]
    doc = {**doc, "data": {**doc["data"], "gbs": 256},
           "stack": {"recompute_modules": ["core_attn", "moe_act"], "cross_entropy": "te",
                     "shared_expert_overlap": False}}
    emitted, r = _emit_and_read_back(run, tmp_path, doc)
    assert "--recompute-modules core_attn moe_act" in emitted and "--cross-entropy-fusion-impl te" in emitted
    assert "--moe-shared-expert-overlap" not in emitted
    assert r["ckpt"] == "selective"
    got, want = parse_spec(r["spec"]).stack, parse_spec(doc).stack
    assert got.model_dump() == want.model_dump()


def _emit_and_read_back(run, tmp_path, doc: dict, layout: str = "tp=1,pp=2,ep=8,ckpt=selective") -> tuple[str, dict]:
    """``doc`` (a spec) -> `estimate --emit megatron` at ``layout`` (default TP 1 PP 2 EP 8 selective) on 64 GPUs ->
    a log of that run -> `calibrate add --megatron-log`: (the emitted arguments, the one stored run)."""
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(doc))
    code, emitted, err = run("estimate", spec_path, "--devices", "64", "--layout", layout, "--emit", "megatron")
    assert code == 0, err
    log = tmp_path / "run.log"
    log.write_text(_log_of(emitted, 64, [5.0] * 14))
    db = f"sqlite:///{tmp_path / 'obs.db'}"
    code, _, err = run("calibrate", "add", "--megatron-log", log, "--db", db)
    assert code == 0, err
    [r] = _stored(db)
    return emitted, r
