"""The trainer's state: what a checkpoint holds, how it is restored, and the rollbacks that use it.

A state is everything a resumed run needs to continue exactly: the step, optimizer, controllers,
guards, data cursors, sampling streams and RNGs, the evaluations so far, and (LoRA) the adapters
or (in-memory snapshots) the weights. `capture` and `restore` are mirror images; `load` reads a checkpoint's
state back, checked against `template` (`state_check`); `save` writes a checkpoint, `snapshot` keeps one in memory between checkpoints, `rollback` restores the newest good
one; `stop_if_asked` saves and stops where a signal asked (`interrupt`); `eval_journal` keeps what an
owed evaluation completed before a stop, and `eval_cache` the base evaluation's answers for later runs. Owns the
state's contents. Imports torch; nothing of chess (the tokenizers' source only, hashed by `code_digest`).
"""

from __future__ import annotations

import copy
import functools
import random
import signal
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from rookworld_rlvr import __version__, resumed, state_check
from rookworld_rlvr.config import TrainConfig
from rookworld_rlvr.grpo import checkpoint as ckpt
from rookworld_rlvr.grpo import distributed as dist
from rookworld_rlvr.grpo.control import load_optimizer
from rookworld_rlvr.grpo.guards import TrainingStopped
from rookworld_rlvr.grpo.lora import adapter_state, load_adapter_state
from rookworld_rlvr.grpo.runlog import truncate_logs
from rookworld_rlvr.interrupt import Interrupted
from rookworld_rlvr.model import load_policy
from rookworld_rlvr.state_check import each, maybe, optional
from rookworld_rlvr.verdict import figure_problem

if TYPE_CHECKING:
    from rookworld_rlvr.model.journal import Journal
    from rookworld_rlvr.grpo.trainer import Trainer


def capture(tr: Trainer) -> dict:
    """The trainer's state as plain values and tensors (no weights: a checkpoint holds them as a model)."""
    st = {
        "step": tr.step, "optimizer": tr.opt.state_dict(), "lr_scale": tr.lr_scale,
        "kl_ctl": tr.kl_ctl.state_dict(), "guard": tr.guard.state_dict(), "beta_scale": tr.beta_scale,
        "phase_key": tr.phase_key,
        "nan_guard": tr.nan_guard.state_dict(), "normalizer": tr.normalizer.state_dict(),
        "monitor": tr.monitor.state_dict(), "prompts": copy.deepcopy(tr.prompts.state),
        "anchor": copy.deepcopy(tr.anchor.sampler.state) if tr.anchor else None,
        "generator": tr.gen.get_state(), "torch_rng": torch.get_rng_state(), "python_rng": random.getstate(),
        "base_eval": tr.base_eval, "best": tr.best, "history_eval": tr.history_eval,
        "eval_owed": tr.eval_owed,  # saved before the evaluation at this step: a resume runs it first
        "config": tr.cfg.to_dict(), "version": __version__, "elapsed": tr.run_seconds(),
        "events_logged": tr.events_logged,  # read by a resume alone: a rollback keeps every event
        "backward_dtype": "bf16" if tr.grad_dtype is not None else "float32",
    }
    if tr.ref is not None and tr.cfg.ref_refresh_every:
        st["ref"] = {k: v.detach().cpu() for k, v in tr.ref.state_dict().items()}
    if tr.cfg.lora_r:  # the base never changes: the adapters are the whole trained state
        st["lora"] = adapter_state(tr.policy)
    return st


def _evaluation(value: object, field: str) -> state_check.Problem | None:
    if not isinstance(value, dict):
        return field, f"must be an evaluation (a mapping), got {value!r}"[:200]
    figures = ((k, v) for k, v in value.items() if k not in ("meta", "examples"))  # settings and sample answers
    return next((p for k, v in figures if (p := figure_problem(v, f"{field}.{k}"))), None)


