"""The iteration-time equation as a record: t_analytic (eq:cal-iter before chi_sys) is the explicit
sum of named terms, each computed from its own physics (sec:iteration-time-model). Arrays over plans;
seconds per iteration.

The 1F1B wall of the pipelined part is n_mb p + R / VPP (:func:`pipeline.pipeline_time`): p the
pacing stage's period per micro-batch, R = (PP - 1) p the fill and drain (every ramp slot a pacing
period: :mod:`pipeline`). It splits into

* the **layers' compute** of the stage with the most layer work (``t_cmp``), one term per block
  component (attention projections, SDPA, routed experts, router, permutation, shared expert, the
  EP all-to-all wire time the shared expert leaves exposed, dense MLP, element-wise, framework
  kernels, TP and CP collectives), forward + backward + the checkpoint mode's recompute, x n_mb;
* the **dispatch floor**: what the host adds to that stage's period beyond its GPU time,
  n_mb (q - t_cmp), q the slowest vocabulary-free period (max(GPU, host) + exposed all-to-all);
* the **bubble**: the fill and drain at the vocabulary-free pacing period, (PP - 1) q / VPP:
  eq:bubble's f_bubble n_mb q;
* the **vocabulary**: what the embedding (first stage), the LM head and the loss (last stage) add
  to the pipelined wall, (n_mb + (PP - 1) / VPP) (p - q) (the paper's t_vocab with its ramp term;
  with one stage: n_mb (t_first + t_last) wherever the GPU paces);

then the PP send/recv, the exposed DP traffic, the expert-bias all-reduce and the optimizer step.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike
from scaleplan.estimator.ckpt import recompute

if TYPE_CHECKING:
    from scaleplan.estimator.kernels import LayerKernels


@dataclass(frozen=True)
class IterationTime:
    """Seconds per iteration of each term of t_analytic (arrays over plans); :attr:`total` is their sum.

    The layer terms are the slowest stage's (most layer work), fwd + bwd + recompute, x n_mb; the MoE
    terms are zero for a dense model. Field order is the order of the breakdown users see.
    """

    attn_proj: np.ndarray          # QKV (+ head gate) and output projections
    sdpa: np.ndarray               # core attention on the local heads, 1/CP of the causal work
    experts: np.ndarray            # routed experts' grouped GEMMs and their activation
    router: np.ndarray             # router GEMM + top-k
    permute: np.ndarray            # token permute + unpermute
    shared_expert: np.ndarray      # shared expert MLP (overlaps the all-to-all)
    ep_a2a: np.ndarray             # EP all-to-all wire time the shared expert does not cover
    dense_mlp: np.ndarray          # the dense blocks' MLP
    elementwise: np.ndarray        # norms, residual adds, RoPE, head gate
    framework_kernels: np.ndarray  # kernels the dispatch law counts but no table costs
    tp_comm: np.ndarray            # TP all-gathers + reduce-scatters (sequence parallel)
    cp_comm: np.ndarray            # CP key/value exchange the attention does not cover
    dispatch_floor: np.ndarray     # host launch time beyond the pacing stage's GPU time
    bubble: np.ndarray             # 1F1B fill + drain, PP - 1 pacing periods (vocabulary-free)
    vocab: np.ndarray              # embedding, LM head and loss, as they lengthen the pipelined wall
    pp_p2p: np.ndarray             # PP send/recv of activations and their gradients
    dp_comm: np.ndarray            # exposed DP gradient / parameter collectives
    bias_sync: np.ndarray          # expert-bias token-count all-reduce
    optimizer: np.ndarray          # the slowest stage's optimizer step

    @property
    def total(self) -> np.ndarray:
        """t_analytic (seconds, arrays over plans): the sum of every term, in field order."""
        return (self.attn_proj + self.sdpa + self.experts + self.router + self.permute + self.shared_expert
                + self.ep_a2a + self.dense_mlp + self.elementwise + self.framework_kernels + self.tp_comm
                + self.cp_comm + self.dispatch_floor + self.bubble + self.vocab + self.pp_p2p + self.dp_comm
                + self.bias_sync + self.optimizer)

    def as_dict(self) -> dict[str, np.ndarray]:
        """{term: seconds per iteration}, in field order (the breakdown of the CLI, JSON and reports)."""
        return {f: getattr(self, f) for f in TERMS}


TERMS = tuple(f.name for f in fields(IterationTime))
#: the terms of the layers' compute on the slowest stage (their sum is n_mb t_cmp)
LAYER_TERMS = TERMS[:TERMS.index("dispatch_floor")]


def layer_terms(k: LayerKernels, fw: ArrayLike, n_mb: ArrayLike, L_stage: ArrayLike, n_moe: ArrayLike,
                ckpt: np.ndarray, is_moe: bool, overlap: bool = True, modules: Iterable[str] | None = None,
                mla: bool = False) -> dict[str, np.ndarray]:
    """The slowest stage's layer compute per iteration, one term per block component (seconds; the
    keys of :data:`LAYER_TERMS`). ``k``: :class:`kernels.LayerKernels`; ``fw``: one layer's framework
    kernels (fwd + bwd + recompute); ``L_stage``: layers on the stage; ``n_moe``: its MoE layers (the
    rest are dense); ``ckpt``: mode codes; ``overlap``, ``modules``, ``mla``: as
    :func:`~scaleplan.estimator.stages.layer_totals`. Each layer costs
    forward + backward + what the mode recomputes (:mod:`ckpt`), as the stage time of the model does,
    so the terms add up to n_mb t_cmp without rescaling."""
    r = recompute(ckpt, modules)
    rc, rs, rp = r.block, r.sdpa, r.pointwise
    zero = np.zeros(np.shape(ckpt))
    out = {"attn_proj": n_mb * L_stage * (k.attn_f * (1 + rc) + r.mla_up * k.mla_up_f + k.attn_b),
           "sdpa": n_mb * L_stage * (k.sd_f * (1 + rs) + k.sd_b)}
    n_d = L_stage - n_moe if is_moe else L_stage
    if is_moe:
        rm = rc + r.moe  # the whole MoE block re-run, by full recompute or the moe module
        a2a_f, a2a_b = (np.maximum(k.a2a_f - k.sh_f, 0), np.maximum(k.a2a_b - k.sh_b, 0)) if overlap else \
            (k.a2a_f, k.a2a_b)
        out["experts"] = n_mb * n_moe * (k.ex_f * (1 + rm) + r.act * k.act_f + k.ex_b)
        out["router"] = n_mb * n_moe * ((k.rg_f + k.tk_f) * (1 + rm) + k.rg_b + k.tk_b)
        out["permute"] = n_mb * n_moe * (k.perm * (1 + rp + r.moe) + k.perm_b)
        out["shared_expert"] = n_mb * n_moe * (k.sh_f * (1 + rm + r.shared) + k.sh_b)
        out["ep_a2a"] = n_mb * n_moe * (a2a_f * (1 + rm) + a2a_b)
    else:
        out.update(dict.fromkeys(("experts", "router", "permute", "shared_expert", "ep_a2a"), zero))
    out["dense_mlp"] = n_mb * n_d * (k.dense_f * (1 + rc + r.mlp) + k.dense_b)
    # the separate norms a layernorm module re-runs: a MoE block's pre-MLP norm, and MLA's input norm in every block
    norms = r.norm * (n_moe * float(is_moe) + float(mla) * L_stage) * k.norm_f
    out["elementwise"] = n_mb * L_stage * (k.ew_f * (1 + rp) + k.ew_b) + n_mb * norms
    out["framework_kernels"] = n_mb * L_stage * fw
    out["tp_comm"] = n_mb * L_stage * (k.tp_f * (1 + rc) + k.tp_b)
    out["cp_comm"] = n_mb * L_stage * (k.cp_f * (1 + rc) + k.cp_b)
    return out
