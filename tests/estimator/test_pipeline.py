"""1F1B bubble (eq:bubble) and vocabulary-stage terms against hand-computed cases, the paper's t_vocab, and
a discrete-event 1F1B schedule with fixed op times (which the model's pacing ramp exceeds by the last stage's
LM head surplus per fill and drain hop)."""
import numpy as np
import pytest
from scaleplan.estimator import Estimator
from scaleplan.estimator.model import bubble_fraction, pipeline_time
from scaleplan.estimator.pipeline import Middle, StageWork, Vocab
from scaleplan.estimator.pipeline import stage_periods as _stage_periods

from scaleplan.specs import Layout, parse_spec

from .conftest import moe_spec


def stage_periods(pp, t_first_layers, t_other_layers, t_first, t_last_fwd, t_last_bwd, t_disp, serial=False,
                  a2a_first=0.0, a2a_other=0.0, last_bwd_exposed=0.0):
    """:func:`pipeline.stage_periods` of a pipeline whose stages after the first run the same layers
    (``t_other_layers``), all at dispatch time ``t_disp``."""
    pp = np.asarray(pp)
    other = StageWork(np.asarray(t_other_layers), np.asarray(t_disp), a2a_other)
    return _stage_periods(pp, StageWork(np.asarray(t_first_layers), np.asarray(t_disp), a2a_first),
                          Middle(np.maximum(pp - 2, 0), other, other, other), other,
                          Vocab(t_first, t_last_fwd, t_last_bwd, last_bwd_exposed), serial)


def test_bubble_fraction_hand_cases():
    # (PP-1)/(VPP n_mb): PP=4, n_mb=32 -> 3/32; interleaving by 2 halves it; PP=1 -> 0
    assert bubble_fraction(4, 1, 32) == pytest.approx(3 / 32)
    assert bubble_fraction(4, 2, 32) == pytest.approx(3 / 64)
    assert bubble_fraction(1, 1, 8) == 0.0
    assert np.allclose(bubble_fraction(np.array([2, 8]), 1, np.array([16, 4])), [1 / 16, 7 / 4])


def _one_f_one_b(f, b, n_mb):
    """Wall time of a 1F1B schedule by discrete events: stage s runs PP-s-1 warm-up forwards, then
    alternates one forward and one backward, then drains; F(s, i) needs F(s-1, i), B(s, i) needs
    F(s, i) and B(s+1, i). ``f``, ``b``: per-stage forward / backward seconds of one micro-batch."""
    pp = len(f)
    orders = []
    for s in range(pp):
        warm = min(pp - s - 1, n_mb)
        ops = [("F", i) for i in range(warm)]
        for i in range(n_mb):
            if warm + i < n_mb:
                ops.append(("F", warm + i))
            ops.append(("B", i))
        orders.append(ops)
    done, nxt, clock = {}, [0] * pp, [0.0] * pp
    while any(nxt[s] < len(orders[s]) for s in range(pp)):
        for s in range(pp):
            while nxt[s] < len(orders[s]):
                kind, i = orders[s][nxt[s]]
                deps = [("F", s - 1, i)] if kind == "F" and s > 0 else []
                if kind == "B":
                    deps = [("F", s, i)] + ([("B", s + 1, i)] if s < pp - 1 else [])
                if any(d not in done for d in deps):
                    break
                clock[s] = max([clock[s]] + [done[d] for d in deps]) + (f[s] if kind == "F" else b[s])
                done[(kind, s, i)] = clock[s]
                nxt[s] += 1
    return max(clock)