def template(tr: Trainer) -> dict:
    """What `capture` writes, as `state_check` reads it: the fields a checkpoint of this run must hold (optional:
    those older checkpoints lack, or this run's settings leave out) and their kinds."""
    sampling = tr.gen.device  # the sampling stream's generator: on the GPU there
    return {
        "step": 0, "optimizer": state_check.optimizer(tr.opt), "lr_scale": 0.0, "kl_ctl": {"beta": 0.0},
        "guard": optional({"history": each([0.0]), "streaks": each((0, 0)), "recoveries": 0}),
        "beta_scale": optional(0.0), "phase_key": optional(None),
        "nan_guard": {"consecutive": 0, "rollbacks": 0, "total_skips": 0, "last_cause": optional("")},
        "normalizer": {"mean": 0.0, "var": 0.0, "count": 0},
        "monitor": {"kl": [0.0], "grad": [0.0], "reward": [0.0], "entropy_first": [0.0], "last_fired": each(0)},
        "prompts": each(each(0)), "anchor": optional(maybe(each(each(0)))),
        "generator": state_check.rng(sampling), "generators": optional(maybe([state_check.rng(sampling)])),
        "torch_rng": state_check.rng(), "python_rng": state_check.python_rng,
        "base_eval": maybe(_evaluation), "best": maybe((0.0, 0)), "history_eval": [_evaluation],
        "eval_owed": optional(False), "config": optional({}), "elapsed": optional(0.0),
        "events_logged": optional(0), "backward_dtype": optional(""),
        "ref": optional(state_check.tensors_like(tr.ref.state_dict()) if tr.ref is not None else None),
        "lora": optional(state_check.tensors_like(adapter_state(tr.policy)) if tr.cfg.lora_r else None),
    }


def load(tr: Trainer, path: Path) -> dict:
    """The trainer state of checkpoint `path`, checked against this run's `template`: a damaged or hand-edited
    one is a ValueError naming the file and the field, before any of it is used."""
    st = ckpt.load_state(path)
    state_check.check(st, template(tr), path / f"{ckpt.STATE_NAME}.json")
    return st


# where the run is and how fast it goes, not what it computes (the same rewards and answers: see their field docs)
PLACE = ("output_dir", "resume", "device", "ref_device", "threads", "step_timeout_minutes", "engine_workers",
         "engine_cache", "score_overlap", "eval_batch_size", "tensorboard", "wandb", "report", "progress")


def changed_settings(tr: Trainer, st: dict) -> list[str]:
    """The settings a resume changes against those its checkpoint was saved with (`resumed.changed_settings`)."""
    return resumed.changed_settings(st.get("config", {}), tr.cfg.to_dict(), TrainConfig().to_dict(), PLACE)


def restore(tr: Trainer, st: dict, weights_from: Path | None = None) -> None:
    """Put `st` back into the trainer; the weights from the adapters, an in-memory snapshot's
    "weights", or the checkpoint directory `weights_from` (copied in place: the optimizer keeps
    its parameters)."""
    if tr.cfg.lora_r:
        if "lora" not in st:
            raise ValueError("this checkpoint has no LoRA adapters (saved with lora_r 0): resume it with lora_r 0")
        load_adapter_state(tr.policy, st["lora"])
    elif "weights" in st:  # an in-memory snapshot
        with torch.no_grad():
            tr.policy.load_state_dict(st["weights"])
    elif weights_from is not None:
        loaded, _ = load_policy(str(weights_from), device=str(tr.device), verbose=False)
        with torch.no_grad():
            for p, q in zip(tr.policy.parameters(), loaded.parameters()):
                p.copy_(q)
    tr.step = st["step"]
    chosen = st.get("backward_dtype")
    was = torch.bfloat16 if chosen == "bf16" else None
    if tr.cfg.backward_dtype == "auto" and tr.amp is None and chosen and was != tr.grad_dtype:
        # a resumed run goes on as it started, whatever this machine's measurement says today
        tr.grad_dtype, tr.grad_note = was, f"{chosen} (auto: as the run was started)"
    load_optimizer(tr.opt, st["optimizer"])
    tr.lr_scale = st["lr_scale"]
    tr.kl_ctl.load_state_dict(st["kl_ctl"])
    if "guard" in st:  # checkpoints written before the collapse guard start it afresh
        tr.guard.load_state_dict(st["guard"])
    tr.beta_scale, tr.phase_key = st.get("beta_scale", 1.0), st.get("phase_key")
    tr.nan_guard.load_state_dict(st["nan_guard"])
    tr.normalizer.load_state_dict(st["normalizer"])
    tr.monitor.load_state_dict(st["monitor"])
    tr.prompts.load_state(st["prompts"])
    if tr.anchor and st.get("anchor"):
        tr.anchor.sampler.load_state(st["anchor"])
    gens = st.get("generators")  # one sampling stream per rank (the same world size continues each)
    tr.gen.set_state(gens[dist.rank()] if gens and len(gens) == dist.world() else st["generator"])
    torch.set_rng_state(st["torch_rng"])
    random.setstate(st["python_rng"])
    tr.base_eval, tr.best, tr.history_eval = st["base_eval"], st["best"], st["history_eval"]
    tr.eval_owed = st.get("eval_owed", False)
    if "ref" in st and tr.ref is not None:
        tr.ref.load_state_dict(st["ref"])


