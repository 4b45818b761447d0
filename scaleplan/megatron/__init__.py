"""Megatron-LM in both directions: the training arguments of a plan (:mod:`.args`) and a plan read back from a
Megatron-LM training log (:mod:`.log`). The mapping is the one table in docs/megatron.md; the version of
Megatron-LM it was checked against is :data:`MEGATRON_LM_VERSION`.

Never imports torch (planner commands use it).
"""
from __future__ import annotations

# The command-line layer the emitted arguments target (megatron/training/arguments.py at this tag; its flag table is
# tests/data/megatron/). Its TransformerConfig checks are exercised through the megatron-core wheel of the test extra.
MEGATRON_LM_VERSION = "core_v0.19.0"
