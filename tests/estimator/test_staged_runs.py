"""The paper's four staged training runs (tab:staged-top4) on the recorded B200 tables.

These are the only measured MFU figures of ladder geometries (the ones MOSAIC searches) that the
paper publishes, as ratios to the best of the four. Compared as the table gives them: each geometry
at its fastest checkpointing that fits under the planner's memory rule (--mem-fraction 0.95), our
MFU in the FLOP count the runs logged (6 N tokens, N every active parameter), normalised by the
best. Asserted, uncalibrated (every EP group inside a node and pp < GPUs/node, so eq:desync is 1):
the order of the four runs is the measured one, and the normalised MAPE over IDs 1-3 is within 5%
(4.4% today: ID 1 without recompute, 0.86 against 0.84 measured, under the planner's rule and the paper's
reference search's rule, 0.9 of HBM, alike; at selective recompute it would be 0.84; docs/accuracy.md
"Memory of the staged run"; benchmarks/estimator_accuracy.py prints the three rules and the paper's own 19.7%).
"""
import numpy as np
import pytest
from paper_tables import STAGED_LAYOUT, STAGED_RUNS
from scaleplan.estimator import Estimator, PlanConstraints
from scipy.stats import spearmanr

from scaleplan.geometry import ladder_model
from scaleplan.units import MEM_FRACTION


def staged_plan(est: Estimator, q: int, E: int, K: int, G: int, mem_fraction: float, modes=None):
    """Fastest plan over the checkpointing modes at the staged layout within ``mem_fraction`` of HBM."""
    lay = STAGED_LAYOUT
    extra = {"ckpt": modes} if modes else {}
    fixed = PlanConstraints(**{k: (lay[k],) for k in ("tp", "cp", "pp", "ep", "mbs")}, mem_fraction=mem_fraction,
                            **extra)
    r = est.best_plan(ladder_model(q, E, K, G), lay["n_devices"], lay["gbs"], lay["seqlen"], "adamw", fixed)
    assert r is not None, (q, E, K, G)
    return r


@pytest.fixture(scope="module")
def est(recorded_db):
    return Estimator("p6-b200.48xlarge", db_url=recorded_db, use_calibration=False)


def test_staged_runs_ordered_and_normalised_as_measured(est):
    plans = [staged_plan(est, q, E, K, G, MEM_FRACTION) for q, E, K, G, _, _ in STAGED_RUNS]
    pred = np.array([r.mfu_validation for r in plans])
    measured = np.array([r[5] for r in STAGED_RUNS])
    assert np.all((pred > 0.05) & (pred < 0.5)), pred
    assert spearmanr(pred, measured).statistic == 1.0, pred
    keep = measured < 1  # ID 4 is 1 on both sides by construction
    mape = float(np.mean(np.abs(pred[keep] / pred.max() - measured[keep]) / measured[keep]))
    assert mape <= 0.05, (mape, pred)


def test_id1_fits_without_recompute_under_both_rules(est):
    """ID 1 (250 B total parameters) with its blocks saving what Megatron-Core with Transformer Engine saves:
    MoE blocks as Megatron-Core's (the fused weighted SwiGLU keeps its input and the probabilities, no product),
    attention keeping contiguous q, k, v and no QKV GEMM output, the loss's transient copy in bf16 (2 bytes per
    logit beside its fp32 softmax). No recompute needs ~158 of 179 GB: within the reference search's 0.9 of HBM
    (161 GB) as within the planner's 0.95, where it needed ~162 GB and took selective under the 0.9 rule before
    the attention and the loss were counted so. All four fit without recompute under either rule."""
    hbm_gb = est.profile.hbm_bytes / 1e9
    q, E, K, G = STAGED_RUNS[0][:4]
    none = staged_plan(est, q, E, K, G, 10.0, ("none",))
    assert none.mem_per_device_gb <= 0.9 * hbm_gb
    for frac, modes in ((MEM_FRACTION, None), (0.9, ("none", "selective", "full"))):
        got = [staged_plan(est, *r[:4], frac, modes).layout["ckpt"] for r in STAGED_RUNS]
        assert got == ["none"] * 4, (frac, got)
