"""A training set whose P: positions are those in check and those where a king move would step into check.

    python scripts/king_positions.py --out runs/king.jsonl
    make train ARGS="--data runs/king.jsonl --check-share 0.75 --output-dir runs/king75"
    python scripts/king_positions.py --out runs/king_anchor.jsonl --keep king
    make train ARGS="--anchor-data runs/king_anchor.jsonl --output-dir runs/king_anchor"
    python scripts/king_positions.py --out runs/out_of_check.jsonl --keep out-of-check
    make train ARGS="--anchor-data runs/out_of_check.jsonl --output-dir runs/anchor_out_of_check"

GRPO on positions in check teaches the policy to move its king, and it then moves the king into
check out of check too: every run of docs/grpo-experiments.md lost legality there and nowhere else
out of check. This set keeps the training data's A: rows (for the anchor) and, of its P: rows, the
positions in check and those out of check where a king move (castling aside) would be illegal, so
that `check_share` splits the prompts between the two. The P: anchor then draws from the same
positions. `--keep king` leaves out the positions in check, `--keep out-of-check` keeps every
position out of check: files for `anchor_data`, whose true answers then do not teach, by
supervision, the moves in check that GRPO is to learn.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rookworld_rlvr.data.io import open_text
from rookworld_rlvr.tasks.strength import in_check, king_can_step_into_check


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="data/train.jsonl.xz")
    ap.add_argument("--out", required=True)
    ap.add_argument("--keep", choices=("check-and-king", "king", "out-of-check"), default="check-and-king",
                    help="the P: rows kept: in check or where a king move would step into check (default); only "
                         "the latter; every one out of check")
    args = ap.parse_args()
    env, policy, checks = [], [], 0
    with open_text(Path(args.data)) as f:
        for line in f:
            row = json.loads(line)
            if row["task"] == "A":
                env.append(line)
            elif row["task"] == "P" and in_check(row["truth"]["fen"]):
                if args.keep == "check-and-king":
                    policy.append(line)
                    checks += 1
            elif row["task"] == "P" and (args.keep == "out-of-check" or king_can_step_into_check(row["truth"]["fen"])):
                policy.append(line)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(env + policy))
    where = "" if args.keep == "out-of-check" else " where a king move would step into check"
    print(f"{out}: {checks} P: positions in check, {len(policy) - checks} out of check{where}, {len(env)} A: rows")


if __name__ == "__main__":
    main()
