"""How much each std floor changes the advantages on real batches (no training: about a minute).

    python scripts/std_floor_effect.py                       # configs/default.yaml, 8 batches
    python scripts/std_floor_effect.py --batches 16 --config configs/stable.yaml

Samples batches with the preset's model, data, sampling settings and rewards (what step 0 of
`rookworld train` sees), then for every group with a learning signal prints how its std
compares with the floor and by how much each mode shrinks its advantages against the plain
(reward - mean) / std: `max` divides by max(std, floor), `add` by std + floor. The decision
between them is for training runs (configs/sweeps/std_floor.yaml); this shows how often and
how hard the floor binds on the task.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from step0_batches import sampled_groups


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/default.yaml")
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--floors", default="max:0.05,add:0.05,add:0.0001", help="mode:floor pairs to compare")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cfg, groups = sampled_groups(args.config, args.batches, args.seed)
    stds = []
    for g in groups:
        r = torch.tensor([x.reward for x in g], dtype=torch.float64)
        if r.max() - r.min() > 1e-8:
            stds.append(float(r.std()))
    n = cfg.batch_positions * args.batches
    if not stds:
        raise SystemExit(f"{args.config}: {n} groups of {cfg.group_size}, none with a learning signal (every group's "
                         "rewards equal, as when no answer is readable): no floor binds; sample more batches "
                         "(--batches)")
    print(f"{args.config}: {n} groups of {cfg.group_size}, {len(stds)} with a learning signal "
          f"({n - len(stds)} flat); their reward std: median {statistics.median(stds):.4f}, "
          f"10th percentile {sorted(stds)[len(stds) // 10]:.4f}, min {min(stds):.4f}")
    print(f"{'mode':>5} {'floor':>7}  {'groups where the floor binds':>28}  {'|A| kept (mean)':>15}  {'|A| kept (worst)':>16}")
    for pair in args.floors.split(","):
        mode, floor = pair.split(":")
        f = float(floor)
        kept = [s / max(s, f) if mode == "max" else s / (s + f) for s in stds]  # scaled / unfloored advantage
        binds = sum(k < 0.99 for k in kept)
        print(f"{mode:>5} {f:>7g}  {binds:>6} of {len(stds):<5} ({binds / len(stds):6.1%})  "
              f"{statistics.fmean(kept):>15.3f}  {min(kept):>16.3f}")


if __name__ == "__main__":
    main()
