"""The measurements of `scripts/gpu_check.sh`: generation tokens/s, GRPO step time, phase shares and
peak memory at the GPT-2 124M architecture (each with `decode_graph` off and on), and SFT throughput,
on one device; a JSON file and a markdown table in --out.

    python benchmarks/gpu_check.py --device cuda --out OUT            # on the GPU machine (about 5 minutes)
    python benchmarks/gpu_check.py --device cpu --smoke --out OUT     # tiny sizes: proves the script runs

The 124M model has random weights and GPT-2's 50,257-token vocabulary (the chess tokenizer padded
with unused tokens, so the LM head and the log-prob tensors have their real size and nothing is
downloaded); a random model almost never samples EOS, so every completion runs to the length limit
and every configuration does the same work. GRPO steps use a dense toy reward (no Stockfish), so
the timings are the trainer's own. Medians over the measured repeats, after one unmeasured one.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import itertools
import json
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))  # gpu_check_table, also where the tests load this file as a module

from rookworld_rlvr.chess_tokenizers import build_chess_tokenizer  # noqa: E402
from rookworld_rlvr.config import load_config  # noqa: E402
from rookworld_rlvr.data.io import read_samples  # noqa: E402
from rookworld_rlvr.grpo.trainer import Trainer  # noqa: E402
from rookworld_rlvr.model import generate, save_pretrained_atomic, tf32_unless_chosen, tiny_config  # noqa: E402

from gpu_check_table import markdown  # noqa: E402

GPT2_VOCAB = 50257


class _Result:
    def __init__(self, total):
        self.total, self.components, self.valid_format = total, {"chars": total}, True


def toy_reward(prompts, completions, truths, weights):
    return [_Result(sum(c.isdigit() for c in t) / max(len(t), 1)) for t in completions]


def machine(device: torch.device) -> dict:
    out = {"torch": torch.__version__, "python": platform.python_version(), "device": str(device)}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        out.update(gpu=props.name, memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda,
                   float32_matmul=getattr(torch.backends.cuda.matmul, "fp32_precision", "unknown"))
        try:
            out["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out["driver"] = "unknown"
    else:
        out["cpu"] = platform.processor() or platform.machine()
    return out


def padded_chess_tokenizer(vocab: int):
    """The chess tokenizer with unused tokens added up to `vocab` (GPT2_VOCAB: an LM head of RookWorld-LM-124M's size)."""
    tok = build_chess_tokenizer()
    if vocab < len(tok):
        raise ValueError(f"vocab {vocab} is smaller than the chess tokenizer's {len(tok)} tokens")
    tok.add_tokens([f"<unused{i}>" for i in range(vocab - len(tok))])
    return tok


SMOKE_SHAPE = {"n_layer": 2, "n_embd": 64, "n_head": 4}  # --smoke: the test suite's tiny model, so that a CPU that
# emulates bf16 (60-80x slower than float32 on an AVX2-only CPU) still runs the bf16 rows in seconds


def random_model(preset: str, vocab: int, out: Path, seed: int = 0, shape: dict[str, int] | None = None) -> Path:
    """A random GPT-2 of `preset` (its shape replaced by `shape` where given) with the chess tokenizer padded
    to `vocab` tokens, saved to `out`."""
    from transformers import GPT2LMHeadModel

    torch.manual_seed(seed)
    tok = padded_chess_tokenizer(vocab)
    config = tiny_config(len(tok), preset, n_positions=512)
    for key, value in (shape or {}).items():
        setattr(config, key, value)
    model = GPT2LMHeadModel(config)
    save_pretrained_atomic(model, tok, out)
    return out


def peak_memory(device: torch.device) -> float:
    """GiB: the device's peak allocation since the last reset, or the process's peak RSS on a CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Results:
    """OUT/gpu_check.json and .md, written again after every measurement, so that a call its timeout ends
    still sends back what it finished; a measurement that would start after `deadline` (epoch seconds) is
    left out and named under `not_measured`, so that the steps after it (TRL's run) keep their time."""

    def __init__(self, out: Path, result: dict, deadline: float | None):
        self.out, self.result, self.deadline = out, result, deadline
        result.update(generation=[], grpo=[], sft=[], not_measured=[], complete=False)
        self.save()

    def add(self, section: str, row: dict) -> None:
        self.result[section].append(row)
        self.save()

    def in_time(self, what: str) -> bool:
        if self.deadline is None or time.time() < self.deadline:
            return True
        self.result["not_measured"].append(f"{what}: the deadline had passed")
        self.save()
        print(f"{what}: not measured, the deadline had passed", flush=True)
        return False

    def save(self) -> None:
        (self.out / "gpu_check.json").write_text(json.dumps(self.result, indent=2) + "\n")
        (self.out / "gpu_check.md").write_text(markdown(self.result))


def failed(res: Results, section: str, row: dict, what: str, error: Exception) -> None:
    """A measurement that raised: its row names the error, the device's cache is freed, and the measurements after
    it still run (one configuration failing on a GPU loses none of the others' figures)."""
    res.add(section, {**row, "error": f"{type(error).__name__}: {error}"[:300]})
    print(f"{what}: failed: {type(error).__name__}: {error}", flush=True)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def generation(model_dir: Path, device: torch.device, shapes, new_tokens: int, repeats: int, res: Results) -> None:
    from rookworld_rlvr.model import load_policy

    prompts_all = [s.render("padded")[0] for s in read_samples(ROOT / "data" / "eval.jsonl.gz") if s.task == "P"]
    for (dtype_name, dtype), graph in itertools.product((("float32", None), ("bf16", torch.bfloat16)), (False, True)):
        model, tok = load_policy(str(model_dir), device=str(device), verbose=False)
        for prompts_n, group in shapes:
            what = f"generation {dtype_name}{' decode_graph' if graph else ''} {prompts_n}x{group}"
            if not res.in_time(what):
                continue
            row = {"dtype": dtype_name, "decode_graph": graph, "prompts": prompts_n, "group": group,
                   "new_tokens": new_tokens}
            times, tokens = [], 0
            try:
                for k in range(repeats + 1):
                    sync(device)
                    t = time.perf_counter()
                    out = generate(model, tok, prompts_all[:prompts_n], max_new_tokens=new_tokens, temperature=1.0,
                                   num_return_sequences=group, autocast_dtype=dtype, decode_graph=graph,
                                   generator=torch.Generator(device=device).manual_seed(k))
                    sync(device)
                    if k:  # the first run warms up (allocator, kernels)
                        times.append(time.perf_counter() - t)
                        tokens = int(out.completion_mask.sum())
            except Exception as e:  # noqa: BLE001 - a configuration that fails is a result too
                failed(res, "generation", row, what, e)
                continue
            sec = statistics.median(times)
            res.add("generation", {**row, "generated_tokens": tokens, "seconds": round(sec, 4),
                                   "tokens_per_s": round(tokens / sec, 1)})
            print(f"{what}: {tokens / sec:.0f} tokens/s", flush=True)


def grpo_config(model_dir: Path, data: Path, device: torch.device, out: Path, steps: int, smoke: bool, autocast: str,
                graph: bool):
    """configs/rookworld-124m.yaml on the random model, its autocast and decode_graph as given, without Stockfish,
    held-out evaluation or checkpoints (tiny sizes with smoke)."""
    over = dict(model=str(model_dir), data=str(data), eval_data="", output_dir=str(out), steps=steps,
                device=str(device), autocast=autocast, decode_graph=graph, save_every=10**6, report=False,
                tensorboard=False, progress=False, engine_cache=None, puzzle_data=None, strength_data=None,
                puzzle_eval_data=None, history_eval_data=None, mix_env_ratio=0.5)
    if autocast == "bf16":
        over["backward_dtype"] = "auto"
    if smoke:
        over.update(batch_positions=2, group_size=2, max_new_tokens=8, minibatch_size=0)
    return load_config(str(ROOT / "configs" / "rookworld-124m.yaml"), over)


def grpo(model_dir: Path, data: Path, device: torch.device, tmp: Path, steps: int, smoke: bool, res: Results) -> None:
    """The preset's steps with decode_graph off and on, once with attention as torch chooses it (cuDNN's kernel
    included, which our forwards leave out on CUDA: `model.generate.attention_backends`; this row prices that
    choice), and once with log-prob scoring chunks 4x the default (`logprobs.SCORE_CHUNK_ELEMENTS`: 4 rows a chunk
    at GPT-2's vocabulary; fewer, larger chunks launch fewer kernels and hold more memory, which this row prices)."""
    from rookworld_rlvr.model import logprobs

    generate = importlib.import_module("rookworld_rlvr.model.generate")  # the module (the package's name: a function)
    default_chunk, our_attention = logprobs.SCORE_CHUNK_ELEMENTS, generate.attention_backends
    # (torch.compile was a setting once; config.REMOVED says why it went)
    for autocast, graph, chunk, torch_attention in (("none", False, 1, False), ("bf16", False, 1, False),
                                                     ("bf16", True, 1, False), ("bf16", True, 1, True),
                                                     ("bf16", True, 4, False)):
        name = f"autocast {autocast}" + (", decode_graph" if graph else "") + (f", scoring chunks x{chunk}"
                                                                               if chunk > 1 else "") \
            + (", attention as torch chooses (cuDNN's too)" if torch_attention else "")
        if not res.in_time(f"grpo {name}"):
            continue
        try:
            out = tmp / f"grpo-{autocast}-{graph}-{chunk}-{torch_attention}"
            cfg = grpo_config(model_dir, data, device, out, steps, smoke, autocast, graph)
            tr = Trainer(cfg, toy_reward, read_samples(cfg.data), None, log=lambda *_: None)
            reset_peak(device)
            logprobs.SCORE_CHUNK_ELEMENTS = default_chunk * chunk
            if torch_attention:
                generate.attention_backends = lambda _device: contextlib.nullcontext()
            tr.train()
        except Exception as e:  # noqa: BLE001 - a configuration that fails is a result too
            failed(res, "grpo", {"config": name}, f"grpo {name}", e)
            continue
        finally:
            logprobs.SCORE_CHUNK_ELEMENTS, generate.attention_backends = default_chunk, our_attention
        recs = [json.loads(x) for x in (Path(cfg.output_dir) / "metrics.jsonl").read_text().splitlines()][1:]
        step = statistics.median(r["time/step"] for r in recs)
        phases = {k[5:]: round(statistics.median(r[k] for r in recs) / step, 3)
                  for k in recs[0] if k.startswith("time/") and k != "time/step"}
        res.add("grpo", {"config": name, "batch": f"{cfg.batch_positions} x {cfg.group_size} x {cfg.max_new_tokens}",
                         "s_per_step": round(step, 3), "phase_share": phases,
                         "peak_memory_gib": round(peak_memory(device), 2)})
        print(f"grpo {name}: {step:.2f} s/step, peak {peak_memory(device):.1f} GiB", flush=True)


def profile_grpo(model_dir: Path, data: Path, device: torch.device, tmp: Path, out: Path, smoke: bool) -> Path:
    """Where the 124M preset's GRPO step (bf16, decode_graph) spends its time: torch.profiler over its third and
    fourth steps (the first captures the graph, the second warms the profiler), the operators and the phases
    (phase/generate, phase/policy, ...) by device time and by calls, into OUT/grpo_profile.txt."""
    from torch.profiler import ProfilerActivity, profile, schedule

    cfg = grpo_config(model_dir, data, device, tmp / "grpo-profile", 4, smoke, "bf16", True)
    tr = Trainer(cfg, toy_reward, read_samples(cfg.data), None, log=lambda *_: None)
    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []),
                 schedule=schedule(wait=1, warmup=1, active=2)) as prof:
        tr.train(writer=lambda _record: prof.step())
    events = prof.key_averages()
    by_time = "self_device_time_total" if cuda else "self_cpu_time_total"
    text = (f"# GRPO steps 3-4 of configs/rookworld-124m.yaml (bf16, decode_graph) on {device}, "
            f"{cfg.batch_positions} x {cfg.group_size} x {cfg.max_new_tokens}\n\n## by {by_time}\n"
            + events.table(sort_by=by_time, row_limit=45, max_name_column_width=70)
            + "\n## by calls\n" + events.table(sort_by="count", row_limit=30, max_name_column_width=70))
    path = out / "grpo_profile.txt"
    path.write_text(text)
    return path