@pytest.mark.parametrize("pp,n_mb,t_first,t_last_f,t_last_b", [
    (2, 8, 1e-3, 4e-3, 8e-3), (4, 32, 0.5e-3, 6e-3, 12e-3), (8, 64, 2e-3, 15e-3, 30e-3), (4, 4, 0.0, 20e-3, 1e-3),
])
def test_ramp_at_the_pacing_period_exceeds_a_fixed_op_time_schedule_by_the_last_stages_surplus(
        pp, n_mb, t_first, t_last_f, t_last_b):
    # compute-bound stages: 10 ms forward, 20 ms backward of layers; the embedding on the first stage's
    # forward, the LM head + CE on the last stage's forward and backward. A schedule with fixed op times
    # runs the PP-1 fill and drain hops at the other stages' periods; the model runs each at the pacing
    # (last) stage's: more by PP-1 LM head surpluses. The first stage's embedding hides in its hop.
    f_l, b_l = 10e-3, 20e-3
    f = [f_l + (t_first if s == 0 else 0.0) + (t_last_f if s == pp - 1 else 0.0) for s in range(pp)]
    b = [b_l + (t_last_b if s == pp - 1 else 0.0) for s in range(pp)]
    z = np.array(0.0)
    st = stage_periods(np.array(pp), np.array(f_l + b_l), np.array(f_l + b_l), np.array(t_first),
                       np.array(t_last_f), np.array(t_last_b), z)
    surplus = (pp - 1) * (t_last_f + t_last_b) - t_first
    assert pipeline_time(n_mb, 1, st.period, st.ramp) == pytest.approx(_one_f_one_b(f, b, n_mb) + surplus,
                                                                       rel=1e-12)
    # equal stages: the two agree
    st = stage_periods(np.array(pp), np.array(f_l + b_l), np.array(f_l + b_l), z, z, z, z)
    assert pipeline_time(n_mb, 1, st.period, st.ramp) == pytest.approx(_one_f_one_b([f_l] * pp, [b_l] * pp, n_mb),
                                                                       rel=1e-12)


def test_ramp_is_the_papers_t_vocab_with_its_ramp_term():
    # compute-bound, last stage slowest: the paper's t_block (1 + f_bubble) + t_vocab, with
    # t_vocab = (n_mb-1) max(t_first, t_last) + t_first + t_last + t_last n_mb f_bubble; the embedding
    # (t_first) runs on the first stage's hop, inside its pacing period, so it adds nothing of its own
    n_mb, pp, t_layers, tf, tl = 16, 4, 50e-3, 1e-3, 20e-3
    st = stage_periods(np.array(pp), np.array(t_layers), np.array(t_layers), np.array(tf), np.array(tl / 3),
                       np.array(2 * tl / 3), np.array(0.0))
    f = (pp - 1) / n_mb
    paper = n_mb * t_layers * (1 + f) + (n_mb - 1) * tl + tf + tl + tl * n_mb * f
    assert pipeline_time(n_mb, 1, st.period, st.ramp) == pytest.approx(paper - tf)
    # one stage: embedding and LM head every micro-batch, no ramp
    st1 = stage_periods(np.array(1), np.array(t_layers), np.array(0.0), np.array(tf), np.array(tl / 3),
                        np.array(2 * tl / 3), np.array(0.0))
    assert pipeline_time(n_mb, 1, st1.period, st1.ramp) == pytest.approx(n_mb * (t_layers + tf + tl))


def test_interleaving_divides_the_ramp_as_eq_bubble_divides_the_bubble():
    # uniform stages, period 30 ms, PP=4, n_mb=8: 8*30 + 3*30/VPP
    z = np.array(0.0)
    st = stage_periods(np.array(4), np.array(30e-3), np.array(30e-3), z, z, z, z)
    for vpp in (1, 2, 4):
        expect = 8 * 30e-3 * (1 + bubble_fraction(4, vpp, 8))
        assert pipeline_time(8, vpp, st.period, st.ramp) == pytest.approx(expect)


def test_dispatch_floor_is_a_max_not_a_sum():
    # CPU 30 ms vs GPU 20 ms per micro-batch: the period is 30 ms, not 50 ms
    z = np.array(0.0)
    st = stage_periods(np.array(1), np.array(20e-3), z, z, z, z, np.array(30e-3))
    assert st.period == pytest.approx(30e-3)
    st = stage_periods(np.array(1), np.array(40e-3), z, z, z, z, np.array(30e-3))
    assert st.period == pytest.approx(40e-3)


def test_loss_sync_exposes_the_lm_head_forward_only():
    # dispatch-bound last stage: host 30 ms, layers 10 ms on the GPU, LM head + CE 4 ms forward and
    # 8 ms backward. The loss's NaN check syncs the host after the forward: 30 + 4 ms. The backward
    # runs while the host launches the layers' backward: 10 + 8 = 18 ms of GPU work < 30 ms, hidden.
    z, pp = np.array(0.0), np.array(2)
    st = stage_periods(pp, np.array(10e-3), np.array(10e-3), z, np.array(4e-3), np.array(8e-3), np.array(30e-3))
    assert st.period == pytest.approx(34e-3)
    assert st.period_disp == pytest.approx(30e-3)
    # compute-bound instead (GPU layers 40 ms): both parts add, 40 + 8 (GPU side) + 4 (after the sync)
    st = stage_periods(pp, np.array(40e-3), np.array(40e-3), z, np.array(4e-3), np.array(8e-3), np.array(30e-3))
    assert st.period == pytest.approx(52e-3)


