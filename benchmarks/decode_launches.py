"""Operations per decoded token outside the decode graph: what a GPU launches from Python at every token.

    python benchmarks/decode_launches.py [--model models/rookworld-board] [--tokens 40] [--temperature 0.8]

With `decode_graph` a CUDA token is one graph replay (`token_graph.TokenGraph`): its draw, its bookkeeping and
the model's step. What is left outside (the uniforms drawn every `check_every` tokens, the stop check's read)
is launched one kernel at a time; when the graph held the model's step alone, the token's sampling and
bookkeeping were 24.6 launches a token more, and on an H200 the host's launches, not the GPU's arithmetic, set
the 124M preset's step time (benchmarks/gpu/README.md). This counts the aten operations dispatched per token
outside what the graph captures, with torch's dispatch hook on the CPU: the same Python code, so the same
operations as on CUDA. Operations that only make a view (no kernel) are counted apart. `--step-only` counts
as the graph of the model's step alone would leave them (the decoder's step paused, the token's sampling and
bookkeeping counted). Counts do not depend on the model's size.
"""

from __future__ import annotations

import argparse
import collections

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rookworld_rlvr.model import generate, gpt2_decode, load_policy, token_graph

VIEWS = {"view", "select", "slice", "squeeze", "unsqueeze", "detach", "t", "transpose", "expand", "alias",
         "as_strided", "_unsafe_view", "lift_fresh", "reshape"}


class Counter(TorchDispatchMode):
    """Aten operations by name, except while `paused` (inside the graph's step)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def per_token(model, tokenizer, prompts: list[str], tokens: int, temperature: float,
              step_only: bool = False) -> dict[str, float]:
    """Operations per token outside what a CUDA graph captures (the token's call with its decode; with
    `step_only`, CascadeDecoder.step): the difference of two rollouts, `tokens` and 8 long, over their
    difference in tokens (the prefill and the end's decoding cancel)."""
    counter = Counter()
    owner, name = (gpt2_decode.CascadeDecoder, "step") if step_only else (token_graph.TokenGraph, "_token")
    captured = getattr(owner, name)

    def inside(self, *args, **kwargs):
        if not step_only and not kwargs.get("decode", args[0] if args else True):
            return captured(self, *args, **kwargs)  # the last token runs eagerly, outside the graph
        counter.paused = True
        try:
            return captured(self, *args, **kwargs)
        finally:
            counter.paused = False

    totals = []
    setattr(owner, name, inside)
    try:
        for n in (8, tokens):
            counter.ops.clear()
            with counter:
                generate(model, tokenizer, prompts, max_new_tokens=n, temperature=temperature,
                         num_return_sequences=8, generator=torch.Generator().manual_seed(0), decode_graph=True,
                         check_every=8)
            totals.append(collections.Counter(counter.ops))
    finally:
        setattr(owner, name, captured)
    diff = {name: (totals[1][name] - totals[0][name]) / (tokens - 8) for name in totals[1]}
    return {name: n for name, n in sorted(diff.items(), key=lambda kv: -kv[1]) if n > 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="models/rookworld-board")
    ap.add_argument("--tokens", type=int, default=40, help="new tokens of the longer rollout (more than 8)")
    ap.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (the GRPO presets' P:)")
    ap.add_argument("--step-only", action="store_true",
                    help="count as a graph of the model's step alone leaves them (the token's sampling outside)")
    args = ap.parse_args()
    if args.tokens <= 8:
        ap.error("--tokens must be more than 8")
    model, tokenizer = load_policy(args.model, device="cpu", verbose=False)
    prompts = ["P: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1 ",
               "A: 8/8/8/8/8/8/8/K6k w - - 0 1+"]
    ops = per_token(model, tokenizer, prompts, args.tokens, args.temperature, args.step_only)
    kernels = {k: v for k, v in ops.items() if k not in VIEWS}
    where = "the model's step" if args.step_only else "the token's graph"
    print(f"per decoded token outside {where} ({len(prompts)} prompts x 8 rows, T={args.temperature:g}): "
          f"{sum(kernels.values()):.1f} operations that launch a kernel on CUDA (or are free no-ops), "
          f"{sum(ops.values()) - sum(kernels.values()):.1f} views")
    print(", ".join(f"{k} {v:g}" for k, v in kernels.items()))


if __name__ == "__main__":
    main()
