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
import random
import time
from dataclasses import asdict
from pathlib import Path

from rookworld_rlvr import resumed
from rookworld_rlvr.atomic import write_text
from rookworld_rlvr.progress import bar as progress_bar
from rookworld_rlvr.sft_cache import training_rows
from rookworld_rlvr.sft_config import SFTConfig
from rookworld_rlvr.sft_rows import (MicroBatch, draw_batch, encode, legality_loss, make_batch, micro_batches,
                                    on_device, own_repeat_rows, repeat_bans, unlikelihood)
from rookworld_rlvr.step_profile import StepProfile

__all__ = ["SFTConfig", "encode", "make_batch", "own_repeat_rows", "repeat_bans", "set_dropout", "train"]

SFT_STATE = "sft_state"  # sft_state.safetensors + sft_state.json (statefile: no pickle)


# where the run is, how many threads it uses, when this invocation ends and what it also writes: none changes what a
# resumed run computes
_PLACE = ("out", "device", "threads", "stop_after_minutes", "stop_when", "rows_cache", "encode_only",
          "step_timeout_minutes", "profile_steps", "profile_after", "tensorboard", "wandb")


def changed_settings(saved: dict, now: dict) -> list[str]:
    """The settings a resume changes against the checkpoint's (`resumed.changed_settings`)."""
    return resumed.changed_settings(saved, now, asdict(SFTConfig()), _PLACE)


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
                legal_coef: float = 0.0, batches: list[MicroBatch] | None = None, n_tokens: int | None = None):
    """Forward and backward one step's rows as two micro-batches, the shorter half and the longer.

    P: and A: samples differ in length (about 120 vs 180 characters); padding them to a
    common width wastes a fifth of the step. The loss is the token mean over the whole
    step (each target token weighted by its row's weight: 1 for data), so the gradient equals
    that of the single mixed batch. `distinct_coef` adds the unlikelihood of repeating an M: move
    (see repeat_bans), per token like the likelihood; `legal_coef` the legality loss (legal_sets).
    `batches`: micro_batches(rows), made beforehand. Nothing waits for the device (on_device copies, a ready
    causal_mask), so the host makes the next step's while it runs. `n_tokens`: the target tokens of the whole
    step where `rows` are one rank's share of it (torchrun); default those of `rows`.
    Returns [likelihood loss, unlikelihood loss, legality loss], float64 on the device.
    """
    import torch
    import torch.nn.functional as F
    from rookworld_rlvr.model.generate import attention_backends
    from rookworld_rlvr.model.padding import causal_mask

    batches = batches or micro_batches(rows, pad_id, loss_on)
    n_tokens = n_tokens or max(1, target_tokens(batches))
    total = torch.zeros(3, dtype=torch.float64, device=device)
    for b in batches:
        ids = on_device(b.input_ids, device)
        mask = causal_mask(model, ids)  # the padding mask is moved only for a model that needs it
        with autocast, attention_backends(device):
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


def target_tokens(batches: list[MicroBatch]) -> int:
    """How many tokens the step's loss is the mean over (host tensors: no wait for the device)."""
    return sum(int((b.labels[:, 1:] != -100).sum()) for b in batches)


