"""scaleplan's own GPU tables (cluster_profiles/recorded, measured on one NVIDIA H200 and on one NVIDIA H100;
its README has the provenance and commands): they import with their provenance, a lookup at a measured
point returns the measurement, and the estimator, reading only these tables, predicts the reference MoE's
step time and peak memory measured on the same GPU (cluster_profiles/observed/<profile>-validate.csv: five
`validate` sweeps of four layouts on three or more H200s, two on one H100); a traced step's device time is counted
once (<profile>-trace.csv); the tables agree with the paper's own tables of the same GPU model; the
composition rules meet the points measured above the single-gpu range; the sync:<every> rows hold the cost
of a device synchronisation. Runs on a CPU: nothing here needs the GPU."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scaleplan.estimator import Estimator
from scaleplan.estimator.tables import COMPOSED
from sqlalchemy import select

from scaleplan.db import models as m
from scaleplan.db import session as dbs
from scaleplan.db.recorded import default_recorded_dir, import_recorded_dir
from scaleplan.specs import load_spec, parse_layout

REPO = Path(__file__).resolve().parents[2]
OBSERVED = REPO / "cluster_profiles" / "observed"
SPEC = REPO / "tests" / "data" / "validate_specs" / "gpu_small.yaml"
# profile -> (GPU name, validate rows in its observed CSV)
GPUS = {"h200-single": ("NVIDIA H200", 20), "h100-single": ("NVIDIA H100 80GB HBM3", 8)}


def _recorded(suite: str, profile: str) -> pd.DataFrame:
    df = pd.read_csv(default_recorded_dir() / f"{suite}.csv")
    return df[df["profile"] == profile]


@pytest.fixture(scope="module")
def gpu_db(tmp_path_factory) -> tuple[str, list]:
    url = f"sqlite:///{tmp_path_factory.mktemp('gpu') / 'gpu.db'}"
    dbs.upgrade(url)
    with dbs.session_scope(url) as s:
        res = import_recorded_dir(s, default_recorded_dir())
    return url, res


def observed(profile: str) -> pd.DataFrame:
    """Per layout (mbs, ckpt): the median over the profile's sweeps of the measured step time and peaks."""
    df = pd.read_csv(OBSERVED / f"{profile}-validate.csv")
    gpu, n_rows = GPUS[profile]
    assert set(df["gpu_name"]) == {gpu} and set(df["profile"]) == {profile} and len(df) == n_rows
    return df.groupby(["mbs", "ckpt"])[["measured_t_iter_s", "peak_mem_gb", "peak_reserved_gb"]].median()


def test_own_tables_import_with_their_provenance(gpu_db):
    url, res = gpu_db
    suites = {r.suite for r in res}
    assert suites == {"gemm", "grouped_gemm", "sdpa", "router", "elementwise", "vocab", "dispatch", "allocator"}
    for r in res:  # every row of a file is a point (a key measured twice keeps its first row)
        csv = pd.read_csv(default_recorded_dir() / r.file)
        keys = [c for c in csv.columns if c in _key_columns(r.suite)] + ["profile"]
        assert r.inserted == len(csv.drop_duplicates(keys)), r.file
        assert set(csv["status"]) == {"OK"} and set(csv["profile"]) == set(GPUS)
    with dbs.session_scope(url) as s:
        for profile, (gpu, _) in GPUS.items():
            runs = s.scalars(select(m.BenchRun).where(m.BenchRun.profile == profile)).all()
            assert len(runs) == 8  # one imported run per suite file and profile
            assert {(r.gpu_name, r.driver_version, r.cuda_version, r.torch_version) for r in runs} == {
                (gpu, "580.159.04", "13.0", "2.11.0+cu130")}
            assert all(r.git_rev and len(r.git_rev) == 40 for r in runs)


def _key_columns(suite: str) -> tuple[str, ...]:
    from scaleplan.bench.suites import get_suite

    return get_suite(suite).KEY


@pytest.mark.parametrize("profile", GPUS)
def test_a_lookup_at_a_measured_gemm_point_is_the_measurement(gpu_db, profile):
    url, _ = gpu_db
    csv = _recorded("gemm", profile)
    once = csv[(csv["dtype"] == "bf16") & ~csv.duplicated(["m", "n", "k", "dtype"], keep=False)].iloc[::17]
    tab = Estimator(profile, url).tables.gemm
    got = tab.lookup(once["m"].to_numpy(float), once["n"].to_numpy(float), once["k"].to_numpy(float))
    assert (got.code == 0).all()  # measured, not interpolated
    assert np.allclose(got.t, once["t_s"].to_numpy(), rtol=1e-9)


