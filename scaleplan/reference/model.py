"""The reference MoE decoder built from a spec's ``model`` block (sec:training-setup, sec:train_recipe).

Architecture: token embedding; ``n_layers`` pre-norm blocks; final norm; untied LM head (tied when
the spec says so); next-token cross-entropy on fp32 logits.
  * attention: fused QKV projection with GQA (``n_kv_heads``), RoPE, causal SDPA, and the head-wise
    sigmoid output gate (Qiu et al. 2025): gate = sigmoid(x W_g), W_g in R^{d x n_heads}, multiplies
    each head's SDPA output before the output projection;
  * FFN: the first ``moe.first_dense_layers`` blocks carry a dense SwiGLU of width ``inter_sz``;
    after them every ``moe_frequency``-th block is an MoE layer (the others dense): the router of
    :mod:`scaleplan.reference.router`, E routed SwiGLU experts of width ``expert_inter_sz`` computed
    with the grouped GEMM of :mod:`scaleplan.reference.grouped`, plus one always-on shared expert of
    width ``shared_expert_inter_sz`` (eq:moe-output);
  * norms: LayerNorm with gain 1 and no bias, so the parameter count equals
    :func:`scaleplan.geometry.spec_param_counts` exactly;
  * init: fan-in matrices (QKV, gate, FFN/expert fc1, router, embedding, LM head) N(0, 0.006^2);
    residual-write matrices (attention output, FFN/expert fc2) N(0, (0.006/sqrt(2 L))^2).

Activation checkpointing (``ckpt``): 'none'; 'selective' recomputes the core attention (SDPA and
head gate, Korthikanti et al. 2022); 'super-selective' additionally recomputes the norms and the
SwiGLU activations; 'full' recomputes each whole block in the backward pass.
Aux losses (router z-loss and sequence loss, with their coefficients) are summed into the loss.
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from scaleplan.reference.grouped import grouped_linear, select_impl
from scaleplan.reference.router import Router
from scaleplan.specs import ModelBlock

INIT_STD = 0.006
ROPE_BASE = 10_000.0
TRACE_SCOPES = {"on": False}  # scaleplan.validate.trace switches the sp::<region> profiler scopes on


def scope(region: str):
    """A ``record_function('sp::<region>')`` while tracing (a profiler names each op's region), else nothing."""
    if TRACE_SCOPES["on"]:
        return torch.profiler.record_function(f"sp::{region}")
    return contextlib.nullcontext()


def _ckpt(fn, *args, enabled: bool):
    return checkpoint(fn, *args, use_reentrant=False) if enabled else fn(*args)


def swiglu(h: torch.Tensor) -> torch.Tensor:
    """[.., 2f] -> [.., f]: silu(gate) * up (gate and up fused in one fc1 GEMM)."""
    a, b = h.chunk(2, dim=-1)
    return F.silu(a) * b


def rope_tables(seq_len: int, head_dim: int, device, dtype):
    inv = 1.0 / ROPE_BASE ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    ang = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv)
    return torch.cos(ang).to(dtype), torch.sin(ang).to(dtype)


