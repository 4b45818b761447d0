"""ParallelLayout (estimator/layout.py): validity rules, derived degrees, placement in Megatron-Core's rank order."""
import dataclasses
import numpy as np
import pytest
from scaleplan.estimator.ckpt import CkptMode
from scaleplan.estimator.model_dims import geometry
from scaleplan.estimator.plans import enumerate_grid
from scaleplan.estimator.layout import (
    GEOMETRIC_COLUMNS,
    RULES,
    SPLIT_FIELDS,
    LayoutContext,
    ParallelLayout,
    layout_text,
    rule,
)

from scaleplan.errors import SpecError
from scaleplan.specs import Layout, parse_spec
from tests.estimator.conftest import moe_spec


def _ctx(n=32, gbs=64, seqlen=4096):
    return LayoutContext(geometry(parse_spec(moe_spec()).model), n, gbs, seqlen)


def test_from_specs_derives_dp_and_round_trips_the_schema():
    lay = ParallelLayout.from_specs([Layout(tp=2, pp=2, ep=8, mbs=2, ckpt="selective")], 32)
    assert int(lay.dp[0]) == 8 and int(lay.ckpt[0]) == CkptMode.SELECTIVE
    assert lay.row(0) == {"tp": 2, "cp": 1, "pp": 2, "dp": 8, "ep": 8, "etp": 1, "vpp": 1, "mbs": 2,
                          "ckpt": "selective"}
    assert lay.spec(0) == Layout(tp=2, pp=2, dp=8, ep=8, mbs=2, ckpt="selective")
    assert layout_text(lay.row(0)) == "tp=2 cp=1 pp=2 dp=8 ep=8 etp=1 vpp=1 mbs=2 selective"


def test_derived_degrees():
    lay = ParallelLayout.of(tp=2, cp=2, pp=4, dp=8, ep=4, etp=2, vpp=2, mbs=2)
    assert int(lay.n_devices[0]) == 128
    assert int(lay.edp[0]) == 2 * 2 * 8 // (4 * 2)   # eq:mesh-moe: TP CP DP = EP ETP EDP
    assert int(lay.virtual_stages[0]) == 8


def test_each_plan_reports_its_first_broken_rule():
    ok = dict(tp=1, cp=1, pp=2, dp=16, ep=8, mbs=1)
    cases = [({}, None), ({"dp": 8}, "mesh_not_dividing_devices"), ({"ep": 32}, "expert_mesh_not_folding"),
             ({"tp": 2, "dp": 8, "ep": 16}, None),  # EP 16 over TP 2 x DP 8: folded, EP need not divide DP
             ({"mbs": 3}, "gbs_not_divisible"), ({"pp": 32, "dp": 1, "ep": 1}, "layers_not_split_over_stages"),
             ({"pp": 1, "dp": 32, "vpp": 2}, "vpp_needs_pp"), ({"tp": 32, "dp": 1, "pp": 1, "ep": 1},
                                                                "heads_not_divisible_by_tp"),
             ({"pp": 1, "dp": 32, "decoder_first_pipeline_num_layers": 4}, "stage_layers_need_pp"),
             ({"pp": 4, "dp": 8, "decoder_first_pipeline_num_layers": 5}, "stage_layers_not_adding_up"),
             ({"pp": 4, "dp": 8, "decoder_first_pipeline_num_layers": 2, "decoder_last_pipeline_num_layers": 2}, None),
             # 3 layers in 2 chunks: stated, a --pipeline-model-parallel-layout string runs it (2 + 1)
             ({"pp": 4, "dp": 8, "vpp": 2, "decoder_first_pipeline_num_layers": 3, "decoder_last_pipeline_num_layers": 3},
              None)]
    for change, want in cases:
        lay = ParallelLayout.of(**{**ok, **change})
        assert lay.reasons(_ctx())[0] == want, change
    # the paper's P_disc (an enumeration not asked to fold): EP within DP, ETP within TP
    paper = dataclasses.replace(_ctx(), fold_experts=False)
    for change, want in [({"tp": 2, "dp": 8, "ep": 16}, "ep_not_dividing_dp"), ({"etp": 2}, "etp_not_dividing_tp"),
                         ({"tp": 2, "dp": 8, "etp": 2}, None)]:
        assert ParallelLayout.of(**{**ok, **change}).reasons(paper)[0] == want, change
        assert ParallelLayout.of(**{**ok, **change}).reasons(_ctx())[0] is None, change  # folded


