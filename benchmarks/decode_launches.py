"""Operations per decoded token outside the decode graph: what a GPU launches from Python at every token.

    python benchmarks/decode_launches.py [--model models/rookworld-board] [--tokens 40] [--temperature 0.8]

With `decode_graph` a CUDA decode step is one graph replay; the token's sampling and bookkeeping around it
(temperature, softmax, the draw, the masks and buffers written) are launched one kernel each, which on a GPU
costs host time comparable to the step itself (benchmarks/gpu/README.md: 26,030 launches outside the decode
graphs in two GRPO steps of the 124M preset). This counts the aten operations dispatched per token outside the
graph's step, with torch's dispatch hook on the CPU: the same Python code, so the same operations as on CUDA.
Operations that only make a view (no kernel) are counted apart. Counts do not depend on the model's size.
"""

from __future__ import annotations

import argparse
import collections

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rookworld_rlvr.model import generate, gpt2_decode, load_policy

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


def per_token(model, tokenizer, prompts: list[str], tokens: int, temperature: float) -> dict[str, float]:
    """Operations per token outside CascadeDecoder.step: the difference of two rollouts, `tokens` and 8 long,
    over their difference in tokens (the prefill and the end's decoding cancel)."""
    counter = Counter()
    step = gpt2_decode.CascadeDecoder.step

    def outside(self, *args, **kwargs):
        counter.paused = True
        try:
            return step(self, *args, **kwargs)
        finally:
            counter.paused = False

    totals = []
    gpt2_decode.CascadeDecoder.step = outside
    try:
        for n in (8, tokens):
            counter.ops.clear()
            with counter:
                generate(model, tokenizer, prompts, max_new_tokens=n, temperature=temperature,
                         num_return_sequences=8, generator=torch.Generator().manual_seed(0), decode_graph=True,
                         check_every=8)
            totals.append(collections.Counter(counter.ops))
    finally:
        gpt2_decode.CascadeDecoder.step = step
    diff = {name: (totals[1][name] - totals[0][name]) / (tokens - 8) for name in totals[1]}
    return {name: n for name, n in sorted(diff.items(), key=lambda kv: -kv[1]) if n > 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="models/rookworld-board")
    ap.add_argument("--tokens", type=int, default=40, help="new tokens of the longer rollout (more than 8)")
    ap.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (the GRPO presets' P:)")
    args = ap.parse_args()
    if args.tokens <= 8:
        ap.error("--tokens must be more than 8")
    model, tokenizer = load_policy(args.model, device="cpu", verbose=False)
    prompts = ["P: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1 ",
               "A: 8/8/8/8/8/8/8/K6k w - - 0 1+"]
    ops = per_token(model, tokenizer, prompts, args.tokens, args.temperature)
    kernels = {k: v for k, v in ops.items() if k not in VIEWS}
    print(f"per decoded token outside the graph's step ({len(prompts)} prompts x 8 rows, T={args.temperature:g}): "
          f"{sum(kernels.values()):.1f} operations that launch a kernel on CUDA (or are free no-ops), "
          f"{sum(ops.values()) - sum(kernels.values()):.1f} views")
    print(", ".join(f"{k} {v:g}" for k, v in kernels.items()))


if __name__ == "__main__":
    main()
