"""The domains a parallel group spans, counted from its ranks: ParallelLayout.nodes / ranks_per_node /
spans_nodes against groups built here the way Megatron-Core's RankGenerator builds them (the world's ranks as
an array of the order's degrees, TP fastest; a group: the ranks that differ only along its axes), for NVLink
domains of 8 GPUs (a node) and of 72 (a GB200 NVL72 rack), and by hand for the cases the 72-GPU rack makes."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from scaleplan.estimator.layout import ParallelLayout

# (generator order, fastest first; the group's axes) per group name of layout.GROUPS. Dense generator
# "tp-cp-ep-dp-pp" with EP 1 (tp-cp-dp-pp); expert generator "tp-ep-dp-pp" with tp = ETP, dp = EDP, no CP
DENSE, EXPERT = ("tp", "cp", "dp", "pp"), ("etp", "ep", "edp", "pp")
AXES = {"tp": (DENSE, ("tp",)), "cp": (DENSE, ("cp",)), "dp_cp": (DENSE, ("cp", "dp")), "pp": (DENSE, ("pp",)),
        "tp_cp_dp": (DENSE, ("tp", "cp", "dp")), "etp": (EXPERT, ("etp",)), "ep": (EXPERT, ("ep",)),
        "edp": (EXPERT, ("edp",))}


def _groups(deg: dict, name: str) -> np.ndarray:
    """Every ``name`` group's ranks, [groups, ranks of one]."""
    order, axes = AXES[name]
    sizes = [deg[a] for a in order]
    ranks = np.arange(int(np.prod(sizes))).reshape(sizes[::-1])  # C order: the last axis varies fastest
    pos = [len(order) - 1 - order.index(a) for a in axes]
    rest = [i for i in range(len(order)) if i not in pos]
    return ranks.transpose(rest + pos).reshape(-1, int(np.prod([deg[a] for a in axes])))


def _reference(deg: dict, name: str, domain: int) -> tuple[int, int]:
    """(most domains one group spans, fewest ranks a spanning group has in one domain; its size if none spans)."""
    most, fewest = 1, None
    for g in _groups(deg, name):
        doms, counts = np.unique(g // domain, return_counts=True)
        most = max(most, len(doms))
        if len(doms) > 1:
            fewest = int(counts.min()) if fewest is None else min(fewest, int(counts.min()))
    return most, (fewest if fewest is not None else _groups(deg, name).shape[1])


def _layouts():
    """Valid degrees on 64 to 256 GPUs (EP x ETP within TP CP DP), and 96 and 144 (not powers of two)."""
    for n_dev, tp, cp, pp, ep, etp in itertools.product((64, 96, 128, 144, 256), (1, 2, 4), (1, 2), (1, 2, 3, 4),
                                                        (1, 2, 3, 4, 6, 8, 16, 32, 64), (1, 2)):
        stage = n_dev // pp
        if n_dev % pp or stage % (tp * cp) or tp % etp or stage % (ep * etp):
            continue
        yield dict(tp=tp, cp=cp, pp=pp, dp=stage // (tp * cp), ep=ep, etp=etp, edp=stage // (ep * etp))


CASES = list(_layouts())


@pytest.mark.parametrize("domain", [8, 72])
def test_every_group_kind_against_its_ranks(domain):
    lay = ParallelLayout.of(**{k: [c[k] for c in CASES] for k in ("tp", "cp", "pp", "dp", "ep", "etp")})
    assert len(CASES) > 300
    for name in AXES:
        nodes, per, spans = lay.nodes(name, domain), lay.ranks_per_node(name, domain), lay.spans_nodes(name, domain)
        for i, c in enumerate(CASES):
            want = _reference(c, name, domain)
            assert (nodes[i], per[i], spans[i]) == (want[0], want[1], want[0] > 1), (name, c)


def test_a_group_across_a_rack_boundary_spans_both_racks():
    """GB200 NVL72, 72 GPUs a rack. EP 64 on 128 GPUs: ranks 0-63 in rack 0, ranks 64-127 in racks 0 (64-71)
    and 1 (72-127): 2 racks, 8 ranks on the rack-0 side. EP 64 on 256: 64-127, 128-191 (rack 1: 128-143,
    rack 2: 144-191), 192-255 (rack 2: 192-215, rack 3: 216-255) all straddle; the fewest on one side is 8 (64-71).
    EP 128 on 256: ranks 128-255 fall in racks 1, 2 and 3. EP 8 on 144 (two full racks): 72 / 8 groups per rack."""
    def ep(n_dev, e):
        lay = ParallelLayout.of(dp=n_dev, ep=e)
        return float(lay.nodes("ep", 72)[0]), float(lay.ranks_per_node("ep", 72)[0])

    assert ep(128, 64) == (2, 8)
    assert ep(256, 64) == (2, 8)
    assert ep(256, 128) == (3, 16)  # 128-143 in rack 1: 16 ranks
    assert ep(144, 8) == (1, 8)
    assert ep(144, 16) == (2, 8)   # ranks 64-79: 8 in each rack
    assert ep(64, 64) == (1, 64)   # one rack holds it all


def test_eight_gpu_nodes_with_power_of_two_degrees_keep_the_closed_form():
    """Aligned blocks (every power-of-two layout on 8-GPU nodes): min(max(floor(8 / s), 1), n) ranks per node
    and ceil(n / that) nodes, the form the layout always used."""
    for c in CASES:
        if any(v & (v - 1) for v in c.values()):
            continue
        lay = ParallelLayout.of(**{k: c[k] for k in ("tp", "cp", "pp", "dp", "ep", "etp")})
        for name in AXES:
            stride, size = (float(x[0]) for x in lay.group(name))
            per = min(max(np.floor(8 / stride), 1.0), max(size, 1.0))
            assert (lay.ranks_per_node(name, 8)[0], lay.nodes(name, 8)[0]) == (per, np.ceil(size / per)), (name, c)