def save(tr: Trainer) -> Path:
    """Checkpoint; collective under torchrun: rank 0 writes (with every rank's sampling stream),
    the others wait until it is complete, so a rollback or resume finds it. In-memory snapshots
    older than it are dropped: a run resumed from it has none, and both must roll back alike."""
    gens = dist.all_gather_object(tr.gen.get_state())
    path = ckpt.checkpoint_dir(tr.run_dir, tr.step)
    if tr.main:
        path = ckpt.save_checkpoint(tr.run_dir, tr.step, tr.sampler(), tr.tokenizer, {**capture(tr), "generators": gens})
        ckpt.prune(tr.run_dir, tr.cfg.keep_last, {tr.best[1]} if tr.best else set())
    tr.snapshots = {s: v for s, v in tr.snapshots.items() if s >= tr.step}
    dist.barrier()
    return path


def stop_if_asked(tr: Trainer, saved: bool = False) -> None:
    """Between steps: where `tr.stop` (set by `rookworld train`: `interrupt.StopOnSignal`) was asked to
    stop on any rank, a checkpoint at this step (unless `saved` already), then Interrupted on every rank
    alike. Without a `tr.stop` (a library caller's run) nothing, and no collective."""
    if tr.stop is None:
        return
    tr.stop.arm()  # from the first step on: before it a signal acts at once, with no step to end
    asked = tr.stop.asked
    if dist.all_reduce_sum([float(asked or 0)])[0]:
        if not saved:
            save(tr)
        raise Interrupted(asked or signal.SIGTERM, tr.step)  # a rank that got none itself names torchrun's


def snapshot(tr: Trainer) -> None:
    """Keep the state at this step in memory (every guard_snapshot_every steps): a rollback
    target between checkpoints, restored without touching the disk. Only the newest snapshot
    old enough for any future recovery (a collapse guard's goes back guard_patience + 1 steps
    before the record that acts, the NaN guard's nan_max_consecutive) and newer ones are kept."""
    if tr.step % tr.cfg.guard_snapshot_every or tr.step in tr.snapshots:
        return
    state = copy.deepcopy(capture(tr))  # tensors cloned: later steps must not write into it
    state["generator"] = tr.gen.get_state()  # this rank's own sampling stream
    if not tr.cfg.lora_r:
        state["weights"] = {k: v.detach().to("cpu", copy=True) for k, v in tr.policy.state_dict().items()}
    tr.snapshots[tr.step] = state
    reach = max(tr.cfg.guard_patience, tr.cfg.nan_max_consecutive)
    old = [s for s in tr.snapshots if s <= tr.step - reach]
    if old:
        tr.snapshots = {s: v for s, v in tr.snapshots.items() if s >= max(old)}


def rollback(tr: Trainer, reason: str, to_step: int | None = None, kl_factor: float = 1.0) -> int:
    """Restore the newest good state at or before `to_step` (default: now), from memory or a
    checkpoint: weights, optimizer, controllers, data and sampling streams; the guards keep their
    counts. LR x rollback_lr_factor and beta x `kl_factor` from then on. Returns the step."""
    dist.barrier()  # every rank decided the same; no checkpoint is half-written while they read it
    to_step = tr.step if to_step is None else to_step
    disk = {s: p for s, p in ckpt.list_checkpoints(tr.run_dir) if s <= to_step}
    memory = [s for s in tr.snapshots if s <= to_step]
    if not disk and not memory:
        raise TrainingStopped(f"{reason}; no saved state at or before step {to_step} to roll back to")
    target = max(memory + list(disk))
    nan_state, recoveries = tr.nan_guard.state_dict(), tr.guard.recoveries
    lr_scale, beta_scale = tr.lr_scale * tr.cfg.rollback_lr_factor, tr.beta_scale * kl_factor
    now = tr.step
    if target in memory:
        restore(tr, copy.deepcopy(tr.snapshots[target]))
        where = f"step_{target:06d} (in memory)"
    else:
        restore(tr, load(tr, disk[target]), weights_from=disk[target])
        where = disk[target].name
    tr.nan_guard.load_state_dict(nan_state)  # the guards remember how often they fired
    tr.guard.recoveries = recoveries
    tr.lr_scale, tr.beta_scale = lr_scale, beta_scale
    tr.snapshots = {s: v for s, v in tr.snapshots.items() if s <= target}
    if tr.main:  # rank 0 owns the logs and the checkpoints
        # the abandoned run's states go first: a kill between the two never leaves a checkpoint newer
        # than the logs, which a later --resume would continue
        ckpt.drop_after(tr.run_dir, target)
        truncate_logs(tr.run_dir, tr.step)
    tr.log(f"step {now}: {reason}: rolled back to {where}, LR x{tr.lr_scale:.3g}"
           + (f", beta x{tr.beta_scale:.3g}" if tr.beta_scale != 1 else ""))
    return target


