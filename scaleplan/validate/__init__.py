"""Predict, then measure: `scaleplan validate` runs the reference MoE model.

The model it trains lives in :mod:`scaleplan.reference` (shared with the bench suites).
Modules (all import torch; nothing here is imported by the planner commands):
  * :mod:`.runner`  - forward+backward+AdamW steps, DP over spawned processes (gloo/NCCL), median
    step time after warm-up, peak memory;
  * :mod:`.compare` - MFU, the estimator's prediction, the ObservedRun row.

Workflow on a new machine::

    scaleplan bench plan SPEC.yaml --devices P --run --profile cpu-local   # tables the estimate reads
    scaleplan validate SPEC.yaml --nproc P --layout mbs=2,ckpt=full         # measure, store, compare
    scaleplan calibrate fit --profile cpu-local                             # chi_sys from the stored runs

(`scaleplan validate --bench` does the first step itself, for exactly the layouts given.)
"""
