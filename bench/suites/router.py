"""MoE routing kernels, forward and backward, over (num_tokens, num_experts, k) (paper
sec:microbenchmarks, "MoE top-k routing"; Algorithm alg:routing; eq:gumbel-corr).

Variants (the ``variant`` column):
- ``topk``: ``torch.topk`` of a [T, E] score matrix alone (hidden = 0: it never sees d).
- ``router``: logits = H W_r^T (H [T, d], W_r [E, d]), sigmoid scores, top-k, gates renormalised
  over the selected set.
- ``gumbel``: Algorithm alg:routing: row-normalised router weights (norm c_r), sigmoid clean
  scores s', bias-added scores s = s' + phi, per-expert-centred Gumbel noise, proposal
  C = Top-M(log s' + tau g) with M = min(rho K, E), correction Top-K of s within C, gates
  s'/sum over the selected set, per-expert token counts n. Defaults tau = 0.01, rho = 12 (the
  paper's runs).
- ``permute``: tokens [T, d] gathered into expert order (stable sort of the [T, k] expert ids);
  backward is the scatter-add of the gradient.
- ``unpermute``: expert outputs [T*k, d] scaled by their gates and summed back per token.
Times in seconds; bwd_s is the backward pass alone. Expert ids for permute/unpermute are uniform
random (balanced in expectation).
"""

from __future__ import annotations

import torch
from scaleplan.bench import harness as h
from scaleplan.bench.config import SuiteConfig, explicit_points, grid

from scaleplan.db import models as m

NAME = "router"
TABLE = m.RouterPoint
KEY = ("variant", "num_tokens", "num_experts", "k", "hidden", "dtype")
VARIANTS = ("topk", "router", "gumbel", "permute", "unpermute")


class Config(SuiteConfig):
    dtypes: list[str] = ["bf16"]
    variants: list[str] = list(VARIANTS)
    num_tokens: list[int] = [4096]
    num_experts: list[int] = [64]
    k: list[int] = [4]
    hidden: list[int] = [2048]
    tau: float = 0.01
    rho: int = 12
    c_r: float = 1.0


def expand(cfg: Config, ctx: h.Context) -> list[dict]:
    ctx.extra["router_cfg"] = {"tau": cfg.tau, "rho": cfg.rho, "c_r": cfg.c_r}
    if cfg.points is not None:
        return explicit_points(cfg.points, KEY, NAME)
    pts = grid(
        variant=cfg.variants,
        num_tokens=cfg.num_tokens,
        num_experts=cfg.num_experts,
        k=cfg.k,
        hidden=cfg.hidden,
        dtype=cfg.dtypes,
    )
    seen, out = set(), []
    for p in pts:
        if p["variant"] == "topk":
            p["hidden"] = 0
        key = tuple(p[k] for k in KEY)
        if p["k"] <= p["num_experts"] and key not in seen:
            seen.add(key)
            out.append(p)
    return out


def gumbel_route(
    hs: torch.Tensor, w_r: torch.Tensor, phi: torch.Tensor, k: int, tau: float, rho: int, c_r: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Algorithm alg:routing for H [T, d]: returns (top-k expert ids [T, k], gates [T, k] summing
    to 1 per token, per-expert token counts [E])."""
    n_exp = w_r.shape[0]
    w_n = w_r * (c_r / w_r.norm(dim=1, keepdim=True))
    clean = torch.sigmoid(hs @ w_n.t())  # s'
    biased = clean + phi  # s, selection only
    u = torch.rand_like(clean, dtype=torch.float32).clamp_(1e-20, 1.0)
    g = -torch.log(-torch.log(u))
    g = g - g.mean(dim=0, keepdim=True)  # per-expert centring over the tokens
    m_prop = min(rho * k, n_exp)
    proposal = torch.topk(torch.log(clean.float()) + tau * g, m_prop, dim=-1).indices  # C_t
    pick = torch.topk(biased.detach().gather(1, proposal), k, dim=-1).indices
    top = proposal.gather(1, pick)  # T_K
    sel = clean.gather(1, top)
    gates = sel / sel.sum(dim=-1, keepdim=True)
    counts = torch.bincount(top.flatten(), minlength=n_exp)
    return top, gates, counts


def _closures(p: dict, dt: torch.dtype, ctx: h.Context):
    """(forward closure returning the tensor to backprop, its grad shape, leaf tensors)."""
    t, e, k, d, dev = p["num_tokens"], p["num_experts"], p["k"], p["hidden"], ctx.device
    rc = ctx.extra.get("router_cfg", {"tau": 0.01, "rho": 12, "c_r": 1.0})
    v = p["variant"]
    if v == "topk":
        s = h.randn((t, e), dt, dev, grad=True)
        return (lambda: torch.topk(s, k, dim=-1).values), (t, k), [s]
    if v in ("router", "gumbel"):
        hs = h.randn((t, d), dt, dev, grad=True)
        w = h.randn((e, d), dt, dev, scale=d**-0.5, grad=True)
        if v == "router":

            def router():
                vals = torch.topk(torch.sigmoid(hs @ w.t()), k, dim=-1).values
                return vals / vals.sum(dim=-1, keepdim=True)

            return router, (t, k), [hs, w]
        phi = torch.zeros(e, dtype=dt, device=dev)
        return (lambda: gumbel_route(hs, w, phi, k, rc["tau"], rc["rho"], rc["c_r"])[1]), (t, k), [hs, w]
    ids = torch.randint(0, e, (t, k), device=dev)
    order = torch.sort(ids.flatten(), stable=True).indices
    if v == "permute":
        x = h.randn((t, d), dt, dev, grad=True)

        def permute():
            idx = torch.sort(ids.flatten(), stable=True).indices
            torch.bincount(ids.flatten(), minlength=e)  # tokens per expert, as frameworks compute here
            return x.index_select(0, idx // k)

        return permute, (t * k, d), [x]
    if v == "unpermute":
        y = h.randn((t * k, d), dt, dev, grad=True)
        gates = torch.rand((t, k), dtype=dt, device=dev).requires_grad_()
        tok = order // k

        def unpermute():
            scaled = y * gates.flatten().index_select(0, order).unsqueeze(1)
            return torch.zeros((t, d), dtype=dt, device=dev).index_add(0, tok, scaled)

        return unpermute, (t, d), [y, gates]
    raise h.Unsupported(f"unknown router variant {v!r}")


def measure(p: dict, ctx: h.Context) -> dict:
    dt = h.torch_dtype(p["dtype"], ctx)
    if p["dtype"] in ("fp8", "tf32"):
        raise h.Unsupported(f"routing is benchmarked in bf16/fp16/fp32, not {p['dtype']}")
    t, e, k, d = p["num_tokens"], p["num_experts"], p["k"], max(p["hidden"], 1)
    h.check_memory(ctx, 4 * (6 * t * e + 4 * t * k * d + e * d))
    fwd, gshape, leaves = _closures(p, dt, ctx)
    f, b = h.time_fwd_bwd(fwd, leaves, torch.randn(gshape, dtype=dt, device=ctx.device), ctx)
    return dict(fwd_s=f.median, bwd_s=b.median, n_rep=f.n)