def test_the_h200s_fp8_gemm_rows_are_what_an_fp8_model_reads(gpu_db):
    """The H200's dense FP8 GEMMs (torch._scaled_mm, per-tensor scales; `bench run --preset single-gpu-fp8`):
    a lookup at a measured point is the FP8 measurement; an FP8 model's GEMMs on h200-single read them, not the
    bf16 rows x 0.5 of a profile without FP8 rows, so no lane note; and each FP8 row's eager wall per call
    (its note) is within 10% of its device time wherever that exceeds 50 us: no host floor in them."""
    url, _ = gpu_db
    csv = _recorded("gemm", "h200-single")
    f8 = csv[csv["dtype"] == "fp8"]
    assert len(f8) == 96 and set(f8["backend"]) == {"torch_scaled_mm"}
    got = Estimator("h200-single", url).tables.view("fp8", 1.0).gemm.lookup(
        f8["m"].to_numpy(float), f8["n"].to_numpy(float), f8["k"].to_numpy(float))
    assert (got.code == 0).all() and np.allclose(got.t, f8["t_s"].to_numpy(), rtol=1e-9)
    wall = f8["note"].str.extract(r"wall_per_call_s=([0-9.e+-]+)", expand=False).astype(float)
    long = f8["t_s"] > 5e-5
    assert long.sum() >= 40 and np.all(np.abs(wall[long] / f8["t_s"][long] - 1) <= 0.10)
    sp = load_spec(SPEC)
    sp = sp.model_copy(update={"model": sp.model.model_copy(update={"precision": "fp8"})})
    lay = [parse_layout("mbs=1,ckpt=none", sp.default_layout()).model_copy(update={"dp": 1})]
    r = Estimator("h200-single", url, stack="reference").estimate(sp, 1, lay)[0]
    assert r.sources["attn_proj"] in ("measured", "interpolated")
    assert not any(w.startswith("gemm in fp8") for w in r.warnings), r.warnings


def test_the_h100s_fp8_gemms_are_its_bf16_rows_times_the_h200s_fp8_to_bf16_ratio(gpu_db):
    """No FP8 GEMM of the H100 is measured; the H200 is on its die (GH100: same SMs, clocks and lanes) and
    measured both dtypes at 96 shapes. An FP8 model on h100-single reads, at a shape all three row sets hold,
    the H100's bf16 row x the H200's FP8 row / its bf16 row (computed here from the CSV rows), labelled composed;
    beyond the H200's shapes the ratio at its nearest one; not the flat bf16 / FP8 peak (0.5)."""
    url, _ = gpu_db
    keys = ["m", "n", "k"]
    h100, h200 = _recorded("gemm", "h100-single"), _recorded("gemm", "h200-single")
    rows = [d[d["dtype"] == dt].drop_duplicates(keys, keep=False)[keys + ["t_s"]]
            for d, dt in ((h100, "bf16"), (h200, "bf16"), (h200, "fp8"))]
    both = rows[0].merge(rows[1], on=keys, suffixes=("", "_b16")).merge(rows[2], on=keys, suffixes=("", "_f8"))
    assert len(both) >= 40
    tables = Estimator("h100-single", url).tables
    assert not tables.lane_scaled("fp8", 0.5)
    tab = tables.view("fp8", 0.5).gemm
    got = tab.lookup(*(both[a].to_numpy(float) for a in keys))
    want = both["t_s"] * both["t_s_f8"] / both["t_s_b16"]
    assert np.allclose(got.t, want.to_numpy(), rtol=1e-9) and (got.code == COMPOSED).all()
    ratio = (both["t_s_f8"] / both["t_s_b16"]).to_numpy()
    assert np.median(ratio) > 0.55 and ratio.max() < 0.95  # the H200's measured ratio, not the lanes' 0.5
    # an H100 shape wider than any the H200 measured: its ratio at the H200's widest (n, k 8192)
    big = rows[0][(rows[0]["m"] == 4096) & (rows[0]["n"] == 16384) & (rows[0]["k"] == 16384)]
    edge = [r[(r["m"] == 4096) & (r["n"] == 8192) & (r["k"] == 8192)]["t_s"].iloc[0] for r in rows[1:]]
    assert len(big) == 1
    assert tab.lookup(4096.0, 16384.0, 16384.0).t[()] == pytest.approx(big["t_s"].iloc[0] * edge[1] / edge[0],
                                                                        rel=1e-9)
    sp = load_spec(SPEC)
    sp = sp.model_copy(update={"model": sp.model.model_copy(update={"precision": "fp8"})})
    lay = [parse_layout("mbs=1,ckpt=none", sp.default_layout()).model_copy(update={"dp": 1})]
    r = Estimator("h100-single", url, stack="reference").estimate(sp, 1, lay)[0]
    assert r.sources["attn_proj"] == "composed"
    assert any(w.startswith("gemm in fp8: gemm[fp8 = bf16 x the FP8/bf16 ratio of h200-single]") for w in r.warnings)


