"""Megatron-LM's newest model class, HybridModel (``pretrain_hybrid.py``), whose ``--hybrid-layer-pattern`` states
the layer order: both directions.

The grammar (megatron/core/models/hybrid/hybrid_layer_allocation.py, Megatron-LM main after core_v0.19.0): one
symbol per layer, ``*`` attention, ``+`` multi-latent attention, ``-`` dense MLP, ``E`` MoE (``M`` Mamba, ``G``
gated delta net and ``D`` DeepSeek sparse attention are layer families a spec does not describe); ``|`` ends a
pipeline segment (segment k runs on pipeline rank k mod PP as virtual stage k div PP, so PP x VPP segments in the
model's layer order); ``/`` starts a multi-token-prediction pattern, repeated once per MTP depth. Separators are not
layers. One GPT block is two hybrid layers: its attention, then its MLP or MoE. Layer numbers (1-based) count every
hybrid layer, so a per-layer list such as --window-attn-skip-freq runs over the hybrid layers.

Never imports torch.
"""
from __future__ import annotations

from scaleplan.errors import SpecError
from scaleplan.estimator.shapes import accounted_ends, stage_split
from scaleplan.geometry import is_moe_block
from scaleplan.specs import ModelBlock

ATTENTION, MLA, MLP, MOE, PIPE, MTP = "*", "+", "-", "E", "|", "/"
_OTHER = {"M": "Mamba", "G": "gated delta net", "D": "DeepSeek sparse attention"}


def even_segments(n_layers: int, pp: int, vpp: int) -> list[int]:
    """GPT blocks per pipeline segment (PP x VPP of them, in layer order) when they split evenly. Raises SpecError
    naming the layout when they do not (uneven stages state their own counts: :func:`stage_segments`)."""
    return stage_segments(n_layers, pp, vpp)


