"""The DP gradient/parameter collectives hide behind the wall time of the pass they overlap, which on a
dispatch-bound GPU is the host's issue time, not the GPU's compute time (estimator/model.py)."""
from __future__ import annotations

import numpy as np
import pytest
from scaleplan.estimator import Estimator
from scaleplan.estimator.comm import (
    GRAD_BYTES_COMM,
    PARAM_BYTES_COMM,
    collective_time,
    dp_buckets,
    dp_comm_time,
)
from scaleplan.estimator.context import Lookups
from scaleplan.estimator.model_dims import geometry, padded_vocab
from scaleplan.estimator.layout import ParallelLayout
from scaleplan.estimator.sources import Recorder

from scaleplan.specs import Layout, parse_spec
from tests.estimator.conftest import moe_spec

LAY = [Layout(pp=1, ep=8, dp=32, mbs=1, ckpt="full")]


def _dp_comm(host_scale: float, optimizer: str = "adamw") -> float:
    spec = parse_spec(moe_spec(optimizer={"optimizer_type": optimizer}))
    est = Estimator.from_frames("p6-b200.48xlarge", {}, host_scale=host_scale)
    return est.estimate(spec, 32, LAY)[0].breakdown_s["dp_comm"]


def _last_buckets() -> float:
    """Independent floor: with an unbounded window only each group's last reduce-scatter and
    all-gather bucket stays exposed, (rs + ag) / n_buckets summed over the dense and expert groups."""
    spec = parse_spec(moe_spec(optimizer={"optimizer_type": "adamw"}))
    est = Estimator.from_frames("p6-b200.48xlarge", {})
    tb, prof = est.tables.view("bf16"), est.profile
    g = geometry(spec.model)
    total = 0.0
    for params, group, layout, inter, nb in dp_buckets(g, ParallelLayout.of(dp=32, ep=8), 8):
        rec = Recorder(1, "compose")
        per = np.atleast_1d(params / nb)
        act = np.atleast_1d(group > 1)
        lk = Lookups(tb, prof, rec)
        rs = collective_time(lk, "dp_comm", "reduce_scatter", np.atleast_1d(group), per * GRAD_BYTES_COMM,
                             np.atleast_1d(inter), layout, active=act)
        ag = collective_time(lk, "dp_comm", "all_gather", np.atleast_1d(group), per * PARAM_BYTES_COMM,
                             np.atleast_1d(inter), layout, active=act)
        total += float(rs[0] + ag[0])  # nb buckets each, of which the last one is exposed: nb * t / nb
    return total


def test_exposed_dp_traffic_shrinks_as_the_host_lengthens_the_pass():
    t = [_dp_comm(s) for s in (0.01, 1.0, 3.0, 30.0)]
    assert all(b <= a + 1e-12 for a, b in zip(t, t[1:])), t
    assert t[0] > t[-1]  # at host_scale 0.01 the GPU-only window leaves more of it exposed


def test_unbounded_window_leaves_only_the_last_bucket():
    assert _dp_comm(1e4) == pytest.approx(_last_buckets(), rel=1e-9)


def test_layerwise_parameter_gather_after_the_step_is_never_hidden():
    # muon: DDP all-reduce overlapped, the owners' all-gather after the step exposed whatever the host does
    assert _dp_comm(1e4, "muon") > _dp_comm(1e4, "adamw")


