"""Linear layers computed in float32 whose backward matrix products run in bf16.

The policy pass must compute the very log-probs the sampler did (float32: the importance ratio
is 1 before any update, the sampler/trainer gap stays below 1e-5), but nothing asks that of its
gradients: bf16 autocast computes them in bf16 as well. So the forward here is the layer's own
float32 product, and the backward's two products (input gradient, weight gradient, 2/3 of a
training pass's FLOPs) take bf16 operands with float32 accumulation, as under autocast. Master
weights, optimizer state and bias gradients stay float32. On a CPU with native bf16 dot
products those products run about twice as fast (see `bf16_speedup`); `auto` picks this only
where they do.

Owns the bf16-gradient linear. Knows torch, not chess: imports nothing of tasks, data, engine or
the trainer.
"""

from __future__ import annotations

import time

import torch
from transformers.pytorch_utils import Conv1D


class _Bf16GradLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, transposed: bool, dtype: torch.dtype, recorded: torch.Tensor | None):
        # transposed: nn.Linear (weight [out, in]); otherwise GPT-2's Conv1D (weight [in, out])
        x2 = x.reshape(-1, x.shape[-1])
        if recorded is not None:  # this product, already computed on these inputs by the sampler
            y = recorded.reshape(x2.shape[0], -1)
        else:
            w = weight.t() if transposed else weight
            y = torch.addmm(bias, x2, w) if bias is not None else x2.mm(w)
        ctx.save_for_backward(x2.to(dtype), weight)
        ctx.transposed, ctx.dtype, ctx.shape, ctx.has_bias = transposed, dtype, x.shape, bias is not None
        return y.view(*x.shape[:-1], y.shape[-1])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x2, weight = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])
        g = g2.to(ctx.dtype)
        w = weight.to(ctx.dtype)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = (g.mm(w) if ctx.transposed else g.mm(w.t())).to(grad.dtype).view(ctx.shape)
        if ctx.needs_input_grad[1]:
            grad_w = (g.t().mm(x2) if ctx.transposed else x2.t().mm(g)).to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g2.sum(0)
        return grad_x, grad_w, grad_b, None, None, None


def _plain(module: torch.nn.Module) -> bool:
    return type(module) in (torch.nn.Linear, Conv1D)


def supports(model: torch.nn.Module) -> bool:
    """Every projection of a GPT-2 (and its LM head) is a plain nn.Linear or Conv1D: no LoRA or
    other wrapper whose forward `linear` would skip."""
    blocks = model.transformer.h
    layers = [m for b in blocks for m in (b.attn.c_attn, b.attn.c_proj, b.mlp.c_fc, b.mlp.c_proj)]
    return all(_plain(m) for m in [*layers, model.lm_head])


def linear(module: torch.nn.Module, x: torch.Tensor, grad_dtype: torch.dtype | None,
           recorded: torch.Tensor | None = None) -> torch.Tensor:
    """`module(x)` for an nn.Linear or GPT-2 Conv1D; with `grad_dtype` (and autograd on) the same
    float32 forward, with the backward's matrix products in `grad_dtype`. `recorded`: `module(x)`
    as already computed (the sampler's projections, see `gpt2_segments`): returned as the output
    without the product, the backward as usual."""
    if recorded is None and (grad_dtype is None or not torch.is_grad_enabled()):
        return module(x)
    if not _plain(module):
        raise TypeError(f"bf16 backward products need a plain nn.Linear or Conv1D, got {type(module).__name__}")
    return _Bf16GradLinear.apply(x, module.weight, module.bias, isinstance(module, torch.nn.Linear),
                                 grad_dtype or x.dtype, recorded)


_SPEEDUPS: dict[str, float] = {}


def bf16_speedup(device: torch.device, size: int = 768, rows: int = 2048, repeats: int = 5) -> float:
    """Measured time of a float32 [rows, size] x [size, 4 size] product over the same in bf16:
    how much faster this device's bf16 matrix products are (AVX-512-BF16 and AMX CPUs, GPUs),
    or slower (CPUs that emulate bf16). Measured once per device and process. A first product of
    rows / 16 rows settles a device where bf16 is clearly slower (under half float32's speed): on a
    CPU that emulates bf16 the full-size measurement took 45-90 s (bf16 at 1/120 of float32). The
    quick check takes the best of 3 too: from one timing, a busy CPU with 8x faster bf16 once read
    0.31x and ran float32."""
    key = str(device)
    if key not in _SPEEDUPS:
        quick = _speedup(device, size, max(1, rows // 16), 3)
        _SPEEDUPS[key] = quick if quick < 0.5 else _speedup(device, size, rows, repeats)
    return _SPEEDUPS[key]


def _speedup(device: torch.device, size: int, rows: int, repeats: int) -> float:
    a = torch.randn(rows, size, device=device)
    b = torch.randn(size, 4 * size, device=device)

    def best(x, y) -> float:
        x.mm(y)  # warm-up
        times = []
        for _ in range(repeats):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            x.mm(y)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
        return min(times)

    return best(a, b) / best(a.bfloat16(), b.bfloat16())
