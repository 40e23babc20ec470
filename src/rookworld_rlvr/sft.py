"""`rookworld sft`: supervised bootstrap of a base model that knows both task formats.

GRPO learns only from differences among well-formed answers, so the base decides
everything. The loop is nanoGPT-shaped: sample a batch, forward, backward, clip, step;
evaluate and checkpoint every so often; resume from the last checkpoint.

Owns supervised training; padding is `model.padding`, the tokenizers `chess_tokenizers`, the
optimizer and schedule `grpo.control`. Imports torch inside functions only, so `rookworld --help`
stays fast.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SFT_STATE = "sft_state"  # sft_state.safetensors + sft_state.json (statefile: no pickle)


@dataclass
class SFTConfig:
    data: str = "data/train.jsonl.gz"
    eval_data: str = "data/eval.jsonl.gz"
    out: str = "models/rookworld-tiny"
    init: str | None = None  # continue from this model directory instead of a fresh one
    preset: str = "tiny"  # tiny | gpt2-124m (fresh models only)
    # char | square | board, fresh models only (default board: square tokens for moves and FEN boards
    # written square by square); --init and --resume keep the model's own
    tokenizer: str | None = None
    n_positions: int = 320
    layout: str = "compact"
    order: str = "best-first"  # P: candidates in the target: best-first | given (see tasks.policy.ORDERS)
    loss_on: str = "full"  # full | completion
    # weight of the unlikelihood of writing an M: move twice (repeat_bans); 0 = likelihood only
    distinct_coef: float = 1.0
    # P: rows per step answered greedily by the model; where it repeats a move, that repeat is
    # pushed down (own_repeat_rows, weighted by distinct_coef); 0 = off
    own_repeats: int = 8
    env_share: float = 0.5  # share of A: samples in each batch
    steps: int = 3000
    max_minutes: float | None = None  # stop early at this wall-clock budget (the schedule follows the budget)
    batch_size: int = 64
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    dropout: float = 0.0  # 0: the tiny model under-fits, and CPU attention runs ~4x slower with dropout
    autocast: str = "none"  # none | bf16
    eval_every: int = 500
    eval_samples: int = 200  # per task, greedy task metrics
    save_every: int = 500
    seed: int = 0
    device: str = "auto"
    threads: int | None = None

    def validate(self) -> None:
        from rookworld_rlvr.tasks.policy import ORDERS

        if self.order not in ORDERS:
            raise ValueError(f"sft.order must be one of {', '.join(ORDERS)}, got {self.order!r}")
        if self.loss_on not in ("full", "completion"):
            raise ValueError("sft.loss_on must be 'full' or 'completion'")
        if self.autocast not in ("none", "bf16"):
            raise ValueError("sft.autocast must be 'none' or 'bf16'")
        if not 0 <= self.dropout < 1:
            raise ValueError("sft.dropout must be in [0, 1)")
        if self.own_repeats < 0:
            raise ValueError(f"sft.own_repeats must be >= 0, got {self.own_repeats}")
        if not 0 <= self.distinct_coef or not math.isfinite(self.distinct_coef):
            raise ValueError(f"sft.distinct_coef must be finite and >= 0, got {self.distinct_coef}")
        if not 0 <= self.env_share <= 1:
            raise ValueError("sft.env_share must be in [0, 1]")
        if self.steps < 1 or self.batch_size < 1 or self.lr <= 0:
            raise ValueError("sft.steps, sft.batch_size and sft.lr must be positive")
        if not Path(self.data).exists():
            raise ValueError(f"sft.data: {self.data}: no such file")
        from rookworld_rlvr.chess_tokenizers import TOKENIZERS

        if self.tokenizer is not None and self.tokenizer not in TOKENIZERS:
            raise ValueError(f"sft.tokenizer must be one of {', '.join(TOKENIZERS)}, got {self.tokenizer!r}")
        if self.tokenizer is not None and self.init:
            raise ValueError("sft.tokenizer applies to fresh models only: --init keeps the model's own tokenizer")


def _encode(tokenizer, samples, layout: str, order: str = "given") -> list[tuple]:
    """(ids with EOS, prompt length, repeat bans). Prompt and completion are tokenized apart, as at
    generation. The bans are (position, token) pairs where that token would repeat an M: move."""
    pairs = [s.render(layout, order) for s in samples]
    prompts = tokenizer([p for p, _ in pairs], add_special_tokens=False)["input_ids"]
    enc = tokenizer([c for _, c in pairs], add_special_tokens=False, return_offsets_mapping=True)
    eos = tokenizer.eos_token_id
    rows = []
    for (_, text), p, c, offsets in zip(pairs, prompts, enc["input_ids"], enc["offset_mapping"]):
        bans = tuple((len(p) + k, tok) for k, tok in repeat_bans(text, c, offsets))
        rows.append((p + c + [eos], len(p), bans))
    return rows


# where the run is and how many threads it uses: neither changes what a resumed run computes
_PLACE = ("out", "device", "threads")


def changed_settings(saved: dict, now: dict) -> list[str]:
    """The settings a resume changes against the checkpoint's: an exact continuation changes none,
    so each one is said (it takes effect from the resumed step on)."""
    return [f"{k} was {saved[k]!r} in the checkpoint, now {now[k]!r} (from this step on)"
            for k in now if k in saved and k not in _PLACE and saved[k] != now[k]]


def repeat_bans(text: str, ids: list[int], offsets: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Where a P: target's M: list teaches "never write a move twice": (token index, token id) pairs.

    A later move that shares all but the last token of an earlier one (the same from-square, say)
    must not end with that earlier move's last token; the unlikelihood loss pushes that token's
    probability down there. A model trained on lists alone still repeats its top move under greedy
    decoding: nothing in the likelihood says the second slot must differ from the first."""
    if "M:" not in text or "E:" not in text:
        return []
    start, stop = text.index("M:") + 2, text.index("E:")
    moves = []
    for m in re.finditer(r"\S+", text[start:stop]):
        a, b = start + m.start(), start + m.end()
        moves.append([k for k, (x, y) in enumerate(offsets) if y > x and x >= a and y <= b])
    bans = []
    for i, cur in enumerate(moves):
        for prev in moves[:i]:
            n = len(prev) - 1
            if n < len(cur) and [ids[k] for k in cur[:n]] == [ids[k] for k in prev[:n]] and ids[cur[n]] != ids[prev[n]]:
                bans.append((cur[n], ids[prev[n]]))
    return bans


