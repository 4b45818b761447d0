"""FP8 from what it costs on the device, inside an evaluation: grouped expert GEMMs composed from the bf16 grouped
table and the dense tables' FP8 / bf16 device-time ratio (estimator/fp8_costs.py), and no table's per-call host
floor charged as device time (estimator/floors.py), on synthetic tables (exact) and the recorded B200 rows."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scaleplan.estimator import Estimator
from scaleplan.estimator.compute import expert_times
from scaleplan.estimator.kernels import layer_kernels
from scaleplan.estimator.layout import ParallelLayout
from scaleplan.estimator.model_dims import geometry
from scaleplan.estimator.tables import COMPOSED

from scaleplan.specs import Layout, parse_spec

from .conftest import context, frame, grouped_frame, moe_spec

C = 1e-13            # seconds per (m n k) of the synthetic bf16 GEMMs
HOST_S = 150e-6      # the synthetic FP8 table's per-call host floor
SMALL_S = 5e-6       # the device's shortest call, both dtypes


def _gemm_frame():
    ax = [2 ** i for i in range(6, 17)]
    rows = []
    for m in ax:
        for n in ax:
            for k in ax:
                rows.append(dict(m=m, n=n, k=k, dtype="bf16", t_s=max(C * m * n * k, SMALL_S)))
                # FP8 at twice bf16's rate on the device, every call HOST_S longer on the host: Transformer
                # Engine's rows, as the recorded B200 table's (their times hold the inputs' casts)
                rows.append(dict(m=m, n=n, k=k, dtype="fp8", t_s=max(C * m * n * k / 2, SMALL_S) + HOST_S,
                                 backend="te_mxfp8"))
    return frame(rows)


def _fp8(spec=None):
    return geometry(parse_spec(moe_spec(model={"precision": "fp8"}, **(spec or {}))).model)


def test_fp8_experts_are_the_bf16_grouped_times_at_the_dense_device_ratio():
    law = lambda ng, tpe: 1e-7 * ng * tpe  # noqa: E731
    est = Estimator.from_frames("p6-b200.48xlarge", {"gemm": _gemm_frame(),
                                                     "grouped_gemm": grouped_frame(2048, 1280, law)})
    assert est.tables.gemm_host_floor_s["fp8"] == pytest.approx(HOST_S, rel=0.02)
    ctx = context(est, _fp8(), ParallelLayout.of(ep=np.array([8, 8])), E_loc=[16.0, 32.0], tile=[1024.0, 2048.0])
    f, b = expert_times(ctx)
    # every expert GEMM is above both floors: the device ratio is exactly 1/2, the host floor left out
    want = np.array([law(16, 1024), law(32, 2048)])
    assert np.allclose(f, 0.5 * want, rtol=1e-6) and np.allclose(b, 0.5 * 2 * want, rtol=1e-6)
    assert (ctx.rec.src["experts"] == COMPOSED).all()
    assert any("bf16 grouped table x the dense FP8 / bf16 device-time ratio" in m for m in ctx.rec.notes)
    # a bf16 model reads the grouped table as it is
    bf = context(est, geometry(parse_spec(moe_spec()).model), ParallelLayout.of(ep=np.array([8])), E_loc=[16.0],
                 tile=[1024.0])
    assert expert_times(bf)[0][0] == pytest.approx(law(16, 1024))


def _log_interp(pivot: pd.Series, m: float, n: float, k: float) -> float:
    """Time at (m, n, k) from the recorded power-of-two grid, log-linear along each axis off the grid."""
    corners = []
    for x in (m, n, k):
        lo = 2.0 ** math.floor(math.log2(x))
        w = math.log2(x / lo)
        corners.append([(lo, 1.0 - w)] + ([(2 * lo, w)] if w > 0 else []))
    out = 0.0
    for a, wa in corners[0]:
        for b_, wb in corners[1]:
            for c, wc in corners[2]:
                out += wa * wb * wc * math.log(pivot.loc[(int(a), int(b_), int(c))])
    return math.exp(out)


def test_recorded_fp8_experts_within_20pct_of_the_bf16_grouped_rows_at_the_dense_device_ratio(recorded_dir,
                                                                                              recorded_db):
    d = pd.read_parquet(recorded_dir / "gemm_util.parquet").reset_index()
    d = d[(d["GPU_MODEL"] == "B200") & (d["status"] == "OK")]
    p = d.pivot_table(index=["M", "N", "K"], columns="dtype", values="time_ms_med").dropna(subset=["bf16", "fp8"])
    tiny = p[(p.index.get_level_values(0) <= 256) & (p.index.get_level_values(1) <= 256)
             & (p.index.get_level_values(2) <= 256)]
    host = (tiny["fp8"].median() - tiny["bf16"].median()) * 1e-3  # the FP8 rows' per-call host time
    grp = pd.read_parquet(recorded_dir / "gemm_grouped_b200.parquet")
    grp = grp[(grp["distribution"] == "balanced") & (grp["num_gemms"] == 16) & (grp["tokens_per_expert"] == 1024)
              & (grp["hidden"] == 2048) & (grp["ffn"] == 1280) & (grp["status"] == "OK")]
    bf16_f, bf16_b = grp["fwd_ms"].sum() * 1e-3, grp["bwd_ms"].sum() * 1e-3
    t, dm, ff = 1024.0, 2048.0, 1280.0
    fwd = [(t, 2 * ff, dm), (t, dm, ff)]
    bwd = [s for m, n, k in fwd for s in ((m, k, n), (k, n, m))]

    def ratio(shapes):
        t8 = sum(_log_interp(p["fp8"], *s) * 1e-3 - host for s in shapes)
        return t8 / sum(_log_interp(p["bf16"], *s) * 1e-3 for s in shapes)

    est = Estimator("p6-b200.48xlarge", db_url=recorded_db, use_calibration=False)
    ctx = context(est, _fp8(), ParallelLayout.of(ep=np.array([8])), E_loc=[16.0], tile=[1024.0])
    f, b = expert_times(ctx)
    assert f[0] == pytest.approx(bf16_f * ratio(fwd), rel=0.2)
    assert b[0] == pytest.approx(bf16_b * ratio(bwd), rel=0.2)
    # the FP8 floor charged per local expert would be 16 x 2 x 0.146 ms in the forward alone
    assert f[0] < 16 * 2 * host


def test_no_component_charges_the_recorded_fp8_host_floor(recorded_db):
    """The recorded FP8 dense rows hold ~0.146 ms of host time per call: an FP8 plan's GEMM components are
    then no dearer than its bf16 twin's (the FP8 device time is at most bf16's plus its quantize), where charging
    the floor made its experts 16 floors per projection."""
    est = Estimator("p6-b200.48xlarge", db_url=recorded_db, use_calibration=False)
    assert 0.13e-3 < est.tables.gemm_host_floor_s["fp8"] < 0.16e-3
    assert est.tables.gemm_host_floor_s["bf16"] == 0.0
    lay = [Layout(pp=2, ep=8)]
    r16 = est.estimate(parse_spec(moe_spec(optimizer={"optimizer_type": "adamw"})), 32, lay)[0]
    r8 = est.estimate(parse_spec(moe_spec(model={"precision": "fp8"}, optimizer={"optimizer_type": "adamw"})),
                      32, lay)[0]
    for comp in ("attn_proj", "experts", "shared_expert", "dense_mlp", "vocab"):
        assert r8.breakdown_s[comp] <= 1.05 * r16.breakdown_s[comp] + 1e-9, comp
    # activations and their exchanges stay bf16 under FP8 GEMMs (the exposed all-to-all grows: the FP8 shared
    # expert it overlaps is shorter)
    for comp in ("permute", "pp_p2p"):
        assert r8.breakdown_s[comp] == pytest.approx(r16.breakdown_s[comp]), comp
    k16, k8 = (layer_kernels(context(est, g, ParallelLayout.of(ep=np.array([8]))))
               for g in (geometry(parse_spec(moe_spec()).model), _fp8()))
    assert k8.a2a_f[0] == pytest.approx(k16.a2a_f[0]) and k8.perm[0] == pytest.approx(k16.perm[0])


def test_fp8_cast_times_are_the_bytes_of_each_cast_at_hbm_bandwidth_or_its_kernels_floor():
    """compute.fp8_cast_times by hand: per-tensor current scaling reads the bf16 input twice (amax, then cast:
    4 bytes an element) and writes two E4M3 copies (2 bytes); MXFP8 reads it once (2), writes two copies (2)
    and one E8M0 scale per 32 elements of each (2 / 32). Forward casts the input [m, k], backward the output
    gradient [m, n]; each cast at least its kernels (3 for tensorwise: amax, scale, cast; 1 for MXFP8) x the
    shortest kernel. None for a table that holds its casts, a GEMM TE does not cast, or a bf16 model."""
    from types import SimpleNamespace

    from scaleplan.estimator.compute import fp8_cast_times

    notes = []

    def ctx(recipe, holds=False, t_min=5e-6):
        return SimpleNamespace(recipe=recipe, hbm=4.8e12, rec=SimpleNamespace(note=lambda *a: notes.append(a)),
                               tables=SimpleNamespace(gemm=SimpleNamespace(holds_casts=holds), t_kernel_min_s=t_min))

    m, n, k = np.array([8192.0, 16.0]), np.array([3072.0, 16.0]), np.array([4096.0, 16.0])
    f, b = fp8_cast_times(ctx("tensorwise"), "attn_proj", m, n, k)
    assert f[0] == pytest.approx(8192 * 4096 * 6 / 4.8e12) and b[0] == pytest.approx(8192 * 3072 * 6 / 4.8e12)
    assert f[1] == b[1] == pytest.approx(3 * 5e-6)
    f, b = fp8_cast_times(ctx("mxfp8"), "experts", m, n, k)
    assert f[0] == pytest.approx(8192 * 4096 * (2 + 2 + 2 / 32) / 4.8e12) and f[1] == pytest.approx(5e-6)
    assert notes and "experts in fp8" in notes[-1][0]
    for c, comp in ((ctx("tensorwise", holds=True), "attn_proj"), (ctx("tensorwise"), "router"),
                    (ctx(None), "attn_proj")):
        assert fp8_cast_times(c, comp, m, n, k) == (0.0, 0.0)
