"""How far apart two correct float32 computations of the same numbers may be.

The tests compare computations that do the same arithmetic in another order: a grouped prompt
pass against a plain one, a decode step on oneDNN-packed weights against a full forward, a split
batch against a whole one, two processes against one. Which order a kernel uses depends on the
CPU (AVX-512, AVX2 or NEON vector widths, AMX, MKL's and oneDNN's blocking for each), so a fixed
tolerance that passes on one machine can fail on another (one gradient element of 165,632 was
1.6e-5 off on an Intel Xeon where a fixed 1e-5 was allowed).

The bound used instead: every addition rounds with a relative error of at most eps (2**-23 for
float32); summing n terms in two different orders gives two sums whose difference is a random
walk of about sqrt(n) such roundings, each relative to a partial sum; no partial sum of the
largest element is larger than the tensor's largest magnitude by much, so

    |a - b| <= C * eps * sqrt(n) * max|reference|

for every element, with n the longest reduction feeding an element (tokens of the batch for a
weight gradient, the widest layer or the vocabulary for a log-prob). C = 1: over every comparison
in the suite the largest difference measured 0.23 of that bound, on an AMD EPYC's AVX-512 kernels
and under simulated AVX2 and SSE4.2 CPUs (ATEN_CPU_CAPABILITY, MKL_ENABLE_INSTRUCTIONS,
ONEDNN_MAX_CPU_ISA), so C = 1 leaves a factor 4; a real bug (a wrong mask, a wrong row, a
missing term) moves values by orders of magnitude more.

The bound is absolute and the same for every element: an element that is small because its
terms cancel carries the rounding of those terms, not of its own size, which is why a relative
tolerance (rtol) is the wrong tool here.
"""

from __future__ import annotations

import math

import torch

EPS32 = torch.finfo(torch.float32).eps  # 2**-23: float32's relative rounding step
C = 1.0  # see the module docstring: measured differences were at most 0.23 of the bound


def rounding_atol(reference: torch.Tensor, n: int) -> float:
    """C * eps * sqrt(n) * max|reference|: the difference rounding alone explains, for float32
    values built by reductions of at most n terms."""
    if n < 1:
        raise ValueError(f"reduction length must be >= 1, got {n}")
    scale = reference.detach().abs().max().item() if reference.numel() else 0.0
    return C * EPS32 * math.sqrt(n) * scale


def assert_rounding_close(actual: torch.Tensor, expected: torch.Tensor, n: int, what: str = "") -> None:
    """actual equals expected up to the float32 rounding of reductions of n terms (no rtol)."""
    atol = rounding_atol(expected, n)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0,
                               msg=lambda m: f"{what}: {m}\n(rounding bound C*eps*sqrt(n)*max|x| = {atol:.3g}, n = {n})")


def logprob_terms(model) -> int:
    """The longest reduction in a GPT-2 forward: the MLP's inner width, the vocabulary (softmax)
    or the context (attention), whichever is widest."""
    cfg = model.config
    return max(cfg.n_inner or 4 * cfg.n_embd, cfg.vocab_size, cfg.n_positions)


def gradient_terms(model, attention_mask: torch.Tensor) -> int:
    """The longest reduction behind a weight gradient: the sum over every real token of the batch
    (or, if longer, a forward reduction that the backward pass retraces)."""
    return max(int(attention_mask.sum()), logprob_terms(model))


# bf16 keeps 8 significant bits, so rounding to it errs by at most BF16_U relative. A gradient
# built from bf16 products (`backward_dtype: bf16`) has both operands of every product rounded
# (2u per product), and in the 2-layer test models a weight gradient passes through at most 4 such
# products, so with errors that do not cancel its error's norm stays below 8u of its own norm.
# Measured 2.5-2.8u on AVX-512-BF16 and under simulated AVX2 / AVX-512 without BF16: the
# operands round alike on every CPU (round to nearest even), only the float32 accumulation
# order differs.
BF16_U = 2.0 ** -9
BF16_GRAD_RTOL = 8 * BF16_U


def assert_bf16_rounding_close(actual: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    """A gradient computed with bf16 products against the float32 one: within bf16 rounding, by norm."""
    err, norm = (actual - expected).norm().item(), expected.norm().item()
    assert err < BF16_GRAD_RTOL * norm, f"{what}: |bf16 - float32| = {err:.3g}, {err / norm / BF16_U:.1f}u of the norm {norm:.3g} (bound 8u)"
