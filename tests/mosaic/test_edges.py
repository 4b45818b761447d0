"""An optimum on the edge of a searched axis is reported and, by default, the axis extended once."""
from fakes import FakeEstimator

from scaleplan.estimator import PlanConstraints
from scaleplan.mosaic.edges import edge_lines, extended, find_edges, search_edges
from scaleplan.mosaic.ladder import LadderGrid
from scaleplan.mosaic.search import Envelope, Mosaic

GRID = LadderGrid(q=(8, 10, 12), experts=(16, 32, 64), topk=(1, 2, 4), g=(1, 2, 4))


def _best(**kw):
    row = {"q": 10, "n_experts": 32, "topk": 2, "g": 2, "tpp": 80.0, "tpp_capped": False, "mem_per_device_gb": 50.0,
           "layout": {"mbs": 2}}
    row.update(kw)
    return row


def test_edges_of_each_axis():
    at = lambda **kw: {e.axis: e for e in find_edges(_best(**kw), GRID, (1, 2, 4), (40, 150), 0.95, 179.0)}  # noqa: E731
    assert at() == {}
    e = at(q=8)["q"]
    assert (e.side, e.extend_with, e.flag) == ("smallest", 6, "--q")
    assert at(q=12)["q"].extend_with == 14 and at(n_experts=64)["E"].extend_with == 96
    assert at(topk=4)["K"].extend_with == 6 and at(g=4)["G"].extend_with == 8
    assert "G" not in at(g=1) and "K" not in at(topk=1)  # the end of the space, not of the search
    assert at(layout={"mbs": 4})["mbs"].extend_with == 8
    assert at(tpp_capped=True)["TPP cap"].flag == "--tpp-max" and at(tpp=40.5)["TPP floor"].flag == "--tpp-min"
    assert at(mem_per_device_gb=0.99 * 0.95 * 179.0)["memory"].flag == "--mem-fraction"
    # a single searched value is the user's choice, not an edge
    assert find_edges(_best(q=8), LadderGrid(q=(8,)), (2,), (40, 150), 0.95, 179.0) == []
    grid, mbs, axes = extended(GRID, (1, 2, 4), list(at(q=8, layout={"mbs": 4}).values()))
    assert grid.q == (6, 8, 10, 12) and mbs == (1, 2, 4, 8) and axes == ["q", "mbs"]


def test_extended_plans_equal_a_fresh_search():
    est = FakeEstimator()
    c = PlanConstraints(mbs=(1, 2))
    m = Mosaic(est, GRID, constraints=c)
    env = Envelope(nodes=4, days=5)
    m.run(env)
    grid2 = LadderGrid(q=(6, 8, 10, 12), experts=GRID.experts, topk=GRID.topk, g=GRID.g)
    c2 = PlanConstraints(mbs=(1, 2, 4))
    merged = m.extended(grid2, c2, [env]).plans(4, env)
    fresh = Mosaic(FakeEstimator(), grid2, constraints=c2).plans(4, env)
    assert merged.equals(fresh)
    # only the new geometries and the new micro-batch size were planned again
    n_new = len(m.extended(grid2, c2, [env]).geoms) - len(m.geoms)
    assert n_new > 0


def test_search_extends_an_edge_optimum_once():
    # MFU falls with the model's width: the smallest q wins, so the optimum sits on the q edge
    mfu = lambda mdl, gbs, seqlen, opt: 0.5 * (4096 / mdl.hidden_sz) / (1 + 0.1 * mdl.moe.experts_per_token)  # noqa: E731
    m = Mosaic(FakeEstimator(mfu_fn=mfu), GRID, constraints=PlanConstraints(mbs=(2,)))
    env = Envelope(nodes=4, days=5)
    before = m.run(env)
    assert int(before.best["q"]) == 8
    m2, results, info = search_edges(m, [(env, before)], True, 0.95)
    assert info["extended"][0] == "q" and info["found"][0]["extend_with"] == 6
    assert 6 in m2.grid.q and (results[0][1].table["q"] == 6).any()
    # the extended answer is the fresh search's over the extended grid
    fresh = Mosaic(FakeEstimator(mfu_fn=mfu), m2.grid, constraints=PlanConstraints(mbs=(2,))).run(env).best
    key = ["q", "n_experts", "topk", "g"]
    assert [int(results[0][1].best[k]) for k in key] == [int(fresh[k]) for k in key]
    assert info["changed"] == ([int(fresh[k]) for k in key] != [int(before.best[k]) for k in key])
    assert edge_lines(info)[len(info["found"])].startswith("extended q")
    _, same, off = search_edges(m, [(env, before)], False, 0.95)
    assert same[0][1] is before and off["extended"] == [] and "not extended" in edge_lines(off)[-1]