_NOT_LAYERS = ("bubble", "vocab", "pp_p2p", "dp_comm", "bias_sync", "optimizer", "dispatch_floor")


def _breakdown(sqlite_url, dense_first: int, pp: int):
    """The breakdown of the 700M model on 32 B200s, EP=8, analytic tables and no dispatch floor."""
    from scaleplan.db.calibrations import newest, store_calibration
    from scaleplan.db.session import session_scope

    with session_scope(sqlite_url) as s:  # a 'dispatch' calibration that zeroes the host terms
        if newest(s, "p6-b200.48xlarge", "dispatch") is None:
            store_calibration(s, "p6-b200.48xlarge", "dispatch", {"t_gap_s": 0.0, "t_host_s": 0.0, "t_ep_host_s": 0.0},
                              inputs={}, residuals=[], cv_error=None, n_obs=0, notes="test: no dispatch floor")
    est = Estimator("p6-b200.48xlarge", db_url=sqlite_url)
    spec = parse_spec(moe_spec(model={**moe_spec()["model"], "moe": {**moe_spec()["model"]["moe"],
                                                                     "first_dense_layers": dense_first}}))
    r = est.estimate(spec, 32, [Layout(pp=pp, ep=8, mbs=1, ckpt="full")])[0]
    b = r.breakdown_s
    assert sum(b.values()) == pytest.approx(r.t_analytic_s, rel=1e-12)
    assert r.t_iter_s == pytest.approx(r.chi_sys * r.t_analytic_s)
    assert b["dispatch_floor"] == pytest.approx(0.0, abs=1e-12)
    n_mb = 256 / (32 // pp)
    return b, sum(v for k, v in b.items() if k not in _NOT_LAYERS) / n_mb  # per micro-batch


def test_model_bubble_is_pp_minus_1_pacing_periods(sqlite_url):
    # equal stages (no dense block): the bubble is eq:bubble, f_bubble = 3/32 of the layers' time
    b, stage = _breakdown(sqlite_url, 0, 4)
    assert b["bubble"] == pytest.approx(3 * stage, rel=1e-9)
    assert b["vocab"] > 0
    # a dense first block makes stage 0 lighter (the two PP = 1 runs give by how much); the slowest stage
    # holds 4 MoE layers either way, and every fill and drain slot lasts its period: the same bubble
    b1, stage1 = _breakdown(sqlite_url, 1, 4)
    assert stage1 == pytest.approx(stage, rel=1e-12)
    _, moe16 = _breakdown(sqlite_url, 0, 1)
    _, dense1_moe15 = _breakdown(sqlite_url, 1, 1)
    assert moe16 - dense1_moe15 > 0
    assert b1["bubble"] == pytest.approx(3 * stage, rel=1e-9)


def test_all_to_all_adds_outside_the_dispatch_max():
    # the host reads the token counts before it sizes the exchange: a dispatch-bound stage (host 30 ms,
    # GPU 10 ms) still pays the 5 ms of all-to-all wire time, and so does a compute-bound one (GPU 40 ms)
    z, pp = np.array(0.0), np.array(2)
    st = stage_periods(pp, np.array(10e-3), np.array(10e-3), z, z, z, np.array(30e-3), a2a_first=5e-3,
                       a2a_other=5e-3)
    assert st.period == pytest.approx(35e-3)
    st = stage_periods(pp, np.array(40e-3), np.array(40e-3), z, z, z, np.array(30e-3), a2a_first=5e-3,
                       a2a_other=5e-3)
    assert st.period == pytest.approx(45e-3)


def test_full_recompute_exposes_the_lm_head_backward_at_the_next_dispatcher_sync():
    # same dispatch-bound last stage, but the last block's backward starts by re-running its forward,
    # whose token dispatcher syncs the host: the 8 ms LM head backward issued just before is waited for
    z, pp = np.array(0.0), np.array(2)
    st = stage_periods(pp, np.array(10e-3), np.array(10e-3), z, np.array(4e-3), z, np.array(30e-3),
                       last_bwd_exposed=np.array(8e-3))
    assert st.period == pytest.approx(42e-3)
    assert st.period_disp == pytest.approx(30e-3)  # the vocabulary-free period does not carry it
    one = stage_periods(np.array(1), np.array(10e-3), z, z, np.array(4e-3), z, np.array(30e-3),
                        last_bwd_exposed=np.array(8e-3))
    assert one.period == pytest.approx(42e-3)


@pytest.mark.parametrize("pp", [1, 4])
def test_the_model_exposes_the_lm_head_backward_only_under_full_recompute(pp):
    # host-bound 700M MoE plans (host_scale 50): the vocabulary term is (t_LM fwd + t_LM bwd) per slot under
    # full recompute (the recompute's dispatcher sync), t_LM fwd per slot without recompute (hidden); a slot
    # each of the n_mb micro-batches and of the PP - 1 fill and drain hops, which last a pacing period
    from scaleplan.estimator.kernels import layer_kernels
    from scaleplan.estimator.layout import ParallelLayout
    from scaleplan.estimator.model_dims import geometry
    from scaleplan.specs import Layout, parse_spec
    from tests.estimator.conftest import moe_spec

    spec = parse_spec(moe_spec())
    est = Estimator.from_frames("p6-b200.48xlarge", {}, host_scale=50.0)
    g, n_mb = geometry(spec.model), 256 // (32 // pp)
    for ckpt, with_bwd in (("full", 1.0), ("none", 0.0)):
        lay = Layout(pp=pp, ep=8, dp=32 // pp, mbs=1, ckpt=ckpt)
        pl = ParallelLayout.from_specs([lay], 32)
        k = layer_kernels(est.model.context(g, pl, 8192))
        vocab = est.estimate(spec, 32, [lay])[0].breakdown_s["vocab"]
        expect = (n_mb + pp - 1) * (float(k.t_last_f[0]) + with_bwd * float(k.t_last_b[0]))
        assert vocab == pytest.approx(expect, rel=1e-9), ckpt


def test_uneven_stages_pace_on_the_slowest():
    """Uneven stages (the first and last lighter, three middle stages of 30, 30 and 40 ms): the period is the
    slowest stage's, 40 ms, whichever stage it is; every one of the PP - 1 fill and drain slots lasts it."""
    z = np.array(0.0)
    work = lambda t: StageWork(np.array(t), z)  # noqa: E731  (GPU-bound: no host time)
    middle = Middle(np.array(3), work(30e-3), work(40e-3), work(100e-3 / 3))
    st = _stage_periods(np.array(5), work(20e-3), middle, work(25e-3), Vocab())
    assert float(st.period) == pytest.approx(40e-3) and float(st.ramp) == pytest.approx(4 * 40e-3)
    assert float(st.period_disp) == pytest.approx(40e-3)
    # a lighter middle leaves the last stage (with its LM head) the pacing one
    light = Middle(np.array(3), work(10e-3), work(10e-3), work(10e-3))
    assert float(_stage_periods(np.array(5), work(20e-3), light, work(25e-3), Vocab(0.0, 5e-3)).period) == \
        pytest.approx(30e-3)


def test_each_pass_takes_its_own_max_of_gpu_and_host():
    """The host waits for the device between a micro-batch's forward and backward (Megatron-Core's p2p
    torch.cuda.synchronize, the loss's NaN check): a host-bound forward cannot hide under a device-bound
    backward. Forward 0.5 s on the GPU, 1 s on the host (1/3 of 3 s); backward 2.5 s on the GPU, 2 s on the
    host: 1 + 2.5 = 3.5 s, where the max over the micro-batch would be 3 s."""
    w = StageWork(np.array(3.0), np.array(3.0), 0.25, np.array(0.5), np.array(1 / 3), True)
    assert float(w.period(False)) == pytest.approx(1.0 + 2.5 + 0.25)
    whole = StageWork(np.array(3.0), np.array(3.0), 0.25, np.array(0.5), np.array(1 / 3), False)
    assert float(whole.period(False)) == pytest.approx(3.0 + 0.25)
    assert float(w.period(True)) == pytest.approx(3.0 + 3.0 + 0.25)  # a CPU: everything adds
    # PP = 1: the embedding joins the forward's GPU side, the LM head's backward the backward's
    one = _stage_periods(np.array(1), w, Middle(np.array(0), w, w, w), w, Vocab(0.75, 0.1, 0.2)).period
    assert float(one) == pytest.approx(max(0.5 + 0.75, 1.0) + max(2.5 + 0.2, 2.0) + 0.25 + 0.1)


def test_pipeline_work_splits_the_passes_of_moe_and_non_interleaved_plans():
    """pipeline_work's forward GPU time is the blocks' forward kernels (the framework kernels' forward share
    with them), the host's forward share the mode's forward kernel unit; the split holds for an MoE model at any
    VPP (its dispatcher syncs the host each MoE block) and a dense one at VPP 1 and PP > 1 (the exchanges'
    synchronize), not a dense one interleaved or at PP 1 (its next forward launches under the backward)."""
    from scaleplan.estimator.ckpt import kernel_units
    from scaleplan.estimator.kernels import layer_kernels
    from scaleplan.estimator.layout import ParallelLayout
    from scaleplan.estimator.model_dims import geometry
    from scaleplan.estimator.stages import layer_totals, pipeline_work

    est = Estimator.from_frames("p6-b200.48xlarge", {})
    for over, pp, vpp, split in (({}, 2, 2, True), ({}, 1, 1, True), ({"moe": None}, 2, 1, True),
                                 ({"moe": None}, 2, 2, False), ({"moe": None}, 1, 1, False)):
        d = moe_spec()
        d["model"].update(over)
        g = geometry(parse_spec(d).model)
        lay = ParallelLayout.of(pp=pp, dp=32 // pp, ep=8 if g.is_moe else 1, vpp=vpp, ckpt="selective")
        ctx = est.model.context(g, lay, 8192, 256)
        k = layer_kernels(ctx)
        fw = np.full(1, 3e-3)
        lt = layer_totals(k, lay.ckpt, fw, g.is_moe)
        disp = {n: np.full(1, 1.0) for n in ("first", "middle_lo", "middle_hi", "middle", "last")}
        w = pipeline_work(ctx, lt, disp).last
        units = float(kernel_units(lay.ckpt)[0])
        common = k.attn_f + k.sd_f + k.ew_f + k.tp_f + k.cp_f + 3e-3 / units
        st = ctx.shapes.last
        n_moe = np.ravel(st.n_moe)[0] if g.is_moe else 0
        want = (np.ravel(st.n_layers)[0] - n_moe) * (common + k.dense_f) + n_moe * (common + k.moe_f + k.sh_f)
        assert np.ravel(w.gpu_f)[0] == pytest.approx(np.ravel(want)[0])
        assert float(np.ravel(w.share_f)[0]) == pytest.approx(1 / units)
        assert bool(np.ravel(w.split)[0]) is split


def test_the_lm_heads_forward_hides_under_the_host_only_without_the_losss_sync():
    """A host-bound last stage (layers 10 ms on the GPU, 30 ms to launch; LM head forward 4 ms, backward 8 ms): with
    the NaN check's sync the forward adds after the max, 30 + 4 ms; without it (stack.nan_check false) it runs
    under the launches, max(10 + 4 + 8, 30) = 30 ms. Device-bound (40 ms of layers) it costs 40 + 4 + 8 either way.
    One stage (PP 1, the embedding 1 ms beside): the same rule."""
    def period(pp, gpu, sync):
        w = StageWork(np.asarray(gpu), np.asarray(30e-3))
        return float(_stage_periods(np.asarray(pp), w, Middle(np.asarray(0), w, w, w), w,
                                    Vocab(1e-3, 4e-3, 8e-3, 0.0, sync)).period)

    assert period(2, 10e-3, True) == pytest.approx(34e-3)
    assert period(2, 10e-3, False) == pytest.approx(30e-3)
    assert period(2, 40e-3, True) == pytest.approx(52e-3) == period(2, 40e-3, False)
    assert period(1, 10e-3, True) == pytest.approx(30e-3 + 4e-3)
    assert period(1, 10e-3, False) == pytest.approx(30e-3)