@pytest.mark.parametrize("pp", [1, 2, 3])
@pytest.mark.parametrize("tie", [False, True])
def test_pipeline_stages_hold_every_parameter_once(pp, tie):
    # first + middle + last are the whole model for PP <= 3: their DP groups' parameters add up to the
    # spec's N_tot and embeddings (scaleplan.geometry counts them), plus the LM head's copy of a tied
    # embedding on the last stage; norms are the only parameters the buckets leave out (2 d per block)
    from scaleplan.estimator.comm import dp_stages
    spec = parse_spec(moe_spec(model={**moe_spec()["model"], "tie_embeddings": tie}))
    g = geometry(spec.model)
    total = 0.0
    lay = ParallelLayout.of(pp=pp)
    for present, s in dp_stages(g, lay):
        total += sum(float(np.sum(p)) for p, *_ in dp_buckets(g, lay, 8, s)) if present else 0.0
    n_mats = (1 if tie else 2) + (1 if tie and pp > 1 else 0)  # embedding, LM head, the head's tied copy
    pad = (padded_vocab(g.vocab) - g.vocab) * g.d  # Megatron's padded rows (params.stage_params), per matrix
    expect = g.n_tot + g.embedding + (g.vocab * g.d if tie and pp > 1 else 0) + n_mats * pad + g.d  # + final norm
    assert total == pytest.approx(expect, rel=2 * g.L * g.d / g.n_tot)
    assert total <= expect


def _pp2_model(optimizer: str):
    """The 700M model's geometry and an estimator on the analytic collectives, for PP=2, DP=16."""
    spec = parse_spec(moe_spec(optimizer={"optimizer_type": optimizer}))
    return geometry(spec.model), Estimator.from_frames("p6-b200.48xlarge", {})


def _group_times(g, est, s: int, ep: int, grad_coll: str):
    """Per DP group of stage s (PP=2, DP=16): (gradient collective s, parameter all-gather s, buckets)."""
    out = []
    for params, group, layout, inter, nb in dp_buckets(g, ParallelLayout.of(pp=2, dp=16, ep=ep), 8, s):
        params, group, inter, nb = (np.ravel(x)[0] for x in (params, group, inter, nb))
        per, grp, it = np.atleast_1d(params / nb), np.atleast_1d(group).astype(float), np.atleast_1d(inter)
        t = [nb * collective_time(Lookups(est.tables, est.profile, Recorder(1, "compose")), "dp_comm", coll, grp,
                                  per * nbytes, it, layout, active=grp > 1)[0]
             for coll, nbytes in ((grad_coll, GRAD_BYTES_COMM), ("all_gather", PARAM_BYTES_COMM))]
        out.append((float(t[0]), float(t[1]), float(nb)))
    return out


def _exposed(g, est, ep: int, vpp: int, window: float, optimizer: str) -> float:
    pl = ParallelLayout.from_specs([Layout(pp=2, vpp=vpp, ep=ep, dp=16, mbs=1, ckpt="full")], 32)
    a = lambda x: np.atleast_1d(np.asarray(x, dtype=float))  # noqa: E731
    return float(dp_comm_time(est.model.context(g, pl, 8192), a(window), a(window), optimizer)[0])


@pytest.mark.parametrize("vpp", [1, 2])
def test_the_1f1b_drain_hides_a_later_stages_dp_traffic(vpp):
    # PP=2, EP=1 of the 700M model: the last stage holds 8 MoE blocks, the first 7 and the dense block,
    # so the last stage's expert gradients are the larger; but its last backward ends one stage-backward
    # (one chunk's, 1/VPP of it, when interleaved) before the step does, and its reduce-scatter hides
    # behind that drain as well
    g, est = _pp2_model("adamw")
    w = 0.05

    def stage(s, drain):
        """Exposed seconds of stage s (ZeRO-1): what its own last backward (first forward) leaves of the
        reduce-scatter (all-gather), less the time the earlier stages still drain (fill)."""
        times = _group_times(g, est, s, 1, "reduce_scatter")
        grad = sum(max(rs - w, rs / nb) for rs, _, nb in times)
        param = sum(max(ag - w, ag / nb) for _, ag, nb in times)
        return max(grad - drain, 0.0) + max(param - drain, 0.0)

    assert stage(1, 0.0) > stage(0, 0.0)  # the heavier stage, were it to finish last
    assert stage(1, w / vpp) < stage(1, 0.0)
    assert _exposed(g, est, 1, vpp, w, "adamw") == pytest.approx(max(stage(0, 0.0), stage(1, w / vpp)), rel=1e-12)
