"""What-if questions on an emitted spec, one memory headroom rule, the small things
(a misspelt YAML key named, --db in a missing folder refused, G printed rounded, help on --max-*)."""
from __future__ import annotations

import pytest
import yaml

from scaleplan.errors import SpecError
from scaleplan.specs import parse_spec

from .conftest import SMALL_SEARCH, SPEC


@pytest.fixture()
def emitted(recorded_db, run_json, tmp_path):
    """A spec written by `search --emit-spec` on 4 nodes (32 devices): it fixes parallelism.dp."""
    path = tmp_path / "plan.yaml"
    out = run_json(*SMALL_SEARCH, "--db", recorded_db, "--emit-spec", path)
    doc = yaml.safe_load(path.read_text())
    assert doc["parallelism"]["dp"] == out["best"]["layout"]["dp"] and doc["search"]["num_devices"] == 32
    return path, out["best"]


def test_estimate_emitted_spec_on_other_device_counts(emitted, run_json, recorded_db):
    path, best = emitted
    lay = best["layout"]
    mesh = lay["tp"] * lay["cp"] * lay["pp"]
    res = run_json("estimate", path, "--devices", 128, "--db", recorded_db)
    # dp is derived from --devices; every other degree is the spec's
    assert res[0]["layout"] == {**lay, "dp": 128 // mesh}
    res = run_json("estimate", path, "--layout", "pp=2", "--db", recorded_db)
    assert res[0]["layout"]["pp"] == 2 and res[0]["layout"]["dp"] == 32 // (lay["tp"] * lay["cp"] * 2)
    assert res[0]["layout"]["ep"] == lay["ep"] and res[0]["layout"]["mbs"] == lay["mbs"]


def test_estimate_conflicting_dp_names_where_it_came_from(emitted, run, recorded_db):
    path, best = emitted
    code, _, err = run("estimate", path, "--layout", "dp=3", "--db", recorded_db)
    assert code == 2 and "--layout dp: got 3" in err and len(err.strip().splitlines()) == 1
    doc = yaml.safe_load(path.read_text())
    doc["parallelism"]["dp"] = 7
    path.write_text(yaml.safe_dump(doc))
    code, _, err = run("estimate", path, "--db", recorded_db)
    assert code == 2 and f"parallelism.dp in {path}: got 7" in err
    assert "--devices or --layout on the command line derive dp" in err


def test_one_memory_headroom_default(run, spec_file, recorded_db):
    from scaleplan.cli._common import MEM_FRACTION

    for cmd in (["estimate", spec_file], ["layouts", spec_file], ["search", "--profile", "x", "--nodes", "1",
                                                                  "--days", "1"]):
        code, out, _ = run(*cmd, "--help")
        assert code == 0 and f"[default: {MEM_FRACTION}]" in " ".join(out.split())


def test_estimate_applies_the_memory_fraction(run_json, spec_file, recorded_db):
    full = run_json("estimate", spec_file, "--devices", 32, "--layout", "ep=8", "--mem-fraction", 1,
                    "--db", recorded_db)[0]
    assert full["feasible"]
    frac = 0.9 * full["mem_per_device_gb"] / 179.0  # a cap just under what the plan needs
    capped = run_json("estimate", spec_file, "--devices", 32, "--layout", "ep=8", "--mem-fraction", frac,
                      "--db", recorded_db)[0]
    assert not capped["feasible"] and capped["reason"] == "memory"


def test_misspelt_yaml_key_is_named():
    bad = yaml.safe_load(yaml.safe_dump(SPEC))
    bad["model"]["moe"]["n_expert"] = bad["model"]["moe"].pop("n_experts")
    with pytest.raises(SpecError) as e:
        parse_spec(bad)
    assert str(e.value).startswith("model.moe.n_expert: got 128; unknown field")


def test_db_in_a_missing_folder_is_refused(run, tmp_path):
    where = tmp_path / "no_such_dir"
    code, _, err = run("calibrate", "list", "--db", where / "x.db")
    assert code == 2 and "--db" in err and "existing folder" in err and len(err.strip().splitlines()) == 1
    assert not where.exists()


def test_geometry_ratio_printed_rounded():
    from scaleplan.cli.estimate import _cell

    assert _cell(7.7727272727272725) == "7.77" and _cell(4) == "4" and _cell(None) == "-"


def test_max_degree_flags_have_help(run, spec_file):
    code, out, _ = run("layouts", spec_file, "--help")
    text = " ".join(out.split())
    for flag, what in (("--max-tp", "tensor-parallel"), ("--max-pp", "pipeline"), ("--max-ep", "expert-parallel"),
                       ("--max-cp", "context-parallel")):
        assert f"{flag} <int> Largest {what}" in text


def test_memory_line_names_the_worst_stage():
    from types import SimpleNamespace

    from scaleplan.cli.estimate import memory_line

    first = SimpleNamespace(layout={"pp": 4}, mem_breakdown_gb={"weights": 10.0, "logits": 0.0, "reserve": 5.0})
    assert memory_line(first).endswith("first of 4 stages, no LM head so no logits): weights 10.0, reserve 5.0")
    last = SimpleNamespace(layout={"pp": 2}, mem_breakdown_gb={"weights": 10.0, "logits": 3.0})
    assert "last of 2 stages, with the LM head" in memory_line(last) and "logits 3.0" in memory_line(last)
