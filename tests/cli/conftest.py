"""In-process CLI runs (scaleplan.cli.main) for the launchable-output and provenance tests."""
from __future__ import annotations

import json

import pytest
import yaml

# the 700M validation model (models.yaml moe-700m), AdamW
SPEC = {
    "model": {"n_layers": 16, "hidden_sz": 2048, "inter_sz": 5120, "n_q_heads": 16, "n_kv_heads": 16,
              "head_dim": 128, "vocab_sz": 257540, "tie_embeddings": False,
              "moe": {"n_experts": 128, "experts_per_token": 3, "expert_inter_sz": 1280,
                      "shared_expert_inter_sz": 1280}},
    "performance": {"activation_checkpointing_type": "full"},
    "optimizer": {"optimizer_type": "adamw"},
    "data": {"seqlen": 8192, "gbs": 256},
    "hardware": {"node_type": "p6-b200.48xlarge"},
}
# a small MOSAIC grid with feasible candidates on 4 B200 nodes for 10 days (seconds, one worker)
SMALL_SEARCH = ["search", "--profile", "p6-b200.48xlarge", "--nodes", "4", "--days", "10", "--q", "8",
                "--experts", "32,64", "--topk", "1,2", "--g", "1,2", "--samples", "0", "--workers", "1"]


@pytest.fixture()
def run(capsys):
    """run(*argv) -> (exit code, stdout, stderr) of one in-process CLI call."""
    from scaleplan.cli import main

    def _run(*argv):
        capsys.readouterr()
        try:
            main([str(a) for a in argv])
            code = 0
        except SystemExit as e:
            code = e.code or 0
        out = capsys.readouterr()
        return code, out.out, out.err

    return _run


@pytest.fixture()
def run_json(run):
    def _run(*argv):
        code, out, err = run(*argv, "--json")
        assert code == 0, err
        return json.loads(out)

    return _run


@pytest.fixture()
def spec_file(tmp_path):
    p = tmp_path / "moe.yaml"
    p.write_text(yaml.safe_dump(SPEC))
    return p
