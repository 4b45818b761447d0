"""bench plan's lookups for a validate run (stack 'reference') ask a GPU profile for the reference model's
host rows ops:* of the checkpoint mode; the default (Megatron) stack does not."""
from __future__ import annotations

import yaml

from tests.bench.test_cli import TINY_SPEC


def test_reference_lookups_include_the_host_rows_on_a_gpu_profile(tmp_path, sqlite_url):
    from scaleplan.bench import plan

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(TINY_SPEC))  # p6-b200.48xlarge, full recompute

    def modes(**kw):
        points, prof = plan.lookups(spec, 2, None, None, sqlite_url, **kw)
        assert prof == "p6-b200.48xlarge"
        return {p["mode"] for p in points["dispatch"]}

    assert {"ops:moe:full", "ops:dense:full", "ops:microbatch:full", "ops:step_moe", "ops:step"} <= modes(
        stack="reference")
    assert not any(m.startswith("ops:") for m in modes())


def test_the_dispatch_chain_point_is_in_the_models_dtype_and_width(tmp_path, sqlite_url):
    """The chain point that measures the dispatch gap runs the model's precision at its hidden width
    (at most 2048, the recorded GPU rows'); an fp32 CPU model is never asked for a bf16 chain at 2048."""
    from scaleplan.bench import plan

    def chain(precision, hidden, node="cpu-local"):
        model = {**TINY_SPEC["model"], "precision": precision, "hidden_sz": hidden, "head_dim": hidden // 4}
        spec = tmp_path / f"{precision}{hidden}.yaml"
        spec.write_text(yaml.safe_dump({**TINY_SPEC, "model": model, "hardware": {"node_type": node}}))
        points, _ = plan.lookups(spec, 2, None, None, sqlite_url, stack="reference")
        return [p for p in points["dispatch"] if p["mode"] == "gemm"]

    assert chain("fp32", 64) == [
        {"mode": "gemm", "m": 8, "n": 64, "k": 64, "dtype": "fp32", "chain_len": 512}]
    assert chain("bf16", 4096, "p6-b200.48xlarge") == [
        {"mode": "gemm", "m": 8, "n": 2048, "k": 2048, "dtype": "bf16", "chain_len": 512}]
    assert chain("fp8", 1024, "p6-b200.48xlarge")[0]["dtype"] == "bf16"  # no plain fp8 matmul chain
