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
