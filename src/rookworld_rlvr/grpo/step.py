"""The pieces of one GRPO update: the loss of each minibatch, the rules that combine minibatch
metrics into the step's, the sampler agreement check, and the optimizer step with its guard.

Normalisers are those of the GLOBAL batch (all ranks): each rank's loss is then its exact share
of the one-process loss, and summing the gradients over ranks gives the one-process gradient.
Owns the update's arithmetic around `loss.grpo_loss`. Imports torch; nothing of the model
package or chess.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rookworld_rlvr.config import TrainConfig
from rookworld_rlvr.grpo import distributed as dist
from rookworld_rlvr.grpo.guards import NonFiniteGuard
from rookworld_rlvr.grpo.loss import LossOutput, exact_kl, grpo_loss
from rookworld_rlvr.grpo.passes import Passes
from rookworld_rlvr.grpo.rollout import Batch

LAST_EPOCH_KEYS = ("loss", "kl_mean", "clip_frac")  # logged as last_<key> when updates_per_batch > 1


@dataclass
class Norms:
    """The global batch's sizes that scale each rank's loss (ranks hold equal numbers of rows)."""

    rows: int  # completions over all ranks
    tokens: torch.Tensor  # completion tokens over all ranks (dapo)
    budget: torch.Tensor  # [N] each row's task's token limit at this step (dr_grpo: a constant)

    @classmethod
    def of(cls, batch: Batch, cfg: TrainConfig, step: int) -> Norms:
        budget = [float(cfg.sampling_for(r.task, step)["max_new_tokens"]) for r in batch.rows]
        return cls(len(batch.rows) * dist.world(), dist.all_gather_tensor(batch.completion_mask.sum().reshape(1)).sum(),
                   torch.tensor(budget, device=batch.completion_mask.device))


def slice_loss(o: dict, ref: dict | None, old: dict | None, batch: Batch, sl: slice, cfg: TrainConfig, beta: float,
               norms: Norms) -> LossOutput:
    """`grpo_loss` of one minibatch from its policy pass `o` and its reference and old passes."""
    exact = cfg.kl_estimator == "exact"
    kl = exact_kl(o["logits"], ref["logits"]).clamp(max=cfg.kl_clamp) if exact and ref is not None else None
    return grpo_loss(o["logprobs"], old["logprobs"] if old else None, ref["logprobs"] if ref else None,
                     batch.advantages[sl], batch.completion_mask[sl], beta=beta,
                     kl_kind=cfg.kl_estimator if not exact else "k3", kl_clamp=cfg.kl_clamp, eps_low=cfg.eps_low,
                     eps_high=cfg.eps_high, loss_type=cfg.loss_type, max_completion_length=norms.budget[sl],
                     entropy=o.get("entropy"), entropy_coef=cfg.entropy_coef, num_items_in_batch=norms.tokens,
                     kl=kl, level=cfg.importance_sampling_level, delta=cfg.clip_delta,
                     sampler_logp=batch.sampler_logp[sl], tis_cap=cfg.tis_cap)


def add_metrics(agg: dict[str, float], metrics: dict[str, float], share: float, dapo: bool) -> None:
    """Fold one minibatch's metrics into the step's: the largest `*_max`, the smallest `kl_min`,
    dapo's losses summed (already divided by the global token count; x world, as the reduction over
    ranks is a mean), everything else weighted by the minibatch's share of this rank's rows."""
    for key, v in metrics.items():
        if key.endswith("_max"):
            agg[key] = max(agg.get(key, -math.inf), v)
        elif key == "kl_min":
            agg[key] = min(agg.get(key, math.inf), v)
        elif dapo and key in ("loss", "policy_loss", "kl_loss"):
            agg[key] = agg.get(key, 0.0) + v * dist.world()
        else:
            agg[key] = agg.get(key, 0.0) + v * share


def sampler_agreement(logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The sampler and the trainer must agree on log-probs before any update: the largest and the
    mean per-token gap of a minibatch (logp_sampler_diff, logp_sampler_diff_mean), as 0-dim tensors."""
    diff = (logp.detach() - sampler_logp).abs() * mask
    return {"logp_sampler_diff": diff.max(), "logp_sampler_diff_mean": diff.sum() / mask.sum().clamp(min=1)}


def task_entropy(entropy: torch.Tensor | None, mask: torch.Tensor, task_of: torch.Tensor,
                 tasks: list[str]) -> dict[str, torch.Tensor]:
    """Each task's entropy sum and token count in a minibatch (`entropy/P`, `tokens/P`, ...), as 0-dim
    tensors; `task_of` [rows] holds each row's index in `tasks`. The collapse guard judges each task by
    its own entropy: a deterministic task such as A: is meant to reach near zero."""
    if entropy is None:
        return {}
    out = {}
    for k, task in enumerate(tasks):
        rows = (task_of == k).unsqueeze(1)
        out[f"entropy/{task}"], out[f"tokens/{task}"] = (entropy.detach() * mask * rows).sum(), (mask * rows).sum()
    return out