def _fp8_grouped_vs_composed(url: str, impl: str = "torch_scaled_grouped_mm") -> pd.DataFrame:
    """Per FP8 point of observed/h200-single-fp8-grouped.csv of ``impl`` (torch._scaled_grouped_mm, or one
    torch._scaled_mm per expert, on an H200; bf16 torch._grouped_mm at the same points): its GEMMs alone (the
    note: activations cast outside the timed call) over the composed rule's time, the bf16 grouped time x the
    dense FP8 / bf16 device-time ratio of the same GEMMs read from the H200's shipped dense tables
    (fp8_costs.composed_projection). Columns fwd, bwd."""
    from scaleplan.estimator import fp8_costs

    tabs = Estimator("h200-single", url).tables
    f8, b16 = tabs.view("fp8", 1.0).gemm, tabs.gemm
    obs = pd.read_csv(OBSERVED / "h200-single-fp8-grouped.csv")
    key = ["proj", "distribution", "num_gemms", "tokens_per_expert", "hidden", "ffn"]
    fp8 = obs[(obs["dtype"] == "fp8") & (obs["impl"] == impl)]
    pairs = fp8.merge(obs[obs["dtype"] == "bf16"], on=key, suffixes=("", "_bf16"))
    assert len(pairs) == 108
    gemm = pairs["note"].str.extract(r"gemm_fwd_s=([0-9.e+-]+); gemm_bwd_s=([0-9.e+-]+)").astype(float)
    fwd, bwd = fp8_costs.composed_projection(f8, b16, *(pairs[c].to_numpy(float) for c in (
        "tokens_per_expert", "out_features", "in_features", "fwd_s_bf16", "bwd_s_bf16")))
    return pd.DataFrame({"fwd": gemm[0].to_numpy() / fwd, "bwd": gemm[1].to_numpy() / bwd})


_MISS = pytest.mark.xfail(strict=True, reason="known miss (docs/accuracy.md): on the H200 this FP8 expert "
                         "implementation runs over 20% (median) slower than the dense FP8 / bf16 ratio says")


@pytest.mark.parametrize("impl, direction", [
    ("torch_scaled_grouped_mm", "fwd"), pytest.param("torch_scaled_grouped_mm", "bwd", marks=_MISS),
    pytest.param("torch_scaled_mm", "fwd", marks=_MISS), ("torch_scaled_mm", "bwd")])
def test_the_composed_fp8_experts_against_the_h200s_fp8_expert_gemms(gpu_db, impl, direction):
    """The composed rule (an FP8 grouped GEMM = the bf16 grouped time x the dense FP8 / bf16 ratio) against the
    H200's FP8 expert GEMMs alone, two implementations (no Transformer Engine on the device): median within 20%
    and at least a third of the 108 points within 20%. Seen (median, share within 20%): the grouped kernel
    forward 1.07, 69%, backward 1.21, 44%; one cuBLAS FP8 GEMM per expert forward 1.27, 38%, backward 1.10, 56%.
    The misses are strict xfails: when the rule or the kernels close them, they fail and their marks go."""
    err = _fp8_grouped_vs_composed(gpu_db[0], impl)[direction]
    assert abs(err.median() - 1) <= 0.20 and ((err - 1).abs() <= 0.20).mean() >= 1 / 3, err.describe()


def _step_errors(url: str, profile: str) -> dict[tuple[int, str], float]:
    """Predicted / measured - 1 of the step time per layout (mbs, ckpt), the estimator reading the profile's
    own tables; every GEMM, attention, expert and host-dispatch term read from them, not the fallback."""
    obs = observed(profile)
    sp = load_spec(SPEC)
    lays = [parse_layout(f"mbs={mbs},ckpt={ck}", sp.default_layout()).model_copy(update={"dp": 1})
            for mbs, ck in obs.index]
    res = Estimator(profile, url, stack="reference").estimate(sp, 1, lays)
    errs = {}
    for r, (key, row) in zip(res, obs.iterrows()):
        assert (r.layout["mbs"], r.layout["ckpt"]) == key
        for comp in ("attn_proj", "sdpa", "experts", "router", "dense_mlp", "dispatch_floor"):
            assert r.sources[comp] in ("measured", "interpolated"), (key, comp, r.sources[comp])
        errs[key] = r.t_iter_s / row["measured_t_iter_s"] - 1.0
    return errs