def eval_journal(tr: Trainer, model) -> Journal | None:
    """The journal of the held-out evaluation of `model` (the sampler) at this step (model.journal): what
    an evaluation of these weights stopped or killed before it returned completed (the base evaluation's
    too, read by a run that starts over without a checkpoint), read back on rank 0 and shared with every
    rank (so that they form the same batches), and written on by rank 0. Only for an `eval_fn` that takes
    a `journal` (the CLI's does)."""
    import inspect

    from rookworld_rlvr.model import journal as eval_journal

    if "journal" not in inspect.signature(tr.eval_fn).parameters:
        return None
    header = eval_journal.identity(model, step=tr.step) if tr.main else None
    cached = {}
    if tr.main and (cache := eval_cache(tr, header)) is not None:
        try:
            cached = eval_journal.read(*cache)
        except OSError as e:
            tr.log(f"warning: eval_cache: cannot read {cache[0]} ({e}): its answers are decoded again")
        if cached:
            tr.log(f"held-out evaluation at step {tr.step}: {len(cached)} batches of answers read from the "
                   f"evaluation cache {cache[0]}")
    journal = eval_journal.resume(tr.run_dir / eval_journal.NAME, header, dist.broadcast_object, known=cached)
    if len(journal.done) > len(cached):
        tr.log(f"held-out evaluation at step {tr.step}: {len(journal.done) - len(cached)} batches completed before "
               "the stop are kept")
    return journal


def eval_cache(tr: Trainer, header: dict) -> tuple[Path, dict] | None:
    """The cache file (`eval_cache`) of the evaluation of the weights the run starts from (step 0), and its
    header: the journal's without the step, with the decoding code's hash. None where there is none."""
    from rookworld_rlvr.model import journal as eval_journal

    if not tr.cfg.eval_cache or tr.step != 0:
        return None
    header = {**{k: v for k, v in header.items() if k != "step"}, "code": code_digest()}
    return eval_journal.cache_file(tr.cfg.eval_cache, header), header


@functools.cache
def code_digest() -> str:
    """A hash of the decoding code (the model package, the chess tokenizers, transformers' version): a cache's
    greedy answers are served only to the code that wrote them, since a change there may change one."""
    import hashlib

    import transformers

    from rookworld_rlvr import chess_tokenizers, model

    digest = hashlib.blake2b(transformers.__version__.encode(), digest_size=8)
    for f in sorted(Path(model.__file__).parent.glob("*.py")) + [Path(chess_tokenizers.__file__)]:
        digest.update(f.name.encode() + f.read_bytes())
    return digest.hexdigest()


def end_eval_journal(tr: Trainer, journal: Journal | None = None) -> None:
    """The evaluation returned: its answers go to the evaluation cache (`eval_cache`, at step 0) and its
    journal goes (a later evaluation at this step may be of other weights, after a rollback)."""
    from rookworld_rlvr.model import journal as eval_journal

    if not tr.main:
        return
    if journal is not None and journal.done and (cache := eval_cache(tr, journal.header)):
        try:
            eval_journal.keep(*cache, journal.done)
        except OSError as e:
            tr.log(f"warning: eval_cache: the answers were not kept ({e}): the next run decodes them again")
    (tr.run_dir / eval_journal.NAME).unlink(missing_ok=True)
