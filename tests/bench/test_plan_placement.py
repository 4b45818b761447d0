"""`bench plan` names each collective's placement as the bench measures it:
an expert-DP (strided) group is inter-node exactly when its ranks, laid out by the bench's own
``groups(world, n, "strided")``, leave a node (``is_inter_node``). The old rule looked at the
stride only and called a strided reduce_scatter over 256 ranks intra-node."""
from __future__ import annotations

import pytest
import yaml
from scaleplan.bench.plan import lookups
from scaleplan.bench.suites.collectives import groups, is_inter_node

SPEC = {"model": {"n_layers": 8, "hidden_sz": 1024, "inter_sz": 4096, "n_q_heads": 8, "n_kv_heads": 8,
                  "head_dim": 128, "vocab_sz": 32000,
                  "moe": {"n_experts": 16, "experts_per_token": 2, "expert_inter_sz": 512}},
        "data": {"gbs": 256, "seqlen": 1024, "microbatch_sz": 1}, "hardware": {"node_type": "p6-b200.48xlarge"}}
GPN = 8  # p6-b200.48xlarge


@pytest.mark.parametrize("n_dev,ep", [(256, 1), (256, 8), (256, 16), (16, 4), (8, 4), (8, 8), (16, 16)])
def test_strided_groups_inter_node_as_laid_out(tmp_path, sqlite_url, n_dev, ep):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    pts, _ = lookups(spec, n_dev, [f"tp=1,cp=1,pp=1,ep={ep}"], None, sqlite_url)
    strided = [p for p in pts["collectives"] if p["layout"] == "strided"]
    assert strided or n_dev == ep  # EDP = 1 needs no expert gradient collective
    for p in strided:
        # tp = cp = pp = 1: the expert-DP groups are the bench's strided groups of this world
        placed = groups(n_dev, p["group_size"], "strided")
        assert p["inter_node"] == any(is_inter_node(g, GPN) for g in placed), p


def test_the_reported_case(tmp_path, sqlite_url):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    pts, _ = lookups(spec, 256, ["tp=1,cp=1,pp=1,ep=1"], None, sqlite_url)
    rs = [p for p in pts["collectives"] if p["collective"] == "reduce_scatter" and p["layout"] == "strided"]
    assert rs and all(p["group_size"] == 256 and p["inter_node"] for p in rs)
