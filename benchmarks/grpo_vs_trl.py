"""GRPO seconds per step: our trainer vs TRL's GRPOTrainer on the same work.

    python benchmarks/grpo_vs_trl.py [--config small|124m|both] [--steps 5] [--beta 0 0.04]
                                     [--threads 2] [--device cpu|cuda] [--json OUT]

With --device cuda both trainers run on the GPU (TRL without `use_cpu`), each step is timed with the
device synchronised at both ends, and the matmul rates of the FLOP bound are the GPU's.

Both trainers get the same model (two copies of one checkpoint), the same prompts in the same
order (B prompts per step, half P: and half A:, from data/train.jsonl.xz), the same reward (one
`TRLRewardFunction`; our trainer calls its scorer directly because it also logs the reward
components), G completions per prompt, at most --max-tokens new tokens, the same temperature,
learning rate (constant in both), β, clip range and loss aggregation, dropout off, float32
(or bf16 autocast in both with --bf16). Our policy pass keeps its float32 forward but, by its
default `backward_dtype: auto`, runs its backward's matrix products in bf16 on a CPU where those
measure >= 1.5x faster (`--backward-dtype float32` for an all-float32 run of ours; TRL has no such
mode), and by its default `record_rollout: auto` its first update on a batch takes the projection
outputs the sampler computed instead of recomputing them where the model is 512 or more wide (the
124m configuration; `--record-rollout always|never` to choose). At β 0 neither trainer runs a reference
pass: TRL loads none, and ours runs without the collapse guard's KL signals, which `rookworld train`
computes by default (`--kl-guard` keeps them). On a CPU the process keeps freed host memory for
reuse, as `rookworld train` does (`rookworld_rlvr.hostmem`; process-wide, so for TRL's steps too;
`--glibc-defaults` to leave glibc as it is). The runs are interleaved step by step inside one process:
a TRL `TrainerCallback` runs one step of ours before TRL's step on even steps and after it on odd
steps, and times TRL's optimizer step from `on_step_begin` to `on_step_end`.

Configurations: `small` is the shipped `models/rookworld-board` when it has weights (else a random
model of the same `tiny` preset); `124m` is a random GPT-2 124M architecture
(`tiny_config(vocab, "gpt2-124m")`, saved to a temp dir with the chess tokenizer), for the ratio at
RookWorld-LM scale: by default with GPT-2's 50,257-token vocabulary, as RookWorld-LM-124M has (the
chess tokenizer plus unused added tokens: an LM head of 38.6M parameters, which every generated and
scored token passes through), or with the chess tokenizer's own 98 tokens (`--vocab-124m chess`). A
random model's EOS is made undrawable (`never_stops`), so both trainers' completions all run to
--max-tokens: the same generated tokens in both, equal work by construction. Per configuration and β
it prints the median s/step of each trainer and the ratio TRL / ours, the phase profile of our step,
and the FLOP bound of our step at the measured float32 and bf16 matmul rates, and as run (each
product at the rate of the dtype it ran in).

TRL is a benchmark-only dependency (the `bench` extra):
    pip install -c constraints.txt trl
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shlex
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # also where this file is loaded as a module (the tests)
from gpu_check import GPT2_VOCAB, padded_chess_tokenizer  # noqa: E402  (the random 124M's vocabulary)

PHASES = ("generate", "score", "reference", "old", "policy", "optimizer", "other")


# -- machine -----------------------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def bf16_hardware() -> str:
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return "unknown"
    found = [f for f in ("amx_bf16", "avx512_bf16") if f in flags]
    return "+".join(found) if found else "none"


def sync(device: str) -> None:
    """Wait for the device's queued kernels (a GPU's step ends when its last kernel does)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def matmul_gflops(dtype: torch.dtype, n: int = 1024, min_seconds: float = 0.4, device: str = "cpu") -> float:
    """torch.matmul of n x n matrices at the current thread count (best of short timed batches); on a GPU
    4096 x 4096, timed with the device synchronised. A product slow enough to time alone (a CPU that
    emulates bf16: 2 s each at 1024) is timed once after its warm-up instead of in batches of 4."""
    if torch.device(device).type == "cuda":
        n = max(n, 4096)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    sync(device)
    t0 = time.perf_counter()
    torch.matmul(a, b)
    sync(device)
    reps = 1 if time.perf_counter() - t0 > min_seconds / 4 else 4
    for _ in range(0 if reps == 1 else 2):
        torch.matmul(a, b)
    best, spent = 0.0, 0.0
    while spent < min_seconds:
        sync(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.matmul(a, b)
        sync(device)
        dt = time.perf_counter() - t0
        spent += dt
        best = max(best, 2 * n ** 3 * reps / dt / 1e9)
    return best


# -- model and data ------------------------------------------------------------------------------------
def has_weights(path: Path) -> bool:
    return path.is_dir() and (any(path.glob("*.safetensors")) or (path / "pytorch_model.bin").exists())


def never_stops(model, eos_id: int) -> None:
    """Make a freshly initialised GPT-2's EOS undrawable, so that every completion runs to the token limit
    in both trainers: the same generated tokens, hence equal work. A random model draws its EOS about once
    in a vocabulary's length of tokens, and the two samplers' lengths then differ by chance (67 against 98
    tokens in one 124M run). The final layer norm's output sums to 0 over its width at initialisation
    (weight 1); with its bias at b = 0.1 and the tied EOS embedding at -c everywhere, EOS's logit is
    -c·b·width, set to -40 at every width (c 0.52 at 124M), and every other token's moves by b times the
    sum of its embedding (about ±0.05)."""
    ln = model.transformer.ln_f
    if not (torch.all(ln.weight == 1) and torch.all(ln.bias == 0)):
        raise ValueError("never_stops needs a freshly initialised final layer norm (weight 1, bias 0)")
    b = 0.1
    with torch.no_grad():
        ln.bias.fill_(b)
        model.get_input_embeddings().weight[eos_id].fill_(-40.0 / (b * ln.bias.numel()))


def random_model(preset: str, out_dir: Path, seed: int, vocab: int | None = None) -> Path:
    """A random GPT-2 of `preset` with the chess tokenizer, its EOS undrawable (`never_stops`), saved to `out_dir`.
    `vocab`: that many tokens (the chess tokenizer's plus unused added ones), for an LM head of that size."""
    from transformers import GPT2LMHeadModel

    from rookworld_rlvr.chess_tokenizers import build_chess_tokenizer
    from rookworld_rlvr.model import save_pretrained_atomic, tiny_config

    tok = build_chess_tokenizer() if vocab is None else padded_chess_tokenizer(vocab)
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(tiny_config(len(tok), preset))
    never_stops(model, tok.eos_token_id)
    save_pretrained_atomic(model, tok, out_dir)
    return out_dir


def step_prompts(data: Path, tokenizer, n_steps: int, batch: int, max_tokens: int, n_positions: int, seed: int):
    """Per step: B prompts, P: first then A: (as our trainer's collect orders them); mix 0.5."""
    from rookworld_rlvr.data.io import iter_samples

    n_a = round(batch * 0.5)
    n_p = batch - n_a
    need = {"P": n_p * n_steps, "A": n_a * n_steps}
    pool: dict[str, list] = {"P": [], "A": []}
    for s in iter_samples(data):  # the first rows are enough; no need to parse 120k lines
        prompt = s.render("compact")[0]
        if len(tokenizer(prompt, add_special_tokens=False).input_ids) + max_tokens > n_positions:
            continue
        if len(pool[s.task]) < 4 * need[s.task] + 8:
            pool[s.task].append(s)
        if all(len(pool[t]) >= 4 * need[t] + 8 for t in pool):
            break
    rng = random.Random(seed)
    for t in pool:
        if len(pool[t]) < need[t]:
            raise SystemExit(f"{data}: only {len(pool[t])} usable {t}: samples, need {need[t]}")
        rng.shuffle(pool[t])
    return [pool["P"][k * n_p:(k + 1) * n_p] + pool["A"][k * n_a:(k + 1) * n_a] for k in range(n_steps)]


class OrderedPrompts:
    """Stands in for the trainer's PromptSampler: hands out the prepared prompts in step order."""

    def __init__(self, steps: list[list]) -> None:
        self.queue = {t: [s for step in steps for s in step if s.task == t] for t in ("P", "A")}

    def take(self, task: str, n: int) -> list:
        out, self.queue[task] = self.queue[task][:n], self.queue[task][n:]
        if len(out) < n:
            raise RuntimeError(f"benchmark ran out of {task}: prompts")
        return out


# -- FLOPs ----------------------------------------------------------------------------------------------
def step_flops(model, batch, group_size: int, beta: float, updates_per_batch: int,
               recorded: bool = False) -> dict[str, float]:
    """Model FLOPs of one step of ours, from its real token counts (pads and skipped work not counted).

    body = parameters outside the embeddings (2 FLOPs each per token forward); the LM head (2·V·d)
    only where a next-token distribution is needed (every generated token; completion positions in
    the scoring passes, as our `token_logprobs` does); causal attention 4·n_layer·d·context per token
    forward. Each prompt runs once per group, in generation and in the scoring passes (as ours do), so
    this is the work our step needs, not the work a naive step does. Forward+backward = 3x forward;
    with `recorded` (record_rollout) the first update's forward takes the sampler's projection outputs
    and logits, so its body products (2·body per token) and the LM head at fed tokens are not counted
    again. "policy_backward": the backward's
    share (2x forward per update), the part `backward_dtype` may run in bf16.
    """
    cfg = model.config
    L, d = cfg.n_layer, cfg.n_embd
    emb = model.get_input_embeddings().weight
    wpe = model.transformer.wpe.weight.numel() if hasattr(model, "transformer") else 0
    body = sum(p.numel() for p in model.parameters()) - emb.numel() - wpe
    head = 2 * emb.shape[0] * emb.shape[1]

    def attn(ctx_from: int, ctx_to: int) -> float:  # sum of 4·L·d·c for c in (ctx_from, ctx_to]
        return 4 * L * d * (ctx_to * (ctx_to + 1) - ctx_from * (ctx_from + 1)) / 2

    gen = fwd = fwd_body = 0.0
    for i, row in enumerate(batch.rows):
        p, g = len(row.prompt_ids), len(row.completion_ids)
        if i % group_size == 0:  # one prompt pass per group, when sampling and when scoring
            gen += 2 * body * p + attn(0, p) + head
            fwd += 2 * body * p + attn(0, p)
            fwd_body += 2 * body * p
        gen += (2 * body + head) * max(g - 1, 0) + attn(p, p + max(g - 1, 0))
        fwd += 2 * body * max(g - 1, 0) + attn(p, p + max(g - 1, 0)) + head * g  # the last token is scored, not fed
        fwd_body += (2 * body + head) * max(g - 1, 0)  # and the fed tokens' logits (column 0 comes from the prompt)
    backward = 2 * fwd * updates_per_batch
    out = {"generate": gen, "reference": fwd if beta > 0 else 0.0,
           "old": fwd if updates_per_batch > 1 else 0.0,
           "policy": fwd * updates_per_batch - (fwd_body if recorded else 0.0) + backward}
    out["total"] = sum(out.values())
    out["policy_backward"] = backward
    out["params_body"] = float(body)
    return out


# -- one configuration -----------------------------------------------------------------------------------
def run_pair(name: str, model_dir: Path, args, beta: float, steps: int, warmup: int, tmp: Path, log) -> dict:
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer
    from datasets import Dataset

    from rookworld_rlvr.config import load_config
    from rookworld_rlvr.engine import EngineConfig, StockfishPool
    from rookworld_rlvr.grpo.runlog import step_record
    from rookworld_rlvr.grpo.trainer import Trainer
    from rookworld_rlvr.model import load_policy
    from rookworld_rlvr.tasks.rewards import RewardScorer, TRLRewardFunction

    total = warmup + steps
    B, G, M = args.prompts, args.generations, args.max_tokens
    run_dir = Path(tempfile.mkdtemp(prefix=f"{name}-beta{beta}-", dir=tmp))
    cfg = load_config(None, {
        "model": str(model_dir), "device": args.device, "threads": args.threads, "data": str(args.data), "eval_data": "",
        "batch_positions": B, "group_size": G, "temperature": args.temperature, "max_new_tokens": M,
        "lr": args.lr, "warmup_steps": 0, "min_lr_ratio": 1.0, "kl_coef": beta, "steps": total,
        "mix_env_ratio": 0.5, "autocast": "bf16" if args.bf16 else "none", "engine_cache": None,
        "backward_dtype": args.backward_dtype, "record_rollout": args.record_rollout, "decode_graph": args.decode_graph,
        "output_dir": str(run_dir / "ours"), "tensorboard": False, "report": False, "progress": False,
        "seed": args.seed,
    } | ({} if args.kl_guard or beta > 0 else {"guard_kl_mean": None, "guard_kl_max": None}))
    pool = (StockfishPool(EngineConfig(depth=cfg.engine_depth, workers=cfg.engine_workers, cache_path=None))
            if args.engine == "stockfish" else None)
    reward = TRLRewardFunction(RewardScorer(cfg.reward_config(), engine=pool))
    try:
        ours = Trainer(cfg, reward.scorer, [], None, log=lambda *_: None)
        prompts = step_prompts(args.data, ours.tokenizer, total, B, M, ours.policy.config.n_positions, args.seed)
        ours.prompts = OrderedPrompts(prompts)
        dataset = Dataset.from_list([{"prompt": s.render("compact")[0], "truth": json.dumps(s.truth.to_dict())}
                                     for step in prompts for s in step])

        ours_rec: list[dict] = []

        def ours_step() -> None:
            step = ours.step
            sync(args.device)
            t0 = time.perf_counter()
            timings: dict[str, float] = {}
            batch = ours.assemble(ours.collect(step, timings))
            m = ours.update(batch, step, timings)
            guard = m.pop("guard")
            if ours.ref is not None:
                ours.kl_ctl.update(m.get("kl_mean", 0.0))
            ours.step += 1
            sync(args.device)
            seconds = time.perf_counter() - t0
            rec = step_record(step, batch, m, timings, seconds, G, ours.use_ref, ours.collect_stats)
            rec["guard"] = guard
            rec["flops"] = step_flops(ours.policy, batch, G, beta, cfg.updates_per_batch, ours.record)
            ours_rec.append(rec)

        trl_times: list[float] = []

        class Interleave(TrainerCallback):
            k = 0
            t0 = 0.0

            def on_step_begin(self, a, state, control, **kw):
                torch.set_num_threads(args.threads)
                if self.k % 2 == 0:
                    ours_step()
                sync(args.device)
                self.t0 = time.perf_counter()

            def on_step_end(self, a, state, control, **kw):
                sync(args.device)
                trl_times.append(time.perf_counter() - self.t0)
                if self.k % 2 == 1:
                    ours_step()
                log(f"  {name} beta={beta:g} step {self.k + 1}/{total}: ours {ours_rec[-1]['time/step']:.2f} s, "
                    f"TRL {trl_times[-1]:.2f} s{'  (warm-up)' if self.k < warmup else ''}")
                self.k += 1

        trl_model, tok = load_policy(str(model_dir), device=args.device, verbose=False)
        trl_args = GRPOConfig(
            output_dir=str(run_dir / "trl"), use_cpu=torch.device(args.device).type == "cpu", gradient_checkpointing=False, disable_dropout=True,
            per_device_train_batch_size=B * G, num_generations=G, max_completion_length=M, beta=beta,
            temperature=args.temperature, top_k=0, top_p=1.0, learning_rate=args.lr,
            lr_scheduler_type="constant", warmup_steps=0, max_steps=total, logging_steps=1, report_to=[],
            save_strategy="no", bf16=args.bf16, fp16=False, shuffle_dataset=False,
            loss_type=cfg.loss_type, epsilon=cfg.clip_range, scale_rewards=cfg.scale_rewards,
            max_grad_norm=cfg.grad_clip, weight_decay=cfg.weight_decay, adam_beta2=0.99,
            seed=args.seed, disable_tqdm=True, dataloader_num_workers=0,
        )
        trl = GRPOTrainer(model=trl_model, reward_funcs=[reward], args=trl_args, train_dataset=dataset,
                          processing_class=tok, callbacks=[Interleave()])
        trl.remove_callback(PrinterCallback)  # disable_tqdm adds it; it prints every log dict
        torch.set_num_threads(args.threads)
        trl.train()
        trl_logged = [h["step_time"] for h in trl.state.log_history if "step_time" in h]
        trl_lengths = [h["completions/mean_length"] for h in trl.state.log_history if "completions/mean_length" in h]
    finally:
        if pool is not None:
            pool.close()

    meas = ours_rec[warmup:]
    ours_s = statistics.median(r["time/step"] for r in meas)
    trl_s = statistics.median(trl_times[warmup:])
    phase_tot = {p: sum(r.get(f"time/{p}", 0.0) for r in meas) for p in PHASES}
    step_tot = sum(r["time/step"] for r in meas)
    flops = statistics.median(r["flops"]["total"] for r in meas)
    return {
        "config": name, "model": str(model_dir), "params": ours.n_params,
        "params_body": meas[0]["flops"]["params_body"], "beta": beta, "steps": steps, "warmup_steps": warmup,
        "prompts": B, "generations": G, "max_tokens": M, "temperature": args.temperature, "lr": args.lr,
        "bf16": args.bf16, "threads": torch.get_num_threads(), "ours_backward": ours.grad_note,
        "ours_backward_bf16": ours.grad_dtype is not None,
        "ours_s_per_step": ours_s, "trl_s_per_step": trl_s, "ratio_trl_over_ours": trl_s / ours_s,
        "ours_steps": [r["time/step"] for r in ours_rec], "trl_steps": trl_times, "trl_logged_step_time": trl_logged,
        # step k of each trainer ran back to back, so their ratio sees one state of a drifting machine
        "paired_ratios": [t / r["time/step"] for t, r in zip(trl_times[warmup:], meas)],
        "ours_completion_len": statistics.mean(r["completion_len/mean"] for r in meas),
        "trl_completion_len": statistics.mean(trl_lengths[warmup:]) if len(trl_lengths) > warmup else None,
        # seconds per generated token, TRL's over ours: the ratio at equal work where the two sample different
        # lengths (each stops at its own EOS; a random model's completions all run to the limit)
        "ratio_per_token": (trl_s / ours_s) * (statistics.mean(r["completion_len/mean"] for r in meas)
                                               / statistics.mean(trl_lengths[warmup:]))
        if len(trl_lengths) > warmup else None,
        "phase_seconds": {p: v / len(meas) for p, v in phase_tot.items()},
        "phase_share": {p: (v / step_tot if step_tot else 0.0) for p, v in phase_tot.items()},
        "ours_record_rollout": ours.record, "ours_forward": ours.record_note, "ours_decode_graph": ours.graph,
        "ours_decode": ours.graph_note,
        # beta 0: TRL loads no reference; ours runs one only for the KL guard (--kl-guard)
        "ours_reference_pass": ours.use_ref,
        "flops": {k: statistics.median(r["flops"][k] for r in meas)
                  for k in ("generate", "reference", "old", "policy", "policy_backward")}
        | {"total": flops},
    }


def add_bound(res: dict, rates: dict[str, float]) -> None:
    f = res["flops"]
    res["bound_seconds"] = {k: f["total"] / (r * 1e9) for k, r in rates.items()}
    if res["bf16"]:
        res["bound_seconds"]["as_run"] = res["bound_seconds"]["bf16"]
    else:  # the policy pass's backward at bf16 when ours ran it so
        low = f["policy_backward"] if res["ours_backward_bf16"] else 0.0
        res["bound_seconds"]["as_run"] = (f["total"] - low) / (rates["float32"] * 1e9) + low / (rates["bf16"] * 1e9)
    res["fraction_of_bound"] = {k: v / res["ours_s_per_step"] for k, v in res["bound_seconds"].items()}


# -- output ---------------------------------------------------------------------------------------------
def table(machine: dict, results: list[dict]) -> str:
    lines = [f"GRPO seconds per step: rookworld-rlvr vs TRL {machine['trl']} GRPOTrainer (interleaved, medians)",
             f"machine: {machine['cpu']} ({machine['processor']}), {machine['cores']} cores, "
             f"{machine['threads']} torch threads, torch {machine['torch']}, transformers {machine['transformers']}, "
             f"load average at start {machine['loadavg']}, device {machine['device']}, reward engine {machine['engine']}",
             f"{machine['allocator']} (both trainers)",
             f"command: {machine['command']}",
             "matmul 1024x1024 at the start / end of the run (the bound uses the faster): float32 "
             + " / ".join(f"{machine[k]['float32']:.0f}" for k in ("gflops_start", "gflops_end")) + " GFLOP/s, bf16 "
             + " / ".join(f"{machine[k]['bf16']:.0f}" for k in ("gflops_start", "gflops_end"))
             + f" GFLOP/s (CPU bf16 support: {machine['bf16_hardware']})", ""]
    head = (f"{'config':7s} {'params':>7s} {'beta':>5s} {'steps':>5s} {'BxG':>5s} {'tok':>4s} "
            f"{'ours s/step':>11s} {'TRL s/step':>10s} {'TRL/ours':>8s} {'pairs':>11s} {'len ours/TRL':>12s} "
            f"{'per token':>9s}")
    lines += [head, "-" * len(head)]
    for r in results:
        tl = f"{r['trl_completion_len']:.0f}" if r["trl_completion_len"] is not None else "?"
        lines.append(f"{r['config']:7s} {r['params'] / 1e6:6.1f}M {r['beta']:5g} {r['steps']:5d} "
                     f"{r['prompts']}x{r['generations']:<3d} {r['max_tokens']:4d} {r['ours_s_per_step']:11.2f} "
                     f"{r['trl_s_per_step']:10.2f} {r['ratio_trl_over_ours']:7.2f}x "
                     f"{min(r['paired_ratios']):5.2f}-{max(r['paired_ratios']):4.2f}x "
                     f"{r['ours_completion_len']:>6.0f}/{tl:<5s} "
                     + (f"{r['ratio_per_token']:8.2f}x" if r.get("ratio_per_token") else f"{'?':>9s}"))
    lines.append("")
    for r in results:
        share = ", ".join(f"{p} {100 * r['phase_share'][p]:.0f}%" for p in PHASES)
        f = r["flops"]
        lines.append(f"{r['config']} beta={r['beta']:g} ({Path(r['model']).name}):")
        lines.append(f"  our step: {share}")
        lines.append(f"  FLOPs/step {f['total'] / 1e9:.1f} G (generate {f['generate'] / 1e9:.1f}, reference "
                     f"{f['reference'] / 1e9:.1f}, old {f['old'] / 1e9:.1f}, policy fwd+bwd {f['policy'] / 1e9:.1f}); "
                     f"bound {r['bound_seconds']['float32']:.2f} s at float32, {r['bound_seconds']['bf16']:.2f} s at bf16, "
                     f"{r['bound_seconds']['as_run']:.2f} s as run; ours reaches "
                     f"{100 * r['fraction_of_bound']['float32']:.0f}% / {100 * r['fraction_of_bound']['bf16']:.0f}% / "
                     f"{100 * r['fraction_of_bound']['as_run']:.0f}% of them")
        lines.append(f"  our policy pass: forward {'bf16 autocast' if r['bf16'] else 'float32'}, backward products "
                     f"{r['ours_backward']}; forward projections {r['ours_forward']}")
        lines.append(f"  our decoding: {r.get('ours_decode', '-')}")
        lines.append("  reference pass: " + ("off (beta 0; TRL has none either)" if not r["ours_reference_pass"]
                                             else "on" + (" (beta 0: the collapse guard's KL signals only, --kl-guard)"
                                                          if r["beta"] == 0 else "")))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", choices=("small", "124m", "both"), default="both",
                    help="small: models/rookworld-board; 124m: random GPT-2 124M architecture (default: both)")
    ap.add_argument("--steps", type=int, default=5, help="measured steps of each trainer (small config)")
    ap.add_argument("--steps-124m", type=int, default=3, help="measured steps of each trainer (124m config)")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured first steps of each trainer (small config)")
    ap.add_argument("--warmup-124m", type=int, default=0, help="unmeasured first steps (124m config)")
    ap.add_argument("--vocab-124m", choices=("gpt2", "chess"), default="gpt2",
                    help="the 124m model's vocabulary: gpt2, GPT-2's 50,257 tokens as RookWorld-LM-124M has (124M "
                         "parameters); chess, the chess tokenizer's 98 (86M parameters: an LM head of 75k)")
    ap.add_argument("--beta", type=float, nargs="+", default=[0.0, 0.04], help="KL coefficients, one run pair each")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads (both trainers, matmul timing)")
    ap.add_argument("--json", help="write all numbers here")
    ap.add_argument("--model", help="small config model (default: models/rookworld-board if it has weights, "
                                    "else a random tiny model)")
    ap.add_argument("--data", type=Path, default=ROOT / "data/train.jsonl.xz")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast in both trainers (default float32)")
    ap.add_argument("--record-rollout", choices=("auto", "always", "never"), default="auto",
                    help="our first update on a batch takes the sampler's projection outputs (the trainer's "
                         "record_rollout; default auto: for models 512 or more wide)")
    ap.add_argument("--decode-graph", action="store_true",
                    help="ours decodes with the shape-stable step (the trainer's decode_graph: one CUDA graph a token "
                         "on CUDA, as configs/rookworld-124m.yaml runs; eager elsewhere). Equal work all the same: "
                         "both trainers' completions run to --max-tokens")
    ap.add_argument("--backward-dtype", choices=("auto", "float32", "bf16"), default="auto",
                    help="our policy pass's backward products (the trainer's backward_dtype; default auto)")
    ap.add_argument("--kl-guard", action="store_true",
                    help="keep the collapse guard's KL signals at beta 0, as `rookworld train` does by default: ours "
                         "then runs a reference pass that TRL does not (default: off at beta 0, for equal work)")
    ap.add_argument("--glibc-defaults", action="store_true",
                    help="leave glibc's allocator as it is; by default the process keeps freed host memory for reuse "
                         "on a CPU, as `rookworld train` does (rookworld_rlvr.hostmem), for both trainers")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu or cuda: both trainers run there (default cpu)")
    ap.add_argument("--engine", choices=("stockfish", "none"), default="stockfish",
                    help="the shared reward's Stockfish pool; none: a legal best move outside a sample's top 5 is "
                         "valued at the lowest of the 5 (RewardScorer without an engine), for a machine without "
                         "Stockfish (default stockfish)")
    # smoke-test knobs (the benchmark itself is 8 x 8, 100 tokens)
    ap.add_argument("--prompts", type=int, default=8, help=argparse.SUPPRESS)
    ap.add_argument("--generations", type=int, default=8, help=argparse.SUPPRESS)
    ap.add_argument("--max-tokens", type=int, default=100, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.prompts < 2 or args.generations < 2 or args.steps < 1 or args.steps_124m < 1 or min(args.warmup, args.warmup_124m) < 0:
        ap.error("need --prompts >= 2, --generations >= 2, --steps >= 1, --warmup >= 0")
    if args.bf16 and args.backward_dtype == "float32":
        ap.error("--backward-dtype float32 contradicts --bf16 (autocast's backward products are bf16)")

    try:
        import trl
    except ImportError:
        print("TRL is not installed: pip install -c constraints.txt trl   (the `bench` extra)", file=sys.stderr)
        return 2
    import transformers

    from rookworld_rlvr.hostmem import for_device

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    # host memory as `rookworld train` keeps it on a CPU (process-wide: TRL's steps get it too)
    allocator = ("host memory: glibc's defaults (--glibc-defaults)" if args.glibc_defaults
                 else for_device(torch.device(args.device)) or "host memory: allocator unchanged (a GPU run)")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    machine = {
        "cpu": cpu_model(), "processor": platform.processor() or platform.machine(), "cores": os.cpu_count(),
        "device": args.device if torch.device(args.device).type == "cpu" else
        f"{args.device} ({torch.cuda.get_device_name(torch.device(args.device))})",
        "threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": transformers.__version__,
        "trl": trl.__version__, "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "command": " ".join(["python", *map(shlex.quote, sys.argv)]), "bf16_hardware": bf16_hardware(),
        "engine": args.engine, "allocator": allocator,
    }
    def rates() -> dict[str, float]:
        log("measuring matmul rates ...")
        return {"float32": matmul_gflops(torch.float32, device=args.device),
                "bf16": matmul_gflops(torch.bfloat16, device=args.device)}

    machine["gflops_start"] = rates()  # this VM's matmul rate drifts (96-197 GFLOP/s float32 in one session)

    results = []
    with tempfile.TemporaryDirectory(prefix="grpo-vs-trl-") as tmpdir:
        tmp = Path(tmpdir)
        plans = []
        if args.config in ("small", "both"):
            shipped = ROOT / "models/rookworld-board"
            if args.model:
                small = Path(args.model)
            elif has_weights(shipped):
                small = shipped
            else:
                log(f"{shipped} has no weights yet: using a random model of the tiny preset")
                small = random_model("tiny", tmp / "random-tiny", args.seed)
            plans.append(("small", small, args.steps, args.warmup))
        if args.config in ("124m", "both"):
            vocab = GPT2_VOCAB if args.vocab_124m == "gpt2" else None
            log(f"building a random GPT-2 124M ({'chess tokenizer' if vocab is None else f'{vocab}-token vocabulary'}) ...")
            plans.append(("124m", random_model("gpt2-124m", tmp / "random-gpt2-124m", args.seed, vocab),
                          args.steps_124m, args.warmup_124m))
        for name, model_dir, steps, warmup in plans:
            for beta in args.beta:
                log(f"{name}: {model_dir}, beta {beta:g}, {warmup} warm-up + {steps} measured steps each")
                results.append(run_pair(name, model_dir, args, beta, steps, warmup, tmp, log))
    machine["gflops_end"] = rates()  # so it is measured twice, and the faster is the peak the bound uses
    machine["gflops"] = {k: max(machine["gflops_start"][k], machine["gflops_end"][k]) for k in machine["gflops_end"]}
    for res in results:
        add_bound(res, machine["gflops"])
    print(table(machine, results))
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "results": results}, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
