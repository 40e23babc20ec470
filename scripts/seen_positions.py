"""A training set of a few P: positions, to measure what GRPO learns on the positions it sees.

    python scripts/seen_positions.py --out runs/p64.jsonl          # 64 positions + 2,000 A: rows
    make train ARGS="--data runs/p64.jsonl --output-dir runs/p64"
    rookworld data judge runs/p64.positions.jsonl --out runs/p64.strength.jsonl --puzzles-out '' --positions 64
    rookworld eval --model runs/p64/final --data runs/p64.positions.jsonl --strength runs/p64.strength.jsonl

`make train` draws new positions at every step and is judged on positions it never saw; this
set repeats the same positions (each about 14 times in 150 steps), so the run's greedy answers
can be judged on exactly what it trained on. The A: rows are there for the anchor
(anchor_tasks A), which trains on ground-truth A: answers. Writes OUT (the training set) and
OUT with `.positions.jsonl` (its P: positions alone, to judge and evaluate).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="data/train.jsonl.xz")
    ap.add_argument("--out", required=True)
    ap.add_argument("--positions", type=int, default=64)
    ap.add_argument("--pool", type=int, default=5000, help="P: rows (from the start) the positions are drawn from")
    ap.add_argument("--env-rows", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    policy, env = [], []
    from rookworld_rlvr.data.io import open_text

    with open_text(Path(args.data)) as f:
        for line in f:
            task = json.loads(line)["task"]
            if task == "P" and len(policy) < args.pool:
                policy.append(line)
            elif task == "A" and len(env) < args.env_rows:
                env.append(line)
            if len(policy) >= args.pool and len(env) >= args.env_rows:
                break
    random.Random(args.seed).shuffle(policy)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(policy[:args.positions] + env))
    out.with_suffix(".positions.jsonl").write_text("".join(policy[:args.positions]))
    print(f"{out}: {min(args.positions, len(policy))} P: positions and {len(env)} A: rows")


if __name__ == "__main__":
    main()