def test_a_users_layout_gets_a_one_line_error_naming_the_field():
    lay = ParallelLayout.from_specs([Layout(pp=2, ep=32, dp=16)], 32)
    with pytest.raises(SpecError) as e:
        lay.validate(_ctx())
    assert "layout ep" in str(e.value) and "tp*cp*dp = 16" in str(e.value)
    with pytest.raises(SpecError) as e:
        ParallelLayout.of(tp=2, dp=2).validate(_ctx())
    assert "2*1*1*2" in str(e.value) and "32" in str(e.value)


def test_adding_a_rule_is_one_function(monkeypatch):
    monkeypatch.setattr("scaleplan.estimator.layout.RULES", list(RULES))

    @rule("no_tp_4", "tp", "anything but 4")
    def _no_tp_4(lo, c):
        return lo.tp != 4

    lay = ParallelLayout.of(tp=[1, 4], dp=[32, 8], ep=8)
    assert list(lay.reasons(_ctx())) == [None, "no_tp_4"]


def test_enumeration_counts_every_combination_once():
    axes = {"tp": [1, 2, 3], "cp": [1], "pp": [1, 2], "ep": [1, 8], "etp": [1], "vpp": [1], "mbs": [1, 3],
            "ckpt": [3], **dict.fromkeys(SPLIT_FIELDS, [0])}
    valid, counts, total = enumerate_grid(axes, _ctx())
    assert total == 3 * 2 * 2 * 2
    assert total == len(valid) + sum(counts.values())
    assert counts["mesh_not_dividing_devices"] == 2 * 2 * 2  # tp = 3 divides no 32-GPU mesh
    assert set(valid.mbs.tolist()) == {1} and (valid.reasons(_ctx()) == None).all()  # noqa: E711


