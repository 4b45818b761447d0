"""The paper's sparse-MoE token-choice router (Algorithm alg:routing) and its LFLB bias controller.

Everything here is plain PyTorch on tensors of shape ``[T, d]`` (T tokens of one micro-batch,
flattened over sequences). The router runs in fp32 whatever the model precision (the paper's
"fp32 router precision island", app:training-stack).

Pieces, by paper label:
  * RowNorm(W_r, c_r), logits Theta = H W~_r^T, clean scores s' = sigmoid(Theta) and selection
    scores s = s' + phi (eq:sigmoid-score);
  * Gumbel proposal of M = min(rho K, E) candidates on log s' with temperature tau and per-expert
    noise centred across the batch (eq:gumbel-prop), then the bias-aware top-K inside the
    proposal (eq:gumbel-corr); gates are the clean scores renormalised over the selected set;
  * the RMS-normalised bias update with re-centring (eq:bias-update), once per optimizer step;
  * router z-loss (eq:zloss, coefficient 1e-4) and the DeepSeek-V3 sequence-wise balance loss
    (coefficient 1e-3).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

TAU = 0.01
RHO = 12
MU_B = 1e-3
EPS = 1e-4
C_R = 1.0
Z_LOSS_COEF = 1e-4
SEQ_AUX_COEF = 1e-3
STARVED_FRACTION = 0.05


@dataclass
class RouteOut:
    """Result of :func:`route` for T tokens, E experts, top-K.

    idx: [T, K] int64 selected experts; gates: [T, K] (sum 1 per row, differentiable through s');
    counts: [E] int64 tokens per expert (n of alg:routing); logits: [T, E] fp32 Theta;
    scores: [T, E] fp32 clean sigmoid scores s'; candidates: [T, M] the Gumbel proposal C_t.
    """

    idx: torch.Tensor
    gates: torch.Tensor
    counts: torch.Tensor
    logits: torch.Tensor
    scores: torch.Tensor
    candidates: torch.Tensor


def proposal_size(k: int, n_experts: int, rho: int = RHO) -> int:
    """M = min(rho K, E) (eq:gumbel-corr)."""
    return min(rho * k, n_experts)


def gumbel_noise(shape, device, generator: torch.Generator | None = None) -> torch.Tensor:
    """i.i.d. standard Gumbel(0, 1) samples: -log(Exp(1))."""
    e = torch.empty(shape, device=device, dtype=torch.float32).exponential_(generator=generator)
    return -torch.log(e)


def route(h: torch.Tensor, w_r: torch.Tensor, phi: torch.Tensor, k: int, *, rho: int = RHO,
          tau: float = TAU, c_r: float | None = C_R, center: bool = True, correct: bool = True,
          generator: torch.Generator | None = None) -> RouteOut:
    """Algorithm alg:routing on hidden states ``h`` [T, d] with router weights ``w_r`` [E, d].

    ``phi`` [E] is the LFLB bias (selection only). ``c_r=None`` skips RowNorm. ``center=False``
    keeps the raw Gumbel noise; ``correct=False`` returns the first K of the proposal (ranked by
    the noisy clean score) instead of the bias-aware correction. ``tau=0`` gives the deterministic
    clean top-M proposal.
    """
    T, E = h.shape[0], w_r.shape[0]
    if not 0 < k <= E:
        raise ValueError(f"k={k} must be in [1, E={E}]")
    w = w_r.float()
    if c_r is not None:
        w = c_r * F.normalize(w, dim=-1)  # RowNorm: l2 rows scaled to c_r
    logits = h.float() @ w.t()
    scores = torch.sigmoid(logits)
    m = proposal_size(k, E, rho)
    with torch.no_grad():
        sel = scores + phi.float()  # eq:sigmoid-score, bias for selection only
        prop = F.logsigmoid(logits)  # log s', stable
        if tau > 0:
            g = gumbel_noise((T, E), h.device, generator)
            if center:
                g = g - g.mean(dim=0, keepdim=True)  # per-expert centring across the batch
            prop = prop + tau * g
        cand = prop.topk(m, dim=-1).indices  # eq:gumbel-prop
        if correct:
            pick = sel.gather(1, cand).topk(k, dim=-1).indices  # eq:gumbel-corr
            idx = cand.gather(1, pick)
        else:
            idx = cand[:, :k]
        counts = torch.bincount(idx.reshape(-1), minlength=E)
    chosen = scores.gather(1, idx)
    gates = chosen / chosen.sum(dim=-1, keepdim=True)  # clean scores renormalised, sum 1
    return RouteOut(idx, gates, counts, logits, scores, cand)


@torch.no_grad()
def bias_update(phi: torch.Tensor, counts: torch.Tensor, mu_b: float = MU_B, eps: float = EPS) -> torch.Tensor:
    """eq:bias-update followed by re-centring; returns the new phi (fp32, mean 0).

    u_i = (n_bar - n_i) / sqrt(mean_j (n_bar - n_j)^2 + eps); phi <- phi + mu_b u; phi <- phi - mean(phi).
    """
    n = counts.float()
    v = n.mean() - n
    u = v / torch.sqrt((v * v).mean() + eps)
    new = phi.float() + mu_b * u
    return new - new.mean()


def z_loss(logits: torch.Tensor) -> torch.Tensor:
    """eq:zloss: mean over tokens of (logsumexp_i Theta_ti)^2."""
    return torch.logsumexp(logits.float(), dim=-1).square().mean()


def sequence_aux_loss(scores: torch.Tensor, idx: torch.Tensor, seq_len: int) -> torch.Tensor:
    """DeepSeek-V3 sequence-wise balance loss, unscaled (multiply by its coefficient, 1e-3).

    For each sequence of ``seq_len`` tokens: P_i = mean_t s'_ti / sum_j s'_tj,
    f_i = E / (K T) * #tokens that selected i; loss = sum_i f_i P_i. Averaged over sequences.
    ``scores`` [B*T, E] clean scores, ``idx`` [B*T, K].
    """
    n_tok, E = scores.shape
    K = idx.shape[1]
    B = n_tok // seq_len
    p = (scores / scores.sum(dim=-1, keepdim=True)).view(B, seq_len, E).mean(dim=1)
    hits = torch.zeros(B, E, device=scores.device, dtype=scores.dtype)
    hits.scatter_add_(1, idx.view(B, seq_len * K), torch.ones(B, seq_len * K, device=scores.device,
                                                                   dtype=scores.dtype))
    f = hits * (E / (K * seq_len))
    return (f * p).sum(dim=-1).mean()


def starved_experts(counts: torch.Tensor, k: int, fraction: float = STARVED_FRACTION) -> int:
    """Experts with fewer than ``fraction`` of the uniform share T K / E of a batch (app:train_dynamics)."""
    n = counts.float()
    uniform = n.sum() / n.numel()
    return int((n < fraction * uniform).sum())


class Router(nn.Module):
    """W_r in R^{E x d} with the LFLB bias phi (a buffer, not learned) and its counters.

    ``forward(h [T, d], seq_len)`` returns (idx, gates, aux_loss) where aux_loss already carries the
    coefficients (z-loss 1e-4, sequence loss 1e-3). Token counts are remembered per micro-batch key
    (``self.mb_key``, set by the training loop), so an activation-checkpoint recompute of the same
    micro-batch, which replays the same RNG state, does not count twice. ``update_bias(group)``
    sums the counts over micro-batches (and DP ranks when a process group is initialised),
    applies eq:bias-update once, and clears them.
    """

    def __init__(self, d: int, n_experts: int, k: int, *, tau: float = TAU, rho: int = RHO, mu_b: float = MU_B,
                 eps: float = EPS, c_r: float | None = C_R, z_coef: float = Z_LOSS_COEF,
                 aux_coef: float = SEQ_AUX_COEF):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_experts, d))
        self.register_buffer("phi", torch.zeros(n_experts, dtype=torch.float32))
        self.k, self.tau, self.rho, self.mu_b, self.eps, self.c_r = k, tau, rho, mu_b, eps, c_r
        self.z_coef, self.aux_coef = z_coef, aux_coef
        self.mb_key = 0
        self.counts: dict[int, torch.Tensor] = {}
        self.last_starved = 0

    def forward(self, h: torch.Tensor, seq_len: int):
        out = route(h, self.weight, self.phi, self.k, rho=self.rho, tau=self.tau if self.training else 0.0,
                    c_r=self.c_r)
        if self.training:
            self.counts[self.mb_key] = out.counts
        aux = self.z_coef * z_loss(out.logits) + self.aux_coef * sequence_aux_loss(out.scores, out.idx, seq_len)
        return out.idx, out.gates, aux

    @torch.no_grad()
    def update_bias(self) -> None:
        if not self.counts:
            return
        total = torch.stack(list(self.counts.values())).sum(dim=0)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(total)
        self.last_starved = starved_experts(total, self.k)
        self.phi.copy_(bias_update(self.phi, total, self.mu_b, self.eps))
        self.counts.clear()
