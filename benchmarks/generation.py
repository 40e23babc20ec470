"""Generation throughput: our KV-cache sampler vs transformers' `generate` on the same model.

    python benchmarks/generation.py [--model models/rookworld-board | --gpt2-124m] [--device cpu|cuda]
                                    [--bf16] [--threads 1] [--repeats 3] [--ours-only] [--decode-graph]

Batch 64 = 8 prompts x 8 completions, 100 new tokens, greedy and sampled at T=1. Prints new
tokens per second (median of repeats, after one unmeasured run). `--gpt2-124m`: the GPT-2 124M
architecture with random weights (nothing downloaded); `--bf16`: bf16 autocast in both samplers;
`--decode-graph`: ours with the shape-stable decode step (a CUDA graph on CUDA, eager elsewhere).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

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
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (default float32)")
    ap.add_argument("--gpt2-124m", action="store_true", help="a random model of the GPT-2 124M architecture")
    ap.add_argument("--ours-only", action="store_true", help="skip transformers' generate")
    ap.add_argument("--decode-graph", action="store_true", help="ours with generate(decode_graph=True)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    path = args.model
    if args.gpt2_124m:
        from transformers import GPT2LMHeadModel

        from rookworld_rlvr.chess_tokenizers import build_chess_tokenizer
        from rookworld_rlvr.model import save_pretrained_atomic, tiny_config

        torch.manual_seed(0)
        tok = build_chess_tokenizer()
        path = Path(tempfile.mkdtemp()) / "gpt2-124m"
        save_pretrained_atomic(GPT2LMHeadModel(tiny_config(len(tok), "gpt2-124m", n_positions=512)), tok, path)
    model, tok = load_policy(str(path), device=args.device, verbose=False)
    dtype = torch.bfloat16 if args.bf16 else None
    amp = torch.autocast(torch.device(args.device).type, dtype=torch.bfloat16) if args.bf16 else nullcontext()

    def sync() -> None:
        if torch.device(args.device).type == "cuda":
            torch.cuda.synchronize()

    samples = read_samples(args.data)
    prompts = [s.render("compact")[0] for s in samples if s.task == "P"][:4] + \
              [s.render("compact")[0] for s in samples if s.task == "A"][:4]
    n_pos = model.config.n_positions
    new = min(args.new_tokens, n_pos - max(len(tok(p).input_ids) for p in prompts))
    for mode in ("greedy", "sample"):
        ours, hf = [], []
        for k in range(args.repeats + 1):  # the first run of each warms up (allocator, kernels)
            sync()
            t0 = time.perf_counter()
            g = generate(model, tok, prompts, max_new_tokens=new, greedy=mode == "greedy", temperature=1.0,
                         num_return_sequences=8, generator=torch.Generator(device=args.device).manual_seed(k),
                         autocast_dtype=dtype, decode_graph=args.decode_graph)
            sync()
            if k:
                ours.append(int(g.completion_mask.sum()) / (time.perf_counter() - t0))
            if args.ours_only:
                continue
            enc = tok([p for p in prompts for _ in range(8)], return_tensors="pt", padding=True,
                      add_special_tokens=False).to(args.device)
            t0 = time.perf_counter()
            with torch.no_grad(), amp:
                drawn = dict(do_sample=True, temperature=1.0, top_k=0) if mode == "sample" else dict(do_sample=False)
                out = model.generate(**enc, max_new_tokens=new, pad_token_id=tok.pad_token_id, **drawn)
            sync()
            gen = out[:, enc.input_ids.shape[1]:]
            n = int(((gen != tok.pad_token_id).cumprod(1)).sum()) + int((gen == tok.eos_token_id).any(1).sum())
            if k:
                hf.append(n / (time.perf_counter() - t0))
        theirs = f", transformers generate {statistics.median(hf):7.0f} tok/s, ratio " \
                 f"{statistics.median(ours) / statistics.median(hf):.2f}x" if hf else ""
        print(f"{mode:6s} batch 64, <= {new} new tokens ({args.device}, {'bf16' if dtype else 'float32'}): "
              f"ours {statistics.median(ours):7.0f} tok/s{theirs}")


if __name__ == "__main__":
    main()