def stage_segments(n_layers: int, pp: int, vpp: int, first: int | None = None, last: int | None = None) -> list[int]:
    """GPT blocks per pipeline segment, PP x VPP of them in layer order (segment k = virtual stage k div PP of
    pipeline rank k mod PP), as Megatron-Core's get_num_layers_to_build splits them: the first and the last stage
    hold ``first`` / ``last`` blocks where given, the other stages the rest evenly, each stage's blocks split evenly
    over its VPP chunks; an end stage one block short of the middle ones and no multiple of VPP holds it in its
    outer chunk (Megatron-LM's --account-for-embedding/loss-in-pipeline-split). Raises SpecError naming the layout
    when the counts do not divide so."""
    inner = pp - (first is not None) - (last is not None)
    rest = n_layers - (first or 0) - (last or 0)
    if pp == 1:
        first = last = None
        inner, rest = 1, n_layers
    if rest < 0 or (inner > 0 and rest % inner) or (inner == 0 and rest):
        raise SpecError("layout", f"pp={pp} first={first} last={last}", f"stage layer counts adding up to "
                        f"n_layers={n_layers} with the middle stages holding equal counts")
    F, M, Ls = (int(x) for x in stage_split(n_layers, pp, first or 0, last or 0))  # the estimator's own split
    per = [F] + [M] * (pp - 2) + [Ls] if pp > 1 else [n_layers]
    emb, loss = (bool(x) for x in accounted_ends(n_layers, pp, vpp, first or 0, last or 0))
    if emb or loss:  # the accounting flags' split: every chunk (F + emb) / VPP layers, one fewer at either end
        chunk = (F + emb) // vpp
        segs = [chunk] * (pp * vpp)
        segs[0] -= emb
        segs[-1] -= loss
        return segs
    if any(n % vpp for n in per):
        raise SpecError("layout", f"vpp={vpp}", f"a virtual-stage count dividing every stage's layers {per}")
    return [per[r] // vpp for v in range(vpp) for r in range(pp)]


def block_symbols(m: ModelBlock, i: int) -> str:
    """The two hybrid layers of GPT block ``i``."""
    return (MLA if m.mla is not None else ATTENTION) + (MOE if is_moe_block(m, i) else MLP)


def hybrid_pattern(m: ModelBlock, segments: list[int]) -> str:
    """--hybrid-layer-pattern of ``m`` split into pipeline segments of ``segments`` GPT blocks each (one segment:
    no ``|``), with its MTP layers after ``/`` (each a block of the last block's kind)."""
    if sum(segments) != m.n_layers:
        raise SpecError("layout", segments, f"segment layer counts adding up to n_layers={m.n_layers}")
    parts, i = [], 0
    for n in segments:
        parts.append("".join(block_symbols(m, j) for j in range(i, i + n)))
        i += n
    tail = "".join(MTP + block_symbols(m, m.n_layers - 1) for _ in range(m.mtp_layers))
    return PIPE.join(parts) + tail


def hybrid_window_list(m: ModelBlock) -> str | None:
    """--window-attn-skip-freq over the hybrid layers (1 at a windowed attention layer), or None when every
    attention layer slides (Megatron-LM's default with a window)."""
    w = m.sliding_window
    if w is None:
        return None
    per = [w.pattern[i % len(w.pattern)] == "S" for i in range(m.n_layers)]
    if all(per):
        return None
    return "[" + ",".join(f"{int(x)},0" for x in per) + "]"


def read_pattern(text: str, where: str) -> dict:
    """What a --hybrid-layer-pattern says of the model: ``blocks`` (the GPT blocks' MLP kinds, True = MoE),
    ``mla``, ``mtp_layers``, ``segments`` (GPT blocks per pipeline segment). Raises SpecError (one line) for a
    symbol a spec does not describe, an attention not followed by its MLP, or MTP depths that differ."""
    main, *mtp = text.split(MTP)
    if any(p != mtp[0] for p in mtp):
        raise SpecError(f"{where}: hybrid_layer_pattern", text, "identical MTP patterns after each '/'")
    for ch in text:
        if ch in _OTHER:
            raise SpecError(f"{where}: hybrid_layer_pattern", ch, f"attention and MLP/MoE layers ({_OTHER[ch]} "
                            "layers are not modelled)")
        if ch not in (ATTENTION, MLA, MLP, MOE, PIPE, MTP):
            raise SpecError(f"{where}: hybrid_layer_pattern", ch, "one of * + - E | /")
    segments, blocks, attn = [], [], set()
    for seg in main.split(PIPE):
        if len(seg) % 2 or any(seg[k] not in (ATTENTION, MLA) or seg[k + 1] not in (MLP, MOE)
                               for k in range(0, len(seg), 2)):
            raise SpecError(f"{where}: hybrid_layer_pattern", seg, "pairs of an attention (* or +) followed by its "
                            "MLP (- or E): one GPT block each")
        segments.append(len(seg) // 2)
        blocks += [seg[k + 1] == MOE for k in range(0, len(seg), 2)]
        attn |= set(seg[0::2])
    if len(attn) > 1:
        raise SpecError(f"{where}: hybrid_layer_pattern", text, "one attention kind (* or +) throughout")
    return {"blocks": blocks, "mla": attn == {MLA}, "mtp_layers": len(mtp) if mtp and mtp[0] else 0,
            "segments": segments}


def split_of_segments(segments: list[int], pp: int, where: str,
                      field: str = "hybrid_layer_pattern") -> tuple[int, int]:
    """(first, last) stage layers a pattern's ``|`` segments (or a pipeline layout's chunks) state ((0, 0) for an
    even split): stage r holds the segments k with k mod PP = r. Raises SpecError (one line, naming ``field``) when
    the segments do not number PP x VPP or the middle stages differ (what Megatron-Core's uneven split cannot
    state)."""
    if len(segments) == 1 or pp == 1:
        return 0, 0
    if len(segments) % pp:
        raise SpecError(f"{where}: {field}", f"{len(segments)} segments", f"a multiple of PP {pp}")
    stages = [sum(segments[k] for k in range(r, len(segments), pp)) for r in range(pp)]
    middle = set(stages[1:-1])
    if len(middle) > 1:
        raise SpecError(f"{where}: {field}", stages, "equal middle stages (uneven first/last only)")
    # an uneven split states both end stages (as scaleplan's own split does); an even one neither
    return (0, 0) if len(set(stages)) == 1 else (stages[0], stages[-1])


def block_window_list(hybrid_list: list, n_blocks: int) -> list[int]:
    """A hybrid run's --window-attn-skip-freq list read at each GPT block's attention layer (positions 0, 2, ...)."""
    return [int(hybrid_list[2 * i]) for i in range(n_blocks)]
