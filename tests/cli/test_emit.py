"""Output you can launch: full geometry in every planner output, --emit-spec round trips,
--emit megatron (mapping documented in docs/megatron.md)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from scaleplan.specs import load_spec, parse_spec

from .conftest import SMALL_SEARCH, SPEC

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _ladder_geometry(q: int, E: int, K: int, G: int) -> dict:
    """The paper's ladder (sec:geometry-ladder), written out: L = n_head = 4q, d = 128 n_head, d_ff = 2.5 d,
    d_expert = d_ff / G, one shared expert of width d_expert, 8 KV heads, V = 257,536."""
    L = 4 * q
    d = 128 * L
    d_ff = int(2.5 * d)
    return {"n_layers": L, "d": d, "d_ff": d_ff, "d_expert": d_ff // G, "n_heads": L, "n_kv_heads": 8,
            "head_dim": 128, "vocab": 257_536, "n_experts": E, "topk": K, "g": G, "d_shared_expert": d_ff // G}


def test_search_rows_carry_full_geometry_and_spec_round_trips(recorded_db, run_json, tmp_path):
    spec_path = tmp_path / "opt.yaml"
    out = run_json(*SMALL_SEARCH, "--db", recorded_db, "--emit-spec", spec_path)
    best = out["best"]
    assert best is not None and out["top"]
    for r in out["top"]:
        want = _ladder_geometry(r["q"], r["n_experts"], r["topk"], r["g"])
        assert {k: r["geometry"][k] for k in want} == want
    # the spec loads unchanged and describes the optimum's model and layout
    spec = load_spec(spec_path)
    m = spec.model
    g = best["geometry"]
    assert (m.n_layers, m.hidden_sz, m.inter_sz, m.n_q_heads, m.n_kv_heads, m.vocab_sz) == \
        (g["n_layers"], g["d"], g["d_ff"], g["n_heads"], g["n_kv_heads"], g["vocab"])
    assert (m.moe.n_experts, m.moe.experts_per_token, m.moe.expert_inter_sz) == \
        (best["n_experts"], best["topk"], m.inter_sz // best["g"])
    lay = best["layout"]
    assert spec.default_layout().model_dump(exclude_none=True) == {**lay, "dp": lay["dp"]}
    assert spec.search.num_devices == 4 * 8 and spec.data.gbs == 1024 and spec.data.seqlen == 2048
    # estimating it gives the search's MFU (same tables, same calibration)
    est = run_json("estimate", spec_path, "--db", recorded_db)
    assert est[0]["mfu"] == pytest.approx(best["mfu"], rel=1e-9)
    assert est[0]["mem_per_device_gb"] == pytest.approx(best["mem_per_device_gb"], rel=1e-9)


def test_layouts_emit_spec_round_trips(recorded_db, run_json, spec_file, tmp_path):
    path = tmp_path / "plan1.yaml"
    out = run_json("layouts", spec_file, "--devices", "32", "--top", "3", "--db", recorded_db, "--emit-spec", path)
    best = out["best"]
    assert best == out["ranked"][0] and best["geometry"] == out["geometry"]
    g = out["geometry"]
    assert (g["n_layers"], g["d"], g["d_ff"], g["d_expert"], g["n_heads"], g["n_kv_heads"], g["head_dim"],
            g["vocab"], g["n_experts"], g["topk"], g["g"], g["d_shared_expert"]) == \
        (16, 2048, 5120, 1280, 16, 16, 128, 257540, 128, 3, 4, 1280)
    emitted = yaml.safe_load(path.read_text())
    assert emitted["model"] == parse_spec(SPEC).model.model_dump(mode="json")
    est = run_json("estimate", path, "--db", recorded_db)
    assert est[0]["layout"] == best["layout"]
    assert est[0]["mfu"] == pytest.approx(best["mfu"], rel=1e-9)


def test_estimate_json_carries_geometry(recorded_db, run_json, spec_file):
    res = run_json("estimate", spec_file, "--devices", "32", "--layout", "ep=8", "--db", recorded_db)
    assert res[0]["geometry"]["d_expert"] == SPEC["model"]["moe"]["expert_inter_sz"]
    assert res[0]["geometry"]["g"] == 5120 // 1280


def _flags(text: str) -> dict[str, list[str]]:
    """Parse the emitted shell text into {flag: [values]} (comment line skipped)."""
    import shlex

    words = shlex.split(" ".join(ln.rstrip("\\") for ln in text.splitlines() if not ln.startswith("#")))
    out: dict[str, list[str]] = {}
    key = None
    for w in words:
        if w.startswith("--"):
            key = w
            out[key] = []
        else:
            out[key].append(w)
    return out


def test_megatron_args_match_the_spec(run, spec_file):
    code, out, err = run("estimate", spec_file, "--devices", "32", "--layout", "tp=2,pp=2,ep=8,mbs=2,vpp=2",
                         "--emit", "megatron")
    assert code == 0, err
    f = _flags(out)
    m = SPEC["model"]
    assert f["--num-layers"] == ["16"] and f["--hidden-size"] == ["2048"] and f["--ffn-hidden-size"] == ["5120"]
    assert f["--num-attention-heads"] == ["16"] and f["--kv-channels"] == ["128"]
    assert "--group-query-attention" not in f  # 16 kv heads = 16 query heads
    assert f["--num-experts"] == ["128"] and f["--moe-router-topk"] == ["3"]
    assert f["--moe-ffn-hidden-size"] == ["1280"] and f["--moe-shared-expert-intermediate-size"] == ["1280"]
    pattern = eval(f["--moe-layer-freq"][0])  # a Python list literal, as Megatron's parser reads it
    assert pattern == [0] + [1] * 15
    assert f["--vocab-size"] == [str(m["vocab_sz"])] and f["--seq-length"] == ["8192"]
    assert f["--tensor-model-parallel-size"] == ["2"] and "--sequence-parallel" in f
    assert f["--pipeline-model-parallel-size"] == ["2"] and f["--expert-model-parallel-size"] == ["8"]
    assert f["--num-layers-per-virtual-pipeline-stage"] == [str(16 // (2 * 2))]
    assert f["--micro-batch-size"] == ["2"] and f["--global-batch-size"] == ["256"]
    assert f["--recompute-granularity"] == ["full"]
    assert f["--optimizer"] == ["adam"] and "--use-distributed-optimizer" in f
    assert out.startswith("# candidate: ") and "\n# 32 GPUs = 4 nodes x 8: torchrun" in out
    assert "# token budget: not given" in out and "--train-samples" not in f


@pytest.mark.parametrize("over", [
    {"model": {"precision": "fp8", "n_kv_heads": 4, "moe": {"capacity_factor": 1.5, "moe_frequency": 2}}},
    {"optimizer": {"optimizer_type": "muon"}, "performance": {"activation_checkpointing_type": "super-selective"}},
    {"model": {"precision": "fp16", "tie_embeddings": True, "attn_gate": False, "rotary_embeds": False}},
])
def test_every_emitted_flag_is_documented(over):
    from scaleplan.emit import megatron_args

    d = yaml.safe_load(yaml.safe_dump(SPEC))
    for block, vals in over.items():
        for k, v in vals.items():
            if isinstance(v, dict):
                d[block][k].update(v)
            else:
                d[block][k] = v
    spec = parse_spec(d)
    doc = (DOCS / "megatron.md").read_text()
    for mode in ("none", "selective", "super-selective", "full"):
        args = megatron_args(spec, {**spec.default_layout().model_dump(), "dp": 8, "tp": 2, "vpp": 2, "pp": 2,
                                    "ckpt": mode})
        for flag in args:
            assert f"`{flag[0]}" in doc or f" {flag[0]}" in doc, flag[0]


def test_emitted_plans_keep_megatrons_unfused_token_permutation():
    """The estimator costs the token permute / unpermute from the router suite's unfused torch index ops
    (estimator/compute.py permute_times), which Megatron-Core runs by default (moe_permute_fusion False):
    an emitted plan must not switch on the fused kernels that timing does not describe."""
    from scaleplan.emit import megatron_args

    spec = parse_spec(yaml.safe_load(yaml.safe_dump(SPEC)))
    for mode in ("none", "selective", "full"):
        for ep in (1, 8):
            args = megatron_args(spec, {**spec.default_layout().model_dump(), "dp": 8, "ep": ep, "ckpt": mode})
            flags = {a[0] for a in args}
            assert "--moe-token-dispatcher-type" in flags or ep == 1, flags  # a MoE plan was emitted
            assert not any("permute" in f for f in flags), flags


def test_moe_layer_pattern_counts_the_geometry_moe_blocks():
    from scaleplan.emit import moe_layer_pattern
    from scaleplan.geometry import moe_layer_count

    for L, first, freq in ((16, 1, 1), (24, 3, 2), (10, 0, 3), (7, 7, 1)):
        m = parse_spec({**SPEC, "model": {**SPEC["model"], "n_layers": L,
                                          "moe": {**SPEC["model"]["moe"], "first_dense_layers": first,
                                                  "moe_frequency": freq}}}).model
        pat = moe_layer_pattern(L, first, freq)
        assert len(pat) == L and sum(pat) == moe_layer_count(m) and not any(pat[:first])


def test_megatron_names_the_nearest_optimizer_for_scion(run, tmp_path):
    """Megatron-LM has no Scion: its nearest, muon, is emitted with a comment saying what differs."""
    p = tmp_path / "scion.yaml"
    p.write_text(yaml.safe_dump({**SPEC, "optimizer": {"optimizer_type": "scion"}}))
    code, out, err = run("estimate", p, "--devices", "32", "--emit", "megatron")
    assert code == 0, err
    f = _flags(out)
    assert f["--optimizer"] == ["muon"] and "--use-distributed-optimizer" in f
    assert "# optimizer scion: Megatron-LM has no Scion; emitted its nearest, muon" in out
    assert "emerging-optimizers" in out


def test_estimate_emits_every_layout_and_refuses_an_infeasible_one(run, spec_file):
    """Several --layout: each gets its own block naming it; a layout the estimator calls infeasible gets a one-line
    refusal with its reason and exit status 2, the feasible ones are still printed."""
    code, out, err = run("estimate", spec_file, "--devices", "32", "--layout", "tp=1,pp=1,ep=8,ckpt=full",
                         "--layout", "tp=2,pp=2,ep=8,ckpt=full", "--layout", "tp=1,pp=1,ep=1,mbs=4,ckpt=none",
                         "--tokens", "2e11", "--emit", "megatron")
    blocks = out.strip().split("\n\n")
    assert [b.splitlines()[0].split(" under ")[1].split(" (")[0] for b in blocks] == \
        ["tp=1,cp=1,pp=1,dp=32,ep=8,etp=1,vpp=1,mbs=1,ckpt=full", "tp=2,cp=1,pp=2,dp=8,ep=8,etp=1,vpp=1,mbs=1,ckpt=full"]
    for b, tp in zip(blocks, ("1", "2")):
        f = _flags(b)
        assert f["--tensor-model-parallel-size"] == [tp]
        assert f["--train-samples"] == [str(-(-int(2e11) // (256 * 8192)) * 256)]
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(errors) == 1 and errors[0].startswith("error: --layout tp=1,cp=1,pp=1,dp=32,ep=1,")
    assert "infeasible (memory:" in err and "GB per GPU" in err


def test_bad_emit_value(run, spec_file):
    code, _, err = run("estimate", spec_file, "--devices", "32", "--emit", "deepspeed")
    assert code == 2 and "--emit" in err and "megatron" in err


def test_emit_spec_unwritable_path(recorded_db, run, spec_file, tmp_path):
    code, _, err = run("layouts", spec_file, "--devices", "32", "--db", recorded_db,
                       "--emit-spec", tmp_path / "missing" / "dir" / "x.yaml")
    assert code == 2 and "--emit-spec" in err and len(err.strip().splitlines()) == 1


def test_spec_doc_lists_every_field_with_its_default():
    """docs/spec.md documents every field of scaleplan.specs.Spec (walked from the pydantic models) with the
    model's own default."""
    from pydantic import BaseModel

    from scaleplan.specs import Spec

    rows = {}
    for line in (DOCS / "spec.md").read_text().splitlines():
        m = re.match(r"\| `([a-z0-9_.]+)` \|[^|]*\|[^|]*\| ([^|]*) \|", line)
        if m:
            rows[m.group(1)] = m.group(2).strip()

    def walk(model, prefix):
        for name, f in model.model_fields.items():
            path = prefix + name
            subs = [a for a in (*getattr(f.annotation, "__args__", ()), f.annotation)
                    if isinstance(a, type) and issubclass(a, BaseModel)]
            if subs:
                if prefix:  # a nested block (model.moe) has its own row
                    assert path in rows, path
                walk(subs[0], path + ".")
                continue
            assert path in rows, f"{path} is not documented in docs/spec.md"
            doc = rows[path]
            if f.is_required():
                assert doc == "required", (path, doc)
            elif f.default is not None:
                want = str(f.default).lower() if isinstance(f.default, bool) else str(f.default)
                assert doc.strip("`") == want, (path, doc, want)

    walk(Spec, "")
