"""The reference model's optimizer: AdamW on fp32 master weights (app:lr_hpo), and the torch dtype of a
spec precision. Used by ``scaleplan validate``'s steps and by the bench suites that time the same step."""
from __future__ import annotations

LR = 1e-4
WEIGHT_DECAY = 0.1
ADAM_EPS = 1e-14  # app:lr_hpo


def torch_dtype(precision: str):
    """The torch dtype a spec precision ('fp32', 'tf32', 'bf16', 'fp16') trains in (tf32: fp32 storage).
    Raises KeyError for any other name (specs.py admits only these)."""
    import torch

    return {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


class MasterAdamW:
    """AdamW on fp32 master copies of low-precision parameters (fp32 parameters are stepped directly)."""

    def __init__(self, params):
        import torch

        self.params = [p for p in params if p.requires_grad]
        self.masters = [p.detach().float().clone() if p.dtype != torch.float32 else p for p in self.params]
        for m in self.masters:
            m.requires_grad_(True)
        kw = {"lr": LR, "betas": (0.9, 0.999), "eps": ADAM_EPS, "weight_decay": WEIGHT_DECAY}
        try:  # one fused kernel per dtype/device group, as production stacks run Adam
            self.opt = torch.optim.AdamW(self.masters, fused=True, **kw)
        except (RuntimeError, ValueError, TypeError):
            self.opt = torch.optim.AdamW(self.masters, foreach=True, **kw)

    def zero_grad(self) -> None:
        for p, m in zip(self.params, self.masters):
            p.grad = None
            m.grad = None

    def step(self) -> None:
        import torch

        with torch.no_grad():
            for p, m in zip(self.params, self.masters):
                if m is not p:
                    m.grad = None if p.grad is None else p.grad.float()
            self.opt.step()
            for p, m in zip(self.params, self.masters):
                if m is not p:
                    p.copy_(m)
