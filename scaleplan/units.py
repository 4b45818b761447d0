"""Unit constants. Internally scaleplan uses SI base units: seconds, bytes, FLOP, FLOP/s."""
KB, MB, GB, TB = 1e3, 1e6, 1e9, 1e12
KiB, MiB, GiB = 1024.0, 1024.0**2, 1024.0**3
MS = 1e-3
US = 1e-6
TFLOPS = 1e12
PFLOPS = 1e15
DAY = 86400.0

BYTES_PER_ELEMENT = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "fp4": 0.5}
