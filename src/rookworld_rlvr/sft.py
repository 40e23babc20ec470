"""`rookworld sft`: supervised bootstrap of a base model that knows both task formats.

GRPO learns only from differences among well-formed answers, so the base decides
everything. The loop is nanoGPT-shaped: sample a batch, forward, backward, clip, step;
evaluate and checkpoint every so often; resume from the last checkpoint.

Owns supervised training; padding is `model.padding`, the tokenizers `chess_tokenizers`, the
optimizer and schedule `grpo.control`. Imports torch inside functions only, so `rookworld --help`
stays fast.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rookworld_rlvr.sft_cache import training_rows
from rookworld_rlvr.sft_rows import (MicroBatch, draw_batch, encode, legality_loss, make_batch, micro_batches,
                                    on_device, own_repeat_rows, repeat_bans, unlikelihood)

__all__ = ["SFTConfig", "encode", "make_batch", "own_repeat_rows", "repeat_bans", "set_dropout", "train"]

SFT_STATE = "sft_state"  # sft_state.safetensors + sft_state.json (statefile: no pickle)


@dataclass
class SFTConfig:
    data: str = "data/train.jsonl.xz"
    eval_data: str = "data/eval.jsonl.gz"  # held-out samples for eval_every; "" = none
    out: str = "runs/sft/model"
    init: str | None = None  # continue from this model directory instead of a fresh one
    # deepen the --init model to this many blocks before training (model.grow: the new blocks start as
    # exact no-ops, so the model begins where the init model stopped); 0 = keep its depth
    grow_layers: int = 0
    preset: str = "tiny"  # tiny | small | wide | gpt2-124m (fresh models only; model.load.PRESETS)
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
    # weight of the correction on those rows: the best true candidate the model had not listed, learned
    # where it repeated a move (DAgger); 0 = the ban alone
    own_targets: float = 0.0
    # weight of the legality loss: at every token of a P: move, -log of the probability that the token
    # continues a legal move not yet listed (sft_rows.legal_sets); 0 = off (measured on rookworld-board:
    # legality up, move quality and mates in one down; models/README.md)
    legal_coef: float = 0.0
    env_share: float = 0.5  # share of A: samples in each batch
    steps: int = 3000
    max_minutes: float | None = None  # the whole run's wall-clock budget, over resumes (the schedule follows it)
    # end this invocation after so many minutes, checkpointed; the schedule still follows --steps, so
    # --resume continues the same run (how a long run is spread over several invocations)
    stop_after_minutes: float | None = None
    stop_when: str | None = None  # end this invocation, checkpointed, once this file exists (say, more data is ready)
    # a file that keeps the rows read and encoded from --data (sft_cache): a resume or a later run reads them in
    # seconds; other data or settings encode afresh
    rows_cache: str | None = None
    encode_only: bool = False  # fill --rows-cache and stop (prepare the rows on the CPU while a GPU trains)
    batch_size: int = 64
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    # the last N steps (of --steps) take the scheduled lr linearly down to zero (a warmup-stable-decay
    # cooldown): a long run ends on a cooldown without paying the cosine again; 0 = off
    cooldown_steps: int = 0
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    dropout: float = 0.0  # 0: the tiny model under-fits, and CPU attention runs ~4x slower with dropout
    # none | bf16 | auto (bf16 where the hardware does it well: CUDA with bf16, a CPU with AMX; on a CPU
    # without bf16 units, bf16 autocast measured 16x slower than float32)
    autocast: str = "none"
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
        if self.autocast not in ("none", "bf16", "auto"):
            raise ValueError(f"sft.autocast must be 'none', 'bf16' or 'auto', got {self.autocast!r}")
        if not 0 <= self.dropout < 1:
            raise ValueError("sft.dropout must be in [0, 1)")
        if not 0 <= self.own_targets or not math.isfinite(self.own_targets):
            raise ValueError(f"sft.own_targets must be finite and >= 0, got {self.own_targets}")
        if self.grow_layers < 0:
            raise ValueError(f"sft.grow_layers must be >= 0, got {self.grow_layers}")
        if self.grow_layers and not self.init:
            raise ValueError("sft.grow_layers deepens an --init model; a fresh model takes its shape from --preset")
        if self.own_repeats < 0:
            raise ValueError(f"sft.own_repeats must be >= 0, got {self.own_repeats}")
        for name in ("distinct_coef", "legal_coef"):
            value = getattr(self, name)
            if not 0 <= value or not math.isfinite(value):
                raise ValueError(f"sft.{name} must be finite and >= 0, got {value}")
        if not 0 <= self.env_share <= 1:
            raise ValueError("sft.env_share must be in [0, 1]")
        if self.steps < 1 or self.batch_size < 1 or self.lr <= 0:
            raise ValueError("sft.steps, sft.batch_size and sft.lr must be positive")
        if not 0 <= self.cooldown_steps <= self.steps:
            raise ValueError(f"sft.cooldown_steps must be in [0, steps={self.steps}], got {self.cooldown_steps}")
        for name in ("max_minutes", "stop_after_minutes"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"sft.{name} must be a positive number of minutes, got {value}")
        if self.encode_only and not self.rows_cache:
            raise ValueError("sft.encode_only fills a rows cache: give --rows-cache FILE")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"sft.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if not Path(self.data).exists():
            raise ValueError(f"sft.data: {self.data}: no such file")
        if self.eval_data and not Path(self.eval_data).exists():
            raise ValueError(f"sft.eval_data: {self.eval_data}: no such file (pass --eval-data '' to train "
                             "without a held-out evaluation)")
        from rookworld_rlvr.chess_tokenizers import TOKENIZERS
        from rookworld_rlvr.model.load import PRESETS

        if self.preset not in PRESETS:
            raise ValueError(f"sft.preset must be one of {', '.join(PRESETS)}, got {self.preset!r}")

        if self.tokenizer is not None and self.tokenizer not in TOKENIZERS:
            raise ValueError(f"sft.tokenizer must be one of {', '.join(TOKENIZERS)}, got {self.tokenizer!r}")
        if self.tokenizer is not None and self.init:
            raise ValueError("sft.tokenizer applies to fresh models only: --init keeps the model's own tokenizer")


# where the run is, how many threads it uses and when this invocation ends: none changes what a resumed run computes
_PLACE = ("out", "device", "threads", "stop_after_minutes", "stop_when", "rows_cache", "encode_only")


def changed_settings(saved: dict, now: dict) -> list[str]:
    """The settings a resume changes against the checkpoint's: an exact continuation changes none,
    so each one is said (it takes effect from the resumed step on). A setting newer than the
    checkpoint had the effect of its default there."""
    defaults = asdict(SFTConfig())
    was = {k: saved.get(k, defaults.get(k)) for k in now}
    return [f"{k} was {was[k]!r} in the checkpoint{'' if k in saved else ' (its default then)'}, now {now[k]!r} "
            "(from this step on)" for k in now if k not in _PLACE and was[k] != now[k]]


def cooldown(step: int, total_steps: int, cooldown_steps: int) -> float:
    """LR multiplier of a warmup-stable-decay cooldown: 1 before the last `cooldown_steps` of `total_steps`,
    then a straight line toward zero: N/(N+1), ..., 1/(N+1) over those N steps (0 after them)."""
    if cooldown_steps <= 0:
        return 1.0
    return min(1.0, max(0.0, (total_steps - step) / (cooldown_steps + 1)))


def set_aside(paths: list[Path]) -> None:
    """Rename an older run's outputs to `<name>-<time>` (as `rookworld train` does): nothing is deleted."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for p in paths:
        aside = p.with_name(f"{p.stem}-{stamp}{p.suffix}" if p.is_file() else f"{p.name}-{stamp}")
        p.rename(aside)
        print(f"sft: moved the previous run's {p} to {aside} (use --resume to continue it)")


