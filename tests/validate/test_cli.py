"""`scaleplan validate` end to end on CPU: JSON keys, a stored ObservedRun, DP over 2 gloo processes, refusals."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import inproc
import pytest
from pace import budget

SPECS = Path(__file__).resolve().parents[1] / "data" / "validate_specs"
TINY = SPECS / "tiny.yaml"
KEYS = {"layout", "measured_t_iter_s", "predicted_t_iter_s", "measured_mfu", "predicted_mfu",
        "measured_peak_mem_gb", "predicted_mem_gb", "observation_id"}
EXTRA_KEYS = {"predicted_mem_allocated_gb", "predicted_mem_reserved_gb", "predicted_mem_device_gb",
              "predicted_mem_breakdown_gb", "measured_mem_reserved_gb", "estimator_mem_gb", "load", "warnings"}


def _cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from scaleplan.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=budget(timeout), check=False)


def _observed(url: str):
    from sqlalchemy import select

    from scaleplan.db.models import ObservedRun
    from scaleplan.db.session import session_scope

    with session_scope(url) as s:
        return list(s.scalars(select(ObservedRun).order_by(ObservedRun.id)))


@pytest.mark.parametrize("nproc", [1, 2])
def test_validate_json_and_observed_run(sqlite_url, nproc):
    p = _cli("--json", "validate", str(TINY), "--steps", "2", "--warmup", "1", "--nproc", str(nproc),
             "--layout", "mbs=1,ckpt=selective", "--db", sqlite_url)
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)  # stdout is one JSON document
    assert len(rows) == 1 and KEYS <= set(rows[0]) and EXTRA_KEYS <= set(rows[0])
    r = rows[0]
    # memory: the reference runner's peak allocated; no caching allocator on a CPU, so reserved = allocated
    assert r["predicted_mem_gb"] == r["predicted_mem_allocated_gb"] == r["predicted_mem_reserved_gb"] > 0
    assert r["measured_mem_reserved_gb"] is None and r["allocator_overhead"]["fraction"] == 0.0
    load = r["load"]  # the timed steps' machine load, and a warning exactly when the rule says loaded
    assert load["wall_s"] > 0 and load["own_cpu_s"] > 0 and load["world_size"] == nproc
    assert (load["warning"] is not None) == load["loaded"] and r["warnings"] == ([load["warning"]] if load["loaded"] else [])
    assert r["layout"]["dp"] == nproc and r["layout"]["ckpt"] == "selective"
    assert r["measured_t_iter_s"] > 0 and 0 < r["measured_mfu"] < 1
    assert r["measured_peak_mem_gb"] > 0
    obs = _observed(sqlite_url)
    assert [o.id for o in obs] == [r["observation_id"]]
    o = obs[0]
    assert o.source == "validate" and o.profile == "cpu-local" and o.n_devices == nproc and o.dp == nproc
    assert o.measured_t_iter_s == pytest.approx(r["measured_t_iter_s"])
    # gbs = 4 sequences over dp * mbs: gradient-accumulation micro-batches per step
    assert o.extra["n_mb"] == 4 // nproc
    assert len(o.extra["step_times_s"]) == 2 and o.extra["provenance"]["torch_version"]
    assert o.extra["provenance"]["backend"] == ("gloo" if nproc == 2 else "none")
    # after the steps every rank holds the same weights and LFLB biases (gradients were all-reduced)
    assert o.extra["dp_replicas_in_sync"] is True
    assert o.extra["load"]["wall_s"] == pytest.approx(load["wall_s"])


# the refusals come before any worker starts: they run in-process (tests/inproc.py)
def test_refuses_model_parallel_layouts_with_one_line(sqlite_url):
    p = inproc.cli("validate", str(TINY), "--layout", "ep=2", "--db", sqlite_url)
    assert p.returncode == 2
    assert "ep" in p.stderr and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not _observed(sqlite_url)


@pytest.mark.parametrize("field,value", [("dropout", "true"), ("sdpa_precision", "fp8"), ("qk_norm", "true"),
                                         ("sliding_window", "{size: 8}"), ("mtp_layers", "1")])
def test_refuses_what_the_reference_model_cannot_run(sqlite_url, tmp_path, field, value):
    spec = tmp_path / "spec.yaml"
    spec.write_text(TINY.read_text().replace("  precision: fp32\n", f"  precision: fp32\n  {field}: {value}\n", 1)
                    .replace("  sdpa_precision: fp32\n", "" if field == "sdpa_precision" else "  sdpa_precision: fp32\n"))
    p = inproc.cli("validate", str(spec), "--db", sqlite_url)
    assert p.returncode == 2, p.stderr
    assert f"model.{field}" in p.stderr and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not _observed(sqlite_url)


def test_refuses_gbs_not_divisible_by_dp_mbs(sqlite_url):
    p = inproc.cli("validate", str(TINY), "--layout", "mbs=3", "--db", sqlite_url)
    assert p.returncode == 2 and "dp*mbs must divide gbs" in p.stderr and "Traceback" not in p.stderr


def test_cuda_without_gpu_is_a_one_line_error(sqlite_url):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    p = inproc.cli("validate", str(TINY), "--device", "cuda", "--db", sqlite_url)
    assert p.returncode == 2 and "--device" in p.stderr and "Traceback" not in p.stderr


def test_help_does_not_import_torch():
    code = "import sys; from scaleplan.cli import app; print('torch' in sys.modules)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=budget(60), check=False)
    assert p.stdout.strip() == "False", p.stderr


def test_mfu_is_eq_mfu_with_n_act():
    from scaleplan.specs import load_spec
    from scaleplan.validate.compare import mfu

    spec = load_spec(TINY)
    m = spec.model
    # by hand: attention 2*64*64 + 2*64*32 + 64*4 + 2*64 = 12672 per block; dense SwiGLU 3*64*160;
    # MoE active: (K + shared) * 3*64*40 + router 8*64; final norm 64; no embedding or head (eq:mfu's
    # N = N_act, as the estimator's predicted mfu)
    attn = 2 * 64 * 64 + 2 * 64 * 32 + 64 * 4 + 2 * 64
    n_act = 3 * attn + 3 * 64 * 160 + 2 * (3 * 3 * 64 * 40 + 8 * 64) + 64
    flops = 6 * n_act * spec.data.gbs * spec.data.seqlen
    assert mfu(spec, 0.5, 2, 1e9) == pytest.approx(flops / (0.5 * 2 * 1e9))
    assert m.moe.n_experts == 8


@pytest.mark.parametrize("nproc", [1, 2])
def test_bench_then_predict_on_the_same_machine(sqlite_url, nproc):
    """README step 5: `validate --bench` measures exactly the points the prediction looks up (one of
    each for one layout), so the prediction exists and reads measured tables, not analytic fallbacks.
    With 2 processes the collectives' torchrun ranks open the database too: the run it reports is stored."""
    from scaleplan.db.session import get_engine

    get_engine(sqlite_url).dispose()  # the command is the only process holding the database, as a user's is
    p = _cli("--json", "validate", str(TINY), "--steps", "2", "--warmup", "1", "--bench", "--nproc", str(nproc),
             "--db", sqlite_url)
    assert p.returncode == 0, p.stderr
    (r,) = json.loads(p.stdout)
    assert r["predicted_t_iter_s"] and r["predicted_t_iter_s"] > 0 and r["predicted_mfu"] > 0
    (o,) = _observed(sqlite_url)
    assert o.id == r["observation_id"] and o.n_devices == nproc
    src = o.extra["predicted_sources"]
    for comp in ("attn_proj", "sdpa", "experts", "router", "vocab", "dispatch_floor"):
        assert src[comp] in ("measured", "interpolated"), (comp, src[comp])


def test_trace_saves_a_perfetto_trace_and_components(sqlite_url, tmp_path):
    p = _cli("--json", "validate", str(TINY), "--steps", "1", "--warmup", "1", "--trace", str(tmp_path / "tr"),
             "--no-store", "--db", sqlite_url)
    assert p.returncode == 0, p.stderr
    comp = json.loads(p.stdout)[0]["components"]
    trace = Path(comp["trace_path"])
    assert trace.parent == tmp_path / "tr" / "dp1_mbs1_none" and trace.name.endswith(".pt.trace.json")
    assert json.loads(trace.read_text())["traceEvents"]  # Chrome trace format (Perfetto, TensorBoard)
    from scaleplan.validate.trace import COMPONENTS

    rows = {r["component"]: r for r in comp["rows"]}
    assert list(rows) == list(COMPONENTS)
    assert sum(r["measured_s"] for r in rows.values()) == pytest.approx(comp["step_wall_s"], rel=1e-6)
    assert rows["expert GEMMs"]["measured_s"] > 0 and rows["attention"]["measured_s"] > 0
