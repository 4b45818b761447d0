"""Predict, then measure: the reference MoE model and `scaleplan validate` (issue 7).

Modules (all import torch; nothing here is imported by the planner commands):
  * :mod:`.router`  - Algorithm alg:routing (RowNorm, sigmoid scores, LFLB bias for selection,
    Gumbel proposal of M = min(rho K, E) with per-expert centred noise, bias-aware top-K, clean-score
    gates), the eq:bias-update controller, z-loss (eq:zloss) and the sequence-wise balance loss;
  * :mod:`.grouped` - the routed experts' grouped GEMM (same implementation rule as the bench);
  * :mod:`.model`   - the decoder built from a spec's model block (gated GQA attention, SwiGLU,
    shared expert, init of sec:train_recipe, checkpointing modes);
  * :mod:`.runner`  - forward+backward+AdamW steps, DP over spawned processes (gloo/NCCL), median
    step time after warm-up, peak memory;
  * :mod:`.compare` - MFU, the estimator's prediction, the ObservedRun row.

Workflow on a new machine::

    scaleplan bench plan SPEC.yaml --devices P --run --profile cpu-local   # tables the estimate reads
    scaleplan validate SPEC.yaml --nproc P --layout mbs=2,ckpt=full         # measure, store, compare
    scaleplan calibrate fit --profile cpu-local                             # chi_sys from the stored runs

(`scaleplan validate --bench` does the first step itself, for exactly the layouts given.)
"""