HOST_BOUND = [(1, "none"), (2, "none"), (2, "full")]


@pytest.mark.parametrize("profile", GPUS)
def test_estimate_from_own_tables_predicts_the_host_bound_steps(gpu_db, profile):
    """The three host-bound layouts (8 or 16 micro-batches: the host issues ~2800 kernels per micro-batch,
    longer than the GPU runs them) within 20% each and 15% on average, on both GPUs (seen: H200 -0.6%,
    -11.3%, -15.8% against the median of five sweeps on several machines, whose hosts differ by up to 1.7x;
    H100 -16.7%, -12.2%, -10.3% against the median of its two sweeps, which differ by 18% at mbs=1)."""
    errs = _step_errors(gpu_db[0], profile)
    e = np.array([errs[k] for k in HOST_BOUND])
    assert np.abs(e).max() <= 0.20, errs
    assert np.abs(e).mean() <= 0.15, errs


@pytest.mark.xfail(strict=True, reason="known miss (docs/accuracy.md): the reference model's "
                   "uncosted element-wise and permute kernels, ~2/3 of its device time in the traces")
@pytest.mark.parametrize("profile", GPUS)
def test_estimate_from_own_tables_predicts_the_device_bound_step(gpu_db, profile):
    """mbs=4 (4 micro-batches): the GPU sets the pace (measured 0.255 s on the H200 and 0.275 s on the H100,
    about the device time of a traced mbs=2 step). Predicted 19% and 34% short: the traces put 0.17-0.19 s
    of device time per step in element-wise, router and permute kernels that the model costs at 0.03-0.04 s.
    When that is fixed this test passes, strict xfail fails, and the marker goes."""
    err = _step_errors(gpu_db[0], profile)[(4, "none")]
    assert abs(err) <= 0.15, err


@pytest.mark.parametrize("profile", GPUS)
def test_reference_memory_from_own_allocator_rows_matches_the_measured_peaks(gpu_db, profile):
    """Peak allocated within 12% of torch.cuda.max_memory_allocated and reserved within 15% of
    max_memory_reserved, with the allocator overhead measured on the same GPU (not the 10% default)."""
    from scaleplan.validate.memory import measured_allocator_overhead, predict_reference_memory

    url, _ = gpu_db
    sp = load_spec(SPEC)
    overhead = measured_allocator_overhead(url, GPUS[profile][0])
    assert overhead is not None and 0.0 < overhead[0] < 0.10 and overhead[2].startswith("measured")
    for (mbs, ck), row in observed(profile).iterrows():
        lay = parse_layout(f"mbs={mbs},ckpt={ck}", sp.default_layout()).model_copy(update={"dp": 1})
        pred = predict_reference_memory(sp, lay, "cuda", overhead)
        assert pred["allocated_gb"] == pytest.approx(row["peak_mem_gb"], rel=0.12), (mbs, ck)
        assert pred["reserved_gb"] == pytest.approx(row["peak_reserved_gb"], rel=0.15), (mbs, ck)


@pytest.mark.recorded
def test_h200_tables_agree_with_the_papers_h200_tables(recorded_db):
    """The same kernels on the same GPU model, measured by the paper's authors (../shared, profile
    p5en.48xlarge: sdpa_h200 backend pt, topk_h200): torch's flash SDPA and top-k at the shapes both
    measured agree within 10% in the median (seen: SDPA 0.95 forward and backward over 32 shapes,
    top-k 0.99 over 27) and within 30% at every shape (short sequences and tiny top-k are
    launch-bound)."""
    import sqlite3

    con = sqlite3.connect(recorded_db.split("///", 1)[1])
    paper = pd.read_sql("select p.* from sdpa_point p join bench_run r on r.id = p.run_id where r.profile = "
                        "'p5en.48xlarge' and r.source_file like 'sdpa_h200%' and p.backend = 'pt' and "
                        "p.status = 'OK' and p.causal = 1", con)
    ours = _recorded("sdpa", "h200-single")
    j = ours[ours["backend"] == "flash"].merge(
        paper, on=["seq_len", "micro_bs", "n_q_heads", "n_kv_heads", "head_dim"], suffixes=("", "_paper"))
    assert len(j) >= 30
    for col in ("fwd_s", "bwd_s"):
        r = j[col] / j[f"{col}_paper"]
        assert abs(r.median() - 1) <= 0.10 and r.between(0.7, 1.3).all(), (col, r.describe())
    topk = pd.read_sql("select p.* from router_point p join bench_run r on r.id = p.run_id where r.profile = "
                       "'p5en.48xlarge' and p.status = 'OK'", con)
    ours = _recorded("router", "h200-single")
    j = ours.merge(topk, on=["variant", "num_tokens", "num_experts", "k", "dtype"], suffixes=("", "_paper"))
    r = j["fwd_s"] / j["fwd_s_paper"]
    assert len(j) >= 20 and abs(r.median() - 1) <= 0.10 and r.between(0.6, 1.4).all(), r.describe()


