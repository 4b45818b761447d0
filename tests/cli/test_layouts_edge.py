"""`layouts` and the search agree on the search's own spec. The spec is the paper-grid optimum
(micro-batch 8, which the search reached by extending its 1,2,4 once); `layouts` tried 1,2,4 only and ranked a
micro-batch-4 plan first at a lower MFU than the spec's own layout, without saying the edge was hit."""
from __future__ import annotations

import yaml

from .test_suggest import PLAN


def test_layouts_reaches_the_searchs_plan_and_says_the_edge(run, run_json, recorded_db, tmp_path):
    spec = tmp_path / "plan.yaml"
    spec.write_text(yaml.safe_dump(PLAN))
    own = run_json("estimate", spec, "--db", recorded_db)[0]  # the spec's own layout: micro-batch 8
    assert own["layout"]["mbs"] == 8
    doc = run_json("layouts", spec, "--top", "3", "--db", recorded_db)
    assert doc["best"]["mfu"] >= own["mfu"] - 1e-12, (doc["best"]["layout"], doc["best"]["mfu"], own["mfu"])
    e = doc["edges"]
    assert e["extended"] == ["mbs"] and e["found"][0]["value"] == 4 and e["found"][0]["extend_with"] == 8
    assert e["before"]["mfu"] < e["after"]["mfu"] == doc["best"]["mfu"]
    code, out, err = run("layouts", spec, "--top", "3", "--db", recorded_db)
    assert code == 0, err
    text = " ".join(out.split())
    assert "edge: plan #1 used the largest micro-batch tried (mbs 4" in text
    if e["still"]:  # plan #1 at the extended edge too: said, with the flag that goes further
        assert "pass --mbs with values beyond 8" in text
