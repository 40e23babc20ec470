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


def add_sampler_agreement(agg: dict[str, float], logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor,
                          share: float) -> None:
    """The sampler and the trainer must agree on log-probs before any update: the largest and the
    mean per-token gap (logp_sampler_diff, logp_sampler_diff_mean)."""
    diff = (logp.detach() - sampler_logp).abs() * mask
    agg["logp_sampler_diff"] = max(agg.get("logp_sampler_diff", 0.0), float(diff.max()))
    agg["logp_sampler_diff_mean"] = (agg.get("logp_sampler_diff_mean", 0.0)
                                     + float(diff.sum() / mask.sum().clamp(min=1)) * share)


def add_task_entropy(agg: dict[str, float], entropy: torch.Tensor | None, mask: torch.Tensor, tasks: list[str],
                     task_rows: dict[str, int]) -> None:
    """Each task's entropy (`entropy/P`, `entropy/A`): the token mean over its completions in this
    minibatch, weighted by its share of the task's rows. The collapse guard judges each task by its
    own entropy: a deterministic task such as A: is meant to reach near zero."""
    if entropy is None:
        return
    ent = entropy.detach() * mask
    for task in dict.fromkeys(tasks):
        rows = torch.tensor([t == task for t in tasks], device=mask.device)
        tokens = mask[rows].sum()
        if tokens > 0:
            agg[f"entropy/{task}"] = (agg.get(f"entropy/{task}", 0.0)
                                      + float(ent[rows].sum() / tokens) * int(rows.sum()) / task_rows[task])


def policy_pass(passes: Passes, model, batch: Batch, slices: list[slice], ref: list, old: list, beta: float,
                norms: Norms, device: torch.device, first: bool, record: bool) -> tuple[dict[str, float], bool]:
    """Loss and backward of every minibatch (gradients accumulate); (the metrics, whether every
    loss was finite: the first non-finite one stops the pass before its backward). The first pass on
    a batch checks the sampler's log-probs and may use the rows' recorded projections, which are
    freed after it (2 GB at 124M)."""
    cfg, agg = passes.cfg, {}
    tasks = [r.task for r in batch.rows]
    task_rows = {t: tasks.count(t) for t in set(tasks)}
    try:
        for k, sl in enumerate(slices):
            o = passes.logprobs(model, batch, sl, device, cfg.kl_estimator == "exact", True, recorded=first and record)
            out = slice_loss(o, ref[k] if ref else None, old[k] if old else None, batch, sl, cfg, beta, norms)
            loss = out.loss if cfg.loss_type == "dapo" else out.loss * ((sl.stop - sl.start) / norms.rows)
            if not torch.isfinite(loss):
                return agg, False
            loss.backward()
            share = (sl.stop - sl.start) / len(batch.rows)  # metrics: means over this rank's rows, then ranks'
            add_metrics(agg, out.metrics(), share, cfg.loss_type == "dapo")
            add_task_entropy(agg, o.get("entropy"), batch.completion_mask[sl], tasks[sl], task_rows)
            if first:
                add_sampler_agreement(agg, o["logprobs"], batch.sampler_logp[sl], batch.completion_mask[sl], share)
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
