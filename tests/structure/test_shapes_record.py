"""One plan, derived once (docs/architecture.md): the per-rank shapes (local experts E / EP, tokens per rank
seqlen B_micro / CP, micro-batches G / (DP B_micro), layers and MoE layers per stage L / PP) are computed in
estimator/shapes.py and nowhere else in the package. A division of a model size by a parallel degree
anywhere else fails this test: read the shapes record (``PlanShapes``, ``stage_counts``, ``layout_shapes``)."""
from __future__ import annotations

import ast
from pathlib import Path

from .test_sizes import PACKAGE

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = PACKAGE  # every folder pyproject maps into the package (test_sizes checks the list), migrations aside
HOME = ROOT / "estimator" / "shapes.py"
# model sizes a per-rank shape divides, and the parallel degrees it divides them by
# (ours, and Megatron-LM's argument names, which the emitters and log readers use)
SIZES = {"E", "n_experts", "num_moe_experts", "num_experts", "L", "n_layers", "num_layers", "n_moe", "seqlen",
         "seq_len", "seq_length", "gbs", "global_batch_size"}
DEGREES = {"ep", "pp", "cp", "dp", "vpp", "mbs", "virtual_stages", "ep_size", "expert_model_parallel_size",
           "pipeline_model_parallel_size", "context_parallel_size", "data_parallel_size", "micro_batch_size",
           "virtual_pipeline_model_parallel_size", "num_virtual_stages_per_pipeline_rank"}


def _names(node: ast.AST) -> set[str]:
    """The names, attributes and constant subscripts (``lo["pp"]``) an expression mentions."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str):
            out.add(n.slice.value)
    return out


def per_rank_divisions(path: Path) -> list[str]:
    """``"file:line expression"`` for every division (/ or //) of a model size by a parallel degree."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.FloorDiv)):
            if _names(node.left) & SIZES and _names(node.right) & DEGREES:
                out.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return out


def test_per_rank_shapes_are_computed_in_the_shapes_record_only():
    files = [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py")) if p != HOME]
    assert len(files) > 100
    assert [hit for p in files for hit in per_rank_divisions(p)] == []


def test_the_shapes_record_computes_them():
    # the check sees the record's own divisions (so it would see a copy of them elsewhere)
    hits = " ".join(per_rank_divisions(HOME))
    for expr in ("g.E / lay.ep", "seqlen * mbs / cp", "gbs / (dp * mbs)", "L // (pp * vpp)"):
        assert expr in hits, expr


def test_the_checker_finds_the_copies_the_record_replaced(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("a = g.E / (ep * int(layout.get('etp', 1)))\nb = g.n_moe / lay.pp\nc = gbs // (dp * layout.mbs)\n"
                 "d = m.n_layers // (lo['pp'] * lo['vpp'])\ne = seqlen * mbs / cp\n"
                 "f = args.num_moe_experts // args.expert_model_parallel_size\n"
                 "ok = g.dexp / lay.etp + T / tp + n_moe * e_loc\n")
    found = [h.split(" ", 1)[1] for h in per_rank_divisions(f)]
    assert found == ["g.E / (ep * int(layout.get('etp', 1)))", "g.n_moe / lay.pp", "gbs // (dp * layout.mbs)",
                     "m.n_layers // (lo['pp'] * lo['vpp'])", "seqlen * mbs / cp",
                     "args.num_moe_experts // args.expert_model_parallel_size"]
