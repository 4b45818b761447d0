"""bench plan --search: the table points of the search's near-tie set, deduplicated, with who needs them."""
import json
import subprocess
import sys

import pytest

from scaleplan.errors import SpecError
from scaleplan.geometry import ladder_model
from scaleplan.mosaic.table_points import deciding_candidates, deciding_points, read_search

LAY = {"tp": 1, "cp": 1, "pp": 2, "dp": 32, "ep": 8, "mbs": 2, "ckpt": "selective"}


def _cand(q, E, K, G, p):
    return {"q": q, "n_experts": E, "topk": K, "g": G, "layout": dict(LAY), "p_optimal": p}


SEARCH = {"profile": "p6-b200.48xlarge", "n_devices": 64, "best": _cand(8, 32, 2, 4, 0.5),
          "envelope": {"gbs": 512, "seqlen": 4096, "optimizer": "adamw"},
          "near_ties": [_cand(8, 32, 2, 4, 0.5), _cand(10, 128, 1, 8, 0.2)]}


class FakeEst:
    def __init__(self):
        self.calls = []

    def lookups(self, spec, n, layouts):
        self.calls.append((spec, n, layouts))
        e = spec.model.moe.n_experts
        return {"gemm": [{"m": 1, "n": 2, "k": 3}, {"m": e, "n": 2, "k": 3}], "router": [{"e": e}]}


def test_points_deduplicated_with_who_needs_them():
    est = FakeEst()
    got = deciding_points(SEARCH, est)
    assert got["candidates"] == ["q8/E32/K2/G4", "q10/E128/K1/G8"]
    spec, n, layouts = est.calls[1]
    assert spec.model == ladder_model(10, 128, 1, 8) and n == 64
    assert (spec.data.gbs, spec.data.seqlen) == (512, 4096)
    assert (layouts[0].pp, layouts[0].ep, layouts[0].mbs, layouts[0].ckpt) == (2, 8, 2, "selective")
    gemm = got["lookups"]["gemm"]
    assert len(gemm) == 3 and got["counts"] == {"gemm": 3, "router": 2}
    shared = next(p for p in gemm if p["m"] == 1)
    assert shared["needed_by"] == ["q8/E32/K2/G4", "q10/E128/K1/G8"]


def test_without_samples_the_optimum_decides():
    assert deciding_candidates({**SEARCH, "near_ties": []}) == [SEARCH["best"]]
    assert deciding_candidates({**SEARCH, "near_ties": [], "best": None}) == []


def test_bad_search_file(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    with pytest.raises(SpecError):
        read_search(bad)
    with pytest.raises(SpecError):
        read_search(tmp_path / "missing.json")


def test_cli_bench_plan_search_json(tmp_path):
    f = tmp_path / "s.json"
    f.write_text(json.dumps(SEARCH))
    p = subprocess.run([sys.executable, "-c", "from scaleplan.cli import main; main()", "bench", "plan", "--search",
                        str(f), "--db", str(tmp_path / "e.db"), "--json"], capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["candidates"] == ["q8/E32/K2/G4", "q10/E128/K1/G8"] and out["devices"] == 64
    pts = [q for v in out["lookups"].values() for q in v]
    assert pts and all(set(q["needed_by"]) <= set(out["candidates"]) and q["needed_by"] for q in pts)
    assert out["counts"] == {k: len(v) for k, v in out["lookups"].items()}
