"""The catalogue of well-known models and `scaleplan spec from-hf`.

* Parameter counts computed from each catalogue spec (scaleplan.geometry) against the figures the model's authors
  publish, each with its source and the convention it counts in (which embeddings an "activated" figure includes).
* `spec from-hf` on each family's config.json (tests/data/hf/, written from the public configs: tests/data/hf/SOURCES.md) gives
  the catalogue's spec exactly; a key or a family it does not know is one line naming it, exit 2.
* A catalogue name stands wherever a spec file is accepted.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from scaleplan import catalogue
from scaleplan.geometry import spec_param_counts
from scaleplan.hf_config import spec_from_hf
from scaleplan.specs import parse_spec

HF = Path(__file__).resolve().parents[1] / "data" / "hf"
FAMILIES = sorted(p.stem for p in HF.glob("*.json"))


def _counts(name: str):
    return spec_param_counts(parse_spec(catalogue.spec_data(name)).model)


# What each model's authors publish, where, and which parameters the figure counts. "total": every parameter
# (embeddings included); "active": per token, counting the embeddings the source names: "both" (input embedding and
# LM head), "head" (the LM head but not the input embedding, a lookup); "non-embedding". The 1% rule is the issue's;
# three headline figures printed with one or two digits are our count rounded or cut to those digits, not within 1%
# of it: HEADLINES, each with its deviation and the precise figure where its authors publish one.
CARDS = [
    ("deepseek-v3", "total", 671e9, "huggingface.co/deepseek-ai/DeepSeek-V3 model card and its README_WEIGHTS"),
    ("deepseek-v3", "active:head", 36.7e9, "DeepSeek-V3's README_WEIGHTS: 36.7B activated, which it says includes "
                                           "the 0.9B embedding and the 0.9B head; it adds up with one of the two "
                                           "(ours 36.63B with the head; 37.55B with both, +2.3%)"),
    ("deepseek-v3", "total+mtp", 685e9, "model card: the Hugging Face checkpoint's 685B = 671B main model + 14B MTP "
                                        "module (its 11.5B unique parameters and its stored copies of the embedding "
                                        "and output head)"),
    ("deepseek-v3", "mtp", 11.5e9, "DeepSeek-V3's README_WEIGHTS: MTP module 11.5B unique parameters (without "
                                   "the shared embedding and head)"),
    ("kimi-k2", "active:head", 32e9, "huggingface.co/moonshotai/Kimi-K2-Instruct: 32B activated"),
    ("qwen3-30b-a3b", "total", 30.5e9, "huggingface.co/Qwen/Qwen3-30B-A3B: 30.5B in total"),
    ("qwen3-30b-a3b", "non-embedding", 29.9e9, "huggingface.co/Qwen/Qwen3-30B-A3B: 29.9B non-embedding"),
    ("qwen3-235b-a22b", "total", 235e9, "huggingface.co/Qwen/Qwen3-235B-A22B: 235B in total"),
    ("qwen3-235b-a22b", "active:both", 22e9, "huggingface.co/Qwen/Qwen3-235B-A22B: 22B activated"),
    ("qwen3-235b-a22b", "non-embedding", 234e9, "huggingface.co/Qwen/Qwen3-235B-A22B: 234B non-embedding"),
    ("gpt-oss-120b", "total", 117e9, "openai.com/index/gpt-oss-model-card: 117B total (116.83B in its table)"),
    ("gpt-oss-120b", "active:head", 5.1e9, "gpt-oss model card: 5.1B active (5.13B in its table, counting the "
                                           "unembedding but not the embedding)"),
    ("gpt-oss-20b", "total", 21e9, "gpt-oss model card: 21B total (20.91B in its table)"),
    ("gpt-oss-20b", "active:head", 3.6e9, "gpt-oss model card: 3.6B active (3.61B in its table)"),
    ("mixtral-8x7b", "total", 46.7e9, "mistral.ai/news/mixtral-of-experts, arXiv 2401.04088: 46.7B total"),
    ("mixtral-8x7b", "active:both", 12.9e9, "same: 12.9B used per token"),
    ("mixtral-8x22b", "total", 141e9, "mistral.ai/news/mixtral-8x22b: 141B parameters"),
    ("mixtral-8x22b", "active:both", 39e9, "same: 39B active"),
    ("olmoe-1b-7b", "total", 6.9e9, "arXiv 2409.02060 (OLMoE): 6.9B total"),
]
HEADLINES = [  # (name, kind, card figure, the unit of its last printed digit, rounded or cut, source)
    ("deepseek-v3", "active:head", 37e9, 1e9, "rounded", "model card headline: 37B activated (ours 36.63B, -1.0%; "
                                                         "README_WEIGHTS's 36.7B is within 0.2%, CARDS)"),
    ("kimi-k2", "total", 1e12, 1e12, "cut", "Kimi-K2 model card: 1T total (ours 1.026T, +2.6%; arXiv 2507.20534 "
                                            "gives 1.04T, -1.3%)"),
    ("qwen3-30b-a3b", "active:both", 3.3e9, 1e8, "cut", "Qwen3-30B-A3B model card: 3.3B activated (ours 3.35B, "
                                                        "+1.6%)"),
]


def _ours(name: str, kind: str) -> float:
    p = _counts(name)
    return {"total": p.n_tot + p.embedding, "active:both": p.n_act + p.embedding,
            "active:head": p.n_act + p.vocab_matrix, "non-embedding": p.n_tot, "mtp": p.mtp,
            "total+mtp": p.n_tot + p.embedding + p.mtp + 2 * p.vocab_matrix}[kind]


@pytest.mark.parametrize("name,kind,card,source", CARDS, ids=[f"{c[0]} {c[1]} {c[2]:.4g}" for c in CARDS])
def test_parameter_counts_match_the_cards(name, kind, card, source):
    assert abs(_ours(name, kind) / card - 1) <= 0.01


@pytest.mark.parametrize("name,kind,card,unit,how,source", HEADLINES, ids=[f"{t[0]} {t[1]}" for t in HEADLINES])
def test_headline_figures_are_our_counts_to_their_digits(name, kind, card, unit, how, source):
    ours = _ours(name, kind)
    shown = round(ours / unit) * unit if how == "rounded" else ours // unit * unit
    assert shown == pytest.approx(card) and abs(ours / card - 1) > 0.01


def test_the_paper_models_count_what_the_validation_file_states(validation_dir):
    """models.yaml's comments: 0.7B / 15.5B, 5.4B / 127B, 18B / 434B non-embedding (active / total), and the
    validation README's N for the logged MFU (every active parameter with both embeddings)."""
    for name, act, tot, mfu_n in (("moe-700m", 0.7e9, 15.5e9, 1.8269e9), ("moe-5p4b", 5.4e9, 127e9, 6.4239e9),
                                  ("moe-18b", 18e9, 434e9, 20.983e9)):
        p = _counts(name)
        assert abs(p.n_tot / tot - 1) < 0.01 and abs(p.n_act / act - 1) < 0.12, name
        # the README's N leaves out the router and the head-wise gate
        m = parse_spec(catalogue.spec_data(name)).model
        router = (m.n_layers - 1) * m.moe.n_experts * m.hidden_sz
        assert abs((p.n_act + p.embedding - router - m.n_layers * m.hidden_sz * m.n_q_heads) / mfu_n - 1) < 1e-3


