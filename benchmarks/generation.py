"""Generation throughput: our KV-cache sampler vs transformers' `generate` on the same model.

    python benchmarks/generation.py [--model models/rookworld-board] [--threads 1] [--repeats 3]

Batch 64 = 8 prompts x 8 completions, 100 new tokens, greedy (every row runs to the limit
when --no-eos is given) and sampled at T=1. Prints new tokens per second (median of repeats).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rookworld_rlvr.data.io import read_samples
from rookworld_rlvr.model import generate, load_policy


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/rookworld-board")
    ap.add_argument("--data", default="data/eval.jsonl.gz")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=100)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_policy(args.model, device="cpu", verbose=False)
    samples = read_samples(args.data)
    prompts = [s.render("compact")[0] for s in samples if s.task == "P"][:4] + \
              [s.render("compact")[0] for s in samples if s.task == "A"][:4]
    n_pos = model.config.n_positions
    new = min(args.new_tokens, n_pos - max(len(tok(p).input_ids) for p in prompts))
    for mode in ("greedy", "sample"):
        ours, hf = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            g = generate(model, tok, prompts, max_new_tokens=new, greedy=mode == "greedy", temperature=1.0,
                         num_return_sequences=8, generator=torch.Generator().manual_seed(0))
            ours.append(int(g.completion_mask.sum()) / (time.perf_counter() - t0))
            enc = tok([p for p in prompts for _ in range(8)], return_tensors="pt", padding=True, add_special_tokens=False)
            t0 = time.perf_counter()
            out = model.generate(**enc, max_new_tokens=new, do_sample=mode == "sample", temperature=1.0, top_k=0,
                                 pad_token_id=tok.pad_token_id)
            gen = out[:, enc.input_ids.shape[1]:]
            n = int(((gen != tok.pad_token_id).cumprod(1)).sum()) + int((gen == tok.eos_token_id).any(1).sum())
            hf.append(n / (time.perf_counter() - t0))
        print(f"{mode:6s} batch 64, <= {new} new tokens: ours {statistics.median(ours):7.0f} tok/s, "
              f"transformers generate {statistics.median(hf):7.0f} tok/s, ratio {statistics.median(ours) / statistics.median(hf):.2f}x")


if __name__ == "__main__":
    main()
