"""GRPO loss: pure tensor math, no model, no chess.

Shapes: N = B * G rows (B prompts, G completions each, grouped contiguously),
C completion tokens, V vocabulary. ``mask`` [N, C] (bool or 0/1 float) marks the
completion tokens that count. Per-token maths is done in float32.

Padding never contributes: every input is passed through ``torch.where(mask, x, 0)``
*before* any arithmetic, so -inf/NaN log-probs under padding can produce neither NaN
values nor NaN gradients (multiplying by the mask would: 0 * inf = NaN).

The loss, top to bottom:

    A_i      = (r_i - mean_group(r)) / scale          group_advantages (scale: group std, batch std, 1)
    rho      = exp(logp - old_logp)                    per token, or per sequence (GSPO):
               exp(mean_t(logp - old_logp))            importance_sampling_level
    pg_t     = -min(min(rho, delta) A, clip(rho, 1 - eps_low, 1 + eps_high) A) * w_t
               (delta: two-sided clip for A < 0; w_t: sampler correction, min(pi_old / pi_sampler, cap))
    total    = agg(pg) + beta * agg(KL estimate) - entropy_coef * agg(entropy)

KL estimators and their gradients. Tokens are sampled from the policy pi and the loss
differentiates the estimate through log pi only (no score-function term), so an estimator's
*value* and its *gradient in the loss* answer different questions. With r = log(ref / pi):

    estimator          E_pi[value]          E_pi[gradient of value in the loss]
    k1 = -r            KL(pi || ref)        0: a k1 penalty pulls toward nothing on average
    k2 = r^2 / 2       ~KL(pi || ref)       grad KL(pi || ref)   (reverse KL, mode-seeking)
    k3 = e^r - r - 1   KL(pi || ref)        grad KL(ref || pi)   (forward KL, mass-covering)

k3 is the default because DeepSeekMath's GRPO and TRL use it (an unbiased, non-negative,
low-variance *value*); its gradient keeps the policy covering what the reference covers.
k2 is the one whose gradient is that of the KL it reports. k1 is refused with beta > 0
(tests/test_loss.py computes each expectation exactly on a small categorical).

Owns the GRPO objective, advantages and KL estimators. Imports torch only: nothing of the model,
the trainer or chess.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

KLKind = Literal["k1", "k2", "k3"]
ScaleMode = Literal["group", "batch", "none"]
FloorMode = Literal["max", "add"]
LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo"]
Level = Literal["token", "sequence"]

KL_KINDS = ("k1", "k2", "k3")
SCALE_MODES = ("group", "batch", "none")
FLOOR_MODES = ("max", "add")
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
LEVELS = ("token", "sequence")


# --------------------------------------------------------------------------- masking


def _as_bool(mask: Tensor) -> Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def _masked(x: Tensor, mask: Tensor) -> Tensor:
    """x where mask, exact 0 elsewhere (safe for -inf/NaN under padding, values and grads)."""
    return torch.where(_as_bool(mask), x.float(), torch.zeros((), dtype=torch.float32, device=x.device))


# Metrics over masked entries as 0-dim tensors, 0 where nothing is masked: masked reductions, not x[mask]
# (selecting by a mask makes the host wait for the GPU to learn its size).
def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    m = _as_bool(mask)
    return torch.where(m, x.detach().float(), 0.0).sum() / m.sum().clamp(min=1)


def _masked_max(x: Tensor, mask: Tensor, sign: float = 1.0) -> Tensor:
    """The largest masked entry (sign -1: the smallest)."""
    m = _as_bool(mask)
    extreme = (x.detach().float() * sign).masked_fill(~m, -math.inf).amax() * sign
    return torch.where(m.any(), extreme, 0.0)


# ------------------------------------------------------------------------ KL estimators
# Schulman, "Approximating KL divergence" (2020). Tokens are sampled from the policy, so
# with r = ref_logp - logp = log(ref/policy) each k's *value* estimates KL(policy || ref):
# k1 is unbiased but high-variance and can be negative, k2 is biased but low-variance,
# k3 is unbiased, non-negative and low-variance (the DeepSeekMath/TRL choice). Their
# *gradients* in the loss differ: see the module docstring.


def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1 = -r = logp - ref_logp."""
    return logp - ref_logp


