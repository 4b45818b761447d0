"""estimator/optimizer.py: one description per optimizer (state, step bytes and FLOPs, DP collectives,
sharded or replicated), checked by hand."""
import math

import numpy as np
import pytest
from scaleplan.estimator.model_dims import geometry
from scaleplan.estimator.layout import ParallelLayout
from scaleplan.estimator.optimizer import dp_collectives, optimizer, slowest_step, step_time
from scaleplan.estimator.params import stage_params

from scaleplan.errors import SpecError
from scaleplan.specs import parse_spec

from .conftest import moe_spec

HBM, PEAK = 8e12, 2.25e15


def test_state_and_collectives_of_each_optimizer():
    adam, muon, sgd = optimizer("adam"), optimizer("muon"), optimizer("sgd")
    assert (adam.state_bytes, adam.moment_bytes, adam.step_bytes) == (12.0, 8.0, 30.0)  # master + m + v
    assert (muon.state_bytes, muon.moment_bytes) == (8.0, 4.0)                         # master + momentum
    assert dp_collectives("adam") == (("reduce_scatter", 4), ("all_gather", 2))  # ZeRO-1, fp32 grads
    assert dp_collectives("muon") == (("all_reduce", 4), ("all_gather", 2))      # layer-wise owners
    assert dp_collectives("sgd") == (("all_reduce", 4),)                          # plain DDP
    assert not sgd.sharded and adam.sharded and muon.orthogonalises and not adam.orthogonalises
    with pytest.raises(SpecError, match="optimizer"):
        optimizer("lion")


def _setup():
    g = geometry(parse_spec(moe_spec()).model)
    lay = ParallelLayout.of(tp=1, pp=1, dp=8, ep=8, etp=1)  # EDP = 1: each rank owns its experts' state
    return g, lay, stage_params(g, lay, 0)


def test_adam_step_reads_its_dp_shard_through_hbm():
    g, lay, p = _setup()
    want = 30.0 * (p.dense[0] / 8 + p.experts[0] / 1) / HBM
    assert float(step_time(optimizer("adam"), g, lay, p, PEAK, HBM)[0]) == pytest.approx(want)
    # replicated (sgd): the whole stage on every rank, 18 bytes per parameter
    want = 18.0 * (p.dense[0] + p.experts[0]) / HBM
    assert float(step_time(optimizer("sgd"), g, lay, p, PEAK, HBM)[0]) == pytest.approx(want)


def test_muon_adds_the_newton_schulz_flops_of_the_matrices_a_rank_owns():
    g, lay, p = _setup()

    def ns(m, n):  # 5 iterations of 4 m^2 n + 2 m^3 (m <= n)
        m, n = min(m, n), max(m, n)
        return 5 * (4 * m * m * n + 2 * m ** 3)

    attn = 2 * ns(2048, 2048) + 2 * ns(2048, 2048)  # Q and O (16 x 128), K and V (16 x 128)
    experts = 3 * ns(2048, 1280)                     # gate, up, down of one expert
    flops = 16 * attn / 8 + 15 * 128 * experts / 8   # the DP rank's share; 15 MoE blocks, EP 8, EDP 1
    want = 18.0 * (p.dense[0] / 8 + p.experts[0]) / HBM + flops / (0.5 * PEAK)
    assert float(step_time(optimizer("muon"), g, lay, p, PEAK, HBM)[0]) == pytest.approx(want)


def test_slowest_step_is_the_stage_with_the_most_to_step():
    g = geometry(parse_spec(moe_spec()).model)
    lay = ParallelLayout.of(pp=np.array([1, 2]), dp=np.array([8, 4]), ep=4)
    got = slowest_step(optimizer("adam"), g, lay, PEAK, HBM)
    for i in range(2):
        one = lay.take([i])
        stages = [stage_params(g, one, s) for s in range(int(one.pp[0]))]
        want = max(float(step_time(optimizer("adam"), g, one, p, PEAK, HBM)[0]) for p in stages)
        assert got[i] == pytest.approx(want)
    assert math.isfinite(got.sum())
