"""The reference tool's own example configs (dmlc/ScalePlan, ../shared/recorded/dmlc-scaleplan/configs,
read at test time) load unchanged and estimate: its fields are mapped or reported as ignored with the reason, the
device count is tp*cp*pp*dp when the file gives dp, and a batch no layout of the spec divides is named with a
layout that does."""
from __future__ import annotations

import json

import pytest
import yaml

# (config, N_dev the file names: search.num_devices or tp*cp*pp*dp, fields reported as ignored)
CONFIGS = [
    ("18b_p6_actual.yaml", 512, ()),
    ("700m-config.yaml", 32, ()),
    ("96m-config.yaml", 32, ()),
    ("config-5p3b.yaml", 1 * 2 * 1 * 256, ("zero_level=0", "n_param_buckets=8")),
    ("config-p5.yaml", 1 * 8 * 4 * 64, ("zero_level=1", "n_param_buckets=8")),
    ("config-p6-search-test.yaml", 1 * 4 * 4 * 32, ("zero_level=1", "n_param_buckets=5")),
    ("config-p6.yaml", 2 * 16 * 1 * 8, ("zero_level=1", "n_param_buckets=8")),
    ("llama3_70b.yaml", 8 * 2 * 1 * 64, ("zero_level=1", "n_param_buckets=5")),
    ("moe_s4_search_e32_nc16-5120.yaml", 8 * 4 * 1 * 4, ("zero_level=1", "n_param_buckets=8")),
    ("qwen3_235b.yaml", 8 * 2 * 1 * 32, ("zero_level=1", "n_param_buckets=8")),
    # attention wider than the residual stream: 64 x 64 heads on d 2880 (Megatron-LM's --kv-channels)
    ("gpt_oss_120b.yaml", 1 * 6 * 1 * 128, ("zero_level=1", "n_param_buckets=5")),
]


@pytest.mark.parametrize("name,n_dev,ignored", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_reference_config_estimates_unchanged(recorded_dir, recorded_db, run, name, n_dev, ignored):
    from scaleplan.specs import load_spec

    path = recorded_dir / "configs" / name
    spec = load_spec(path)
    assert spec.device_count() == n_dev
    code, out, err = run("estimate", path, "--db", recorded_db, "--json")
    assert code == 0, err
    res = json.loads(out)
    lo = res[0]["layout"]
    assert lo["tp"] * lo["cp"] * lo["pp"] * lo["dp"] == n_dev
    par = yaml.safe_load(path.read_text()).get("parallelism") or {}
    assert {k: lo[k] for k in ("tp", "cp", "pp", "ep") if k in par} == {k: par[k] for k in ("tp", "cp", "pp", "ep")
                                                                         if k in par}
    notes = [ln for ln in err.splitlines() if ln.startswith("note: ") and " ignored: " in ln]
    assert [n.split("parallelism.")[1].split(" ")[0] for n in notes] == list(ignored)


def test_a_batch_no_layout_of_the_spec_divides_names_one_that_does(recorded_dir, recorded_db, run):
    """5p3b_p6_actual.yaml: gbs 96 on 512 devices with the all-ones layout (dp 512). The error names data.gbs and
    a --layout whose dp divides 96 (pp=16: dp 32), checked against every layout rule; that layout then estimates."""
    path = recorded_dir / "configs" / "5p3b_p6_actual.yaml"
    code, _, err = run("estimate", path, "--db", recorded_db)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("error: data.gbs: got 96;") and "--layout pp=16 fits" in err
    code, out, err = run("estimate", path, "--db", recorded_db, "--layout", "pp=16,ep=8", "--json")
    assert code == 0, err
    assert json.loads(out)[0]["layout"]["dp"] == 32


def test_sp_false_with_tp_is_reported(tmp_path):
    from scaleplan.specs import parse_spec

    doc = {"model": {"n_layers": 2, "hidden_sz": 256, "inter_sz": 512, "n_q_heads": 2, "n_kv_heads": 2,
                     "head_dim": 128, "vocab_sz": 1000},
           "parallelism": {"tp": 2, "dp": 4, "sp": False}}
    spec = parse_spec(doc)
    assert spec.device_count() == 8
    assert spec.ignored() == [("parallelism.sp=false ignored: sequence parallelism runs whenever tp > 1 "
                               "(Megatron-LM needs it with MoE and TP; the model assumes it)")]
    assert parse_spec({**doc, "parallelism": {"tp": 1, "sp": False}}).ignored() == []
