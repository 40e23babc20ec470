"""Training controls: KL coefficient, guards, reward normalisation, schedules, diagnostics.

Stateful pieces expose ``state_dict()`` / ``load_state_dict()`` (plain Python values) so a
resumed run continues exactly where the checkpoint left off.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor

GuardAction = Literal["ok", "skip", "recover", "rollback", "stop"]


def _finite(x: float | Tensor | None) -> bool:
    if x is None:
        return True
    if isinstance(x, Tensor):
        return bool(torch.isfinite(x).all())
    return math.isfinite(float(x))


# ------------------------------------------------------------------------ KL coefficient


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


# ---------------------------------------------------------------------------------- guards


@dataclass
class GuardEvent:
    """A collapse signal crossed its bound for `patience` steps: recover (roll back, lower the LR) or stop."""

    action: Literal["recover", "stop"]
    signal: str  # the record key, e.g. "valid/P", "kl_mean", "eval"
    value: float
    reference: float | None  # the signal's recent median (eval: the best held-out score so far)
    bound: float  # the value the signal crossed
    step: int  # the record (step number) that fired
    first_step: int  # the first record of the streak: the state before it is the last good one
    recoveries: int  # recoveries so far, this one included
    message: str
    also: list[str] = field(default_factory=list)  # other signals out of bounds at the same step

    def record(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items()}


class CollapseGuard:
    """Watches every step's record for a collapse, not only a NaN, and decides to recover or stop.

    Signals (each off when its bound is None; the trainer skips those it does not measure):
      valid/P, valid/A      sampled well-formed share below its recent median - valid_drop
      reward/P, reward/A    training reward below its recent median - reward_drop
      kl_mean               mean per-token KL to the reference above kl_mean
      kl_seq_max            the largest per-completion mean KL above kl_max
      entropy               policy entropy outside [median / entropy_factor, median x entropy_factor]
      truncation_rate       share of completions cut at the limit above its median + truncation_rise
      eval (observe_eval)   held-out score below the best so far - eval_drop

    A relative signal's median is over its last `window` accepted values (it needs MIN_HISTORY of
    them); a value out of bounds is not added, and `patience` such records in a row fire. The
    first `max_recoveries` firings answer "recover" (the trainer rolls back to the last good state
    before the streak, lowers the LR, optionally raises beta), the next "stop" with a message
    naming the signal, its value, the bound and the knob. Decisions depend only on the records,
    which are reduced over ranks, so every rank decides the same; the state resumes exactly.
    """

    MIN_HISTORY = 3
    KNOBS = {
        "valid": "a task's sampled answers stopped being well-formed: lower lr or raise kl_coef, and check the "
                 "reward for a term that pays malformed output (malformed_penalty, the format weight); "
                 "guard_valid_drop sets this bound",
        "reward": "the training reward fell: lower lr, raise kl_coef, narrow clip_range or use fewer "
                  "updates_per_batch; guard_reward_drop sets this bound",
        "kl_mean": "the policy is leaving the reference: lower lr, raise kl_coef (or kl_mode adaptive), narrow "
                   "clip_range or use fewer updates_per_batch; guard_kl_mean sets this bound",
        "kl_seq_max": "single completions moved far from the reference: lower lr, raise kl_coef, narrow "
                      "clip_range; guard_kl_max sets this bound",
        "entropy": "the policy's entropy jumped or collapsed: lower lr, check temperature and phases, adjust "
                   "entropy_coef; guard_entropy_factor sets this band",
        "truncation_rate": "completions run to the length limit: lower lr, raise max_new_tokens or set "
                           "truncated_completions; guard_truncation_rise sets this bound",
        "eval": "the held-out reward fell below the best so far: lower lr, raise kl_coef or anchor_coef; "
                "guard_eval_drop sets this bound",
    }

    def __init__(self, valid_drop: float | None = 0.3, reward_drop: float | None = 0.2, kl_mean: float | None = 1.0,
                 kl_max: float | None = 5.0, entropy_factor: float | None = 2.0, truncation_rise: float | None = 0.3,
                 eval_drop: float | None = 0.05, window: int = 10, patience: int = 2, max_recoveries: int = 2) -> None:
        for name, v in (("valid_drop", valid_drop), ("reward_drop", reward_drop), ("kl_mean", kl_mean),
                        ("kl_max", kl_max), ("truncation_rise", truncation_rise), ("eval_drop", eval_drop)):
            if v is not None and not v > 0:
                raise ValueError(f"{name} must be > 0 or None, got {v}")
        if entropy_factor is not None and not entropy_factor > 1:
            raise ValueError(f"entropy_factor must be > 1 or None, got {entropy_factor}")
        if window < self.MIN_HISTORY or patience < 1 or max_recoveries < 0:
            raise ValueError(f"need window >= {self.MIN_HISTORY}, patience >= 1, max_recoveries >= 0, "
                             f"got {window}, {patience}, {max_recoveries}")
        self.bounds = {"valid": valid_drop, "reward": reward_drop, "kl_mean": kl_mean, "kl_seq_max": kl_max,
                       "entropy": entropy_factor, "truncation_rate": truncation_rise, "eval": eval_drop}
        self.window, self.patience, self.max_recoveries = window, patience, max_recoveries
        self.history: dict[str, deque[float]] = {}
        self.streaks: dict[str, list[int]] = {}  # signal -> [first step, length]
        self.recoveries = 0

    def _check(self, key: str, kind: str, value: float) -> tuple[bool, float | None, float]:
        """(out of bounds, reference, bound) for one signal's value."""
        bound = self.bounds[kind]
        if kind in ("kl_mean", "kl_seq_max"):
            return value > bound, None, bound
        hist = self.history.get(key, ())
        if len(hist) < self.MIN_HISTORY:
            return False, None, math.nan
        ref = statistics.median(hist)
        if kind == "entropy":
            low, high = ref / bound, ref * bound
            return not low <= value <= high, ref, (low if value < low else high)
        if kind == "truncation_rate":
            return value > ref + bound, ref, ref + bound
        return value < ref - bound, ref, ref - bound  # valid, reward

    def _decide(self, signal: str, kind: str, value: float, ref: float | None, bound: float, step: int,
                first: int) -> GuardEvent:
        action: Literal["recover", "stop"] = "recover" if self.recoveries < self.max_recoveries else "stop"
        if action == "recover":
            self.recoveries += 1
        against = f"its recent median {ref:.4g}" if ref is not None and kind != "eval" else (
            f"the best so far {ref:.4g}" if ref is not None else "")
        what = f"{signal} {value:.4g} crossed {bound:.4g}" + (f" ({against})" if against else "")
        span = f"for {step - first + 1} steps " if step > first else ""
        if action == "recover":
            msg = f"collapse guard: {what} {span}at step {step}: recovery {self.recoveries}/{self.max_recoveries}"
        else:
            msg = (f"collapse guard: {what} {span}at step {step}, after {self.recoveries}/{self.max_recoveries} "
                   f"recoveries. {self.KNOBS[kind]}")
        return GuardEvent(action, signal, float(value), ref, float(bound), step, first, self.recoveries, msg)

    def observe(self, step: int, record: Mapping[str, Any]) -> GuardEvent | None:
        """Take one step's record (its `step` is 1-based); return an event when a signal fires."""
        fired = None
        for key, value in record.items():
            kind = key.split("/")[0] if key in ("valid/P", "valid/A", "reward/P", "reward/A") else key
            if kind not in self.bounds or kind == "eval" or self.bounds[kind] is None:
                continue
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            bad, ref, bound = self._check(key, kind, float(value))
            if not bad:
                self.streaks.pop(key, None)
                self.history.setdefault(key, deque(maxlen=self.window)).append(float(value))
                continue
            first, n = self.streaks.get(key, [step, 0])
            self.streaks[key] = [first, n + 1]
            if n + 1 >= self.patience and fired is None:
                fired = (key, kind, float(value), ref, bound)
        if fired is None:
            return None
        first = min(f for f, _ in self.streaks.values())  # the damage began with the earliest streak
        also = sorted(k for k in self.streaks if k != fired[0])
        self.streaks.clear()
        event = self._decide(*fired, step=step, first=first)
        event.also = also
        if also:
            event.message += f" (also out of bounds: {', '.join(also)})"
        return event

    def observe_eval(self, step: int, score: float, best: float) -> GuardEvent | None:
        """A held-out evaluation at `step` against the best score so far."""
        bound = self.bounds["eval"]
        if bound is None or not score < best - bound:
            return None
        return self._decide("eval", "eval", score, best, best - bound, step, step)

    def reset_history(self) -> None:
        """A phase or curriculum change moves the signals on purpose: start their medians afresh."""
        self.history.clear()
        self.streaks.clear()

    def state_dict(self) -> dict[str, Any]:
        return {"history": {k: list(v) for k, v in self.history.items()},
                "streaks": {k: list(v) for k, v in self.streaks.items()}, "recoveries": self.recoveries}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.history = {k: deque(v, maxlen=self.window) for k, v in state["history"].items()}
        self.streaks = {k: list(v) for k, v in state["streaks"].items()}
        self.recoveries = int(state["recoveries"])


