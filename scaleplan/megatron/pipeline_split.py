"""The first and last pipeline stage's layers of a Megatron-LM run, in each of the forms Megatron-LM states them.

A run's argument dump states an uneven split in one of four ways (megatron/training/arguments.py validate_args and
megatron-core's TransformerConfig refuse any two together):

* ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``: read as they are (log.py);
* ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``: the embedding and the
  loss each count as one layer, every stage holds M = (L + e + l) / PP, the first stage M - e decoder layers and
  the last M - l (megatron-core transformer_block.get_num_layers_to_build);
* ``--pipeline-model-parallel-layout``: one ``|``-separated chunk per pipeline rank and virtual stage (chunk k on
  rank k mod PP), each a string of E (embedding), t (decoder layer), m (MTP layer) and L (loss), with ``(...)*n``
  and ``x*n`` repeats and cosmetic commas (megatron-core PipelineParallelLayerLayout);
* a HybridModel's ``--hybrid-layer-pattern`` with ``|`` segments (hybrid.py).

:func:`stated_split` returns the (first, last) decoder layers scaleplan's layout states (0, 0 for the even split), or
refuses in one line a layout scaleplan's stage model (first, equal middle stages, last; the embedding on the first
stage, the loss and MTP layers on the last) does not describe.
"""
from __future__ import annotations

import re
from typing import Any

from scaleplan.errors import SpecError
from scaleplan.estimator.shapes import accounting_split
from scaleplan.megatron.hybrid import read_pattern, split_of_segments

LAYOUT_FIELD = "pipeline_model_parallel_layout"
_REPEAT_GROUP = re.compile(r"\(([^()]+)\)\*(\d+)")
_REPEAT_ONE = re.compile(r"(.)\*(\d+)")


def layout_chunks(text: str, where: str) -> list[str]:
    """The chunks of a --pipeline-model-parallel-layout string, repeats expanded (one pass of groups, then single
    symbols, as megatron-core's parse_str_to_list). Raises SpecError on a symbol other than E, t, m, L."""
    s = _REPEAT_ONE.sub(lambda m: m[1] * int(m[2]), _REPEAT_GROUP.sub(lambda m: m[1] * int(m[2]),
                                                                        text.replace(",", "")))
    bad = sorted(set(s) - set("Etm|L"))
    if bad:
        raise SpecError(f"{where}: {LAYOUT_FIELD}", text, f"chunks of E, t, m, L split by '|' (not {''.join(bad)})")
    return s.split("|")


def split_of_layout(text: str, pp: int, n_layers: int, mtp: int, where: str) -> tuple[int, int]:
    """(first, last) decoder layers a --pipeline-model-parallel-layout string states ((0, 0): even). Raises
    SpecError (one line) where Megatron-Core refuses it (chunks not a multiple of PP, the embedding not first, the
    loss not last, decoder or MTP layer counts differing from the run's) or scaleplan's stage model cannot state
    it (MTP layers off the last chunk of the last stage, middle stages of differing layer counts)."""
    chunks, field = layout_chunks(text, where), f"{where}: {LAYOUT_FIELD}"
    flat = "".join(chunks)
    if len(chunks) % pp:
        raise SpecError(field, text, f"a number of chunks ({len(chunks)}) that is a multiple of PP {pp}")
    if flat.count("E") != 1 or not flat.startswith("E") or flat.count("L") != 1 or not flat.endswith("L"):
        raise SpecError(field, text, "one E opening the first chunk and one L closing the last")
    if flat.count("t") != n_layers or flat.count("m") != mtp:
        raise SpecError(field, text, f"{n_layers} decoder layers (t) and {mtp} MTP layers (m)")
    if mtp and chunks[-1].count("m") != mtp:
        raise SpecError(field, text, "the MTP layers in the last chunk (scaleplan costs them on the last stage)")
    return split_of_segments([c.count("t") for c in chunks], pp, where, LAYOUT_FIELD)


def layout_string(pp: int, vpp: int, stage_layers: list[int], mtp: int) -> str:
    """The --pipeline-model-parallel-layout string of ``stage_layers`` decoder layers on each of ``pp`` stages (the
    first to the last), each stage's spread over its ``vpp`` chunks as evenly as they go (the earlier chunks one
    more), chunk k on stage k mod pp; the embedding opens the first chunk, the ``mtp`` MTP layers and the loss close
    the last. What Megatron-LM runs for a split its first / last stage counts cannot state (layers no multiple of
    VPP: DeepSeek-V3's 8 + 6 x 8 + 5 at VP 2)."""
    per = [[n // vpp + (v < n % vpp) for v in range(vpp)] for n in stage_layers]
    chunks = [("t" if n == 1 else f"t*{n}") if n else "" for n in (per[k % pp][k // pp] for k in range(pp * vpp))]
    chunks[0], chunks[-1] = "E" + chunks[0], chunks[-1] + "m" * mtp + "L"
    return "|".join(chunks)


def split_of_accounting(n_layers: int, pp: int, emb: bool, loss: bool, where: str) -> tuple[int, int]:
    """(first, last) decoder layers of --account-for-embedding/loss-in-pipeline-split ((0, 0) when neither is set
    or PP is 1). Raises SpecError where L + e + l is no multiple of PP (Megatron-Core's own refusal)."""
    if not (emb or loss) or pp == 1:
        return 0, 0
    ok, first, last = accounting_split(n_layers, pp, 1, int(emb), int(loss))
    if not ok:
        raise SpecError(f"{where}: account_for_embedding/loss_in_pipeline_split", n_layers + int(emb) + int(loss),
                        f"num_layers + the embedding and loss counted a multiple of PP {pp}")
    return int(first), int(last)


def stated_split(a: dict[str, Any], pp: int, where: str) -> tuple[int, int]:
    """(first, last) decoder layers an argument dump ``a`` states by a hybrid pattern, a pipeline layout string or
    the accounting flags ((0, 0) when by none of them: the decoder-first/last arguments or the even split)."""
    def given(key: str) -> Any:
        v = a.get(key)
        return None if v in (None, "None", False, "False") else v

    if given("hybrid_layer_pattern") is not None:
        return split_of_segments(read_pattern(str(a["hybrid_layer_pattern"]), where)["segments"], pp, where)
    L = int(a["num_layers"])
    if given(LAYOUT_FIELD) is not None:
        return split_of_layout(str(a[LAYOUT_FIELD]), pp, L, int(given("mtp_num_layers") or 0), where)
    return split_of_accounting(L, pp, bool(given("account_for_embedding_in_pipeline_split")),
                               bool(given("account_for_loss_in_pipeline_split")), where)
