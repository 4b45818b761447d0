"""scaleplan plan's draws widen with the plan's distance from what was measured, as the search's do: a point whose
plan lies beyond the platform's observed runs (the published B200 sweeps) draws its MFU with sigma_c =
sqrt(sigma^2 (1 + D_perf) + sigma_evidence^2), D_perf its doublings beyond the runs' range, so its days band is
wider than a point inside it; the JSON carries the flags and the distances."""
from __future__ import annotations

import math

import numpy as np
import pytest
import yaml

from scaleplan.mosaic.goodput import Goodput
from scaleplan.mosaic.law import PAPER_JOINT_LAW
from scaleplan.mosaic.plan import PlanRequest, run_plan
from scaleplan.mosaic.run import SearchRequest
from scaleplan.mosaic.uncertainty import make_draws

B200 = "p6-b200.48xlarge"
DRAWS = 400
pytestmark = pytest.mark.recorded


def _doublings(v: float, lo: float, hi: float) -> float:
    return max(math.log2(v / hi), math.log2(lo / v), 0.0)


def test_a_point_far_from_the_observed_runs_draws_a_wider_days_band(runtime_fitted_db, validation_dir, tmp_path):
    db, _ = runtime_fitted_db
    spec = yaml.safe_load((validation_dir / "models.yaml").read_text())["moe-700m"]  # a measured model
    spec["data"]["gbs"] = 256
    path = tmp_path / "m700.yaml"
    path.write_text(yaml.safe_dump(spec))
    s = SearchRequest(profile=B200, nodes=(1,), days=(1.0,), q=(8,), experts=(16,), topk=(1,), g=(1,),
                      samples=DRAWS, workers=1, db_url=db, progress=False, extend_edges=False)
    out = run_plan(PlanRequest(search=s, spec=path, tokens=1e11, platforms=(B200,), nodes={B200: (8, 64)},
                               goodput=Goodput(fixed=1.0))).out
    pl = out["platforms"][0]
    ranges, sigma = pl["evidence"]["observed_runs"]["ranges"], pl["evidence"]["mfu_error"]["sigma"]
    assert pl["evidence"]["observed_runs"]["n"] == 24
    z = make_draws(DRAWS, None, 0.0, 1, 0, PAPER_JOINT_LAW).z[:, 0]
    widths = {}
    for p in pl["points"]:
        b, lay = p["plan"], p["plan"]["layout"]
        feats = {"mfu_plan": b["mfu"], "ep_nodes": max(1, lay["ep"] * lay["etp"] // 8), "mbs": lay["mbs"],
                 "pp": lay["pp"], "n_act": b["n_act"]}  # EP ranks contiguous (ETP apart), 8 GPUs a node
        dist = sum(_doublings(v, *ranges[k]) for k, v in feats.items())
        assert b["perf_doublings"] == pytest.approx(dist)
        sig = math.sqrt(sigma ** 2 * (1 + dist) + b["evidence_sigma"] ** 2)
        assert p["mfu_sigma"] == pytest.approx(sig)
        days_k = p["days"] / np.exp(sig * z)  # a fixed model: its window over each draw's MFU factor
        lo, hi = np.percentile(days_k, [5, 95], method="inverted_cdf")
        assert (p["days_p05"], p["days_p95"]) == pytest.approx((lo, hi), rel=1e-9)
        widths[p["nodes"]] = (dist, math.log(p["days_p95"] / p["days_p05"]), b["beyond"])
    (d_near, w_near, f_near), (d_far, w_far, f_far) = widths[8], widths[64]
    assert d_near == 0 and f_near == [] and d_far > 0 and f_far  # 512 GPUs: EP over more nodes than any run
    assert w_far > w_near * 1.2
