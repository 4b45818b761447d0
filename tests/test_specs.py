"""Spec validation: good specs load; each kind of mistake names its field path."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from scaleplan.errors import SpecError
from scaleplan.specs import Degrees, Layout, ParallelismBlock, parse_layout, parse_spec

GOOD = {
    "model": {"n_layers": 48, "hidden_sz": 6144, "inter_sz": 15360, "n_q_heads": 48, "n_kv_heads": 8,
              "head_dim": 128, "vocab_sz": 257536, "precision": "bf16",
              "moe": {"n_experts": 128, "experts_per_token": 3, "expert_inter_sz": 3840}},
    "search": {"num_devices": 512},
    "performance": {"activation_checkpointing_type": "full"},
    "optimizer": {"optimizer_type": "muon"},
    "data": {"gbs": 8192, "seqlen": 8192, "microbatch_sz": 2},
    "hardware": {"node_type": "p6-b200.48xlarge"},
    "parallelism": {"tp": 1, "ep": 8, "pp": 16},
}


def with_change(path: str, value):
    d = copy.deepcopy(GOOD)
    *parents, leaf = path.split(".")
    node = d
    for p in parents:
        node = node[p]
    node[leaf] = value
    return d


def test_paper_listing_loads_and_gives_its_layout():
    spec = parse_spec(GOOD)
    lay = spec.default_layout()
    assert (lay.tp, lay.ep, lay.pp, lay.mbs, lay.ckpt) == (1, 8, 16, 2, "full")
    assert lay.dp is None  # derived later from the device count


@pytest.mark.parametrize("par,moe_etp,etp", [
    ({"tp": 4, "ep": 8}, 2, 2),                 # not named in parallelism: the model's expert_tp_degree
    ({"tp": 4, "ep": 8, "etp": None}, 2, 2),    # null, as specs stored before the field had a default
    ({"tp": 4, "ep": 8, "etp": 4}, 2, 4),       # named in parallelism: that value
    ({"tp": 4, "ep": 8}, None, 1),              # neither: ETP 1
])
def test_expert_tp_is_named_once(par, moe_etp, etp):
    """The spec's layout takes ETP from parallelism.etp, else model.moe.expert_tp_degree, else 1; the dumped
    spec parses back to the same layout (stored specs are re-read by calibrate and validate)."""
    moe = {**GOOD["model"]["moe"], **({"expert_tp_degree": moe_etp} if moe_etp else {})}
    spec = parse_spec({**GOOD, "model": {**GOOD["model"], "moe": moe}, "parallelism": par})
    assert spec.default_layout().etp == etp
    assert parse_spec(spec.model_dump(mode="json")).default_layout() == spec.default_layout()
    no_block = parse_spec({k: v for k, v in GOOD.items() if k != "parallelism"} | {"model": spec.model.model_dump()})
    assert no_block.default_layout().etp == (moe_etp or 1)


def test_layout_and_parallelism_block_share_the_degree_fields():
    """One definition of the degrees: both schemas take them, with their bounds and defaults, from Degrees."""
    degrees = Degrees.model_fields
    for schema in (Layout, ParallelismBlock):
        assert {k: repr(schema.model_fields[k]) for k in degrees} == {k: repr(v) for k, v in degrees.items()}
    assert set(Layout.model_fields) - set(degrees) == {"mbs", "ckpt"}


def test_validation_models_yaml_loads(validation_dir):
    models = yaml.safe_load((validation_dir / "models.yaml").read_text())
    for name, data in models.items():
        spec = parse_spec(data)
        assert spec.model.moe is not None, name


@pytest.mark.parametrize("path,value,field,hint", [
    ("model.head_dim", 0, "model.head_dim", "greater than 0"),
    ("model.n_kv_heads", 7, "model", "must divide n_q_heads"),
    ("model.moe.experts_per_token", 129, "model.moe", "<= n_experts"),
    ("model.n_layers", 0, "model.n_layers", "greater than 0"),
    ("model.precision", "int3", "model.precision", "bf16"),
    ("optimizer.optimizer_type", "adagrad", "optimizer.optimizer_type", "adamw"),
    ("performance.activation_checkpointing_type", "partial", "performance.activation_checkpointing_type", "full"),
    ("hardware.node_type", "dgx-9000", "hardware.node_type", "p6-b200.48xlarge"),
    ("model.moe.n_experts", -4, "model.moe.n_experts", "greater than 0"),
])
def test_bad_field_is_named(path, value, field, hint):
    with pytest.raises(SpecError) as ei:
        parse_spec(with_change(path, value))
    msg = str(ei.value)
    assert msg.startswith(field), msg
    assert hint in msg, msg
    assert "\n" not in msg


def test_unknown_field_and_missing_block():
    with pytest.raises(SpecError, match=r"^model\.hidden_size: .*unknown field"):
        parse_spec(with_change("model.hidden_size", 1))
    with pytest.raises(SpecError, match=r"^model: .*required"):
        parse_spec({"data": {"gbs": 8}})


def test_parse_layout_keeps_base_and_rejects_bad_keys():
    lay = parse_layout("tp=2,pp=4,ep=8,mbs=2,ckpt=selective", base=Layout(cp=2))
    assert (lay.tp, lay.cp, lay.pp, lay.ep, lay.mbs, lay.ckpt) == (2, 2, 4, 8, 2, "selective")
    for bad, field in [("tq=2", "--layout"), ("tp=0", "--layout tp"), ("tp=x", "--layout tp"),
                       ("ckpt=some", "--layout ckpt"), ("pp", "--layout")]:
        with pytest.raises(SpecError) as ei:
            parse_layout(bad)
        assert str(ei.value).startswith(field)


@pytest.mark.parametrize("path,value", [
    ("model.n_layers", 1e23), ("model.n_layers", 10**23), ("model.hidden_sz", 2**40),
    ("model.vocab_sz", 10**12), ("model.moe.n_experts", 10**9), ("model.moe.capacity_factor", float("inf")),
    ("model.moe.capacity_factor", float("nan")), ("data.seqlen", 10**15), ("data.gbs", 10**15),
    ("search.num_devices", 10**20), ("parallelism.pp", 10**20),
])
def test_physical_bounds(path, value):
    """Absurd sizes (the issue's `n_layers: 1e23`), inf and NaN are refused naming the field."""
    with pytest.raises(SpecError) as e:
        parse_spec(with_change(path, value))
    assert e.value.field == path


def test_n_layers_1e23_from_yaml():
    """As a user writes it in YAML: `1.0e+23` is a float PyYAML reads as 1e23, an integral value."""
    d = yaml.safe_load(yaml.safe_dump(GOOD).replace("n_layers: 48", "n_layers: 1.0e+23"))
    with pytest.raises(SpecError, match=r"model\.n_layers: got 1e\+23"):
        parse_spec(d)


def test_layout_bounds_are_one_line_spec_errors():
    with pytest.raises(SpecError, match="--layout tp"):
        parse_layout("tp=99999999999999999999")


def test_cli_ckpt_default_names_every_mode():
    from scaleplan.cli._common import CKPT_ALL
    from scaleplan.specs import CKPT_MODES

    assert CKPT_ALL == ",".join(CKPT_MODES)


@pytest.mark.parametrize("path,key,want", [
    (("model",), "hiden_sz", "did you mean 'hidden_sz'?"),
    (("model", "moe"), "n_expert", "did you mean 'n_experts'?"),
    ((), "dta", "did you mean 'data'?"),
    (("data",), "zzz", "the fields here are gbs, microbatch_sz, seqlen"),
])
def test_a_misspelt_key_gets_did_you_mean(path, key, want):
    """A typo'd YAML key is named with the closest field of its block (or the block's fields)."""
    from pathlib import Path

    doc = copy.deepcopy(yaml.safe_load((Path(__file__).parent / "data" / "validate_specs" / "tiny.yaml").read_text()))
    block = doc
    for p in path:
        block = block.setdefault(p, {})
    block[key] = 1
    with pytest.raises(SpecError) as e:
        parse_spec(doc)
    assert str(e.value) == f"{'.'.join((*path, key))}: got 1; unknown field; {want}"


def test_load_yaml_reads_every_document_as_safe_load_does():
    """scaleplan.yamlio.load_yaml (libyaml's parser where PyYAML has it) builds what yaml.safe_load builds from
    every YAML file the project ships or reads (profiles, catalogue, presets, test data, the recorded configs),
    and raises yaml.YAMLError, with the same line, where safe_load does."""
    from scaleplan.yamlio import load_yaml

    root = Path(__file__).resolve().parents[1]
    shared = root.parent / "shared" / "recorded"
    files = [p for d in (root / "cluster_profiles", root / "scaleplan", root / "bench", root / "tests", shared)
             for p in d.rglob("*.y*ml")]
    assert len(files) > 30
    docs = [p.read_text() for p in files]
    broken = ["a: [1, 2\nb: 3\n", "a: 1\n b: 2\nc: {\n", "key: value: other\n", "- a\nb: 1\n"]
    for text in docs:
        try:
            want = yaml.safe_load(text)
        except yaml.YAMLError:
            broken.append(text)  # the test data holds broken documents too
            continue
        assert load_yaml(text) == want, text[:200]
    for text in broken:
        with pytest.raises(yaml.YAMLError) as ours:
            load_yaml(text)
        with pytest.raises(yaml.YAMLError) as theirs:
            yaml.safe_load(text)
        assert ours.value.problem_mark.line == theirs.value.problem_mark.line, text[:200]