class NonFiniteGuard:
    """NaN/Inf guard. A non-finite loss or grad norm answers "skip" (drop the step); the
    ``max_consecutive``-th skip in a row answers "rollback" instead (restore the last good
    checkpoint, multiply LR by ``lr_factor``; ``lr_scale`` is the cumulative factor); a
    rollback needed after ``max_rollbacks`` rollbacks answers "stop". A finite step resets
    the run of skips."""

    def __init__(self, max_consecutive: int = 3, max_rollbacks: int = 2, lr_factor: float = 0.5) -> None:
        if max_consecutive < 1:
            raise ValueError(f"max_consecutive must be >= 1, got {max_consecutive}")
        if max_rollbacks < 0:
            raise ValueError(f"max_rollbacks must be >= 0, got {max_rollbacks}")
        if not 0 < lr_factor <= 1:
            raise ValueError(f"lr_factor must be in (0, 1], got {lr_factor}")
        self.max_consecutive = max_consecutive
        self.max_rollbacks = max_rollbacks
        self.lr_factor = lr_factor
        self.consecutive = 0
        self.rollbacks = 0
        self.total_skips = 0
        self.last_cause = ""

    @property
    def lr_scale(self) -> float:
        return self.lr_factor**self.rollbacks

    def check(self, loss: float | Tensor | None, grad_norm: float | Tensor | None = None) -> Literal[
        "ok", "skip", "rollback", "stop"
    ]:
        bad = [name for name, x in (("loss", loss), ("grad norm", grad_norm)) if not _finite(x)]
        if not bad:
            self.consecutive = 0
            return "ok"
        self.last_cause = " and ".join(bad)
        self.total_skips += 1
        self.consecutive += 1
        if self.consecutive < self.max_consecutive:
            return "skip"
        self.consecutive = 0
        if self.rollbacks >= self.max_rollbacks:
            return "stop"
        self.rollbacks += 1
        return "rollback"

    @property
    def message(self) -> str:
        return (
            f"non-finite {self.last_cause or 'value'}: {self.total_skips} steps skipped, "
            f"{self.rollbacks}/{self.max_rollbacks} rollbacks (LR scale now {self.lr_scale:.3g}). "
            "Lower the learning rate, tighten gradient clipping, check the KL clamp and "
            "bf16/fp16 overflow, and look for empty or degenerate completions."
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "consecutive": self.consecutive,
            "rollbacks": self.rollbacks,
            "total_skips": self.total_skips,
            "last_cause": self.last_cause,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.consecutive = int(state["consecutive"])
        self.rollbacks = int(state["rollbacks"])
        self.total_skips = int(state["total_skips"])
        self.last_cause = str(state.get("last_cause", ""))


# ----------------------------------------------------------------------- reward normaliser


class RewardNormalizer:
    """EMA estimate of the reward mean and variance; ``normalize`` first folds the batch in,
    then returns (r - mean) / max(std, std_floor). The variance update is the exact variance
    of the mixture (old estimate weighted ``momentum``, batch weighted 1 - momentum), so a
    shifting mean widens it. Disabled: returns the rewards unchanged."""

    def __init__(self, momentum: float = 0.99, enabled: bool = True, std_floor: float = 1e-4) -> None:
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        self.momentum = momentum
        self.enabled = enabled
        self.std_floor = std_floor
        self.mean = 0.0
        self.var = 0.0
        self.count = 0

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


# ------------------------------------------------------------------------------ diagnostics


class SymptomMonitor:
    """Reads per-step metrics and returns warnings naming the likely cause and the knob.

    Each symptom fires at most once every ``every`` steps. Metrics read (missing or
    non-finite ones are skipped): kl_mean, zero_var_share, entropy, clip_frac, grad_norm,
    truncation_rate, reward_mean.
    """

    KL_WINDOW = 5  # KL more than doubled over this many steps
    ENTROPY_BASELINE_STEPS = 5
    GRAD_WINDOW = 50
    GRAD_MIN_HISTORY = 5

    def __init__(self, every: int = 50, flat_steps: int = 50) -> None:
        if every < 1 or flat_steps < 2:
            raise ValueError(f"need every >= 1 and flat_steps >= 2, got {every}, {flat_steps}")
        self.every = every
        self.flat_steps = flat_steps
        self._kl: deque[float] = deque(maxlen=self.KL_WINDOW + 1)
        self._grad: deque[float] = deque(maxlen=self.GRAD_WINDOW)
        self._reward: deque[float] = deque(maxlen=flat_steps)
        self._entropy_first: list[float] = []
        self._last_fired: dict[str, int] = {}

    def _get(self, metrics: Mapping[str, Any], key: str) -> float | None:
        v = metrics.get(key)
        if v is None:
            return None
        v = float(v)
        return v if math.isfinite(v) else None

    def _symptoms(self, m: Mapping[str, Any]) -> dict[str, str]:
        found: dict[str, str] = {}
        kl = self._get(m, "kl_mean")
        if kl is not None:
            self._kl.append(kl)
            if len(self._kl) == self._kl.maxlen and kl > 0.05 and kl > 2 * self._kl[0]:
                found["kl_growth"] = (
                    f"KL more than doubled in {self.KL_WINDOW} steps ({self._kl[0]:.3g} -> {kl:.3g}): the "
                    "policy is leaving the reference fast. Lower the learning rate, raise beta or use "
                    "adaptive KL, narrow the clip range."
                )
        zv = self._get(m, "zero_var_share")
        if zv is not None and zv > 0.5:
            found["zero_variance"] = (
                f"{zv:.0%} of groups have equal rewards and no learning signal: tasks too easy or too "
                "hard, or rewards too coarse. Raise the group size or temperature, use graduated "
                "rewards, filter the data or turn on dynamic_sampling."
            )
        ent = self._get(m, "entropy")
        if ent is not None:
            if len(self._entropy_first) < self.ENTROPY_BASELINE_STEPS:
                self._entropy_first.append(ent)
            else:
                base = sum(self._entropy_first) / len(self._entropy_first)
                if base > 0 and ent < 0.2 * base:
                    found["entropy_collapse"] = (
                        f"entropy collapsed to {ent:.3g} (< 20% of its early average {base:.3g}): the "
                        "policy stopped exploring. Raise entropy_coef, temperature or beta, lower "
                        "the learning rate, or raise eps_high (clip-higher)."
                    )
        cf = self._get(m, "clip_frac")
        if cf is not None and cf > 0.5:
            found["clip_fraction"] = (
                f"clip fraction {cf:.0%}: updates move the policy far from the sampling policy. "
                "Lower the learning rate or the number of updates per batch, or widen the clip range."
            )
        gn = self._get(m, "grad_norm")
        if gn is not None:
            if len(self._grad) >= self.GRAD_MIN_HISTORY:
                median = statistics.median(self._grad)
                if median > 0 and gn > 10 * median:
                    found["grad_spike"] = (
                        f"grad norm {gn:.3g} is over 10x its running median {median:.3g}: an outlier "
                        "batch or instability. Tighten gradient clipping, lower the learning rate, "
                        "check advantage clip and KL clamp."
                    )
            self._grad.append(gn)
        tr = self._get(m, "truncation_rate")
        if tr is not None and tr > 0.5:
            found["truncation"] = (
                f"{tr:.0%} of completions hit the length limit: max_new_tokens too small or the "
                "model does not emit its stop token. Raise max_new_tokens, check EOS/stop "
                "handling, or set truncated_completions (mask or malformed)."
            )
        rw = self._get(m, "reward_mean")
        if rw is not None:
            self._reward.append(rw)
            if len(self._reward) == self.flat_steps and max(self._reward) - min(self._reward) < 1e-3:
                found["reward_flat"] = (
                    f"mean reward flat at {rw:.4g} for {self.flat_steps} steps: no learning signal. "
                    "Check the reward function and zero-variance share, raise the learning rate or "
                    "temperature, or change the data mix / curriculum."
                )
        return found

    def observe(self, step: int, metrics: Mapping[str, Any]) -> list[str]:
        """Update histories with this step's metrics; return the warnings due now."""
        out = []
        for name, text in self._symptoms(metrics).items():
            last = self._last_fired.get(name)
            if last is None or step - last >= self.every:
                self._last_fired[name] = step
                out.append(f"step {step} [{name}] {text}")
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "kl": list(self._kl),
            "grad": list(self._grad),
            "reward": list(self._reward),
            "entropy_first": list(self._entropy_first),
            "last_fired": dict(self._last_fired),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._kl = deque(state["kl"], maxlen=self.KL_WINDOW + 1)
        self._grad = deque(state["grad"], maxlen=self.GRAD_WINDOW)
        self._reward = deque(state["reward"], maxlen=self.flat_steps)
        self._entropy_first = list(state["entropy_first"])
        self._last_fired = {str(k): int(v) for k, v in state["last_fired"].items()}