def make_batch(rows: list[tuple[list[int], int]], pad_id: int, loss_on: str):
    """Right-padded batch; labels -100 on padding (and on the prompt for completion-only loss)."""
    import torch

    from rookworld_rlvr.model.padding import pad

    input_ids, mask = pad([r[0] for r in rows], pad_id, "right")
    # targets from column `start` on; a row of prompt length -1 is for the unlikelihood only (own_repeat_rows)
    start = torch.tensor([input_ids.shape[1] if r[1] < 0 else r[1] if loss_on == "completion" else 1 for r in rows])
    learned = (torch.arange(input_ids.shape[1]) >= start[:, None]) & mask.bool()
    return input_ids, mask, torch.where(learned, input_ids, torch.full_like(input_ids, -100))


def set_dropout(model, p: float) -> None:
    """Set every dropout of a GPT-2-style model (modules and the config that is saved with it)."""
    import torch

    for key in ("attn_pdrop", "resid_pdrop", "embd_pdrop", "summary_first_dropout"):
        if hasattr(model.config, key):
            setattr(model.config, key, p)
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = p


def own_repeat_rows(model, tokenizer, rows: list[tuple], max_new_tokens: int = 18) -> list[tuple]:
    """Rows that teach the model not to repeat a move where it does repeat one: the prompts of P:
    `rows` answered greedily by the model itself; each answer whose M: list writes a move again
    becomes a row (prompt + its own M: prefix through the repeat, no likelihood targets) with a ban
    on the repeated move's last token. The likelihood sees only true lists, where nothing repeats,
    so without these rows greedy decoding keeps writing the top move five times."""
    from rookworld_rlvr.model import generate

    if not rows:
        return []
    prompts = [tokenizer.decode(ids[:n]) for ids, n, *_ in rows]
    texts = generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens, greedy=True).texts
    out = []
    for (ids, n, *_), text in zip(rows, texts):
        moves = list(re.finditer(r"\S+", text[text.find("M:") + 2:]))[:5] if text.startswith("M:") else []
        seen, cut = set(), None
        for m in moves:
            if m.group() in seen:
                cut = text.find("M:") + 2 + m.end()
                break
            seen.add(m.group())
        if cut is None:
            continue
        enc = tokenizer(text[:cut], add_special_tokens=False)["input_ids"]
        # the repeated move's last token, in the context of the model's own list before it
        out.append((ids[:n] + enc, -1, ((n + len(enc) - 1, enc[-1]),)))  # prompt length -1: no likelihood targets
    return out


