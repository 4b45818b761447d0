"""The reference MoE model: what ``scaleplan validate`` trains and the bench suites that time its parts run.

A neutral layer below both users: :mod:`scaleplan.validate` (the run-store-predict loop) and
:mod:`scaleplan.bench` (the allocator, model-ops and dispatch suites) import it; it imports neither.
Modules (all import torch; nothing here is imported by the planner commands):
  * :mod:`.router`  - Algorithm alg:routing (RowNorm, sigmoid scores, LFLB bias for selection,
    Gumbel proposal of M = min(rho K, E) with per-expert centred noise, bias-aware top-K, clean-score
    gates), the eq:bias-update controller, z-loss (eq:zloss) and the sequence-wise balance loss;
  * :mod:`.grouped` - the routed experts' grouped GEMM (same implementation rule as the bench);
  * :mod:`.model`   - the decoder built from a spec's model block (gated GQA attention, SwiGLU,
    shared expert, init of sec:train_recipe, checkpointing modes);
  * :mod:`.optim`   - AdamW on fp32 master weights (the optimizer of every reference step) and the
    torch dtype of a spec precision.
"""
