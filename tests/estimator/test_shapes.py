"""estimator/shapes.py: per-rank shapes by hand on the 700M model (d 2048, 16 heads of 128 with a head
gate, 16 KV heads, 128 experts of 1280, top-3, vocabulary 257540)."""
import numpy as np
import pytest
from scaleplan.estimator.model_dims import geometry
from scaleplan.estimator.layout import ParallelLayout
from scaleplan.estimator.shapes import plan_shapes

from scaleplan.specs import parse_spec

from .conftest import moe_spec


def test_rank_shapes_by_hand():
    g = geometry(parse_spec(moe_spec()).model)
    sh = plan_shapes(g, ParallelLayout.of(tp=2, cp=2, ep=8, etp=1, mbs=2, dp=8), 8192)
    T = 8192 * 2 / 2                     # seqlen x B_micro / CP
    assert float(sh.T[0]) == T and float(sh.Tsp[0]) == T / 2
    assert float(sh.kv_loc[0]) == 8      # 16 KV heads over TP 2
    assert float(sh.n_qkv[0]) == (16 * 128 + 16) / 2 + 2 * 8 * 128  # Q + head gate, then K and V
    assert float(sh.E_loc[0]) == 16
    R = T * 3 * 1 / 2                    # T K ETP / TP routed rows
    assert float(sh.R[0]) == R and float(sh.tile[0]) == R * 8 / 128  # the EP tile correction
    assert float(sh.ffn_loc[0]) == 1280
    assert float(sh.V_loc[0]) == 257792 / 2
    assert float(sh.a2a_bytes[0]) == pytest.approx(R * 2048 * 2)  # bf16 rows of d


@pytest.mark.parametrize("etp", [2, 4])
def test_expert_tensor_parallelism_shards_each_local_expert(etp):
    """ETP 2 and 4 on the 700M model, TP 4, PP 2, EP 8 (64 GPUs): Megatron-Core builds E / EP local experts
    per rank (``num_local_experts = num_moe_experts // ep_size``), each with its own fc1 / fc2 weight, every
    weight 1/ETP of the expert's (TEGroupedMLP over the expert-tensor-parallel group)."""
    from scaleplan.estimator import Estimator
    from scaleplan.estimator.layerwise import stage_tensors
    from scaleplan.estimator.params import stage_params
    from scaleplan.specs import Layout

    spec = parse_spec(moe_spec(optimizer={"optimizer_type": "muon"}))
    lay = Layout(tp=4, pp=2, dp=8, ep=8, etp=etp, mbs=1, ckpt="full")
    ev = Estimator.from_frames("p6-b200.48xlarge", {}).evaluate(spec, 64, [lay])
    g, pl = geometry(spec.model), ev.plans
    assert ev.shapes.E_loc[0] == 128 / 8 and int(pl.edp[0]) == 4 * 8 // (8 * etp)  # EP ETP EDP = TP DP
    fc1, fc2 = 2048 * 2 * 1280, 1280 * 2048  # SwiGLU's two up projections, the down projection (d 2048)
    for s, n_moe in ((0, 7), (1, 8)):  # 16 blocks over 2 stages, block 0 dense
        _, experts = stage_tensors(g, pl, s)
        assert [(float(c[0]), float(n[0])) for c, n in experts] == [(n_moe * 16, fc1 / etp), (n_moe * 16, fc2 / etp)]
        assert float(stage_params(g, pl, s).experts[0]) == n_moe * 16 * (fc1 + fc2) / etp
    assert np.isfinite(ev.t_iter).all()


def _model(n_layers: int, first_dense: int, every: int = 1):
    base = moe_spec()
    moe = {**base["model"]["moe"], "first_dense_layers": first_dense, "moe_frequency": every}
    return geometry(parse_spec(moe_spec(model={**base["model"], "n_layers": n_layers, "moe": moe})).model)


def test_stage_blocks_follow_megatrons_interleaved_chunks():
    """PP 4 x VPP 2 on 16 blocks: chunks of 2, round v of 8 blocks is stage 0's chunk, then stage 1's, ...
    (get_transformer_layer_offset): stage 0 holds blocks 0-1 and 8-9, stage 1 blocks 2-3 and 10-11."""
    lay = ParallelLayout.of(pp=4, vpp=2, dp=8)
    sh = plan_shapes(_model(16, 3), lay, 8192, 256)  # three dense blocks first (0, 1, 2)
    assert (sh.first.n_dense[0], sh.first.n_moe[0], sh.first.chunk_layers[0]) == (2, 2, 2)  # 0, 1 dense; 8, 9
    assert (sh.middle_lo.n_dense[0], sh.middle_lo.n_moe[0], sh.middle_lo.index[0]) == (1, 3, 1)  # block 2 dense
    assert (sh.middle_hi.n_moe[0], sh.middle_hi.index[0]) == (4, 2)
    assert sh.middle.n_moe[0] == 3.5 and sh.n_middle[0] == 2
    assert (sh.last.n_moe[0], sh.last.has_head[0], sh.first.has_embedding[0]) == (4, True, True)
    assert sh.n_mb[0] == 256 / 8 and sh.T[0] == 8192
    # without interleaving the dense blocks all sit on stage 0 (blocks 0-3)
    flat = plan_shapes(_model(16, 3), ParallelLayout.of(pp=4, dp=8), 8192, 256)
    assert (flat.first.n_dense[0], flat.middle_lo.n_dense[0]) == (3, 0)


