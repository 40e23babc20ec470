"""Peak memory of one GRPO minibatch's scoring pass at the GPT-2 124M architecture: the log-probs and
entropy of 64 completions x 144 tokens (8 prompts x 8, `configs/rookworld-124m.yaml`'s minibatch),
with the backward, scored in chunks of rows (the default) and in one piece.

    python benchmarks/logprob_memory.py [--device cpu|cuda] [--autocast none|bf16]

Each measurement runs in its own process: on a GPU the peak is torch's allocator peak, on a CPU the
process's peak resident memory minus its resident memory before the pass (model loaded).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GROUP = 8  # completions a prompt


def measure(device: str, autocast: str, chunked: bool, grad: bool, rows: int, prompt: int, completion: int) -> dict:
    import torch

    sys.path.insert(0, str(ROOT / "src"))
    from transformers import GPT2LMHeadModel

    from rookworld_rlvr.model import logprobs as lp
    from rookworld_rlvr.model import tiny_config

    if not chunked:
        lp.SCORE_CHUNK_ELEMENTS = 2**62
    torch.manual_seed(0)
    dev = torch.device(device)
    model = GPT2LMHeadModel(tiny_config(50257, "gpt2-124m", n_positions=512)).to(dev).eval()
    prompts = torch.randint(0, 50257, (rows // GROUP, prompt), device=dev).repeat_interleave(GROUP, 0)
    ids = torch.cat([prompts, torch.randint(0, 50257, (rows, completion), device=dev)], 1)
    mask = torch.ones_like(ids)
    pos = torch.arange(ids.shape[1], device=dev).expand_as(ids)
    amp = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast == "bf16")
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = _rss_now()
    t0 = time.perf_counter()
    with torch.set_grad_enabled(grad), amp:
        out = lp.token_logprobs(model, ids, mask, pos, completion, temperature=0.9, return_entropy=True,
                                group_size=GROUP, entropy_grad=False)
    if grad:
        out["logprobs"].sum().backward()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    return {"device": device, "autocast": autocast, "chunked": chunked, "backward": grad, "rows": rows,
            "completion": completion, "peak_gib": round(peak / 2**30, 2), "seconds": round(time.perf_counter() - t0, 2)}


def _rss_now() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--autocast", choices=("none", "bf16"), default="none")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=80)
    ap.add_argument("--completion", type=int, default=144)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a single measurement, in this process
    args = ap.parse_args()
    if args.rows < GROUP or args.rows % GROUP:
        ap.error(f"--rows must be a positive multiple of {GROUP} (each prompt's {GROUP} completions), got {args.rows}")
    if args.one:
        chunked, grad = json.loads(args.one)
        print(json.dumps(measure(args.device, args.autocast, chunked, grad, args.rows, args.prompt, args.completion)))
        return
    for grad in (False, True):
        for chunked in (True, False):
            cmd = [sys.executable, __file__, "--device", args.device, "--autocast", args.autocast, "--rows",
                   str(args.rows), "--prompt", str(args.prompt), "--completion", str(args.completion),
                   "--one", json.dumps([chunked, grad])]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"the measurement {json.dumps([chunked, grad])} (chunked, backward) failed:\n{done.stderr}")
            r = json.loads(done.stdout.splitlines()[-1])
            print(f"{'backward' if grad else 'no grad '} {'chunked ' if chunked else 'one piece'}: peak "
                  f"{r['peak_gib']:.2f} GiB above the model, {r['seconds']:.1f} s ({args.device}, {args.autocast})",
                  flush=True)


if __name__ == "__main__":
    main()
