"""Mosaic.plans caches by everything the best plan depends on (devices, gbs, seqlen, optimizer, constraints)."""
from fakes import FakeEstimator
from scaleplan.estimator import PlanConstraints

from scaleplan.mosaic.ladder import LadderGrid
from scaleplan.mosaic.search import Envelope, Mosaic

GRID = LadderGrid(q=(8,), experts=(16, 32), topk=(1, 2), g=(2, 4))


def _mfu(m, gbs, seqlen, opt):
    # depends on every batch input, so a stale cache entry gives a different answer
    return 0.05 + 0.1 * (gbs / 2048) + 0.05 * (seqlen / 4096) + (0.02 if opt == "muon" else 0.0)


def test_plans_recomputed_when_batch_or_optimizer_changes():
    est = FakeEstimator(mfu_fn=_mfu)
    m = Mosaic(est, GRID)
    n = len(m.geoms)
    base = Envelope(nodes=4, days=5)
    variants = [base, Envelope(nodes=4, days=5, gbs=2048), Envelope(nodes=4, days=5, seqlen=4096),
                Envelope(nodes=4, days=5, optimizer="muon")]
    mfus = []
    for env in variants:
        mfus.append(float(m.run(env).table.mfu_plan.iloc[0]))
    assert len(est.calls) == 4 * n
    # each run saw its own inputs, in order
    seen = [c[1:4] for c in est.calls[::n]]
    assert seen == [(1024, 2048, "adamw"), (2048, 2048, "adamw"), (1024, 4096, "adamw"), (1024, 2048, "muon")]
    assert mfus == [_mfu(None, e.gbs, e.seqlen, e.optimizer) for e in variants]
    # same inputs again, other window: served from the cache
    m.run(Envelope(nodes=4, days=9, gbs=2048))
    assert len(est.calls) == 4 * n


def test_plans_recomputed_when_constraints_change():
    est = FakeEstimator(mfu_fn=_mfu)
    m = Mosaic(est, GRID)
    env = Envelope(nodes=4, days=5)
    m.run(env)
    m.constraints = PlanConstraints(mbs=(1,))
    m.run(env)
    assert len(est.calls) == 2 * len(m.geoms)
    assert est.calls[-1][4] == PlanConstraints(mbs=(1,))