@pytest.mark.recorded
def test_h100_gemm_table_agrees_with_the_papers_h100_gemms(recorded_dir):
    """The same bf16 GEMMs on the same GPU model, measured by the paper's authors (gemm_util.parquet, GPU_MODEL
    H100): where their time is at least 0.5 ms, ours agree within 5% in the median and 25% at every shape
    (seen: 0.98 over 54 shapes, 0.77 to 1.23). Below that their times carry a fixed ~0.1 ms more than the
    kernel (0.035 ms for a 1024^3 GEMM that runs in 9 us by CUDA events): host timing, not the kernel."""
    paper = pd.read_parquet(recorded_dir / "gemm_util.parquet").reset_index()
    paper = paper[(paper["GPU_MODEL"] == "H100") & (paper["dtype"] == "bf16") & (paper["status"] == "OK")]
    ours = _recorded("gemm", "h100-single")
    j = ours[ours["dtype"] == "bf16"].merge(paper, left_on=["m", "n", "k"], right_on=["M", "N", "K"])
    j = j[j["time_ms_med"] >= 0.5]
    r = j["t_s"] / (j["time_ms_med"] * 1e-3)
    assert len(j) >= 40 and abs(r.median() - 1) <= 0.05 and r.between(0.75, 1.25).all(), r.describe()


@pytest.mark.parametrize("profile", GPUS)
def test_a_traced_step_counts_each_kernel_once(profile):
    """validate --trace on each GPU (mbs=2, no checkpointing): the device time attributed to the components
    equals the device time the saved trace itself holds (kernels + memcpy + memset, read from the file), not
    twice it (the double counting fixed in e6482b4 / dd834b3); one launch per kernel; the components sum to
    the traced step's wall time (host gaps/idle is the rest). Seen: 22347 kernels, 0.2589 s of device work,
    0.2591 s attributed, of a 1.053 s traced step on the H200; 22347, 0.2864 s, 0.2866 s, 0.609 s on the H100
    (and at mbs=4: 11295, 0.2408 s, 0.2410 s, 0.373 s)."""
    df = pd.read_csv(OBSERVED / f"{profile}-trace.csv")
    assert set(df["gpu_name"]) == {GPUS[profile][0]}
    for _, g in df.groupby(["mbs", "ckpt"]):
        one = g.iloc[0]
        assert one["kernels_per_step"] > 1000 and one["kernels_per_step"] == one["launches_per_step"]
        assert one["attributed_device_s"] == pytest.approx(one["trace_device_s"], rel=0.01)
        assert one["trace_busy_s"] <= one["trace_device_s"] * (1 + 1e-9)
        assert g["measured_s"].sum() == pytest.approx(one["traced_step_wall_s"], rel=1e-6)
        host = g.loc[g["component"] == "host gaps/idle", "measured_s"].item()
        assert host == pytest.approx(one["traced_step_wall_s"] - one["attributed_device_s"], rel=1e-6)


