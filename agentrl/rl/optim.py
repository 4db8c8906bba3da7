"""Adam, as torch.optim.Adam computes it (no weight decay, amsgrad or maximize), with the square root taken by
agentrl.model.kernels.sqrt: torch.sqrt's float32 CPU kernel is MKL's, whose result depends on the CPU, and Adam's
square root is in every parameter's every step. The state (step, exp_avg, exp_avg_sq) is torch's, so checkpoints,
resume and learning-rate schedules treat it as a torch.optim.Adam."""
from __future__ import annotations

import torch

from agentrl.model.kernels.ops import sqrt


class Adam(torch.optim.Adam):
    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8):
        super().__init__(params, lr=lr, betas=betas, eps=eps, foreach=False)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            for p in params:
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
            grads = [p.grad for p in params]
            exp_avgs = [self.state[p]["exp_avg"] for p in params]
            exp_avg_sqs = [self.state[p]["exp_avg_sq"] for p in params]
            torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
            torch._foreach_mul_(exp_avg_sqs, beta2)
            torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
            for p, exp_avg, exp_avg_sq in zip(params, exp_avgs, exp_avg_sqs):
                step = float(self.state[p]["step"])
                bias_correction1 = 1 - beta1 ** step
                bias_correction2_sqrt = (1 - beta2 ** step) ** 0.5
                denom = (sqrt(exp_avg_sq) / bias_correction2_sqrt).add_(group["eps"])
                p.addcdiv_(exp_avg, denom, value=-group["lr"] / bias_correction1)
        return loss
