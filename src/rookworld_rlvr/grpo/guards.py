"""Guards: stop or undo a step that went wrong before it spreads.

`NonFiniteGuard` answers a NaN/Inf loss or gradient (skip, roll back, stop); `CollapseGuard`
watches every step's record (and each evaluation) for a collapse that is not a NaN: well-formed
answers, rewards, KL, entropy and truncation against their recent medians. Both decide from
numbers alone and keep their state in `state_dict()` (plain Python values), so a resumed run
decides as the original would have; the trainer carries out the decision (`grpo.state.rollback`).

Owns the decisions. Imports torch only to read tensors; nothing of the model or chess.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

from rookworld_rlvr.config import TrainConfig


def _default(name: str) -> Any:
    """The TrainConfig field's default: the guards' defaults are the trainer's, written once."""
    return TrainConfig.__dataclass_fields__[name].default

GuardAction = Literal["ok", "skip", "recover", "rollback", "stop"]


class TrainingStopped(RuntimeError):
    """A guard stopped the run; the message names the cause and the knob to turn."""


def _finite(x: float | Tensor | None) -> bool:
    if x is None:
        return True
    if isinstance(x, Tensor):
        return bool(torch.isfinite(x).all())
    return math.isfinite(float(x))


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
    noise: float | None = None  # eval: the paired standard error of the drop, when known

    def record(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items()}


