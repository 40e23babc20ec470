"""Training controls: the KL coefficient, the reward normaliser, the optimizer and its learning-rate
schedule, and the reward weights over steps (curriculum).

Stateful pieces expose ``state_dict()`` / ``load_state_dict()`` (plain Python values) so a
resumed run continues exactly where the checkpoint left off. Guards are `grpo.guards`, warnings
`grpo.monitor`.

Owns the schedules. Imports torch (the optimizer, reward tensors), nothing of the model or chess.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor


class KLController:
    """KL coefficient beta: fixed or adaptive, with an optional warm-up.

    During the first ``warmup_steps`` steps ``value`` returns beta * warmup_factor (factor 0:
    no KL penalty while the policy is still close to the reference). Adaptive mode is the
    proportional controller of Ziegler et al. 2019 (TRL AdaptiveKLController):
    error = clip(kl / target - 1, -0.2, 0.2); beta *= 1 + error * n_steps / horizon,
    then beta is clamped to [beta_min, beta_max] (a beta_min > 0 lets beta recover from 0).
    """

    def __init__(
        self,
        beta: float,
        mode: Literal["fixed", "adaptive"] = "fixed",
        target: float = 0.05,
        horizon: int = 10_000,
        beta_min: float = 0.0,
        beta_max: float = 10.0,
        warmup_steps: int = 0,
        warmup_factor: float = 0.0,
    ) -> None:
        if mode not in ("fixed", "adaptive"):
            raise ValueError(f"KL controller mode must be 'fixed' or 'adaptive', got {mode!r}")
        if beta < 0:
            raise ValueError(f"beta must be >= 0, got {beta}")
        if mode == "adaptive" and not target > 0:
            raise ValueError(f"adaptive KL needs target > 0, got {target}")
        if horizon <= 0:
            raise ValueError(f"KL horizon must be > 0, got {horizon}")
        if not 0 <= beta_min <= beta_max:
            raise ValueError(f"need 0 <= beta_min <= beta_max, got {beta_min}, {beta_max}")
        if warmup_steps < 0 or warmup_factor < 0:
            raise ValueError("warmup_steps and warmup_factor must be >= 0")
        self.beta = float(beta)
        self.mode = mode
        self.target = target
        self.horizon = horizon
        self.beta_min = beta_min
        self.beta_max = beta_max
        self.warmup_steps = warmup_steps
        self.warmup_factor = warmup_factor

    def value(self, step: int) -> float:
        """Beta to use at ``step`` (0-based)."""
        return self.beta * self.warmup_factor if step < self.warmup_steps else self.beta

    def update(self, kl: float, n_steps: int = 1) -> float:
        """Move beta toward keeping ``kl`` at target (adaptive mode); returns the new beta.
        Non-finite KL is ignored (the non-finite guard handles it)."""
        if self.mode == "adaptive" and math.isfinite(kl):
            error = min(max(kl / self.target - 1.0, -0.2), 0.2)
            self.beta *= 1.0 + error * n_steps / self.horizon
            self.beta = min(max(self.beta, self.beta_min), self.beta_max)
        return self.beta

    def state_dict(self) -> dict[str, Any]:
        return {"beta": self.beta}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.beta = float(state["beta"])


class RewardNormalizer:
    """EMA estimate of the reward mean and variance; ``normalize`` first folds the batch in,
    then returns (r - mean) / max(std, std_floor). The variance update is the exact variance
    of the mixture (old estimate weighted ``momentum``, batch weighted 1 - momentum), so a
    shifting mean widens it. Disabled: returns the rewards unchanged."""

    def __init__(self, momentum: float = 0.99, enabled: bool = True, std_floor: float = 1e-4) -> None:
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        self.momentum, self.enabled, self.std_floor = momentum, enabled, std_floor
        self.mean, self.var, self.count = 0.0, 0.0, 0  # the estimate, and the batches folded in

    def update(self, rewards: Tensor) -> None:
        r = rewards.detach().double().reshape(-1)
        if r.numel() == 0:
            return
        batch_mean = r.mean().item()
        batch_var = r.var(correction=0).item()
        if self.count == 0:
            self.mean, self.var = batch_mean, batch_var
        else:
            w = self.momentum
            mean = w * self.mean + (1 - w) * batch_mean
            old_part = self.var + (self.mean - mean) ** 2
            new_part = batch_var + (batch_mean - mean) ** 2
            self.var = w * old_part + (1 - w) * new_part
            self.mean = mean
        self.count += 1

    def normalize(self, rewards: Tensor) -> Tensor:
        if not self.enabled:
            return rewards
        self.update(rewards)
        std = max(math.sqrt(self.var), self.std_floor)
        return (rewards - self.mean) / std

    def state_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.mean = float(state["mean"])
        self.var = float(state["var"])
        self.count = int(state["count"])


# ------------------------------------------------------------------ optimizer and schedules


def adamw(params: list[torch.nn.Parameter], lr: float, betas: tuple[float, float], weight_decay: float) -> torch.optim.AdamW:
    """AdamW that decays only matrices (not biases or layer norms), fused where PyTorch has a kernel.

    The fused kernel updates each tensor in one pass over its memory; the default (foreach) makes a
    pass per element-wise op. For GPT-2 124M on a 2-core CPU that is ~0.05 s against ~0.3-0.6 s a
    step (benchmarks/README.md), and more after a backward has evicted the optimizer state from cache.
    """
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused or None)


def load_optimizer(opt: torch.optim.Optimizer, saved: Mapping[str, Any]) -> None:
    """`opt.load_state_dict(saved)` with this machine's kernels (fused, foreach, capturable) instead of the saved
    ones: a state written on one device continues on another, and its moments land where those kernels want
    them. `saved` is checked first (`state_check.optimizer`)."""
    mine = [{k: g[k] for k in ("fused", "foreach", "capturable") if k in g} for g in opt.param_groups]
    opt.load_state_dict({**saved, "param_groups": [{**g, **m} for g, m in zip(saved["param_groups"], mine)]})


def cosine_lr(step: int, total_steps: int, warmup_steps: int = 0, min_ratio: float = 0.0) -> float:
    """LR multiplier: linear warm-up (step + 1) / warmup_steps, reaching 1 at step
    warmup_steps - 1 (no wasted zero-LR step), then cosine from 1 at ``warmup_steps`` down to
    ``min_ratio`` at ``total_steps`` (and after)."""
    if total_steps <= 0 or warmup_steps < 0:
        raise ValueError(f"need total_steps > 0 and warmup_steps >= 0, got {total_steps}, {warmup_steps}")
    if not 0 <= min_ratio <= 1:
        raise ValueError(f"min_ratio must be in [0, 1], got {min_ratio}")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(max((step - warmup_steps) / max(total_steps - warmup_steps, 1), 0.0), 1.0)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def schedule_step(step: int, total_steps: int, elapsed: float, budget: float | None) -> int:
    """Where the lr schedule is: `step`, or under a wall-clock budget (seconds) the share of it used
    times total_steps when that is further along, so the decay ends when the time does."""
    if not budget:
        return step
    return max(step, min(total_steps, int(elapsed / budget * total_steps)))


class CurriculumSchedule:
    """Reward-component weights that change over training, per task.

    ``schedule = {task: [(step, {component: weight}), ...]}``, piecewise constant: the last
    entry whose step <= the current step applies on top of the base weights (components it
    does not name keep their base weight); before the first entry the base applies.
    """

    def __init__(self, schedule: Mapping[str, Sequence[Sequence[Any]]] | None = None) -> None:
        self.schedule: dict[str, list[tuple[int, dict[str, float]]]] = {}
        for task, entries in (schedule or {}).items():
            parsed: list[tuple[int, dict[str, float]]] = []
            for i, entry in enumerate(entries):
                where = f"curriculum[{task!r}][{i}]"
                if len(entry) != 2:
                    raise ValueError(f"{where}: expected (step, {{component: weight}}), got {entry!r}")
                step, weights = entry
                if isinstance(step, bool) or not isinstance(step, int) or step < 0:
                    raise ValueError(f"{where}: step must be a non-negative integer, got {step!r}")
                if parsed and step <= parsed[-1][0]:
                    raise ValueError(
                        f"{where}: steps must be strictly increasing, got {step} after {parsed[-1][0]}"
                    )
                if not isinstance(weights, Mapping):
                    raise ValueError(f"{where}: weights must be a mapping, got {weights!r}")
                clean: dict[str, float] = {}
                for name, w in weights.items():
                    number = isinstance(w, (int, float)) and not isinstance(w, bool)
                    if not number or not math.isfinite(w) or w < 0:
                        raise ValueError(
                            f"{where}: weight of {name!r} must be a finite number >= 0, got {w!r}"
                        )
                    clean[str(name)] = float(w)
                parsed.append((step, clean))
            self.schedule[task] = parsed

    def weights(self, task: str, step: int, base: Mapping[str, float]) -> dict[str, float]:
        """Weights for ``task`` at ``step``: ``base`` overridden by the entry in force."""
        out = dict(base)
        current: dict[str, float] = {}
        for start, weights in self.schedule.get(task, []):
            if start > step:
                break
            current = weights
        unknown = sorted(set(current) - set(base))
        if unknown:
            raise ValueError(
                f"curriculum for task {task!r} names unknown components {unknown}; known: {sorted(base)}"
            )
        out.update(current)
        return out

    def check(self, base_by_task: Mapping[str, Mapping[str, float]]) -> None:
        """Fail early (at config time) on tasks or components the reward does not have."""
        for task, entries in self.schedule.items():
            if task not in base_by_task:
                raise ValueError(f"curriculum names unknown task {task!r}; known: {sorted(base_by_task)}")
            for start, _ in entries:
                self.weights(task, start, base_by_task[task])