def test_stage_blocks_follow_the_moe_layer_pattern():
    """--moe-layer-freq 2 (every second block an MoE block, none dense first) on 12 blocks over PP 4: stages
    of blocks 0-2, 3-5, 6-8, 9-11 hold the MoE blocks 1 | 3, 5 | 7 | 9, 11."""
    sh = plan_shapes(_model(12, 0, 2), ParallelLayout.of(pp=4, dp=8), 4096, 64)
    assert [float(x.n_moe[0]) for x in (sh.first, sh.middle_hi, sh.middle_lo, sh.last)] == [1, 2, 1, 2]
    assert (sh.middle_hi.index[0], sh.middle_lo.index[0], sh.middle.n_moe[0]) == (1, 2, 1.5)
    assert float(sh.max_moe_per_stage[0]) == 2


@pytest.mark.parametrize("lead", [0, 1])
def test_the_closed_form_of_the_common_case_is_the_stage_count(lead):
    """Where the dense blocks fit in stage 0's first chunk (nearly every plan a search meets) the record
    counts in closed form: the same numbers as counting every stage's chunks (shapes.stage_counts)."""
    g = _model(16, lead)
    even = ParallelLayout.of(pp=np.array([1, 2, 4, 8, 16]), vpp=np.array([1, 2, 2, 2, 1]), dp=2)
    uneven = ParallelLayout.of(pp=np.array([2, 4, 4, 6, 3]), vpp=np.array([1, 2, 1, 1, 1]), dp=2,
                               decoder_first_pipeline_num_layers=[10, 2, 0, 1, 4],
                               decoder_last_pipeline_num_layers=[6, 2, 4, 3, 0])
    for lay in (even, uneven):
        _closed_form_is_the_count(g, lay)


def _closed_form_is_the_count(g, lay):
    from dataclasses import fields

    from scaleplan.estimator.shapes import StageCounts, _chunk_moe, _stage_layers, stage_counts

    sh = plan_shapes(g, lay, 4096, 64)
    pp, mid = lay.pp.astype(float), lay.pp > 2
    want = {"first": 0.0 * pp, "last": pp - 1, "middle_lo": np.where(mid, 1, pp - 1),
            "middle_hi": np.where(mid, pp - 2, pp - 1)}
    F, M, Ls = _stage_layers(g, lay)
    for name, s in want.items():
        got, count = getattr(sh, name), stage_counts(g, lay, s)
        chunk = count.n_layers / lay.vpp  # each chunk's blocks counted one by one (the general count)
        assert np.array_equal(count.n_moe, _chunk_moe(g, lay, np.asarray(s, float), (F, M, Ls), chunk)), name
        for f in fields(StageCounts):
            if f.name not in ("has_embedding", "has_head") or name in ("first", "last"):
                assert np.array_equal(getattr(got, f.name), getattr(count, f.name)), (name, f.name)
    every = [_chunk_moe(g, lay, np.full(len(lay), float(s)), (F, M, Ls), stage_counts(g, lay, s).n_layers / lay.vpp)
             for s in range(16)]
    for p, n in enumerate(lay.pp):  # the mean middle stage: stages 1 .. PP - 2 counted one by one
        if n > 2:
            assert sh.middle.n_moe[p] == np.mean([every[s][p] for s in range(1, n - 1)])


def test_the_even_split_is_the_stated_even_split():
    """stage_split's even split (neither end stage stated) gives every stage L / PP layers, one stage all of
    them: the same (first, middle, last) as stating one end stage at L / PP, which the general path counts."""
    from scaleplan.estimator.shapes import stage_split

    L, pp = np.array([16, 16, 16, 16, 81, 61]), np.array([1, 2, 4, 16, 3, 1])
    per, none = np.where(pp > 1, L / pp, 0), np.zeros(6)
    for stated in (stage_split(L, pp, per, none), stage_split(L, pp, none, per)):
        for got, want in zip(stage_split(L, pp), stated):
            assert got.dtype == want.dtype and got.shape == want.shape
            assert np.array_equal(got, want)
            assert np.array_equal(got, np.array([16, 8, 4, 1, 27, 61]))  # layers per stage, by hand
    F, M, Ls = stage_split(L, pp, none, np.array([0, 0, 0, 0, 25, 0]))  # an uneven last stage
    assert (F[4], M[4], Ls[4]) == (28, 28, 25)
    assert [float(x) for x in stage_split(16, 4)] == [4.0, 4.0, 4.0]  # scalars (the hybrid emitter's call)