def sft(data: Path, device: torch.device, tmp: Path, steps: int, smoke: bool, res: Results) -> None:
    """s/step of `rookworld sft`: the shipped base's shape and settings (tiny, batch 64, 8 own answers a step), and
    the GPU base's shape (small, bf16 where supported) at 256 rows a step without and with those own answers (each
    step then decodes 8 greedy answers of 30 tokens before its forward and backward), and at the recipe's 512 rows:
    how a step's time grows with its rows. The last steps are profiled (`--profile-steps`, after the timed ones): the
    share of a step the device was busy says whether its kernels or the host's launches set the pace."""
    from rookworld_rlvr.sft import SFTConfig, train

    timed = max(2, steps - 3)  # the steps timed; of the rest one warms the profiler up and the others are profiled

    shapes = [("tiny", 64, 8), ("small", 256, 0), ("small", 256, 8), ("small", 512, 0)] if not smoke else \
        [("tiny", 4, 0), ("tiny", 4, 2)]
    for preset, batch, own in shapes:
        name, what = f"sft-{preset}-{batch}-{own}", f"sft {preset} batch {batch} own_repeats {own}"
        if not res.in_time(what):
            continue
        cfg = SFTConfig(data=str(data), eval_data="", out=str(tmp / name), preset=preset, steps=steps,
                        batch_size=batch, own_repeats=own, save_every=10**6, device=str(device), autocast="auto",
                        threads=None, rows_cache=str(tmp / "sft-rows.safetensors"),  # encoded once for all
                        profile_steps=max(0, steps - timed - 1), profile_after=timed)
        t = time.perf_counter()
        try:
            train(cfg, progress=False)
        except Exception as e:  # noqa: BLE001 - a configuration that fails is a result too
            failed(res, "sft", {"preset": preset, "batch_size": batch, "own_repeats": own}, what, e)
            continue
        log = [json.loads(x) for x in (tmp / f"{name}.sft_log.jsonl").read_text().splitlines()]
        seconds = [r["seconds"] for r in log][:timed]
        per_step = (seconds[-1] - seconds[0]) / max(len(seconds) - 1, 1)  # after the first (warm-up) step
        host = host_batch_seconds(cfg)
        profile = tmp / f"{name}.profile.txt"
        text = profile.read_text() if profile.exists() else ""
        busy = re.search(r"\((\d+)% of the wall time", text)
        res.add("sft", {"preset": preset, "batch_size": batch, "own_repeats": own, "s_per_step": round(per_step, 4),
                        "samples_per_s": round(batch / per_step, 1) if per_step else None,
                        "host_batch_ms": round(host * 1000, 2), "wall_s": round(time.perf_counter() - t, 1),
                        "device_busy_share": int(busy.group(1)) / 100 if busy else None,
                        "profile": text.splitlines()[0] if text else None})
        print(f"{what}: {per_step:.3f} s/step, the host's batch {host * 1000:.1f} ms"
              + (f", the device busy {busy.group(1)}% of a profiled step" if busy else ""), flush=True)