class CollapseGuard:
    """Watches every step's record for a collapse, not only a NaN, and decides to recover or stop.

    Signals (each off when its bound is None; the trainer skips those it does not measure):
      valid/P, valid/A      sampled well-formed share below its recent median - valid_drop
      reward/P, reward/A    training reward below its recent median - max(reward_drop, NOISE_Z x the
                            batch's reward_se/<task>): a batch of hard prompts is not a collapse
      kl_mean               mean per-token KL to the reference above kl_mean
      kl_seq_max            the largest per-completion mean KL above kl_max
      entropy/P, entropy/A  a task's policy entropy above median x entropy_factor, or below
                            median / entropy_factor while that task's reward is also below its median
                            (falling entropy with a held reward is certainty, the goal of a
                            deterministic task such as A:, not a collapse); `entropy` (all tasks
                            together) where the record has no per-task entropy
      truncation_rate       share of completions cut at the limit above its median + truncation_rise
      eval (observe_eval)   held-out score below the best so far - max(eval_drop, EVAL_Z x the paired
                            standard error of that difference): a change inside the evaluation's noise is
                            not a drop

    A relative signal's median is over its last `window` accepted values (it needs MIN_HISTORY of
    them); a value out of bounds is not added, and `patience` such records in a row fire. The
    first `max_recoveries` firings answer "recover" (the trainer rolls back to the last good state
    before the streak, lowers the LR, optionally raises beta), the next "stop" with a message
    naming the signal, its value, the bound and the knob. Decisions depend only on the records,
    which are reduced over ranks, so every rank decides the same; the state resumes exactly.
    """

    MIN_HISTORY = 3
    NOISE_Z = 3.0  # a batch mean this many standard errors (from the prompts drawn) low is still noise
    EVAL_Z = 2.0  # a held-out drop within this many paired standard errors is noise (the 95% level of the tables)
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

    def __init__(self, valid_drop: float | None = _default("guard_valid_drop"),
                 reward_drop: float | None = _default("guard_reward_drop"),
                 kl_mean: float | None = _default("guard_kl_mean"), kl_max: float | None = _default("guard_kl_max"),
                 entropy_factor: float | None = _default("guard_entropy_factor"),
                 truncation_rise: float | None = _default("guard_truncation_rise"),
                 eval_drop: float | None = _default("guard_eval_drop"), window: int = _default("guard_window"),
                 patience: int = _default("guard_patience"),
                 max_recoveries: int = _default("guard_max_recoveries")) -> None:
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

    def _median(self, key: str) -> float | None:
        hist = self.history.get(key, ())
        return statistics.median(hist) if len(hist) >= self.MIN_HISTORY else None

    def _check(self, key: str, kind: str, value: float, record: Mapping[str, Any]) -> tuple[bool, float | None, float]:
        """(out of bounds, reference, bound) for one signal's value in its step's record."""
        bound = self.bounds[kind]
        if kind in ("kl_mean", "kl_seq_max"):
            return value > bound, None, bound
        ref = self._median(key)
        if ref is None:
            return False, None, math.nan
        task = key.split("/")[1] if "/" in key else None
        if kind == "entropy":
            low, high = ref / bound, ref * bound
            if value > high:
                return True, ref, high
            if value < low:
                reward, usual = record.get(f"reward/{task}" if task else "reward/mean"), \
                    self._median(f"reward/{task}" if task else "reward/mean")
                certain = isinstance(reward, (int, float)) and usual is not None and reward >= usual
                return not certain, ref, low
            return False, ref, low
        if kind == "truncation_rate":
            return value > ref + bound, ref, ref + bound
        if kind == "reward":
            noise = record.get(f"reward_se/{task}")
            if isinstance(noise, (int, float)) and math.isfinite(noise):
                bound = max(bound, self.NOISE_Z * noise)
        return value < ref - bound, ref, ref - bound  # valid, reward

    def _decide(self, signal: str, kind: str, value: float, ref: float | None, bound: float, step: int,
                first: int, noise: float | None = None) -> GuardEvent:
        action: Literal["recover", "stop"] = "recover" if self.recoveries < self.max_recoveries else "stop"
        if action == "recover":
            self.recoveries += 1
        against = f"its recent median {ref:.4g}" if ref is not None and kind != "eval" else (
            f"the best so far {ref:.4g}" if ref is not None else "")
        if noise is not None:
            against += f"; paired standard error {noise:.2g}"
        what = f"{signal} {value:.4g} crossed {bound:.4g}" + (f" ({against})" if against else "")
        span = f"for {step - first + 1} steps " if step > first else ""
        if action == "recover":
            msg = f"collapse guard: {what} {span}at step {step}: recovery {self.recoveries}/{self.max_recoveries}"
        else:
            msg = (f"collapse guard: {what} {span}at step {step}, after {self.recoveries}/{self.max_recoveries} "
                   f"recoveries. {self.KNOBS[kind]}")
        return GuardEvent(action, signal, float(value), ref, float(bound), step, first, self.recoveries, msg,
                          noise=noise)

    def observe(self, step: int, record: Mapping[str, Any]) -> GuardEvent | None:
        """Take one step's record (its `step` is 1-based); return an event when a signal fires."""
        fired = None
        per_task_entropy = any(k.startswith("entropy/") for k in record)
        for key, value in record.items():
            kind = key.split("/")[0] if key in ("valid/P", "valid/A", "reward/P", "reward/A", "entropy/P",
                                                "entropy/A") else key
            if kind == "reward" and self.bounds[kind] is None and isinstance(value, (int, float)) \
                    and math.isfinite(value):  # the entropy signal still compares with it
                self.history.setdefault(key, deque(maxlen=self.window)).append(float(value))
            if kind not in self.bounds or kind == "eval" or self.bounds[kind] is None:
                continue
            if key == "entropy" and per_task_entropy:
                continue
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            bad, ref, bound = self._check(key, kind, float(value), record)
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

    def eval_bound(self, se: float | None = None) -> float | None:
        """How far below the best a held-out score may fall: eval_drop, widened to EVAL_Z paired
        standard errors of the change where those are known (None: the signal is off)."""
        bound = self.bounds["eval"]
        if bound is None or se is None or not math.isfinite(se):
            return bound
        return max(bound, self.EVAL_Z * se)

    def observe_eval(self, step: int, score: float, best: float, se: float | None = None) -> GuardEvent | None:
        """A held-out evaluation at `step` against the best score so far; `se` is the standard error
        of the difference, paired over the same rows (`metrics.held_out_se`), when known."""
        bound = self.eval_bound(se)
        if bound is None or not score < best - bound:
            return None
        noise = float(se) if se is not None and math.isfinite(se) else None
        return self._decide("eval", "eval", score, best, best - bound, step, step, noise)

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

    def __init__(self, max_consecutive: int = _default("nan_max_consecutive"),
                 max_rollbacks: int = _default("nan_max_rollbacks"),
                 lr_factor: float = _default("rollback_lr_factor")) -> None:
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
