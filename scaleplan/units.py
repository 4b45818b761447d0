"""Unit constants. Internally scaleplan uses SI base units: seconds, bytes, FLOP, FLOP/s."""
KB, MB, GB, TB = 1e3, 1e6, 1e9, 1e12
KiB, MiB, GiB = 1024.0, 1024.0**2, 1024.0**3
MS = 1e-3
US = 1e-6
TFLOPS = 1e12
PFLOPS = 1e15
DAY = 86400.0

BYTES_PER_ELEMENT = {"fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "fp4": 0.5}
# the dtype a model precision keeps its activations in: FP8 and FP4 run only the GEMM operands in that format
# (Transformer Engine quantizes inside each linear layer); activations, permutes and the token, tensor- and
# pipeline-parallel exchanges stay bf16
ACT_DTYPE = {"fp32": "fp32", "tf32": "fp32", "bf16": "bf16", "fp16": "fp16", "fp8": "bf16", "fp4": "bf16"}

# The one memory headroom rule of estimate, layouts and search (docs/estimate.md, "Memory headroom"): a plan may use this
# fraction of the profile's HBM. The memory model counts weights, gradients, optimizer states, activations and
# either the allocator overhead measured by `bench run --suite allocator` or a fixed 5 GB reserve; the 5% left
# (9 GB of a B200's 179 GB) is for what it does not model: the caching allocator's fragmentation where it was not
# measured (up to 10% in MoE training, estimator/memory.py) and transient all-to-all buffers: a plan at
# 175-177 of 179 GB leaves them no room.
MEM_FRACTION = 0.95

# The micro-batch sizes (sequences) `layouts` and the search try unless told otherwise: one list for both, so a
# layout `layouts` ranks is one the search could have chosen (estimator.PlanConstraints, mosaic SearchRequest and
# the --mbs defaults of both commands read it).
SEARCH_MBS: tuple[int, ...] = (1, 2, 4)
