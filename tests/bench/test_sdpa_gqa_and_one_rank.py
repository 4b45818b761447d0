"""GQA attention runs natively (enable_gqa) or with K/V expanded in the timed graph, the
row naming the method; the collectives suite refuses a one-rank world before anything starts."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import yaml
from scaleplan.bench import runner
from scaleplan.bench.config import TimingCfg, parse_preset
from scaleplan.bench.suites import collectives, sdpa
from sqlalchemy import func, select
from torch.nn.attention import SDPBackend

from scaleplan import cli
from scaleplan.db import models as m
from scaleplan.db.session import session_scope
from scaleplan.errors import SpecError

from .conftest import FAST_TIMING, tiny_preset

GQA = {"seq_len": 16, "micro_bs": 1, "n_q_heads": 4, "n_kv_heads": 2, "head_dim": 8, "causal": True,
       "dtype": "fp32"}


def _ctx():
    return runner.make_context(torch.device("cpu"), "cpu-local", TimingCfg(**FAST_TIMING), 0.5)


@pytest.mark.parametrize("backend", ["math", "flash"])
def test_gqa_runs_natively_on_cpu_backends(backend):
    row = runner.measure_point(sdpa, {**GQA, "backend": backend}, _ctx())
    assert row["status"] == "OK" and row["note"].startswith("method=enable_gqa"), row
    mha = runner.measure_point(sdpa, {**GQA, "n_kv_heads": 4, "backend": backend}, _ctx())
    assert mha["status"] == "OK" and mha["note"].startswith("method=native")


def _leaves(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, h, 16, 8, generator=g).requires_grad_() for h in (4, 2, 2)]


def test_refused_enable_gqa_falls_back_to_expanded_kv_with_the_same_gradients(monkeypatch):
    real = F.scaled_dot_product_attention

    def refuses_gqa(q, k, v, **kw):
        if kw.get("enable_gqa"):
            raise RuntimeError("No available kernel. Aborting execution.")
        return real(q, k, v, **kw)

    q, k, v = _leaves()
    dy = torch.randn(1, 4, 16, 8, generator=torch.Generator().manual_seed(9))
    ref = real(q, k, v, is_causal=True, enable_gqa=True)  # torch's own GQA, the reference
    ref.backward(dy)
    ref_grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    monkeypatch.setattr(sdpa.F, "scaled_dot_product_attention", refuses_gqa)
    fwd, note, leaves = sdpa.torch_attention({**GQA, "backend": "math"}, q, k, v, SDPBackend.MATH)
    assert note.startswith("method=expand_kv") and "No available kernel" in note
    assert leaves == [q, k, v]  # the K/V leaves keep their GQA shape: the reduction is timed too
    out = fwd()
    out.backward(dy)
    torch.testing.assert_close(out, ref)
    for x, g in zip((q, k, v), ref_grads):
        torch.testing.assert_close(x.grad, g)


def test_a_backend_that_cannot_run_the_shape_is_unsupported():
    row = runner.measure_point(sdpa, {**GQA, "backend": "efficient"}, _ctx())  # no CPU kernel either way
    assert row["status"] == "UNSUPPORTED"


ONE_RANK = {"dtypes": ["fp32"], "sizes_bytes": [256], "nproc": 1, "timeout_s": 30}


def test_preflight_refuses_a_one_rank_world():
    with pytest.raises(SpecError, match="suites.collectives.nproc: got 1; .*at least 2 ranks"):
        collectives.preflight(collectives.Config(**ONE_RANK), torch.device("cpu"))
    collectives.preflight(collectives.Config(**{**ONE_RANK, "nproc": 2}), torch.device("cpu"))


def _n_runs(url):
    with session_scope(url) as s:
        return s.scalar(select(func.count()).select_from(m.BenchRun))


def test_suite_named_alone_is_refused_before_any_run(sqlite_url):
    preset = parse_preset(tiny_preset({"collectives": ONE_RANK}))
    with pytest.raises(SpecError, match="at least 2 ranks"):
        runner.run_preset(preset, sqlite_url, suites=["collectives"], device="cpu")
    assert _n_runs(sqlite_url) == 0


def test_whole_preset_skips_collectives_with_one_line_and_runs_the_rest(sqlite_url):
    events = []
    suites = {"gemm": {"dtypes": ["fp32"], "m": [8], "n": [8], "k": [8]}, "collectives": ONE_RANK}
    res = runner.run_preset(parse_preset(tiny_preset(suites)), sqlite_url, device="cpu",
                            on_event=lambda kind, info: events.append((kind, info)))
    assert [r.suite for r in res] == ["gemm"] and _n_runs(sqlite_url) == 1
    skipped = [i for k, i in events if k == "error" and i["suite"] == "collectives"]
    assert len(skipped) == 1 and "at least 2 ranks" in skipped[0]["message"]


def test_cli_exit_2_one_line(tmp_path, sqlite_url, capsys):
    preset = tmp_path / "one.yaml"
    preset.write_text(yaml.safe_dump(tiny_preset({"collectives": ONE_RANK})))
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "run", "--preset", str(preset), "--suite", "collectives", "--db", sqlite_url,
                  "--device", "cpu"])
    err = capsys.readouterr()
    assert exc.value.code == 2
    assert len(err.err.strip().splitlines()) == 1 and "at least 2 ranks" in err.err and err.out == ""