def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k2 = r**2 / 2."""
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp: Tensor, ref_logp: Tensor, max_log_ratio: float | None = None) -> Tensor:
    """k3 = exp(r) - r - 1 with r = ref_logp - logp (this sign; the reverse estimates
    something else). ``max_log_ratio`` caps r before exp so it cannot overflow."""
    r = ref_logp - logp
    if max_log_ratio is not None:
        r = r.clamp(max=max_log_ratio)
    return torch.exp(r) - r - 1.0


def kl_estimate(logp: Tensor, ref_logp: Tensor, kind: KLKind = "k3", clamp: float | None = 10.0) -> Tensor:
    """Per-token KL(policy || ref) estimate, clamped to [-clamp, clamp] before any
    aggregation so one runaway token cannot turn the loss into Inf/NaN."""
    if kind not in KL_KINDS:
        raise ValueError(f"unknown KL estimator {kind!r}; expected one of {KL_KINDS}")
    log_ratio = logp.float() - ref_logp.float()
    zero = torch.zeros_like(log_ratio)
    if clamp is not None:
        # Every estimator is already >= clamp at |log ratio| = clamp + 1, so this cap changes no
        # value inside the clamp, but keeps values *and gradients* finite for +-inf inputs.
        log_ratio = log_ratio.clamp(-(clamp + 1.0), clamp + 1.0)
    if kind == "k1":
        kl = kl_k1(log_ratio, zero)
    elif kind == "k2":
        kl = kl_k2(log_ratio, zero)
    else:
        # k3(log1p(c) + 1) >= c as well: capping r there keeps exp from overflowing for any c.
        kl = kl_k3(log_ratio, zero, None if clamp is None else math.log1p(clamp) + 1.0)
    return kl if clamp is None else kl.clamp(-clamp, clamp)


def exact_kl(logits: Tensor, ref_logits: Tensor) -> Tensor:
    """Exact per-token KL(policy || ref) = sum_v p log(p/q) over the vocabulary, [N, C, V]
    -> [N, C]. Terms with p = 0 count 0 (also when q = 0 there)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    ref_logp = torch.log_softmax(ref_logits.float(), dim=-1)
    p = logp.exp()
    terms = torch.where(p > 0, p * (logp - ref_logp), torch.zeros_like(p))
    return terms.sum(-1)


# --------------------------------------------------------------------------- advantages


def _groups(rewards: Tensor, group_size: int) -> Tensor:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"{rewards.numel()} rewards cannot be split into groups of {group_size}")
    return rewards.reshape(-1, group_size)


def zero_variance_groups(rewards: Tensor, group_size: int, tol: float = 1e-8) -> Tensor:
    """BoolTensor [B]: groups whose rewards all agree (max - min <= tol). They carry no
    learning signal in GRPO; report their share, optionally resample them."""
    grouped = _groups(rewards, group_size)
    return (grouped.max(dim=1).values - grouped.min(dim=1).values) <= tol


def group_advantages(
    rewards: Tensor,
    group_size: int,
    scale: ScaleMode = "group",
    std_floor: float = 1e-4,
    floor_mode: FloorMode = "max",
) -> Tensor:
    """Advantages [N] = (reward - group mean) / scale.

    scale: "group" divides by each group's std (DeepSeekMath GRPO), "batch" by the std of the
    whole batch (TRL scale_rewards="batch"), "none" only centres (Dr. GRPO). Std is the
    unbiased sample std, as in TRL. The floor keeps a tiny std from blowing noise up:
    floor_mode "max" divides by max(std, std_floor), "add" by std + std_floor (TRL: std + 1e-4).
    "max" leaves groups with std >= std_floor untouched but shrinks those below it (one of 8
    rewards 0.1 apart: std 0.035, the advantages shrink by 29% under a 0.05 floor); "add"
    shrinks every group by std / (std + std_floor), hardly at all for a small std_floor.
    Groups whose rewards are all equal get exactly 0. With group scaling |A| <= (G - 1) / sqrt(G)
    (2.47 at G = 8) whatever the rewards, so advantages need no clip.
    """
    if scale not in SCALE_MODES:
        raise ValueError(f"unknown advantage scale {scale!r}; expected one of {SCALE_MODES}")
    if floor_mode not in FLOOR_MODES:
        raise ValueError(f"unknown std floor mode {floor_mode!r}; expected one of {FLOOR_MODES}")
    grouped = _groups(rewards, group_size).double()
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    correction = 1 if group_size > 1 else 0

    def floored(std: Tensor) -> Tensor:
        return std.clamp(min=std_floor) if floor_mode == "max" else std + std_floor

    if scale == "group":
        centred = centred / floored(grouped.std(dim=1, keepdim=True, correction=correction))
    elif scale == "batch":
        centred = centred / floored(grouped.std(correction=1 if grouped.numel() > 1 else 0))
    # Centring equal floats can leave rounding dust; a flat group must give exactly zero.
    flat = zero_variance_groups(rewards, group_size).unsqueeze(1)
    adv = torch.where(flat, torch.zeros_like(centred), centred)
    return adv.reshape(-1).to(rewards.dtype if rewards.is_floating_point() else torch.float32)