@pytest.mark.parametrize("name", FAMILIES)
def test_from_hf_gives_the_catalogue_spec(name):
    doc = spec_from_hf(json.loads((HF / f"{name}.json").read_text()), name)
    assert doc == catalogue.spec_data(name)


def test_every_catalogue_entry_names_its_sources():
    for n in catalogue.names():
        e = catalogue.entry(n)
        assert set(e["sources"]) == {"architecture", "parameters", "run"} and all(e["sources"].values()), n
        parse_spec(e["spec"], source=n)
    required = {"deepseek-v3", "kimi-k2", "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-20b", "gpt-oss-120b",
                "mixtral-8x7b", "mixtral-8x22b", "moe-700m", "moe-5p4b", "moe-18b"}
    assert required <= set(catalogue.names())
    assert catalogue.resolve("DeepSeek-AI/DeepSeek-V3") == "deepseek-v3" and catalogue.resolve("gpt-5") is None


def test_from_hf_cli_on_a_file_and_a_model_directory(run, tmp_path):
    code, out, err = run("spec", "from-hf", HF / "gpt-oss-120b.json")
    assert code == 0, err
    assert yaml.safe_load(out) == catalogue.spec_data("gpt-oss-120b")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text((HF / "deepseek-v3.json").read_text())
    code, out, err = run("spec", "from-hf", tmp_path / "model", "-o", tmp_path / "ds.yaml", "--seqlen", "8192")
    assert code == 0, err
    doc = yaml.safe_load((tmp_path / "ds.yaml").read_text())
    assert doc["model"] == catalogue.spec_data("deepseek-v3")["model"] and doc["data"]["seqlen"] == 8192


@pytest.mark.parametrize("edit,field,says", [
    ({"n_group_limit": 4}, "n_group_limit", "unknown key"),
    ({"model_type": "llama"}, "model_type", "one of deepseek_v3"),
    ({"hidden_act": "gelu"}, "hidden_act", "'silu'"),
    ({"moe_layer_freq": 2}, "moe_layer_freq", "one of 1"),
    ({"qk_rope_head_dim": 63}, "model.mla.qk_rope_head_dim", "an even width"),
    ({"scoring_func": "softmax"}, "model.moe.expert_bias", "sigmoid"),
])
def test_from_hf_refuses_what_it_does_not_know_in_one_line(run, tmp_path, edit, field, says):
    cfg = {**json.loads((HF / "deepseek-v3.json").read_text()), **edit}
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg))
    code, out, err = run("spec", "from-hf", f)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert field in err and says in err, err


def test_a_catalogue_name_stands_for_a_spec_file(run, tmp_path):
    code, out, err = run("estimate", "Qwen3-30B-A3B", "--devices", "64", "--layout", "tp=2,pp=2,ep=8", "--json")
    assert code == 0, err
    est = json.loads(out)[0]
    assert est["feasible"] and est["geometry"]["n_layers"] == 48
    # a file of that name wins over the catalogue
    (tmp_path / "mixtral-8x7b").write_text(yaml.safe_dump(catalogue.spec_data("moe-700m")))
    code, out, err = run("estimate", tmp_path / "mixtral-8x7b", "--devices", "32", "--layout", "ep=8", "--json")
    assert code == 0 and json.loads(out)[0]["geometry"]["n_layers"] == 16, err
    code, out, err = run("estimate", "no-such-model", "--devices", "8")
    assert code == 2 and "catalogue model name" in err


def test_spec_list_and_show(run_json, run):
    rows = {r["name"]: r for r in run_json("spec", "list")["models"]}
    assert set(rows) == set(catalogue.names())
    p = _counts("deepseek-v3")
    assert rows["deepseek-v3"]["n_tot"] == p.n_tot and rows["deepseek-v3"]["mtp"] == p.mtp > 0
    code, out, err = run("spec", "show", "gpt-oss-20b")
    assert code == 0 and "openai.com" in out and yaml.safe_load(out) == catalogue.spec_data("gpt-oss-20b")
    code, out, err = run("spec", "show", "gpt-5")
    assert code == 2 and "deepseek-v3" in err