def _unlikelihood(logits, rows) -> "torch.Tensor":
    """Sum over the rows' repeat bans of -log(1 - p(banned token)) (Welleck et al. 2019)."""
    import torch

    where = [(i, pos - 1, tok) for i, r in enumerate(rows) for pos, tok in (r[2] if len(r) > 2 else ())]
    if not where:
        return logits.new_zeros(())
    i, t, tok = (torch.tensor(x, device=logits.device) for x in zip(*where))
    p = torch.softmax(logits[i, t].float(), dim=-1).gather(1, tok[:, None]).squeeze(1)
    return -torch.log1p(-p.clamp(max=1 - 1e-6)).sum()


def _accumulate(model, rows, pad_id: int, loss_on: str, autocast, device, distinct_coef: float = 0.0):
    """Forward and backward one step's rows as two micro-batches, the shorter half and the longer.

    P: and A: samples differ in length (about 120 vs 180 characters); padding them to a
    common width wastes a fifth of the step. The loss is the token mean over the whole
    step, so the gradient equals that of the single mixed batch. `distinct_coef` adds the
    unlikelihood of repeating an M: move (see repeat_bans), per token like the likelihood.
    Returns (likelihood loss, unlikelihood loss).
    """
    rows = sorted(rows, key=lambda r: len(r[0]))
    half = len(rows) // 2
    buckets = [b for b in (rows[:half], rows[half:]) if b]
    batches = [(b, make_batch(b, pad_id, loss_on)) for b in buckets]
    n_tokens = sum(int((labels != -100).sum()) for _, (_, _, labels) in batches)
    total, total_ul = 0.0, 0.0
    for bucket, (input_ids, mask, labels) in batches:
        with autocast:
            out = model(input_ids=input_ids.to(device), attention_mask=mask.to(device), labels=labels.to(device),
                        num_items_in_batch=n_tokens)
        loss = out.loss
        if distinct_coef:
            ul = _unlikelihood(out.logits, bucket) / n_tokens
            loss = loss + distinct_coef * ul
            total_ul += ul.item()
        loss.backward()
        total += out.loss.item()
    return total, total_ul