SDPA_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, S, hd] rotated pairwise (rotate-half convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, m: ModelBlock, recompute_core: bool):
        super().__init__()
        self.nh, self.nkv, self.hd = m.n_q_heads, m.n_kv_heads, m.head_dim
        self.qkv = nn.Linear(m.hidden_sz, (self.nh + 2 * self.nkv) * self.hd, bias=False)
        # head-wise gate (true): one sigmoid per head; element-wise ("element", Megatron-LM's): one per channel
        self.gate_w = self.hd if m.attn_gate == "element" else 1
        self.gate = nn.Linear(m.hidden_sz, self.nh * self.gate_w, bias=False) if m.attn_gate else None
        self.out = nn.Linear(self.nh * self.hd, m.hidden_sz, bias=False)
        self.rope, self.recompute_core = m.rotary_embeds, recompute_core
        self.sdpa_precision = m.sdpa_precision  # SDPA's inputs are cast to it (and its output back)

    def _core(self, q, k, v, x):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.nkv != self.nh).to(x.dtype)
        if self.gate is not None:  # sigmoid gate on each head's (or channel's) SDPA output
            B, S, _ = x.shape
            o = o * torch.sigmoid(self.gate(x)).view(B, S, self.nh, self.gate_w).transpose(1, 2)
        return o

    def forward(self, x: torch.Tensor, cos, sin) -> torch.Tensor:
        with scope("attention"):
            return self._forward(x, cos, sin)

    def _forward(self, x: torch.Tensor, cos, sin) -> torch.Tensor:
        B, S, _ = x.shape
        q, k, v = self.qkv(x).split([self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q = q.view(B, S, self.nh, self.hd).transpose(1, 2)
        k = k.view(B, S, self.nkv, self.hd).transpose(1, 2)
        v = v.view(B, S, self.nkv, self.hd).transpose(1, 2)
        if self.rope:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        sd = SDPA_DTYPES[self.sdpa_precision]
        if sd != x.dtype:  # outside the recomputed core: the cast copies are what SDPA saves either way
            q, k, v = q.to(sd), k.to(sd), v.to(sd)
        o = _ckpt(self._core, q, k, v, x, enabled=self.recompute_core)
        return self.out(o.transpose(1, 2).reshape(B, S, self.nh * self.hd))


class DenseFFN(nn.Module):
    def __init__(self, d: int, width: int, recompute_act: bool):
        super().__init__()
        self.fc1 = nn.Linear(d, 2 * width, bias=False)
        self.fc2 = nn.Linear(width, d, bias=False)
        self.recompute_act = recompute_act
        self.region = "dense_ffn"

    def forward(self, x):
        with scope(self.region):
            return self.fc2(_ckpt(swiglu, self.fc1(x), enabled=self.recompute_act))


class MoEFFN(nn.Module):
    """Router + E routed experts (grouped GEMM) + optional shared expert; returns (y, aux_loss)."""

    def __init__(self, m: ModelBlock, recompute_act: bool):
        super().__init__()
        moe, d = m.moe, m.hidden_sz
        self.E, self.K, self.f = moe.n_experts, moe.experts_per_token, moe.expert_inter_sz
        self.router = Router(d, self.E, self.K)
        self.w1 = nn.Parameter(torch.empty(self.E, d, 2 * self.f))  # fc1: d -> 2 d_expert (GLU)
        self.w2 = nn.Parameter(torch.empty(self.E, self.f, d))  # fc2: d_expert -> d
        self.shared = DenseFFN(d, moe.shared_expert_inter_sz, recompute_act) if moe.shared_expert_inter_sz else None
        if self.shared is not None:
            self.shared.region = "shared_expert"
        self.recompute_act = recompute_act
        self.impl: str | None = None

    def forward(self, x: torch.Tensor):
        B, S, d = x.shape
        x2 = x.reshape(B * S, d)
        with scope("router"):
            idx, gates, aux = self.router(x2, S)
            flat = idx.reshape(-1)
            order = torch.argsort(flat, stable=True)  # permute: rows grouped by expert
            token_of = order // self.K
            counts = torch.bincount(flat, minlength=self.E)
            rows = x2[token_of]
        impl = self.impl or select_impl(x.device, x.dtype)
        with scope("experts"):
            h = grouped_linear(rows, self.w1, counts, impl)
            h = _ckpt(swiglu, h, enabled=self.recompute_act)
            y = grouped_linear(h, self.w2, counts, impl)
        with scope("router"):
            y = y * gates.reshape(-1)[order].unsqueeze(-1).to(y.dtype)
            out = torch.zeros_like(x2).index_add(0, token_of, y)  # unpermute and combine
        if self.shared is not None:
            out = out + self.shared(x2)
        return out.view(B, S, d), aux


class Block(nn.Module):
    def __init__(self, m: ModelBlock, is_moe: bool, ckpt: str):
        super().__init__()
        fine = ckpt == "super-selective"
        self.norm1 = nn.LayerNorm(m.hidden_sz, bias=False)
        self.norm2 = nn.LayerNorm(m.hidden_sz, bias=False)
        self.attn = Attention(m, recompute_core=ckpt in ("selective", "super-selective"))
        self.ffn = MoEFFN(m, fine) if is_moe else DenseFFN(m.hidden_sz, m.inter_sz, fine)
        self.is_moe, self.fine = is_moe, fine

    def forward(self, x, cos, sin):
        x = x + self.attn(_ckpt(self.norm1, x, enabled=self.fine), cos, sin)
        h = _ckpt(self.norm2, x, enabled=self.fine)
        if self.is_moe:
            y, aux = self.ffn(h)
        else:
            y, aux = self.ffn(h), x.new_zeros((), dtype=torch.float32)
        return x + y, aux


def moe_block_flags(m: ModelBlock) -> list[bool]:
    """Which blocks are MoE: after the first dense blocks, every ``moe_frequency``-th one
    (matches :func:`scaleplan.geometry.moe_layer_count`)."""
    if m.moe is None:
        return [False] * m.n_layers
    first, freq = m.moe.first_dense_layers, m.moe.moe_frequency
    return [i >= first and (i - first + 1) % freq == 0 for i in range(m.n_layers)]


class MoEDecoder(nn.Module):
    """The reference model. ``forward(tokens [B, S], labels [B, S]) -> scalar loss`` (CE + aux)."""

    def __init__(self, m: ModelBlock, ckpt: str = "none"):
        super().__init__()
        self.spec, self.ckpt = m, ckpt
        self.embed = nn.Embedding(m.vocab_sz, m.hidden_sz)
        self.blocks = nn.ModuleList(Block(m, f, ckpt) for f in moe_block_flags(m))
        self.norm = nn.LayerNorm(m.hidden_sz, bias=False)
        self.head = None if m.tie_embeddings else nn.Linear(m.hidden_sz, m.vocab_sz, bias=False)
        self.on_stage = None  # callable(name) told 'embed', 'block<i>', 'head' as the forward enters each
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = INIT_STD) -> None:
        out_std = std / math.sqrt(2 * self.spec.n_layers)  # depth-scaled residual writes
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p)  # norm gains
            elif name.endswith(("out.weight", "fc2.weight", ".w2")):
                nn.init.normal_(p, 0.0, out_std)
            else:
                nn.init.normal_(p, 0.0, std)

    def routers(self) -> list[Router]:
        return [b.ffn.router for b in self.blocks if b.is_moe]

    def set_microbatch(self, key: int) -> None:
        for r in self.routers():
            r.mb_key = key

    def _stage(self, name: str) -> None:
        if self.on_stage is not None:  # a probe (saved-tensor capture, profiler) labels what runs next
            self.on_stage(name)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        S = tokens.shape[1]
        self._stage("embed")
        x = self.embed(tokens)
        cos, sin = rope_tables(S, self.spec.head_dim, x.device, x.dtype) if self.spec.rotary_embeds else (None, None)
        aux_total = x.new_zeros((), dtype=torch.float32)
        for i, blk in enumerate(self.blocks):
            self._stage(f"block{i}")
            x, aux = _ckpt(blk, x, cos, sin, enabled=self.ckpt == "full")
            aux_total = aux_total + aux
        self._stage("head")
        with scope("head"):
            x = self.norm(x)
            w = self.embed.weight if self.head is None else self.head.weight
            logits = (x @ w.t()).float()  # fp32 upcast for the cross-entropy
            ce = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.reshape(-1))
        return ce + aux_total


def build_model(m: ModelBlock, ckpt: str, device: torch.device | str, dtype: torch.dtype) -> MoEDecoder:
    """Build, initialise and cast the model; routers stay fp32 (the fp32 router island)."""
    model = MoEDecoder(m, ckpt).to(device=device, dtype=dtype)
    for r in model.routers():
        r.float()
    return model