# ---------------------------------------------------------------------------- surrogate


def clip_fractions(
    ratio: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float, delta: float | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Share of masked tokens where a clip is active (the gradient is cut): low = ratio < 1 - eps_low
    with A < 0; high = ratio > 1 + eps_high with A > 0; delta = ratio > delta with A < 0 (0-dim tensors)."""
    m = _as_bool(mask)
    n = m.sum().clamp(min=1)
    adv = advantages.detach().unsqueeze(1)
    r = ratio.detach().expand_as(m)
    low = (r < 1 - eps_low) & (adv < 0) & m
    high = (r > 1 + eps_high) & (adv > 0) & m
    cut = (r > delta) & (adv < 0) & m if delta is not None else torch.zeros_like(m)
    return low.sum() / n, high.sum() / n, cut.sum() / n


def importance_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor, level: Level = "token") -> Tensor:
    """pi / pi_old: per token [N, C], or per sequence [N, 1] as GSPO (Zheng et al. 2025) defines it,
    exp of the mean per-token log ratio over the sequence's tokens (length-normalised)."""
    if level not in LEVELS:
        raise ValueError(f"unknown importance sampling level {level!r}; expected one of {LEVELS}")
    log_ratio = _masked(logp, mask) - _masked(old_logp, mask)
    if level == "sequence":
        lengths = _as_bool(mask).sum(dim=1, keepdim=True).clamp(min=1)
        log_ratio = log_ratio.sum(dim=1, keepdim=True) / lengths
    return torch.exp(log_ratio)


def clipped_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    mask: Tensor | None = None,
    level: Level = "token",
    delta: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped objective per token: -min(min(ratio, delta) * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A),
    ratio = importance_ratio against the *sampling* policy (not the reference). Separate low/high
    ranges are DAPO's clip-higher; `delta` (> 1 + eps_high, TRL's two-sided clipping) caps the
    ratio of tokens with A < 0, whose loss PPO's clip leaves unbounded. At level "sequence" each
    token carries its sequence's ratio and clip (GSPO). Returns (loss [N, C], stats) with stats
    clip_low, clip_high, clip_delta, clip_frac, ratio_mean, ratio_max over masked tokens (0-dim tensors:
    `grpo_loss` reads every metric from the device at once)."""
    if advantages.dim() != 1 or advantages.shape[0] != logp.shape[0]:
        raise ValueError(f"advantages must be [N={logp.shape[0]}], got {tuple(advantages.shape)}")
    if mask is None:
        mask = torch.ones_like(logp, dtype=torch.bool)
    ratio = importance_ratio(logp, old_logp, mask, level)
    adv = advantages.float().unsqueeze(1)
    capped = ratio if delta is None else ratio.clamp(max=delta)
    clipped = ratio.clamp(1 - eps_low, 1 + eps_high) * adv
    per_token = -torch.minimum(capped * adv, clipped).expand_as(logp)
    clip_low, clip_high, clip_delta = clip_fractions(ratio, advantages, mask, eps_low, eps_high, delta)
    ratio_mean, ratio_max = _masked_mean(ratio.expand_as(logp), mask), _masked_max(ratio.expand_as(logp), mask)
    stats = {
        "clip_low": clip_low,
        "clip_high": clip_high,
        "clip_delta": clip_delta,
        "clip_frac": clip_low + clip_high + clip_delta,
        "ratio_mean": ratio_mean,
        "ratio_max": ratio_max,
    }
    return per_token, stats


def sampler_correction(
    old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, cap: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """Truncated importance sampling (TIS, Yao et al. 2025) between the sampler and the trainer:
    per-token weights w = min(pi_old / pi_sampler, cap) [N, C] (no gradient) for the policy term.
    The tokens were drawn from the sampler's distribution; where it differs from the trainer's
    old policy (bf16 sampling, recorded rollouts, another inference engine) w re-weights them
    toward the trainer's, and the cap bounds the variance. Stats: tis_weight_mean (after the cap),
    tis_weight_max (before it), tis_capped (share of tokens at the cap), as 0-dim tensors."""
    m = _as_bool(mask)
    raw = torch.exp(_masked(old_logp.detach(), m) - _masked(sampler_logp.detach(), m))
    weights = torch.where(m, raw.clamp(max=cap), torch.zeros_like(raw))
    n = m.sum().clamp(min=1)
    stats = {
        "tis_weight_mean": _masked_mean(weights, m),
        "tis_weight_max": _masked_max(raw, m),
        "tis_capped": ((raw > cap) & m).sum() / n,
    }
    return weights, stats


# ---------------------------------------------------------------------------- aggregation


def aggregate(
    per_token: Tensor,
    mask: Tensor,
    loss_type: LossType = "grpo",
    max_completion_length: int | Tensor | None = None,
    num_items_in_batch: int | float | Tensor | None = None,
) -> Tensor:
    """Reduce a per-token quantity [N, C] over masked tokens to a scalar (TRL names):

    - "grpo": mean over sequences of (token sum / sequence length) (DeepSeekMath). Long
      completions weigh each token less, a length bias Dr. GRPO points out.
    - "bnpo": token sum / number of masked tokens in the local batch (token-level mean).
    - "dr_grpo": token sum / (N * max_completion_length) (Dr. GRPO, Liu et al. 2025; TRL): a
      constant normaliser, the generation budget, so no length bias and every token weighs the
      same whatever the batch's longest completion. A tensor [N] gives each row its own budget
      (rows of tasks with different token limits). Falls back to C when it is None.
    - "dapo": token sum / number of masked tokens in the *global* batch (DAPO, Yu et al. 2025),
      given as num_items_in_batch so gradient-accumulation micro-batches and processes sum
      to the right token mean; falls back to the local count. If DDP averages gradients over
      P processes, pass num_items_in_batch / P (as TRL does).
    """
    m = _as_bool(mask)
    values = _masked(per_token, m)
    total = values.sum()
    if loss_type == "grpo":
        lengths = m.sum(dim=1).clamp(min=1)
        return (values.sum(dim=1) / lengths).mean()
    if loss_type == "bnpo":
        return total / m.sum().clamp(min=1)
    if loss_type == "dr_grpo":
        budget = per_token.shape[1] if max_completion_length is None else max_completion_length
        if isinstance(budget, Tensor):
            return (values.sum(dim=1) / budget.to(values)).sum() / per_token.shape[0]
        return total / (per_token.shape[0] * budget)
    if loss_type == "dapo":
        if num_items_in_batch is None:
            return total / m.sum().clamp(min=1)
        if isinstance(num_items_in_batch, Tensor):
            return total / num_items_in_batch.to(total).clamp(min=1)
        return total / max(float(num_items_in_batch), 1.0)
    raise ValueError(f"unknown loss type {loss_type!r}; expected one of {LOSS_TYPES}")


# ------------------------------------------------------------------------------- loss


@dataclass
class LossOutput:
    """Total loss (scalar with grad) and detached float metrics for logging."""

    loss: Tensor
    policy_loss: float
    kl_loss: float
    kl_mean: float
    kl_max: float
    kl_min: float
    kl_seq_max: float  # the largest per-completion mean KL: one runaway completion, not one token
    kl_clamped: float  # share of tokens whose KL reached kl_clamp: their KL gradient is zero
    kl_share: float
    clip_low: float
    clip_high: float
    clip_delta: float
    clip_frac: float
    ratio_mean: float
    ratio_max: float
    entropy: float | None = None
    tis_weight_mean: float | None = None
    tis_weight_max: float | None = None
    tis_capped: float | None = None

    loss_value: float = math.nan  # the loss's value, read with the metrics

    def metrics(self) -> dict[str, float]:
        """Flat float metrics (no loss tensor), ready for a logger."""
        out = {k: v for k, v in vars(self).items() if k not in ("loss", "loss_value") and v is not None}
        out["loss"] = self.loss_value
        return out


def grpo_loss(
    logp: Tensor,
    old_logp: Tensor | None,
    ref_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    beta: float,
    kl_kind: KLKind = "k3",
    kl_clamp: float | None = 10.0,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    loss_type: LossType = "grpo",
    max_completion_length: int | Tensor | None = None,
    entropy: Tensor | None = None,
    entropy_coef: float = 0.0,
    num_items_in_batch: int | float | Tensor | None = None,
    kl: Tensor | None = None,
    level: Level = "token",
    delta: float | None = None,
    sampler_logp: Tensor | None = None,
    tis_cap: float | None = None,
) -> LossOutput:
    """Total = policy term + beta * KL term - entropy_coef * entropy term, each aggregated by
    ``loss_type``. ``old_logp`` None means one update per batch (old = logp.detach()).
    KL comes from ``kl`` if given (e.g. exact_kl, already clamped), else from ``ref_logp`` with
    ``kl_kind``; with neither the KL term is 0. k1 with beta != 0 is refused: its gradient is zero
    in expectation (module docstring). ``sampler_logp`` with ``tis_cap`` weights the policy term by
    `sampler_correction` (not the KL or entropy terms). KL/entropy metrics are token means over the mask."""
    if kl is None and kl_kind == "k1" and beta != 0.0:
        raise ValueError("the k1 KL estimator has a zero expected gradient: as a penalty (beta > 0) it "
                         "pulls toward nothing; use k3 (gradient of KL(ref || policy)) or k2 (of KL(policy || ref))")
    m = _as_bool(mask)
    if old_logp is None:
        old_logp = logp.detach()
    per_token_pg, stats = clipped_surrogate(logp, old_logp, advantages, eps_low, eps_high, m, level, delta)
    if sampler_logp is not None and tis_cap is not None:
        weights, tis_stats = sampler_correction(old_logp, sampler_logp, m, tis_cap)
        per_token_pg = per_token_pg * weights
        stats.update(tis_stats)
    policy_term = aggregate(per_token_pg, m, loss_type, max_completion_length, num_items_in_batch)
    loss = policy_term

    zero = logp.new_zeros((), dtype=torch.float32)
    kl_stats = dict.fromkeys(("kl_loss", "kl_mean", "kl_max", "kl_min", "kl_seq_max", "kl_clamped"), zero)
    if kl is None and ref_logp is not None:
        kl = kl_estimate(_masked(logp, m), _masked(ref_logp, m), kl_kind, kl_clamp)
    if kl is not None:
        kl = _masked(kl, m)
        kl_stats.update(kl_mean=_masked_mean(kl, m), kl_max=_masked_max(kl, m), kl_min=_masked_max(kl, m, -1.0))
        per_seq = kl.detach().sum(dim=1) / m.sum(dim=1).clamp(min=1)
        kl_stats["kl_seq_max"] = _masked_max(per_seq, m.any(dim=1))
        if kl_clamp is not None:
            kl_stats["kl_clamped"] = ((kl.detach().abs() >= kl_clamp) & m).sum() / m.sum().clamp(min=1)
        if beta != 0.0:  # skip 0 * kl so an unclamped inf cannot become NaN
            kl_term = beta * aggregate(kl, m, loss_type, max_completion_length, num_items_in_batch)
            loss = loss + kl_term
            kl_stats["kl_loss"] = kl_term.detach()

    if entropy is not None:
        stats["entropy"] = _masked_mean(entropy, m)
        if entropy_coef != 0.0:
            entropy_term = aggregate(entropy, m, loss_type, max_completion_length, num_items_in_batch)
            loss = loss - entropy_coef * entropy_term

    # The policy term's value is ~0 by construction (advantages are centred per group) while its
    # gradient is not, so its scale for the KL share is the aggregate of |per-token surrogate|.
    policy_scale = aggregate(per_token_pg.detach().abs(), m, loss_type, max_completion_length, num_items_in_batch)
    scalars = {"loss_value": loss.detach(), "policy_loss": policy_term.detach(), "policy_scale": policy_scale,
               **kl_stats, **stats}
    # one read from the device for every metric: each .item() would make the host wait for the GPU
    values = dict(zip(scalars, torch.stack([v.float().reshape(()) for v in scalars.values()]).tolist()))
    denom = values.pop("policy_scale") + abs(values["kl_loss"])
    values["kl_share"] = abs(values["kl_loss"]) / denom if denom > 0 else 0.0  # |β·KL| / (|β·KL| + policy scale)
    return LossOutput(loss=loss, **values)