def test_enumeration_is_every_rule_on_every_combination():
    """The rules that do not read the model run once per grid (shared by the models searched on it): the
    plans and the counts are those of every rule run on every combination, for models of other layer,
    head, expert and width counts on one grid, and for an empty axis."""
    from scaleplan.geometry import ladder_model

    axes = {"tp": [1, 2, 4, 8], "cp": [1, 2, 4], "pp": [1, 2, 3, 4, 8], "ep": [1, 2, 4, 8, 16], "etp": [1, 2],
            "vpp": [1, 2], "mbs": [1, 2, 4], "ckpt": [0, 3], **dict.fromkeys(SPLIT_FIELDS, [0])}
    for model in (ladder_model(8, 16, 1, 1), ladder_model(12, 32, 2, 4), ladder_model(10, 6, 2, 2)):
        ctx = LayoutContext(geometry(model), 64, 256, 8192)
        names = [f for f in ParallelLayout.__dataclass_fields__ if f != "dp"]
        grid = np.stack(np.meshgrid(*(axes[f] for f in names), indexing="ij"), -1).reshape(-1, len(names))
        mp = grid[:, 0] * grid[:, 1] * grid[:, 2]
        every = ParallelLayout(grid[:, 0], grid[:, 1], grid[:, 2], np.where(64 % mp == 0, 64 // mp, 1), *grid[:, 3:].T)
        why = every.reasons(ctx)
        valid, counts, total = enumerate_grid(axes, ctx)
        assert total == len(grid) and len(valid) == (why == None).sum() > 0  # noqa: E711
        assert counts == {r.name: int((why == r.name).sum()) for r in RULES if (why == r.name).any()}
        ok = every.take(np.nonzero(why == None)[0])  # noqa: E711
        assert all(np.array_equal(getattr(valid, f), getattr(ok, f)) for f in ParallelLayout.__dataclass_fields__)
    empty, counts, total = enumerate_grid({**axes, "ep": []}, ctx)
    assert (len(empty), counts, total) == (0, {}, 0)


def test_geometric_rules_read_only_the_geometric_columns():
    """Enumeration runs the rules that read the model on the distinct GEOMETRIC_COLUMNS combinations alone:
    on layouts whose other columns vary at random, every such rule gives on those few rows, handed back to
    each plan, what it gives on every plan (a rule reading another column would differ)."""
    from scaleplan.geometry import ladder_model

    rng = np.random.default_rng(7)
    n = 8000
    cols = {"tp": [1, 2, 4, 8], "cp": [1, 2, 4], "pp": [1, 2, 3, 4, 8], "dp": [1, 2, 4, 8, 16], "ep": [1, 2, 4, 8, 16],
            "etp": [1, 2], "vpp": [1, 2, 3], "mbs": [1, 2, 4], "ckpt": [0, 1, 3],
            "decoder_first_pipeline_num_layers": [0, 0, 3], "decoder_last_pipeline_num_layers": [0, 0, 4]}
    lay = ParallelLayout(**{f: rng.choice(v, n) for f, v in cols.items()})
    first, inv = lay.distinct(*GEOMETRIC_COLUMNS)
    assert len(first) < n / 2
    geometric = [r for r in RULES if r.geometric]
    assert len(geometric) >= 8
    for model in (ladder_model(8, 16, 1, 1), ladder_model(10, 6, 2, 2)):
        for uneven, fold in ((False, False), (True, True)):
            ctx = LayoutContext(geometry(model), 64, 256, 8192, fold, uneven)
            for r in geometric:
                full = np.broadcast_to(np.asarray(r.check(lay, ctx), dtype=bool), (n,))
                few = np.broadcast_to(np.asarray(r.check(lay.take(first), ctx), dtype=bool), (len(first),))
                assert np.array_equal(few[inv], full), r.name


def test_placement_follows_megatron_rank_order():
    gpn = 8
    # TP is contiguous: it leaves a node only beyond 8
    assert list(ParallelLayout.of(tp=[8, 16], dp=1).spans_nodes("tp", gpn)) == [False, True]
    # EP ranks are ETP apart (the expert generator, etp-ep-edp-pp), whatever TP and CP are: at ETP 1
    # an EP 8 group is 8 neighbours (one node) even at TP 2, where the dense order would put them
    # 2 apart over two nodes; at ETP 2 EP 4 fills a node and EP 8 needs two
    lay = ParallelLayout.of(tp=2, etp=[1, 1, 2, 2], ep=[4, 8, 4, 8], dp=8)
    assert list(lay.nodes("ep", gpn)) == [1, 1, 1, 2] and list(lay.ranks_per_node("ep", gpn)) == [4, 8, 4, 4]
    assert list(ParallelLayout.of(cp=2, ep=8, dp=8).nodes("ep", gpn)) == [1]  # CP is folded into EDP
    # expert-DP ranks are ETP EP apart: stride 8 puts one per node, stride 4 two, stride 1 whole nodes
    rails = ParallelLayout.of(ep=[8, 4, 1, 1, 4], etp=[1, 1, 1, 1, 2], tp=[1, 1, 1, 1, 2],
                              dp=[32, 32, 32, 4, 16]).ranks_per_node("edp", gpn)
    assert list(rails) == [1, 2, 8, 4, 1]
    # the expert tensor group is ETP contiguous ranks
    assert list(ParallelLayout.of(tp=8, etp=[1, 8], dp=2).group("etp")[0]) == [1, 1]
    # pipeline neighbours are TP CP DP ranks apart: at 8 every boundary leaves the node, at 4 every other
    pp = ParallelLayout.of(pp=4, dp=[8, 4], tp=[1, 1])
    assert list(pp.nodes("pp", gpn)) == [4, 2] and list(pp.ranks_per_node("pp", gpn)) == [1, 2]
