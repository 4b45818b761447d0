"""A table's flat per-call floor and the host time in it (estimator/floors.py), on synthetic tables whose
floor is known and on the recorded B200 FP8 / bf16 dense-GEMM rows (../shared, read at test time)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scaleplan.estimator.floors import FLOOR_TOL, detect_floor, device_times, host_floor


def _synthetic(host_s: float, rate: float, kernel_min_s: float):
    """Calls whose time is a host part plus the device's (never under its shortest kernel), over 8 decades."""
    work = np.logspace(3, 11, 200)
    dev = np.maximum(work / rate, kernel_min_s)
    return work, host_s + dev, dev


def test_a_flat_host_floor_is_found_and_taken_off_every_call():
    work, t, dev = _synthetic(host_s=150e-6, rate=1e15, kernel_min_s=5e-6)
    f = detect_floor(work, t)
    assert f is not None and f.t_s == pytest.approx(155e-6, rel=FLOOR_TOL)
    # above the floor the time follows the work: the floor's points end where the work shows
    assert f.work_max < 1e15 * 155e-6 * (1 + FLOOR_TOL)
    h = host_floor(f, 5e-6)
    assert h == pytest.approx(150e-6, rel=0.05)
    got = device_times(t, h, 5e-6)
    np.testing.assert_allclose(got, dev, rtol=0.06, atol=1e-6)


def test_a_table_without_a_floor_or_with_the_devices_own_has_no_host_time():
    work = np.logspace(3, 11, 200)
    assert detect_floor(work, work / 1e15) is None  # every point follows its work
    _, t, _ = _synthetic(host_s=0.0, rate=1e15, kernel_min_s=5e-6)
    f = detect_floor(work, t)
    assert f is not None and host_floor(f, 5e-6) == 0.0  # the floor is the device's shortest kernel
    np.testing.assert_array_equal(device_times(t, 0.0, 5e-6), t)


@pytest.fixture(scope="module")
def b200_gemm(recorded_dir):
    d = pd.read_parquet(recorded_dir / "gemm_util.parquet").reset_index()
    d = d[(d["GPU_MODEL"] == "B200") & (d["status"] == "OK")]
    p = d.pivot_table(index=["M", "N", "K"], columns="dtype", values="time_ms_med").dropna(subset=["bf16", "fp8"])
    p = p.reset_index()
    p["work"] = 2.0 * p["M"] * p["N"] * p["K"]
    p[["bf16", "fp8"]] *= 1e-3
    return p


def test_the_recorded_fp8_floor_is_host_time_and_bf16_keeps_its_own(b200_gemm):
    p = b200_gemm
    f8, f16 = detect_floor(p["work"], p["fp8"]), detect_floor(p["work"], p["bf16"])
    assert f8 is not None and f16 is not None
    assert 0.15e-3 < f8.t_s < 0.17e-3 and f8.decades > 4 and f8.n_points > 1000
    # the bf16 floor is the device's ordinary call: no host time above itself; FP8's is 10x above it
    assert host_floor(f16, f16.t_s) == 0.0
    h = host_floor(f8, f16.t_s)
    assert h == pytest.approx(f8.t_s - f16.t_s) and h > 0.13e-3
    dev = device_times(p["fp8"].to_numpy(), h, f16.t_s)
    at = p.set_index(["M", "N", "K"]).index.get_loc((2048, 512, 2048))
    # the example: 156 us measured, the device's own shortest call left (bf16 takes 19 us there)
    assert p["fp8"].iloc[at] > 0.15e-3 and dev[at] <= p["bf16"].iloc[at]
    # where the floor is noise against the work, the device time is the measured time
    big = p["fp8"].to_numpy() > 20e-3
    np.testing.assert_allclose(dev[big], p["fp8"].to_numpy()[big], rtol=0.01)


def test_recorded_fp8_device_time_is_between_half_and_all_of_bf16_where_compute_bound(b200_gemm):
    """The physics the separation must give back: on B200 the FP8 lane is twice the bf16 lane (datasheet),
    so a compute-bound FP8 GEMM takes at least half the bf16 time, and with its quantize kernels less than
    all of it."""
    p = b200_gemm
    f8, f16 = detect_floor(p["work"], p["fp8"]), detect_floor(p["work"], p["bf16"])
    dev = device_times(p["fp8"].to_numpy(), host_floor(f8, f16.t_s), f16.t_s)
    # compute-bound: square-ish shapes, every dimension >= 2048, bf16 above 0.2 ms
    cb = (p[["M", "N", "K"]].min(axis=1) >= 2048).to_numpy() & (p["bf16"].to_numpy() > 0.2e-3)
    ratio = dev[cb] / p["bf16"].to_numpy()[cb]
    raw = p["fp8"].to_numpy()[cb] / p["bf16"].to_numpy()[cb]
    assert cb.sum() > 50
    assert 0.5 <= np.median(ratio) < 1.0 and np.median(raw) > np.median(ratio)


def test_a_tables_rows_lose_their_host_floor_per_dtype(recorded_dir):
    from scaleplan.estimator.floors import gemm_host_floors, without_host_floor

    d = pd.read_parquet(recorded_dir / "gemm_util.parquet").reset_index()
    d = d[(d["GPU_MODEL"] == "B200") & (d["status"] == "OK") & d["dtype"].isin(["bf16", "fp8"])]
    df = pd.DataFrame({"m": d["M"], "n": d["N"], "k": d["K"], "dtype": d["dtype"], "t_s": d["time_ms_med"] * 1e-3})
    hosts = gemm_host_floors(df)
    assert hosts["bf16"][0] == 0.0 and hosts["fp8"][0] > 0.13e-3
    assert hosts["fp8"][1] == hosts["bf16"][1]  # the device's shortest call is bf16's floor
    out = without_host_floor(df, hosts)
    f8 = out["dtype"] == "fp8"
    np.testing.assert_array_equal(out.loc[~f8, "t_s"], df.loc[~f8, "t_s"])  # bf16 untouched
    # every FP8 row lost at most its host floor and kept at least the device's shortest call
    took = out.loc[f8, "host_floor_s"].to_numpy()
    assert np.all(took <= hosts["fp8"][0] + 1e-12) and np.all(out.loc[f8, "t_s"] >= hosts["bf16"][1] - 1e-12)
    np.testing.assert_allclose(out.loc[f8, "t_s"] + took, df.loc[f8, "t_s"])