def _starting_model(cfg: SFTConfig, resume: bool, device, main: bool, say) -> tuple:
    """(model, tokenizer, the checkpoint's state or None): on --resume the checkpoint's model, else `init`'s
    (grown to `grow_layers` blocks) or a fresh one of `preset`."""
    from rookworld_rlvr.chess_tokenizers import TOKENIZERS
    from rookworld_rlvr.model import fuse_activations, load_policy, tiny_config
    from rookworld_rlvr.statefile import load_state, state_exists

    ckpt = cfg.checkpoint_dir()
    if resume and state_exists(ckpt, SFT_STATE):
        model, tokenizer = load_policy(str(ckpt), device=str(device), verbose=main)
        return model, tokenizer, load_state(ckpt, SFT_STATE)
    if cfg.init:
        model, tokenizer = load_policy(cfg.init, device=str(device), verbose=main)
        if cfg.grow_layers:  # on --resume the checkpoint already holds the grown model
            from rookworld_rlvr.model.grow import grow_depth

            old = model.config.n_layer
            model = grow_depth(model, cfg.grow_layers)
            say(f"sft: grew {cfg.init} from {old} to {cfg.grow_layers} blocks (the new ones start as no-ops)")
        return model, tokenizer, None
    from transformers import GPT2LMHeadModel

    tokenizer = TOKENIZERS[cfg.tokenizer or "board"]()
    model = GPT2LMHeadModel(tiny_config(len(tokenizer), cfg.preset, cfg.n_positions)).to(device)
    fuse_activations(model)
    return model, tokenizer, None


def _restore(state: dict, cfg: SFTConfig, opt, rng: random.Random, device, say) -> tuple[int, float]:
    """A checkpoint's optimizer and random streams put back, each checked first (`state_check`); returns its
    (step, seconds trained). Under torchrun each rank takes its own streams where the checkpoint has them."""
    import torch

    from rookworld_rlvr import state_check as sc
    from rookworld_rlvr.grpo import distributed as dist
    from rookworld_rlvr.grpo.control import load_optimizer

    sc.check(state, {"step": 0, "elapsed": 0.0, "optimizer": sc.optimizer(opt), "python_rng": sc.python_rng,
                     "torch_rng": sc.rng(), "torch_rng_ranks": sc.optional([sc.rng()]), "config": sc.optional({}),
                     "cuda_rng_ranks": sc.optional([sc.rng(device)] if device.type == "cuda" else None)},
             cfg.checkpoint_dir() / f"{SFT_STATE}.json")
    load_optimizer(opt, state["optimizer"])
    rng.setstate(state["python_rng"])
    rank, world = dist.rank(), dist.world()
    streams = state.get("torch_rng_ranks") or [state["torch_rng"]]  # one per rank under torchrun
    if rank < len(streams):
        torch.set_rng_state(streams[rank])
    if device.type == "cuda" and rank < len(state.get("cuda_rng_ranks", ())):  # dropout's masks on a GPU
        torch.cuda.set_rng_state(state["cuda_rng_ranks"][rank], device)
    say(f"sft: resumed at step {state['step']} ({state['elapsed'] / 60:.1f} min done)")
    if len(streams) != world:
        say(f"sft: the checkpoint was written by {len(streams)} process(es), this run has {world}: the updates "
            "are the same, dropout's masks are drawn afresh")
    for line in changed_settings(state.get("config", {}), asdict(cfg)):
        say(f"sft: {line}")
    return state["step"], state["elapsed"]