def set_dropout(model, p: float) -> None:
    """Set every dropout of a GPT-2-style model (modules and the config that is saved with it)."""
    import torch

    for key in ("attn_pdrop", "resid_pdrop", "embd_pdrop", "summary_first_dropout"):
        if hasattr(model.config, key):
            setattr(model.config, key, p)
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = p


def _accumulate(model, rows, pad_id: int, loss_on: str, autocast, device, distinct_coef: float = 0.0,
                legal_coef: float = 0.0, batches: list[MicroBatch] | None = None):
    """Forward and backward one step's rows as two micro-batches, the shorter half and the longer.

    P: and A: samples differ in length (about 120 vs 180 characters); padding them to a
    common width wastes a fifth of the step. The loss is the token mean over the whole
    step (each target token weighted by its row's weight: 1 for data), so the gradient equals
    that of the single mixed batch. `distinct_coef` adds the unlikelihood of repeating an M: move
    (see repeat_bans), per token like the likelihood; `legal_coef` the legality loss (legal_sets).
    `batches`: micro_batches(rows), made beforehand. Nothing waits for the device (on_device copies, a ready
    causal_mask), so the host makes the next step's while it runs.
    Returns [likelihood loss, unlikelihood loss, legality loss], float64 on the device.
    """
    import torch
    import torch.nn.functional as F
    from rookworld_rlvr.model.padding import causal_mask

    batches = batches or micro_batches(rows, pad_id, loss_on)
    n_tokens = max(1, sum(int((b.labels[:, 1:] != -100).sum()) for b in batches))  # host tensors: no wait
    total = torch.zeros(3, dtype=torch.float64, device=device)
    for b in batches:
        ids = on_device(b.input_ids, device)
        mask = causal_mask(model, ids)  # the padding mask is moved only for a model that needs it
        with autocast:
            logits = model(input_ids=ids, attention_mask=on_device(b.mask, device) if mask is None else mask).logits
        targets = on_device(b.labels, device)[:, 1:]
        nll = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), targets.flatten(), ignore_index=-100,
                              reduction="none").view_as(targets)
        loss = (nll * on_device(b.weights, device)[:, 1:]).sum() / n_tokens
        ul = unlikelihood(logits, b.bans) / n_tokens if distinct_coef else loss.new_zeros(())
        ll = legality_loss(logits, b.legal) / n_tokens if legal_coef else loss.new_zeros(())
        (loss + distinct_coef * ul + legal_coef * ll).backward()
        total += torch.stack([nll.detach().sum().double() / n_tokens, ul.detach().double(), ll.detach().double()])
    return total


