"""How close finished runs came to each collapse guard bound (calibration of the guard_* defaults).

    python scripts/guard_margins.py runs/guard-cal-0 runs/guard-cal-1 runs/guard-cal-2
    python scripts/guard_margins.py RUN... --guard-reward-drop 0.15     # what a tighter bound would have done

For every run directory it replays metrics.jsonl (and eval.jsonl) through the collapse guard
with the run's own config.yaml, or the bounds given here, and prints per signal the worst
excursion that lasted guard_patience steps in a row (below the median for the valid share and the
reward, above it for truncation, the larger of the two factors for entropy, the value for KL; the
fall below the best evaluation before it for eval, against the wider of guard_eval_drop and two paired
standard errors where the evaluations kept their rows) next to its bound, with the margin left; and any
step where the guard would have acted. A run that trained without a guard event and keeps a
clear margin on every signal is what the defaults must allow.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import deque
from pathlib import Path

import yaml

from rookworld_rlvr.config import TrainConfig
from rookworld_rlvr.grpo.guards import CollapseGuard
from rookworld_rlvr.metrics import held_out_reward, held_out_se

BOUNDS = ("guard_valid_drop", "guard_reward_drop", "guard_kl_mean", "guard_kl_max", "guard_entropy_factor",
          "guard_truncation_rise", "guard_eval_drop")
SIGNALS = {"valid/P": "guard_valid_drop", "valid/A": "guard_valid_drop", "reward/P": "guard_reward_drop",
           "reward/A": "guard_reward_drop", "kl_mean": "guard_kl_mean", "kl_seq_max": "guard_kl_max",
           "entropy": "guard_entropy_factor", "truncation_rate": "guard_truncation_rise"}


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def excursions(records: list[dict], key: str, window: int, patience: int) -> list[float]:
    """Per step: how far the signal was from its accepted median (or its value, for KL), in the
    units of its bound; the history takes every value (a healthy run's, which is what is measured)."""
    hist: deque[float] = deque(maxlen=window)
    out = []
    for r in records:
        v = r.get(key)
        if not isinstance(v, (int, float)) or not math.isfinite(v) or r.get("nonfinite"):
            continue
        if key.startswith("kl_"):
            out.append(v)
        elif len(hist) >= CollapseGuard.MIN_HISTORY:
            m = statistics.median(hist)
            if key == "entropy":
                out.append(max(v / m, m / v) if m > 0 and v > 0 else math.inf)
            elif key == "truncation_rate":
                out.append(v - m)
            else:
                out.append(m - v)
        hist.append(v)
    # sustained: the smallest excursion of each run of `patience` steps, then the worst of those
    return [min(out[i:i + patience]) for i in range(len(out) - patience + 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+")
    for name in BOUNDS + ("guard_window", "guard_patience"):
        ap.add_argument("--" + name.replace("_", "-"), type=float, default=None)
    args = ap.parse_args()
    for run in map(Path, args.runs):
        cfg = {**vars(TrainConfig()), **yaml.safe_load((run / "config.yaml").read_text())}
        cfg.update({k: v for k, v in vars(args).items() if k in cfg and v is not None})
        window, patience = int(cfg["guard_window"]), int(cfg["guard_patience"])
        records, evals = _lines(run / "metrics.jsonl"), _lines(run / "eval.jsonl")
        events = _lines(run / "events.jsonl")
        print(f"{run}: {len(records)} steps, {len(evals)} evaluations, {len(events)} guard events during training")
        print(f"  {'signal':<16} {'worst (sustained)':>18} {'bound':>9} {'margin':>9}")
        for key, bound_name in SIGNALS.items():
            bound = cfg[bound_name]
            ex = excursions(records, key, window, patience)
            if not ex:
                continue
            worst = max(ex)
            margin = "off" if bound is None else f"{bound - worst:+.4g}"
            print(f"  {key:<16} {worst:>18.4g} {'-' if bound is None else format(bound, '.4g'):>9} {margin:>9}")
        guard = CollapseGuard(*(cfg[n] for n in BOUNDS), window=window, patience=patience, max_recoveries=10 ** 6)
        scores = [held_out_reward(e) for e in evals]
        if len(scores) > 1 and cfg["guard_eval_drop"] is not None:  # each against the best before it, as the guard
            rows = []
            for i in range(1, len(evals)):
                j = max(range(i), key=lambda k: scores[k])
                bound = guard.eval_bound(held_out_se(evals[i], evals[j]))
                rows.append((bound - (scores[j] - scores[i]), scores[j] - scores[i], bound))
            margin, fall, bound = min(rows)
            print(f"  {'eval':<16} {fall:>18.4g} {bound:>9.4g} {margin:>+9.4g}")
        elif len(scores) > 1:
            print(f"  {'eval':<16} {max(max(scores[:i]) - s for i, s in enumerate(scores) if i):>18.4g} {'-':>9} {'off':>9}")
        fired = [(r["step"], e.signal, e.value) for r in records if not r.get("nonfinite")
                 and (e := guard.observe(r["step"], r))]
        print("  would act at: " + (", ".join(f"step {s} ({sig} {v:.4g})" for s, sig, v in fired) if fired else "none"))


if __name__ == "__main__":
    main()
