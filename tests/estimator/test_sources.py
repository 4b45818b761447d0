"""Recorder.fold: records of lookups made once per distinct tuple (and per stacked pipeline stage)
handed back to the plans that share them."""
import numpy as np
from scaleplan.estimator.sources import Recorder
from scaleplan.estimator.tables import COMPOSED, INTERPOLATED, MEASURED


def _sub(mode: str) -> Recorder:
    # 2 stages x 2 distinct tuples = 4 elements, stage after stage
    sub = Recorder(4, mode)
    sub.mark("dp_comm", np.array([MEASURED, INTERPOLATED, MEASURED, COMPOSED]))
    sub.n_clamped[:] = [0, 1, 0, 2]
    sub.has_oor[2] = True  # stage 1 of tuple 0
    sub.oor.reason[2], sub.oor.value[2], sub.oor.lo[2], sub.oor.hi[2] = "out_of_range:collectives.size_bytes", 9, 1, 4
    sub.note("composed beyond", np.array([False, False, False, True]))
    sub.warnings.append("w1")
    return sub


def test_fold_takes_each_plans_weakest_source_first_oor_and_notes():
    inv = np.array([0, 1, 0])  # plans 0 and 2 share tuple 0
    idx = np.stack([inv, 2 + inv])
    rec = Recorder(3, "error")
    rec.fold(_sub("error"), idx)
    assert rec.src["dp_comm"].tolist() == [MEASURED, COMPOSED, MEASURED]
    assert rec.n_clamped.tolist() == [0, 3, 0]
    assert rec.has_oor.tolist() == [True, False, True]
    assert rec.oor.reason[0] == rec.oor.reason[2] == "out_of_range:collectives.size_bytes"
    assert rec.oor.value.tolist() == [9, 0, 9]
    assert rec.notes["composed beyond"].tolist() == [False, True, False]
    assert rec.warnings == ["w1"]


def test_fold_keeps_an_out_of_range_lookup_the_plan_already_had():
    rec = Recorder(3, "error")
    rec.has_oor[0] = True
    rec.oor.reason[0] = "out_of_range:gemm.m"
    rec.mark("dp_comm", np.array([COMPOSED, MEASURED, MEASURED]))
    rec.fold(_sub("error"), np.stack([np.array([0, 1, 0]), np.array([2, 3, 2])]))
    assert rec.oor.reason[0] == "out_of_range:gemm.m" and rec.oor.reason[2] == "out_of_range:collectives.size_bytes"
    assert rec.src["dp_comm"].tolist() == [COMPOSED, COMPOSED, MEASURED]


def test_fold_of_one_row_maps_plans_to_distinct_tuples():
    sub = Recorder(2, "compose")
    sub.mark("experts", np.array([MEASURED, COMPOSED]))
    rec = Recorder(4, "compose")
    rec.fold(sub, np.array([1, 0, 0, 1]))
    assert rec.src["experts"].tolist() == [COMPOSED, MEASURED, MEASURED, COMPOSED]


def test_distinct_tuples_match_a_dictionary_of_the_rows():
    from scaleplan.estimator.sources import distinct
    rng = np.random.default_rng(3)
    # wide values: packing raw values into one int64 would overflow here
    cols = [rng.choice([1, 2, 2 ** 20, 2 ** 40], 500) for _ in range(5)]
    first, inv = distinct(*cols)
    rows = list(zip(*(c.tolist() for c in cols)))
    seen = {}
    for i, r in enumerate(rows):
        seen.setdefault(r, i)
    assert sorted(first.tolist()) == sorted(seen.values())
    for i, r in enumerate(rows):
        assert rows[first[inv[i]]] == r


def test_extrapolated_collectives_are_marked_per_plan():
    # a table measured at 16 and 32 ranks: a 64-rank all-to-all is read by an invariance, a 16-rank one is
    # not; each plan carries its own mark, whichever plans are evaluated with it
    from scaleplan.estimator import Estimator
    from scaleplan.estimator.comm import collective_time
    from scaleplan.estimator.context import Lookups
    from tests.estimator.conftest import frame

    rows = [dict(collective="all_to_all", group_size=n, layout="contiguous", inter_node=True, size_bytes=s,
                 dtype="bf16", t_s=s / 40e9) for n in (16, 32) for s in (1e6, 1e8)]
    est = Estimator.from_frames("p6-b200.48xlarge", {"collectives": frame(rows)})
    rec = Recorder(3, "compose")
    collective_time(Lookups(est.tables, est.profile, rec), "ep_a2a", "all_to_all", np.array([16.0, 64.0, 32.0]), 1e7,
                    True)
    assert rec.extrapolated["ep_a2a"].tolist() == [False, True, False]
    # folded from distinct tuples back to plans: plan p takes its tuple's mark
    top = Recorder(4, "compose")
    top.fold(rec, np.array([1, 0, 2, 1]))
    assert top.extrapolated["ep_a2a"].tolist() == [True, False, False, True]
