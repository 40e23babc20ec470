"""Diagnostics: warnings that name a symptom's likely cause and the knob to turn.

The monitor only speaks (the guards act): KL growing fast, groups without signal, entropy
collapsing, many clipped ratios, gradient spikes, truncation, a flat reward. Its state resumes
exactly (`state_dict()`, plain Python values).

Owns the warnings. Pure Python: imports no torch, nothing of the model or chess.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping
from typing import Any


# what each symptom likely means and which knob to turn (str.format with the symptom's values)
ADVICE = {
    "kl_growth": "KL more than doubled in {window} steps ({first:.3g} -> {value:.3g}): the policy is leaving the "
                 "reference fast. Lower the learning rate, raise beta or use adaptive KL, narrow the clip range.",
    "zero_variance": "{value:.0%} of groups have equal rewards and no learning signal: tasks too easy or too hard, "
                     "or rewards too coarse. Raise the group size or temperature, use graduated rewards, filter the "
                     "data or turn on dynamic_sampling.",
    "entropy_collapse": "entropy collapsed to {value:.3g} (< 20% of its early average {base:.3g}): the policy "
                        "stopped exploring. Raise entropy_coef, temperature or beta, lower the learning rate, or "
                        "raise eps_high (clip-higher).",
    "clip_fraction": "clip fraction {value:.0%}: updates move the policy far from the sampling policy. Lower the "
                     "learning rate or the number of updates per batch, or widen the clip range.",
    "grad_spike": "grad norm {value:.3g} is over 10x its running median {median:.3g}: an outlier batch or "
                  "instability. Tighten gradient clipping, lower the learning rate, check advantage clip and KL clamp.",
    "truncation": "{value:.0%} of completions hit the length limit: max_new_tokens too small or the model does not "
                  "emit its stop token. Raise max_new_tokens, check EOS/stop handling, or set truncated_completions "
                  "(mask or malformed).",
    "reward_flat": "mean reward flat at {value:.4g} for {steps} steps: no learning signal. Check the reward function "
                   "and zero-variance share, raise the learning rate or temperature, or change the data mix / "
                   "curriculum.",
}


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
        found: dict[str, dict[str, float]] = {}  # symptom -> the values its advice names
        kl = self._get(m, "kl_mean")
        if kl is not None:
            self._kl.append(kl)
            if len(self._kl) == self._kl.maxlen and kl > 0.05 and kl > 2 * self._kl[0]:
                found["kl_growth"] = {"value": kl, "first": self._kl[0], "window": self.KL_WINDOW}
        zv = self._get(m, "zero_var_share")
        if zv is not None and zv > 0.5:
            found["zero_variance"] = {"value": zv}
        ent = self._get(m, "entropy")
        if ent is not None:
            if len(self._entropy_first) < self.ENTROPY_BASELINE_STEPS:
                self._entropy_first.append(ent)
            else:
                base = sum(self._entropy_first) / len(self._entropy_first)
                if base > 0 and ent < 0.2 * base:
                    found["entropy_collapse"] = {"value": ent, "base": base}
        cf = self._get(m, "clip_frac")
        if cf is not None and cf > 0.5:
            found["clip_fraction"] = {"value": cf}
        gn = self._get(m, "grad_norm")
        if gn is not None:
            if len(self._grad) >= self.GRAD_MIN_HISTORY:
                median = statistics.median(self._grad)
                if median > 0 and gn > 10 * median:
                    found["grad_spike"] = {"value": gn, "median": median}
            self._grad.append(gn)
        tr = self._get(m, "truncation_rate")
        if tr is not None and tr > 0.5:
            found["truncation"] = {"value": tr}
        rw = self._get(m, "reward_mean")
        if rw is not None:
            self._reward.append(rw)
            if len(self._reward) == self.flat_steps and max(self._reward) - min(self._reward) < 1e-3:
                found["reward_flat"] = {"value": rw, "steps": self.flat_steps}
        return {name: ADVICE[name].format(**values) for name, values in found.items()}

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
        return {"kl": list(self._kl), "grad": list(self._grad), "reward": list(self._reward),
                "entropy_first": list(self._entropy_first), "last_fired": dict(self._last_fired)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._kl = deque(state["kl"], maxlen=self.KL_WINDOW + 1)
        self._grad = deque(state["grad"], maxlen=self.GRAD_WINDOW)
        self._reward = deque(state["reward"], maxlen=self.flat_steps)
        self._entropy_first = list(state["entropy_first"])
        self._last_fired = {str(k): int(v) for k, v in state["last_fired"].items()}