def train(cfg: SFTConfig, resume: bool = False, progress: bool = True) -> dict:
    import torch
    from tqdm import tqdm

    from rookworld_rlvr.data.io import read_samples
    from rookworld_rlvr.grpo.control import adamw, cosine_lr
    from rookworld_rlvr.chess_tokenizers import TOKENIZERS
    from rookworld_rlvr.model import fuse_activations, load_policy, resolve_device, save_pretrained_atomic, tiny_config
    from rookworld_rlvr.statefile import load_state, save_state, state_exists

    cfg.validate()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    device = resolve_device(cfg.device)
    out = Path(cfg.out)
    ckpt = out.parent / f"{out.name}.checkpoint"
    state = None
    if resume and state_exists(ckpt, SFT_STATE):
        model, tokenizer = load_policy(str(ckpt), device=str(device))
        state = load_state(ckpt, SFT_STATE)
    elif cfg.init:
        model, tokenizer = load_policy(cfg.init, device=str(device))
    else:
        from transformers import GPT2LMHeadModel

        tokenizer = TOKENIZERS[cfg.tokenizer or "board"]()
        model = GPT2LMHeadModel(tiny_config(len(tokenizer), cfg.preset, cfg.n_positions)).to(device)
        fuse_activations(model)
    set_dropout(model, cfg.dropout)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"sft: {n_params / 1e6:.2f}M parameters on {device}, data {cfg.data}")

    samples = read_samples(cfg.data)
    by_task = {t: _encode(tokenizer, [s for s in samples if s.task == t], cfg.layout, cfg.order) for t in ("P", "A")}
    limit = getattr(model.config, "n_positions", None) or 10**9
    for t, rows in by_task.items():
        too_long = sum(len(ids) > limit for ids, *_ in rows)
        if too_long:
            raise ValueError(f"{too_long} {t}: samples are longer than the model context ({limit} tokens)")
    eval_samples = read_samples(cfg.eval_data) if Path(cfg.eval_data).exists() else []
    eval_rows = {t: _encode(tokenizer, [s for s in eval_samples if s.task == t][:256], cfg.layout, cfg.order)
                 for t in ("P", "A")}

    opt = adamw(list(model.parameters()), cfg.lr, (0.9, 0.95), cfg.weight_decay)
    step, elapsed_before = 0, 0.0
    log_path = out.parent / f"{out.name}.sft_log.jsonl"
    if state is not None:
        opt.load_state_dict(state["optimizer"])
        step, elapsed_before = state["step"], state["elapsed"]
        rng.setstate(state["python_rng"])
        torch.set_rng_state(state["torch_rng"])
        print(f"sft: resumed at step {step} ({elapsed_before / 60:.1f} min done)")
        for line in changed_settings(state.get("config", {}), asdict(cfg)):
            print(f"sft: {line}")
        if log_path.exists():  # steps after the checkpoint are redone: drop their old records
            kept = [x for x in log_path.read_text().splitlines() if json.loads(x)["step"] <= step]
            log_path.write_text("".join(x + "\n" for x in kept))
    log_path.parent.mkdir(parents=True, exist_ok=True)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.autocast == "bf16")
    t0 = time.time()
    budget = cfg.max_minutes * 60 if cfg.max_minutes else None
    bar = tqdm(total=cfg.steps, initial=step, disable=not progress, desc="sft")
    metrics: dict = {}

    def progress_frac() -> float:
        frac = step / cfg.steps
        if budget:
            frac = max(frac, (elapsed_before + time.time() - t0) / budget)
        return min(frac, 1.0)

    def save(final: bool = False) -> None:
        target = out if final else ckpt
        save_pretrained_atomic(model, tokenizer, target)
        if not final:
            # shards under 25 MB: a checkpoint can be committed, so a later run elsewhere resumes it exactly
            save_state(target, SFT_STATE, {"optimizer": opt.state_dict(), "step": step,
                                           "elapsed": elapsed_before + time.time() - t0, "python_rng": rng.getstate(),
                                           "torch_rng": torch.get_rng_state(), "config": asdict(cfg)},
                       shard_bytes=25_000_000)

    model.train()
    model.config.use_cache = False
    while step < cfg.steps and progress_frac() < 1.0:
        warm = min(1.0, (step + 1) / max(1, cfg.warmup_steps))  # warm-up counts real steps, decay follows progress
        lr = cfg.lr * warm * cosine_lr(int(progress_frac() * cfg.steps), cfg.steps, 0, cfg.min_lr_ratio)
        for g in opt.param_groups:
            g["lr"] = lr
        n_env = sum(rng.random() < cfg.env_share for _ in range(cfg.batch_size))
        env_rows = rng.choices(by_task["A"], k=n_env) if by_task["A"] and n_env else []
        pol_rows = rng.choices(by_task["P"], k=cfg.batch_size - len(env_rows)) if by_task["P"] else []
        rows = env_rows + pol_rows
        opt.zero_grad(set_to_none=True)
        own = []
        if cfg.own_repeats and cfg.distinct_coef and pol_rows:
            model.config.use_cache = True
            own = own_repeat_rows(model, tokenizer, pol_rows[: cfg.own_repeats])
            model.train()
            model.config.use_cache = False
        loss, ul = _accumulate(model, rows + own, tokenizer.pad_token_id, cfg.loss_on, autocast, device,
                               cfg.distinct_coef)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        bar.update()
        bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}")
        record = {"step": step, "loss": loss, **({"unlikelihood": ul, "own_repeats": len(own)} if cfg.distinct_coef
                                                 else {}), "lr": lr,
                  "grad_norm": float(grad_norm),
                  "minutes": round((elapsed_before + time.time() - t0) / 60, 2)}
        done = step >= cfg.steps or progress_frac() >= 1.0
        if step % cfg.eval_every == 0 or done:
            record.update(_evaluate(model, tokenizer, eval_rows, eval_samples, cfg, device))
            model.train()
            metrics = record
            bar.write(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in record.items()}))
        with open(log_path, "a") as fh:
            fh.write(json.dumps(record) + "\n")
        if step % cfg.save_every == 0 and not done:
            save()
    bar.close()
    model.eval()
    model.config.use_cache = True
    save()
    save(final=True)
    print(f"sft: saved {out} after {step} steps, {(elapsed_before + time.time() - t0) / 60:.1f} min")
    return metrics