def train(cfg: SFTConfig, resume: bool = False, progress: bool = True, interrupt=None, closing=None) -> dict:
    """Train (or --resume) the run `cfg` describes; its last held-out metrics. Under torchrun (the
    process group up, as `rookworld sft` sets it) every rank draws the same global batch and takes
    its share of the rows (row i on rank i % world); the gradients are summed and the loss is the
    token mean over the whole batch, so an update is one process's on the same batch. Evaluations
    are shared out; rank 0 alone prints, logs and saves. `interrupt` (`interrupt.StopOnSignal`, rank 0's):
    once it is asked, the run pauses after the step it is in, as `stop_after_minutes` pauses it. `closing` (the
    caller's `contextlib.ExitStack`) ends the run's sinks when training raises: its wandb run, marked failed."""
    import torch

    from rookworld_rlvr.data.io import atomic_write_text, read_log, read_samples
    from rookworld_rlvr.grpo.control import adamw, cosine_lr
    from rookworld_rlvr.model import resolve_device, save_pretrained_atomic
    from rookworld_rlvr.atomic import restore_aside, write_dir
    from rookworld_rlvr.model.load import name_causal_lm_loss, write_pretrained
    from rookworld_rlvr.statefile import save_state, state_exists
    from rookworld_rlvr.grpo import distributed as dist
    from rookworld_rlvr.sft_eval import held_out

    cfg.validate()
    world, rank, main = dist.world(), dist.rank(), dist.is_main()
    say = print if main else (lambda *a, **k: None)
    if world > 1 and cfg.encode_only:
        raise ValueError("sft.encode_only fills a rows cache in one process: run it without torchrun")
    if cfg.batch_size < world:
        raise ValueError(f"sft.batch_size ({cfg.batch_size}) must be at least the number of processes ({world})")
    if cfg.eval_data and cfg.eval_samples:  # its evaluations judge moves with Stockfish: fail now, not at step 500
        from rookworld_rlvr.engine import find_stockfish

        find_stockfish()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    device = dist.local_device(resolve_device(cfg.device))  # under torchrun a bare cuda is cuda:LOCAL_RANK
    out = Path(cfg.out)
    ckpt = cfg.checkpoint_dir()
    if resume:
        if main:
            restore_aside(ckpt)  # a kill between the two renames of a save left the last checkpoint beside it
        dist.barrier()
        if ckpt.exists() and not state_exists(ckpt, SFT_STATE):
            raise ValueError(f"{ckpt}: model weights without {SFT_STATE}.json / {SFT_STATE}.safetensors, so it is "
                             "not a complete checkpoint and --resume cannot continue it exactly; move it aside to "
                             "start afresh")
        if not ckpt.exists():
            say(f"sft: --resume: no checkpoint at {ckpt}; starting a new run")
    model, tokenizer, state = _starting_model(cfg, resume, device, main, say)
    set_dropout(model, cfg.dropout)
    name_causal_lm_loss(model)
    if rank:  # the same model everywhere (seeded); dropout draws its own masks on each rank
        torch.manual_seed(cfg.seed + rank)
    n_params = sum(p.numel() for p in model.parameters())
    say(f"sft: {n_params / 1e6:.2f}M parameters on {device}" + (f" x {world} processes" if world > 1 else "")
        + f", data {cfg.data}")

    if cfg.rows_cache and not main:  # rank 0 fills the cache (once), the others then read it
        dist.barrier()
    by_task = training_rows(cfg.data, tokenizer, cfg.layout, cfg.order, cfg.legal_coef > 0, cfg.rows_cache,
                            say=say, load=not cfg.encode_only)
    if cfg.rows_cache and main:
        dist.barrier()
    if cfg.encode_only:
        return {}
    if not by_task["P"] and (not by_task["A"] or cfg.env_share == 0):  # every batch would be empty: nothing learnt
        raise ValueError(f"sft: no training samples in {cfg.data}" if not by_task["A"] else
                         f"sft: {cfg.data} holds only A: samples and env_share is 0: every batch would be empty")
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
    log_path, watched = cfg.beside(".sft_log.jsonl"), (cfg.beside(".tb"), cfg.beside(".wandb"))
    if state is not None:
        step, elapsed_before = _restore(state, cfg, opt, rng, device, say)
        if main and log_path.exists():  # steps after the checkpoint are redone: drop their old records
            kept = [json.dumps(r) for r in read_log(log_path) if r["step"] <= step]
            atomic_write_text(log_path, [x + "\n" for x in kept])
    elif main and resume and log_path.exists():  # killed before its first checkpoint: every logged step is redone
        log_path.unlink()
    elif main and any(p.exists() for p in (log_path, ckpt, *watched)):  # a fresh run never appends to, or saves
        set_aside([p for p in (log_path, ckpt, out, *watched) if p.exists()])  # over, an older one
    if main:
        log_path.parent.mkdir(parents=True, exist_ok=True)
    sinks = None
    if main and (cfg.tensorboard or cfg.wandb):  # a resume goes on from its checkpoint's step, as the log does
        from rookworld_rlvr.grpo.sinks import Sinks, Where

        sinks = Sinks(Where(out.name, watched[0], watched[1], watched[1] / "id", asdict(cfg), resume, step,
                            off="leave out --wandb"), cfg.tensorboard, cfg.wandb)
        if closing is not None:
            closing.enter_context(sinks)
    from rookworld_rlvr.grpo.precision import autocast_dtype

    amp = autocast_dtype(cfg.autocast, device)
    say(f"sft: autocast {'bf16' if amp else 'off (float32)'} ({cfg.autocast})")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp is not None)
    t0 = time.time()
    budget = cfg.max_minutes * 60 if cfg.max_minutes else None
    bar = progress_bar(total=cfg.steps, initial=step, enabled=progress and main, desc="sft")
    metrics: dict = {}

    def progress_frac() -> float:
        frac = step / cfg.steps
        if budget:
            frac = max(frac, (elapsed_before + time.time() - t0) / budget)
        return min(frac, 1.0)

    def save() -> None:  # every rank calls it (their sampling streams are gathered); rank 0 writes
        cuda = device.type == "cuda"
        streams, gpu = zip(*dist.all_gather_object((torch.get_rng_state(),
                                                    torch.cuda.get_rng_state(device) if cuda else None)))

        def write(tmp: Path) -> None:  # weights and state together: the checkpoint swaps in whole or not at all
            write_pretrained(model, tokenizer, tmp)
            # shards under 25 MB: a checkpoint can be committed, so a later run elsewhere resumes it exactly
            save_state(tmp, SFT_STATE, {"optimizer": opt.state_dict(), "step": step,
                                        "elapsed": elapsed_before + time.time() - t0, "python_rng": drawn,
                                        "torch_rng": streams[0], "config": asdict(cfg),
                                        **({"torch_rng_ranks": list(streams)} if world > 1 else {}),
                                        **({"cuda_rng_ranks": list(gpu)} if cuda else {})},
                       shard_bytes=25_000_000)

        if main:
            write_dir(ckpt, write)
        dist.barrier()

    model.train()
    model.config.use_cache = False

    def signalled() -> bool:
        return interrupt is not None and interrupt.asked is not None

    def paused() -> bool:  # this invocation ends (stop_after_minutes, stop_when, a signal); the run goes on
        return ((cfg.stop_after_minutes is not None and time.time() - t0 >= cfg.stop_after_minutes * 60)
                or (cfg.stop_when is not None and Path(cfg.stop_when).exists()) or signalled())

    timed = bool(budget or cfg.stop_after_minutes is not None or cfg.stop_when or interrupt is not None)

    def reading() -> tuple[float, bool, bool]:  # progress, pause, on a signal: rank 0's, so every rank agrees
        here = (progress_frac(), paused(), signalled())
        return dist.broadcast_object(here) if timed and world > 1 else here

    own_answers, pad_id = bool(cfg.own_repeats and cfg.distinct_coef), tokenizer.pad_token_id

    def draw() -> tuple[list, list, list[MicroBatch] | None]:  # with own answers, the step's model makes its batches
        env_rows, pol_rows = draw_batch(rng, by_task, cfg.batch_size, cfg.env_share)  # the same on every rank
        mine = (env_rows + pol_rows)[rank::world]
        return env_rows, pol_rows, None if own_answers else micro_batches(mine, pad_id, cfg.loss_on)

    upcoming, drawn = None, rng.getstate()  # drawn: the rng after this step's draw, what a checkpoint keeps
    label = f"rookworld sft of {out.name}, batch {cfg.batch_size}, {n_params / 1e6:.2f}M weights"
    profiled = StepProfile(cfg.profile_steps if main else 0, cfg.profile_after, cfg.beside(".profile.txt"),
                           device, label)
    if interrupt is not None:  # from here a signal pauses the run after its step (before, it acts at once)
        interrupt.arm()
    frac, stop, _ = reading()
    while step < cfg.steps and frac < 1.0 and not stop:
        warm = min(1.0, (step + 1) / max(1, cfg.warmup_steps))  # warm-up counts real steps, decay follows progress
        at = int(frac * cfg.steps)
        lr = cfg.lr * warm * cosine_lr(at, cfg.steps, 0, cfg.min_lr_ratio) * cooldown(at, cfg.steps, cfg.cooldown_steps)
        for g in opt.param_groups:
            g["lr"] = lr
        profiled.before(step)
        env_rows, pol_rows, batches = upcoming or draw()
        opt.zero_grad(set_to_none=True)
        own = []
        if own_answers and pol_rows:  # each rank answers its share of the prompts
            model.config.use_cache = True
            own = own_repeat_rows(model, tokenizer, pol_rows[: cfg.own_repeats][rank::world],
                                  target_weight=cfg.own_targets)
            model.train()
            model.config.use_cache = False
        rows = (env_rows + pol_rows)[rank::world] + own  # this rank's share of the step
        batches = batches or micro_batches(rows, pad_id, cfg.loss_on)
        n_tokens = max(1, int(dist.all_reduce_sum([target_tokens(batches)])[0]))  # the whole step's
        sums = _accumulate(model, rows, pad_id, cfg.loss_on, autocast, device, cfg.distinct_coef, cfg.legal_coef,
                           batches, n_tokens)
        dist.all_reduce_grads(list(model.parameters()))  # summed: one process's gradient of the whole batch
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip or float("inf"))  # 0: none
        opt.step()
        step += 1
        drawn = rng.getstate()
        upcoming = draw() if step < cfg.steps else None  # made on the host while the device runs this step
        # the step's first wait for the device; its sums, and the own answers that repeated a move, over all ranks
        loss, ul, legal, repeats = dist.all_reduce_sum(sums.tolist() + [sum(r.learn_from is None for r in own)])
        repeats = int(repeats)
        profiled.after(step)
        bar.update()
        bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}")
        record = {"step": step, "loss": loss, "A_rows": len(env_rows),
                  **({"unlikelihood": ul, "own_repeats": repeats} if cfg.distinct_coef else {}),
                  **({"legality": legal} if cfg.legal_coef else {}),
                  "lr": lr,
                  "grad_norm": float(grad_norm),
                  "minutes": round((elapsed_before + time.time() - t0) / 60, 2),
                  "seconds": round(elapsed_before + time.time() - t0, 3)}
        frac, stop, on_signal = reading()
        finished = step >= cfg.steps or frac >= 1.0
        done = finished or stop
        if step % cfg.eval_every == 0 or finished or (stop and not on_signal):  # a signal: the checkpoint at once
            record.update(held_out(model, tokenizer, eval_rows, eval_samples, cfg.layout, cfg.eval_samples, device,
                                   spread=dist.spread if world > 1 else None))
            model.train()
            metrics = record
            if main:
                shown = {k: (float(f"{v:.5g}") if isinstance(v, float) else v) for k, v in record.items()}
                bar.write(json.dumps(shown))  # 5 significant digits (an lr of 1e-5 is not 0.0)
        if main:
            write_text(log_path, json.dumps(record) + "\n")
            if sinks:
                sinks(record)
        if step % cfg.save_every == 0 and not done:
            save()
    profiled.close(step)
    bar.close()
    model.eval()
    model.config.use_cache = True
    save()
    if main:
        save_pretrained_atomic(model, tokenizer, out)
        if sinks:
            sinks.close()
    dist.barrier()  # nobody is done before the model is written
    say(f"sft: saved {out} after {step} steps, {(elapsed_before + time.time() - t0) / 60:.1f} min"
          + (f"; paused, --resume continues to step {cfg.steps}" if step < cfg.steps and paused() else "")
          + f" (its curves: rookworld report {out})")
    return metrics
