"""Held-out against training loss of a base model: is it short of data or of capacity? (about 30 s)

    python scripts/fit_gap.py                                    # models/rookworld-board, 512 rows a task
    python scripts/fit_gap.py --model models/rookworld-board --rows 1024

Per task, the answer-token loss (nats a token, as `rookworld sft` logs `eval_loss_*`) on a seeded
sample of the training rows and of the held-out rows. A held-out loss far above the training
loss means the model memorises: more data would help. Nearly equal losses mean it underfits:
more capacity or more steps would, more data of the same kind alone would not.
"""

from __future__ import annotations

import argparse
import random

import torch

from rookworld_rlvr.data.io import read_samples
from rookworld_rlvr.model import load_policy
from rookworld_rlvr.model.load import name_causal_lm_loss
from rookworld_rlvr.sft_rows import encode, make_batch


def answer_loss(model, tokenizer, samples, batch: int = 128) -> float:
    rows = encode(tokenizer, samples, "compact", "best-first")
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(rows), batch):
            ids, mask, labels = make_batch(rows[i:i + batch], tokenizer.pad_token_id, "completion")
            n = int((labels[:, 1:] != -100).sum())
            total += model(input_ids=ids, attention_mask=mask, labels=labels).loss.item() * n
            count += n
    return total / count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="models/rookworld-board")
    ap.add_argument("--train", default="data/train.jsonl.xz")
    ap.add_argument("--eval", default="data/eval.jsonl.gz")
    ap.add_argument("--rows", type=int, default=512, help="rows per task and set")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    model, tokenizer = load_policy(args.model, device="cpu")[:2]
    model.eval()
    name_causal_lm_loss(model)
    sets = {name: read_samples(path) for name, path in (("train", args.train), ("held out", args.eval))}
    for task in ("P", "A"):
        losses, counts = {}, {}
        for name, samples in sets.items():
            rows = [s for s in samples if s.task == task]
            random.Random(args.seed).shuffle(rows)
            rows = rows[:args.rows]
            if not rows:
                raise SystemExit(f"fit_gap: no {task}: rows in {args.train if name == 'train' else args.eval}")
            losses[name], counts[name] = answer_loss(model, tokenizer, rows), len(rows)
        print(f"{task}: train {losses['train']:.4f}, held out {losses['held out']:.4f} nats a token "
              f"(gap {losses['held out'] - losses['train']:+.4f}; {counts['train']} training and "
              f"{counts['held out']} held-out rows)")


if __name__ == "__main__":
    main()