def _evaluate(model, tokenizer, eval_rows, eval_samples, cfg: SFTConfig, device) -> dict:
    """Eval loss per task, and greedy task metrics on a subset when the eval module is there."""
    import torch

    model.eval()
    out: dict = {}
    with torch.no_grad():
        for t, rows in eval_rows.items():
            if rows:
                ids, mask, labels = (x.to(device) for x in make_batch(rows[:128], tokenizer.pad_token_id, "completion"))
                loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss.item()
                out[f"eval_loss_{t}"] = loss
                # per character (EOS counts as one), comparable across tokenizers
                n_tokens = int((labels[:, 1:] != -100).sum())
                n_chars = sum(len(tokenizer.decode(x[n:], skip_special_tokens=True)) + 1 for x, n, *_ in rows[:128])
                out[f"eval_nats_per_char_{t}"] = loss * n_tokens / n_chars
    if cfg.eval_samples and eval_samples:
        from rookworld_rlvr.evaluate import EvalConfig, evaluate

        model.config.use_cache = True
        res = evaluate(model, tokenizer, eval_samples, config=EvalConfig(layout=cfg.layout, limit=cfg.eval_samples),
                       scorer=_scorer())
        model.config.use_cache = False
        for task in ("policy", "environment"):
            for k, v in res.get(task, {}).items():
                if isinstance(v, (int, float)) and k != "n":
                    out[f"{task}/{k}"] = v
    return out


_SCORER = None


def _scorer():
    global _SCORER
    if _SCORER is None:
        from rookworld_rlvr.engine import EngineConfig, StockfishPool
        from rookworld_rlvr.tasks.rewards import RewardScorer

        _SCORER = RewardScorer(engine=StockfishPool(EngineConfig(depth=8, workers=1)))
    return _SCORER


_HELP = {
    "tokenizer": "char (one token per character), square (plus one token per square inside UCI moves) or board "
                 "(square, and FEN boards written square by square); fresh models only, default board",
    "distinct_coef": "weight of the unlikelihood of writing an M: move twice (0 = plain likelihood)",
    "own_repeats": "P: rows per step the model answers greedily; the moves it repeats there are pushed down "
                   "(with distinct_coef; 0 = off)",
    "order": "P: candidates in the target: best-first (by eval; greedy decoding then writes distinct moves) "
             "or given (as stored; upstream shuffled them)",
    "init": "continue from this model directory (with its own tokenizer) instead of a fresh model",
}


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    defaults = SFTConfig()
    for field, value in asdict(defaults).items():
        flag = "--" + field.replace("_", "-")
        kind = type(value) if value is not None else {"max_minutes": float, "threads": int}.get(field, str)
        p.add_argument(flag, type=kind, default=value, help=_HELP.get(field, f"(default: {value})"))
    p.add_argument("--resume", action="store_true", help="continue from <out>.checkpoint")
    p.add_argument("--quiet", action="store_true")


def run(args: argparse.Namespace, name: str) -> int:
    fields = asdict(SFTConfig())
    cfg = SFTConfig(**{k: getattr(args, k) for k in fields})
    train(cfg, resume=args.resume, progress=not args.quiet)
    return 0
