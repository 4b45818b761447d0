"""A fix the command line suggests is run back through the same command and accepted.
The spec is the paper-grid optimum `search --emit-spec` writes (L48 E128 K1 G2, tp 2, ep 128, micro-batch 8 on
256 B200); on 100 devices `estimate` used to suggest --layout pp=25, which it then refused."""
from __future__ import annotations

import re

import pytest
import yaml

PLAN = {
    "model": {"n_layers": 48, "hidden_sz": 6144, "inter_sz": 15360, "n_q_heads": 48, "n_kv_heads": 8,
              "head_dim": 128, "vocab_sz": 257536,
              "moe": {"n_experts": 128, "experts_per_token": 1, "expert_inter_sz": 7680,
                      "shared_expert_inter_sz": 7680, "first_dense_layers": 1}},
    "search": {"num_devices": 256}, "performance": {"activation_checkpointing_type": "full"},
    "optimizer": {"optimizer_type": "adamw"}, "data": {"gbs": 1024, "seqlen": 2048, "microbatch_sz": 8},
    "hardware": {"node_type": "p6-b200.48xlarge"},
    "parallelism": {"tp": 2, "cp": 1, "pp": 1, "dp": 128, "ep": 128, "etp": 1, "vpp": 1},
}


@pytest.mark.parametrize("devices", [100, 192, 36])
def test_every_suggested_fix_is_accepted(devices, run, tmp_path, sqlite_url):
    spec = tmp_path / "plan.yaml"
    spec.write_text(yaml.safe_dump(PLAN))
    code, _, err = run("estimate", spec, "--devices", devices, "--db", sqlite_url)
    assert code == 2 and err.startswith("error: data.gbs"), err
    fixes = re.findall(r"(?:--devices (\d+) )?--layout ([\w=,]+)", err)
    assert fixes, err
    for n, layout in fixes:
        code, out, err2 = run("estimate", spec, "--devices", n or devices, "--layout", layout, "--db", sqlite_url)
        assert code == 0, (layout, err2)