def train(cfg: SFTConfig, resume: bool = False, progress: bool = True) -> dict:
    import torch
    from tqdm import tqdm

    from rookworld_rlvr.data.io import atomic_write_text, read_log, read_samples
    from rookworld_rlvr.grpo.control import adamw, cosine_lr
    from rookworld_rlvr.chess_tokenizers import TOKENIZERS
    from rookworld_rlvr.model import fuse_activations, load_policy, resolve_device, save_pretrained_atomic, tiny_config
    from rookworld_rlvr.atomic import restore_aside, write_dir
    from rookworld_rlvr.model.load import write_pretrained
    from rookworld_rlvr.statefile import load_state, save_state, state_exists

    cfg.validate()
    if cfg.eval_data and cfg.eval_samples:  # its evaluations judge moves with Stockfish: fail now, not at step 500
        from rookworld_rlvr.engine import find_stockfish

        find_stockfish()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    device = resolve_device(cfg.device)
    out = Path(cfg.out)
    ckpt = out.parent / f"{out.name}.checkpoint"
    state = None
    if resume:
        restore_aside(ckpt)  # a kill between the two renames of a save left the last checkpoint beside it
        if ckpt.exists() and not state_exists(ckpt, SFT_STATE):
            raise ValueError(f"{ckpt}: model weights without {SFT_STATE}.json / {SFT_STATE}.safetensors, so it is "
                             "not a complete checkpoint and --resume cannot continue it exactly; move it aside to "
                             "start afresh")
        if not ckpt.exists():
            print(f"sft: --resume: no checkpoint at {ckpt}; starting a new run")
    if resume and state_exists(ckpt, SFT_STATE):
        model, tokenizer = load_policy(str(ckpt), device=str(device))
        state = load_state(ckpt, SFT_STATE)
    elif cfg.init:
        model, tokenizer = load_policy(cfg.init, device=str(device))
        if cfg.grow_layers:  # on --resume the checkpoint already holds the grown model
            from rookworld_rlvr.model.grow import grow_depth

            old = model.config.n_layer
            model = grow_depth(model, cfg.grow_layers)
            print(f"sft: grew {cfg.init} from {old} to {cfg.grow_layers} blocks (the new ones start as no-ops)")
    else:
        from transformers import GPT2LMHeadModel

        tokenizer = TOKENIZERS[cfg.tokenizer or "board"]()
        model = GPT2LMHeadModel(tiny_config(len(tokenizer), cfg.preset, cfg.n_positions)).to(device)
        fuse_activations(model)
    set_dropout(model, cfg.dropout)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"sft: {n_params / 1e6:.2f}M parameters on {device}, data {cfg.data}")

    by_task = training_rows(cfg.data, tokenizer, cfg.layout, cfg.order, cfg.legal_coef > 0, cfg.rows_cache,
                            load=not cfg.encode_only)
    if cfg.encode_only:
        return {}
    limit = getattr(model.config, "n_positions", None) or 10**9
    for t, rows in by_task.items():
        too_long = sum(len(ids) > limit for ids, *_ in rows)
        if too_long:
            raise ValueError(f"{too_long} {t}: samples are longer than the model context ({limit} tokens)")
    eval_samples = read_samples(cfg.eval_data) if cfg.eval_data else []
    eval_rows = {t: encode(tokenizer, [s for s in eval_samples if s.task == t][:256], cfg.layout, cfg.order, legal=True)
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
            kept = [json.dumps(r) for r in read_log(log_path) if r["step"] <= step]
            atomic_write_text(log_path, [x + "\n" for x in kept])
    elif resume and log_path.exists():  # killed before its first checkpoint: every logged step is redone
        log_path.unlink()
    elif log_path.exists() or ckpt.exists():  # a fresh run never appends to, or saves over, an older one
        set_aside([p for p in (log_path, ckpt, out) if p.exists()])
    log_path.parent.mkdir(parents=True, exist_ok=True)
    from rookworld_rlvr.grpo.precision import autocast_dtype

    amp = autocast_dtype(cfg.autocast, device)
    print(f"sft: autocast {'bf16' if amp else 'off (float32)'} ({cfg.autocast})")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp is not None)
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
        if final:
            save_pretrained_atomic(model, tokenizer, out)
            return

        def write(tmp: Path) -> None:  # weights and state together: the checkpoint swaps in whole or not at all
            write_pretrained(model, tokenizer, tmp)
            # shards under 25 MB: a checkpoint can be committed, so a later run elsewhere resumes it exactly
            save_state(tmp, SFT_STATE, {"optimizer": opt.state_dict(), "step": step,
                                        "elapsed": elapsed_before + time.time() - t0, "python_rng": drawn,
                                        "torch_rng": torch.get_rng_state(), "config": asdict(cfg)},
                       shard_bytes=25_000_000)

        write_dir(ckpt, write)

    model.train()
    model.config.use_cache = False

    def paused() -> bool:  # this invocation ends (stop_after_minutes, stop_when); the run itself goes on
        return ((cfg.stop_after_minutes is not None and time.time() - t0 >= cfg.stop_after_minutes * 60)
                or (cfg.stop_when is not None and Path(cfg.stop_when).exists()))

    own_answers, pad_id = bool(cfg.own_repeats and cfg.distinct_coef), tokenizer.pad_token_id

    def draw() -> tuple[list, list, list[MicroBatch] | None]:  # with own answers, the step's model makes its batches
        env_rows, pol_rows = draw_batch(rng, by_task, cfg.batch_size, cfg.env_share)
        return env_rows, pol_rows, None if own_answers else micro_batches(env_rows + pol_rows, pad_id, cfg.loss_on)

    upcoming, drawn = None, rng.getstate()  # drawn: the rng after this step's draw, what a checkpoint keeps
    while step < cfg.steps and progress_frac() < 1.0 and not paused():
        warm = min(1.0, (step + 1) / max(1, cfg.warmup_steps))  # warm-up counts real steps, decay follows progress
        at = int(progress_frac() * cfg.steps)
        lr = cfg.lr * warm * cosine_lr(at, cfg.steps, 0, cfg.min_lr_ratio) * cooldown(at, cfg.steps, cfg.cooldown_steps)
        for g in opt.param_groups:
            g["lr"] = lr
        env_rows, pol_rows, batches = upcoming or draw()
        opt.zero_grad(set_to_none=True)
        own = []
        if own_answers and pol_rows:
            model.config.use_cache = True
            own = own_repeat_rows(model, tokenizer, pol_rows[: cfg.own_repeats], target_weight=cfg.own_targets)
            model.train()
            model.config.use_cache = False
        sums = _accumulate(model, env_rows + pol_rows + own, pad_id, cfg.loss_on, autocast, device,
                           cfg.distinct_coef, cfg.legal_coef, batches)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        drawn = rng.getstate()
        upcoming = draw() if step < cfg.steps else None  # made on the host while the device runs this step
        loss, ul, legal = sums.tolist()  # the step's first wait for the device
        bar.update()
        bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}")
        repeats = sum(r.learn_from is None for r in own)  # the model's own answers that repeated a move
        record = {"step": step, "loss": loss, "A_rows": len(env_rows),
                  **({"unlikelihood": ul, "own_repeats": repeats} if cfg.distinct_coef else {}),
                  **({"legality": legal} if cfg.legal_coef else {}),
                  "lr": lr,
                  "grad_norm": float(grad_norm),
                  "minutes": round((elapsed_before + time.time() - t0) / 60, 2),
                  "seconds": round(elapsed_before + time.time() - t0, 3)}
        done = step >= cfg.steps or progress_frac() >= 1.0 or paused()
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
    print(f"sft: saved {out} after {step} steps, {(elapsed_before + time.time() - t0) / 60:.1f} min"
          + (f"; paused, --resume continues to step {cfg.steps}" if step < cfg.steps and paused() else ""))
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
                res = model(input_ids=ids, attention_mask=mask, labels=labels)
                loss = res.loss.item()
                out[f"eval_loss_{t}"] = loss
                n_sets = sum(len(r.legal) for r in rows[:128])
                if n_sets:  # nats per move token off the legal moves (legality_loss), whatever legal_coef is
                    out[f"eval_legality_{t}"] = float(legality_loss(res.logits, rows[:128])) / n_sets
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
