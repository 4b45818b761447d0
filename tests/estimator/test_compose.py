"""--extrapolate compose: each table kind's rule checked against points it never saw.

The recorded B200 tables are cut below their top and the hidden points composed from the rest
(estimator/holdout.py). Tolerances: a factor-2 step beyond the edge, against run-to-run noise of
~14% between identical layouts (validation README); clamping (the old fallback) errs by about the
work ratio itself (~50% for a factor 2), so each bound also requires composition to beat clamping
by a wide margin.
"""
import numpy as np
import pytest
from scaleplan.estimator import holdout
from scaleplan.estimator.tables import GridTable, load_frames

PEAK = 2.25e15
# table -> bound on the hold-out MAPE (fraction)
BOUNDS = {"gemm": 0.10, "sdpa": 0.20, "grouped_gemm": 0.25, "collectives": 0.30}


@pytest.fixture(scope="module")
def frames(recorded_db):
    return load_frames(recorded_db, "p6-b200.48xlarge")


@pytest.mark.parametrize("table", sorted(BOUNDS))
def test_composed_values_match_hidden_measurements(frames, table):
    h = {x.table: x for x in holdout.all_holdouts(frames, PEAK)}[table]
    assert h.n >= 20, h
    assert h.mape <= BOUNDS[table], h


def test_constant_throughput_rule_is_exact_for_a_saturated_kernel():
    # a GEMM table measured at a constant 1 PFLOP/s: composing m beyond the grid must keep that rate
    m = np.array([64.0, 128.0, 256.0])
    grid = [m, np.array([1024.0]), np.array([1024.0])]
    t = 2 * m * 1024 * 1024 / 1e15
    tab = GridTable("gemm", ("m", "n", "k"), grid, t.reshape(3, 1, 1))
    res = tab.lookup(1024.0, 1024.0, 1024.0)
    assert res.oor_axis == 0
    assert float(res.t_composed) == pytest.approx(2 * 1024 ** 3 / 1e15, rel=1e-9)
    assert float(res.t) == pytest.approx(t[-1], rel=1e-9)  # the clamped value is the edge time


def test_grouped_trend_rule_follows_the_last_measured_slope():
    # t ~ tokens^0.5 on the last interval: composed at 4x the edge is 2x the edge time
    tpe = np.array([1024.0, 2048.0])
    tab = GridTable("grouped_gemm[1024x256]", ("num_gemms", "tokens_per_expert"),
                    [np.array([4.0, 8.0]), tpe], np.array([[1.0, np.sqrt(2.0)], [2.0, 2 * np.sqrt(2.0)]]) * 1e-4)
    res = tab.lookup(4.0, 8192.0)
    assert float(res.t_composed) == pytest.approx(np.sqrt(2.0) * 1e-4 * 2.0, rel=1e-9)


def test_below_the_range_keeps_the_floor():
    tab = GridTable("sdpa", ("seq_len", "micro_bs", "n_q_heads", "head_dim"),
                    [np.array([1024.0, 2048.0]), np.array([1.0]), np.array([8.0]), np.array([128.0])],
                    np.array([1e-4, 4e-4]).reshape(2, 1, 1, 1))
    assert float(tab.lookup(512.0, 1.0, 8.0, 128.0).t_composed) == pytest.approx(1e-4)
    assert float(tab.lookup(4096.0, 1.0, 8.0, 128.0).t_composed) == pytest.approx(16e-4)  # quadratic