def host_batch_seconds(cfg, draws: int = 20) -> float:
    """Median seconds the host takes to draw a step's rows and make its micro-batches (sft's loop makes the next
    step's while the device runs this one): a step no longer than this is bound by the host, not the GPU."""
    import random

    from rookworld_rlvr.chess_tokenizers import TOKENIZERS
    from rookworld_rlvr.sft_cache import training_rows
    from rookworld_rlvr.sft_rows import draw_batch, micro_batches

    tokenizer = TOKENIZERS[cfg.tokenizer or "board"]()
    by_task = training_rows(cfg.data, tokenizer, cfg.layout, cfg.order, cfg.legal_coef > 0, cfg.rows_cache,
                            say=lambda _: None)
    rng, seconds = random.Random(0), []
    for _ in range(draws):
        t = time.perf_counter()
        env_rows, pol_rows = draw_batch(rng, by_task, cfg.batch_size, cfg.env_share)
        micro_batches(env_rows + pol_rows, tokenizer.pad_token_id, cfg.loss_on)
        seconds.append(time.perf_counter() - t)
    return sorted(seconds)[draws // 2]


def first_samples(data: Path, n: int, tmp: Path) -> Path:
    """A file of data's first n samples, in tmp."""
    from rookworld_rlvr.data.io import iter_samples, write_samples

    samples = list(itertools.islice(iter_samples(data), n))
    write_samples(tmp / f"train-{n}.jsonl", samples)
    return tmp / f"train-{n}.jsonl"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat: proves the script runs (CPU)")
    ap.add_argument("--deadline", type=float, help="epoch seconds: a measurement that would start later is left "
                                                   "out and named (gpu_check.sh sets it from DEADLINE_S)")
    ap.add_argument("--profile", action="store_true",
                    help="only profile the 124M preset's GRPO steps (bf16, decode_graph) into OUT/grpo_profile.txt")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"error: --device {args.device} but torch {torch.__version__} sees no CUDA device", file=sys.stderr)
        return 2
    if device.type == "cuda":
        tf32_unless_chosen()  # float32 products on TF32 tensor cores, as `rookworld` commands run them there
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmpdir:
        tmp = Path(tmpdir)
        preset, vocab = ("tiny", 512) if args.smoke else ("gpt2-124m", GPT2_VOCAB)
        model_dir = random_model(preset, vocab, tmp / "model", shape=SMOKE_SHAPE if args.smoke else None)
        data = ROOT / "data" / "train.jsonl.xz"
        if args.smoke or args.profile:  # the first 400 training samples: reading all 240k takes longer than the rest
            data = first_samples(data, 400, tmp)
        if args.profile:
            print(f"wrote {profile_grpo(model_dir, data, device, tmp, args.out, args.smoke)}")
            return 0
        shapes = [(2, 2)] if args.smoke else [(16, 8), (64, 8)]
        result = {"machine": machine(device), "smoke": args.smoke, "model": f"random GPT-2 {preset}, vocab {vocab}"
                  + (f" ({SMOKE_SHAPE['n_layer']} x {SMOKE_SHAPE['n_embd']})" if args.smoke else ""),
                  "trl": "not measured yet: scripts/gpu_check.sh runs benchmarks/grpo_vs_trl.py next"}
        res = Results(args.out, result, args.deadline)
        generation(model_dir, device, shapes, 8 if args.smoke else 144, 1 if args.smoke else 3, res)
        grpo(model_dir, data, device, tmp, 2 if args.smoke else 6, args.smoke, res)
        sft(data, device, tmp, 4 if args.smoke else 30, args.smoke, res)
    result.update(seconds=round(time.time() - t0, 1), complete=True)
    res.save()
    print(markdown(result))
    return 1 if any("error" in r for section in ("generation", "grpo", "sft") for r in result[section]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