def fold_minibatch_signals(agg: dict[str, float], pending: list[tuple[dict[str, int], float, dict]],
                           task_rows: dict[str, int]) -> None:
    """Fold each minibatch's sampler agreement and task entropies (read from the device at once, after
    the pass: a read in between would make the host wait for each backward) into the step's metrics:
    the largest gap, shares of the mean gap, and each task's token mean weighted by the minibatch's
    share of the task's rows (a minibatch with none of its tokens adds nothing)."""
    flat = [v for _, _, signals in pending for v in signals.values()]
    if not flat:
        return
    values = iter(torch.stack([v.float().reshape(()) for v in flat]).tolist())
    for rows, share, signals in pending:
        got = {key: next(values) for key in signals}
        if "logp_sampler_diff" in got:
            agg["logp_sampler_diff"] = max(agg.get("logp_sampler_diff", 0.0), got["logp_sampler_diff"])
            mean = got["logp_sampler_diff_mean"] * share
            agg["logp_sampler_diff_mean"] = agg.get("logp_sampler_diff_mean", 0.0) + mean
        for task, n in rows.items():
            if got.get(f"tokens/{task}", 0) > 0:
                agg[f"entropy/{task}"] = (agg.get(f"entropy/{task}", 0.0)
                                          + got[f"entropy/{task}"] / got[f"tokens/{task}"] * n / task_rows[task])


def policy_pass(passes: Passes, model, batch: Batch, slices: list[slice], ref: list, old: list, beta: float,
                norms: Norms, device: torch.device, first: bool, record: bool) -> tuple[dict[str, float], bool]:
    """Loss and backward of every minibatch (gradients accumulate); (the metrics, whether every
    loss was finite: the first non-finite one stops the pass before its backward). The first pass on
    a batch checks the sampler's log-probs and may use the rows' recorded projections, which are
    freed after it (2 GB at 124M). Besides the two reads that shape a minibatch's forward (its unused
    left-pad columns, whether its groups share prompts), the host reads the device once a minibatch (its
    loss and metrics, before the backward) and once after the pass."""
    cfg, agg = passes.cfg, {}
    tasks = [r.task for r in batch.rows]
    task_rows = {t: tasks.count(t) for t in dict.fromkeys(tasks)}
    names = list(task_rows)
    task_of = torch.tensor([names.index(t) for t in tasks]).to(device)  # once a pass, not a minibatch
    pending: list[tuple[dict[str, int], float, dict]] = []
    try:
        for k, sl in enumerate(slices):
            o = passes.logprobs(model, batch, sl, device, cfg.kl_estimator == "exact", True, recorded=first and record)
            out = slice_loss(o, ref[k] if ref else None, old[k] if old else None, batch, sl, cfg, beta, norms)
            if not math.isfinite(out.loss_value):
                fold_minibatch_signals(agg, pending, task_rows)
                return agg, False
            loss = out.loss if cfg.loss_type == "dapo" else out.loss * ((sl.stop - sl.start) / norms.rows)
            loss.backward()
            share = (sl.stop - sl.start) / len(batch.rows)  # metrics: means over this rank's rows, then ranks'
            add_metrics(agg, out.metrics(), share, cfg.loss_type == "dapo")
            mask = batch.completion_mask[sl]
            signals = task_entropy(o.get("entropy"), mask, task_of[sl], names)
            if first:
                signals |= sampler_agreement(o["logprobs"], batch.sampler_logp[sl], mask)
            pending.append(({t: tasks[sl].count(t) for t in dict.fromkeys(tasks[sl])}, share, signals))
        fold_minibatch_signals(agg, pending, task_rows)
        return agg, True
    finally:
        for r in batch.rows:  # only the first pass may use them
            r.recorded = None


def optimizer_step(params: list[torch.nn.Parameter], opt: torch.optim.Optimizer, guard: NonFiniteGuard,
                   agg: dict[str, float], lr: float, grad_clip: float) -> str:
    """Clip the gradient, ask the non-finite guard, then step at `lr`; returns the guard's answer
    ("ok", or "skip" / "rollback" / "stop": the gradient is dropped and no step taken)."""
    grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
    status = guard.check(agg.get("loss", float("nan")), grad_norm)
    if status != "ok":
        opt.zero_grad(set_to_none=True)
        agg["grad_norm"] = float("nan")
        return status
    for g in opt.param_groups:
        g["lr"] = lr
    opt.step()
    agg["grad_norm"], agg["lr"] = float(grad_norm), lr
    return status