@pytest.mark.parametrize("profile", GPUS)
def test_sync_rows_hold_the_cost_of_a_device_synchronisation(profile):
    """dispatch sync:<every> on each GPU (bench/suites/dispatch.py): a torch.cuda.synchronize() in a stream of
    2048-wide GEMMs. When the device sets the pace (m=8192: 89 us kernels, 21 us to issue one on the H200's
    host, 12 us on the H100's) a sync exposes the next launch and the wake-up, about the same per sync
    whether it comes every kernel or every 4th (seen 34.8 and 37.3 us on the H200, 16.8 and 25.1 us on the
    H100); a host-bound stream (m=8) exposes less (14 us, 9 us), the launch being paid either way.
    Every row's note carries (wall - active) * every."""
    import re

    df = _recorded("dispatch", profile)
    sync = df[df["mode"].str.startswith("sync:")].copy()
    sync["every"] = sync["mode"].str.split(":").str[1].astype(int)
    assert sorted(set(zip(sync["every"], sync["m"]))) == [(e, m) for e in (1, 4, 16, 64) for m in (8, 512, 2048, 8192)]
    sync["exposed"] = (sync["wall_per_kernel_s"] - sync["active_per_kernel_s"]) * sync["every"]
    noted = sync["note"].map(lambda n: float(re.search(r"exposed_per_sync_s=([0-9.e+-]+)", n).group(1)))
    assert np.allclose(noted, sync["exposed"], rtol=2e-3)
    cost = sync.set_index(["m", "every"])["exposed"]
    assert 10e-6 < cost[(8192, 1)] < 100e-6 and cost[(8192, 4)] == pytest.approx(cost[(8192, 1)], rel=0.6)
    assert cost[(8, 1)] < cost[(8192, 1)]
    assert sync.loc[sync["m"] == 8192, "note"].str.endswith("(host ahead)").all()
    assert sync.loc[sync["m"] == 8, "note"].str.endswith("(host-bound)").all()


@pytest.mark.parametrize("profile", GPUS)
def test_composition_meets_the_points_measured_above_the_single_gpu_range(gpu_db, profile):
    """Grouped GEMM measured at 4096 and 8192 tokens per expert and SDPA at 32k tokens (preset
    single-gpu-holdout), hidden and composed from the rest (estimator/holdout.py). The bounds are looser than
    the recorded B200's 10%: the grouped rule takes the fastest throughput of any shape, while each shape's
    own throughput is flat from 2048 tokens on (figures: docs/accuracy.md, own-GPU composition)."""
    from scaleplan.estimator import holdout

    from scaleplan.db.measurements import load_frames
    from scaleplan.profiles import load_profile

    url, _ = gpu_db
    frames = load_frames(url, profile)
    peak = load_profile(profile).peak("bf16")
    g = holdout.grouped(frames, peak, cut=2048)
    assert g.n == 216 and g.mape <= 0.15, g
    a = holdout.sdpa(frames, peak, cut=8192)
    assert a.n == 24 and a.mape <= 0.12, a


def test_the_h100_trace_ops_hold_each_component_and_the_index_kernels_run_far_below_bandwidth():
    """validate --trace's per-op table (components.ops) of the H100's mbs=2 and mbs=4 steps: per layout the
    ops' seconds add up to the component totals of the same traced step (h100-single-trace.csv), and the
    unpermute (index_add of the T K routed rows [T K, d] into [T, d], once per MoE layer and micro-batch:
    7 MoE layers x n_mb calls) moves its bytes at a small fraction of HBM bandwidth (seen: 0.37 TB/s, 11% of
    3.35 TB/s, at both widths). So a byte count at bandwidth cannot cost the reference model's index kernels
    (docs/accuracy.md, "Known misses"): they need a measured rate per op."""
    from scaleplan.profiles import load_profile

    ops = pd.read_csv(OBSERVED / "h100-single-trace-ops.csv")
    comp = pd.read_csv(OBSERVED / "h100-single-trace.csv")
    sp = load_spec(SPEC)
    d, K = sp.model.hidden_sz, sp.model.moe.experts_per_token
    n_moe = sp.model.n_layers - sp.model.moe.first_dense_layers
    hbm = load_profile("h100-single").hbm_bandwidth
    for mbs, g in ops.groupby("mbs"):
        c = comp[comp["mbs"] == mbs].set_index("component")["measured_s"]
        for name, t in g.groupby("component")["seconds_per_step"].sum().items():
            assert t == pytest.approx(c[name], rel=1e-6), (mbs, name)
        ia = g[g["op"] == "aten::index_add"].squeeze()
        n_mb = sp.data.gbs // mbs  # one GPU: dp = 1
        assert ia["calls_per_step"] == n_moe * n_mb
        T = mbs * sp.data.seqlen
        bytes_per_call = (T * K * d + 2 * T * d) * 2  # read the routed rows, read-modify-write the output (bf16)
        rate = bytes_per_call * ia["calls_per_step"] / ia["seconds_per_step"]
        assert rate < 0.25 * hbm, (mbs, rate)
