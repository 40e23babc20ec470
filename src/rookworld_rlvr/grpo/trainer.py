"""The GRPO loop. The only place that knows the order of things:

    prompts -> G completions each -> verified rewards -> advantages      (rollout)
    -> reference and old log-probs, μ passes of loss and backward        (passes, step)
    -> optimizer step -> controllers (β, non-finite guard, collapse guard: roll back or stop)
    -> metrics, evaluation, checkpoint                                   (runlog, state)

The trainer receives a reward function (`reward_fn(prompts, completions, truths, weights)`) and
an evaluation function, not the chess modules; `grpo.cli.build` wires in the chess rewards.
Owns the order and the wiring. Imports torch and the model package; nothing of chess.
"""

from __future__ import annotations

import copy
import json
import math
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Callable

import torch

from rookworld_rlvr.config import TrainConfig
from rookworld_rlvr.grpo import checkpoint as ckpt
from rookworld_rlvr.grpo import distributed as dist
from rookworld_rlvr.grpo import state
from rookworld_rlvr.grpo.anchor import Anchor
from rookworld_rlvr.grpo.control import (CurriculumSchedule, KLController, RewardNormalizer, adamw, cosine_lr,
                                         schedule_step)
from rookworld_rlvr.grpo.guards import CollapseGuard, GuardEvent, NonFiniteGuard, TrainingStopped
from rookworld_rlvr.grpo.lora import with_lora
from rookworld_rlvr.grpo.monitor import SymptomMonitor
from rookworld_rlvr.grpo.passes import Passes, task_slices
from rookworld_rlvr.grpo.precision import autocast_dtype, backward_dtype, record_rollout
from rookworld_rlvr.grpo.prompts import PromptSampler, check_given, split_tasks
from rookworld_rlvr.grpo.rollout import (Batch, RewardFn, Row, Rollout, assemble, check_shardable, collect,
                                        decode_graph, score_overlap)
from rookworld_rlvr.grpo.runlog import (append_jsonl, banner, best_summary, logged_events, set_aside, step_record,
                                        timed, truncate_logs)
from rookworld_rlvr.grpo.step import LAST_EPOCH_KEYS, Norms, optimizer_step, policy_pass
from rookworld_rlvr.metrics import held_out_reward, held_out_se
from rookworld_rlvr.model import load_policy, resolve_device
from rookworld_rlvr.progress import bar as progress_bar


class Trainer:
    def __init__(self, cfg: TrainConfig, reward_fn: RewardFn, train_samples: list, eval_fn: Callable | None = None,
                 log: Callable[[str], None] = print, puzzles: list | None = None,
                 anchor_samples: list | None = None) -> None:
        """`train_samples` give the P: and A: prompts (and the anchor's answers unless `anchor_samples`
        does); `puzzles` are P: prompts without a written answer, drawn at `mix_puzzle_ratio` of the P: prompts.
        A config's `puzzle_data` and `anchor_data` are read by the caller (`grpo.cli.build`), not here."""
        cfg.validate()
        self.cfg, self.reward_fn, self.eval_fn = cfg, reward_fn, eval_fn
        self.main = dist.is_main()  # under torchrun only rank 0 logs and writes files
        self.log = log if self.main else (lambda *_: None)
        for note in cfg.inert_settings(processes=dist.world()):
            self.log(f"warning: setting without effect: {note}")
        self.run_dir = Path(cfg.output_dir)
        check_shardable(cfg)
        check_given(cfg, puzzles, anchor_samples)  # before the models load
        if self.main and not cfg.resume:
            set_aside(self.run_dir, log)
        elif self.main:
            ckpt.remove_killed_leftovers(self.run_dir)
        dist.barrier()  # the other ranks look into the run directory only once rank 0 has set it up
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)  # the same on every rank: LoRA adapters start identical everywhere
        self.device = dist.local_device(resolve_device(cfg.device))
        self.ref_device = dist.local_device(resolve_device(cfg.ref_device)) if cfg.ref_device else self.device
        self.amp = autocast_dtype(cfg.autocast, self.device)
        resume_from = ckpt.latest_checkpoint(self.run_dir) if cfg.resume else None
        if cfg.resume and resume_from is None:
            self.log(f"resume: no checkpoint in {self.run_dir}/checkpoints, starting fresh")
            if self.main:  # killed before its first checkpoint: what it logged (the base evaluation) is redone
                truncate_logs(self.run_dir, -1, events=0)
        self._load_models(resume_from)
        self.n_params = sum(p.numel() for p in self.policy.parameters())
        trainable = [p for p in self.policy.parameters() if p.requires_grad]  # all of them without LoRA
        self.n_trainable = sum(p.numel() for p in trainable)
        self.opt = adamw(trainable, cfg.lr, (0.9, 0.99), cfg.weight_decay)
        self.kl_ctl = KLController(cfg.kl_coef, cfg.kl_mode, cfg.kl_target, cfg.kl_horizon, cfg.kl_coef_min,
                                   max(cfg.kl_coef_max, cfg.kl_coef_min), cfg.kl_warmup_steps, cfg.kl_warmup_factor)
        self.guard = CollapseGuard(cfg.guard_valid_drop, cfg.guard_reward_drop, cfg.guard_kl_mean, cfg.guard_kl_max,
                                   cfg.guard_entropy_factor, cfg.guard_truncation_rise, cfg.guard_eval_drop,
                                   cfg.guard_window, cfg.guard_patience, cfg.guard_max_recoveries)
        self.nan_guard = NonFiniteGuard(cfg.nan_max_consecutive, cfg.nan_max_rollbacks, cfg.rollback_lr_factor)
        self.snapshots: dict[int, dict] = {}  # in-memory rollback targets since the last checkpoint (state.snapshot)
        self.beta_scale = 1.0  # rollback_kl_factor ** recoveries
        self.phase_key: str | None = None  # sampling settings and reward weights in force (guard histories reset)
        self.normalizer = RewardNormalizer(cfg.reward_norm_momentum, cfg.reward_norm)
        self.curriculum = CurriculumSchedule(cfg.curriculum)
        self.monitor = SymptomMonitor(every=20, flat_steps=max(20, cfg.steps // 3))
        by_task = split_tasks(train_samples)
        self.prompts = PromptSampler({**by_task, "P_puzzle": list(puzzles or ())}, cfg.seed,
                                     cfg.env_terminal_share, cfg.mix_puzzle_ratio, cfg.check_share)
        split = anchor_samples is None and cfg.check_share is not None  # the sampler's "P": these rows out of check
        self.anchor = Anchor(cfg, by_task if anchor_samples is None else split_tasks(anchor_samples), self.tokenizer,
                             self.device, self.prompts.pools["P"] if split else None) if cfg.anchor_coef else None
        self.gen = torch.Generator(device=self.device).manual_seed(cfg.seed + dist.rank())  # own samples per rank
        self.step, self.stop = 0, None  # stop: asked to stop between steps (rookworld train's signal handler)
        self.events: list[dict] = []  # guard events of this process's run (events.jsonl has every one)
        self.events_logged = 0  # events.jsonl's records: a checkpoint keeps the count, a resume cuts back to it
        self.collect_stats: dict[str, float] = {}
        self.lr_scale = 1.0
        self.base_eval: dict | None = None
        self.best: tuple[float, int] | None = None
        self.history_eval: list[dict] = []
        self.eval_owed = False  # a checkpoint saved before this step's evaluation (state.save) says so
        # wall-clock seconds of the run (max_minutes): before this process, its start, and the last agreed reading
        self.elapsed_before, self.t_start, self.clock = 0.0, time.time(), 0.0
        if resume_from is not None:  # every rank loads the same checkpoint
            st = state.load(self, resume_from)
            state.restore(self, st)
            self.elapsed_before = self.clock = st.get("elapsed", 0.0)
            # a checkpoint from before the count was kept keeps every event
            self.events_logged = st["events_logged"] if "events_logged" in st else logged_events(self.run_dir)
            if self.main:
                truncate_logs(self.run_dir, self.step, self.events_logged, evaluated=not self.eval_owed)
            self.log(f"resumed from {resume_from} at step {self.step}")
            for line in state.changed_settings(self, st):
                self.log(f"resume: {line}")

    def _load_models(self, resume_from: Path | None) -> None:
        """The policy (and its tokenizer), the frozen reference, the sampler, and their precision."""
        cfg = self.cfg
        # LoRA checkpoints hold merged weights; a LoRA resume rebuilds base + adapters (from the trainer state)
        source = str(resume_from) if resume_from and not cfg.lora_r else cfg.model
        self.policy, self.tokenizer = load_policy(source, device=str(self.device), verbose=False)
        self.policy.eval()  # dropout off in every forward pass, training included
        self.policy.requires_grad_(True)
        self.use_ref = cfg.uses_reference  # the KL penalty, or the collapse guard's KL signals
        self.ref, self._sampler = None, None
        if cfg.lora_r:  # the reference is this model with its adapters disabled: no second copy
            self.policy, self._sampler = with_lora(self.policy, cfg)
        elif self.use_ref:
            if resume_from is not None:  # the reference is the base model, not the resumed policy
                self.ref, _ = load_policy(cfg.model, device=str(self.ref_device), verbose=False)
            else:
                self.ref = copy.deepcopy(self.policy).to(self.ref_device)
            self.ref.eval().requires_grad_(False)
        # the peft wrapper's forward hides HF's logits_to_keep; its inner model runs the same adapters
        net = self.policy.get_base_model() if cfg.lora_r else self.policy
        self.forward_model = net
        self.grad_dtype, self.grad_note = backward_dtype(cfg.backward_dtype, self.forward_model, self.amp, self.device)
        self.record, self.record_note = record_rollout(cfg, self.forward_model, self.amp, self.device)
        self.overlap, self.overlap_note = score_overlap(cfg.score_overlap, self.reward_fn, self.device)
        self.graph, self.graph_note = decode_graph(cfg.decode_graph, self.forward_model, self.device)

    def sampler(self):
        """The policy as a plain transformers model: itself, or (LoRA) a separate copy holding base +
        adapters merged now (`lora.MergedSampler`): generation takes the fast decoding path."""
        return self.policy if self._sampler is None else self._sampler()

    def reference(self) -> tuple[Any, AbstractContextManager]:
        """(model, context) of the frozen reference; with LoRA the policy with adapters switched off."""
        if self.ref is not None:
            return self.ref, nullcontext()
        return self.policy.get_base_model(), self.policy.disable_adapter()

    def passes(self, step: int) -> Passes:
        """The log-prob passes of `step` with this run's precision."""
        return Passes(self.cfg, step, self.amp, self.grad_dtype)

    # -- one step ------------------------------------------------------------------------------
    def collect(self, step: int, timings: dict) -> list[list[Row]]:
        """This step's groups (B prompts x G completions, scored); what they cost in `collect_stats`."""
        cfg = self.cfg
        weights = {"P": self.curriculum.weights("P", step, cfg.policy_weights),
                   "A": self.curriculum.weights("A", step, cfg.env_weights)}
        run = Rollout(self.sampler(), self.tokenizer, self.reward_fn, cfg, step, self.gen, self.amp, self.record,
                      weights, timings, self.overlap, self.graph)
        groups, self.collect_stats = collect(run, self.prompts)
        return groups

    def assemble(self, groups: list[list[Row]]) -> Batch:
        """The groups as one padded batch with advantages, on the policy's device."""
        return assemble(groups, self.cfg, self.normalizer, self.tokenizer.pad_token_id, self.device)

    def update(self, batch: Batch, step: int, timings: dict) -> dict:
        """The GRPO update on one batch: log-probs of the frozen reference and (μ > 1) of the policy
        that sampled, then μ passes of loss, backward, gradient all-reduce, and an optimizer step the
        non-finite guard may veto. Returns the step's metrics with `beta` and `guard` (its answer)."""
        cfg, passes = self.cfg, self.passes(step)
        beta = self.kl_ctl.value(step) * self.beta_scale
        slices = task_slices(batch.rows, cfg.group_size, cfg.minibatch_size)
        with timed(timings, "reference", self.device):
            ref = passes.frozen(*self.reference(), batch, slices, self.ref_device, cfg.kl_estimator == "exact") \
                if self.use_ref else []
        with timed(timings, "old", self.device):
            old = passes.frozen(self.forward_model, nullcontext(), batch, slices, self.device) \
                if cfg.updates_per_batch > 1 else []
        norms = Norms.of(batch, cfg, step)
        anchor = self.anchor.batch(self.policy) if self.anchor else None
        at = schedule_step(step, cfg.steps, self.clock, cfg.max_minutes and cfg.max_minutes * 60)
        lr = cfg.lr * self.lr_scale * cosine_lr(at, cfg.steps, cfg.warmup_steps, cfg.min_lr_ratio)
        timings["policy"] = timings["optimizer"] = 0.0
        metrics: dict[str, float] = {}
        status = "ok"
        for epoch in range(cfg.updates_per_batch):
            with timed(timings, "policy", self.device):
                self.opt.zero_grad(set_to_none=True)
                agg, finite = policy_pass(passes, self.forward_model, batch, slices, ref, old, beta, norms,
                                          self.device, first=epoch == 0, record=self.record)
            if anchor is not None:  # a phase of its own, so that its cost shows (time/anchor)
                with timed(timings, "anchor", self.device):
                    finite = finite and self.anchor.backward(self.forward_model, anchor, self.amp, self.grad_dtype, agg)
            with timed(timings, "policy", self.device):
                dist.all_reduce_grads(list(self.policy.parameters()))  # sum over ranks; every rank, finite or not
                if not finite:
                    agg["loss"] = float("nan")
                agg = dist.reduce_metrics(agg)  # a NaN on any rank is a NaN on all: the guards agree
            with timed(timings, "optimizer", self.device):
                status = optimizer_step(list(self.policy.parameters()), self.opt, self.nan_guard, agg, lr, cfg.grad_clip)
            if status != "ok":
                metrics = {**agg, "nonfinite": 1.0}
                break
            metrics = agg if epoch == 0 else {**metrics, **{f"last_{k}": v for k, v in agg.items() if k in LAST_EPOCH_KEYS}}
        return {**metrics, "beta": beta, "guard": status}

    def train_step(self) -> dict | None:
        """One GRPO step: collect, score, update, controllers, guards. Returns the step's metrics
        record, or None when a guard rolled back (the caller just continues from the restored step)."""
        cfg, step = self.cfg, self.step
        state.snapshot(self)
        phase = self._phase(step)
        if phase != self.phase_key:
            if self.phase_key is not None:
                self.guard.reset_history()
            self.phase_key = phase
        t_step = time.time()
        timings: dict[str, float] = {}
        batch = self.assemble(self.collect(step, timings))
        m = self.update(batch, step, timings)
        status = m.pop("guard")
        if status == "stop":
            self._event(GuardEvent("stop", "nonfinite", math.nan, None, math.nan, step + 1, step + 1,
                                   self.nan_guard.rollbacks, self.nan_guard.message))
            raise TrainingStopped(self.nan_guard.message)
        if status == "rollback":  # skipped steps left the weights alone: go back to before the streak's first step
            target = state.rollback(self, "non-finite loss or gradient", max(step + 1 - cfg.nan_max_consecutive - 1, 0))
            self._event(GuardEvent("recover", "nonfinite", math.nan, None, math.nan, step + 1, step + 1,
                                   self.nan_guard.rollbacks, f"non-finite loss or gradient at step {step + 1}: "
                                   f"rollback {self.nan_guard.rollbacks}/{self.nan_guard.max_rollbacks}"),
                        to_step=target, lr_scale=self.lr_scale, beta_scale=self.beta_scale)
            return None
        if self.use_ref:
            self.kl_ctl.update(m.get("kl_mean", 0.0))
        self.step += 1
        if cfg.ref_refresh_every and self.ref is not None and self.step % cfg.ref_refresh_every == 0:
            self._refresh_reference()
        record = step_record(step, batch, m, timings, time.time() - t_step, cfg.group_size, self.use_ref,
                             self.collect_stats)
        if "nonfinite" not in record:  # a skipped step says nothing about collapse
            event = self.guard.observe(record["step"], record)
            if event is not None:
                self._act(event)
                return None
        record["guard/recoveries"] = self.guard.recoveries
        return record

    # -- the loop --------------------------------------------------------------------------------
    def train(self, writer=None) -> dict:
        cfg = self.cfg
        self.log(banner(self))
        if self.main:  # under torchrun rank 0 writes every file of the run directory
            cfg.save(self.run_dir / "config.yaml")
        if self.base_eval is None:
            self.base_eval = self.evaluate()
            if self.base_eval:
                self.history_eval.append(self.base_eval)
                if self.main:
                    append_jsonl(self.run_dir / "eval.jsonl", self.base_eval)
                self.best = (held_out_reward(self.base_eval) or 0.0, 0)
        if dist.broadcast_object(ckpt.latest_checkpoint(self.run_dir) is None):  # rank 0's view: it writes them
            state.save(self)  # the first good state: rollbacks need one
        bar = progress_bar(total=cfg.steps, initial=self.step, enabled=cfg.progress and self.main, desc="grpo",
                           dynamic_ncols=True)
        if self.eval_owed:  # stopped or killed during this step's evaluation
            self._held_out_eval(bar)
        while self.step < cfg.steps and not self.out_of_time():
            state.stop_if_asked(self)
            record = self.train_step()
            self._tick()
            if record is None:  # a guard rolled back: the steps since the restored state are redone
                bar.n = self.step
                bar.set_postfix(recovered=self.guard.recoveries, lr_scale=f"{self.lr_scale:.3g}")
                continue
            for w in self.monitor.observe(record["step"] - 1, record):  # the same record on every rank
                if self.main:
                    bar.write(f"warning: {w}")
            if self.main:
                append_jsonl(self.run_dir / "metrics.jsonl", record)
                if writer is not None:
                    writer(record)
            bar.update()
            bar.set_postfix(reward=f"{record['reward/mean']:.3f}", kl=f"{record.get('kl_mean', 0):.3g}",
                            s=f"{record['time/step']:.1f}", **({"recovered": self.guard.recoveries}
                                                              if self.guard.recoveries else {}))
            last = self.step >= cfg.steps or self.out_of_time()
            due = self.eval_fn is not None and (bool(cfg.eval_every and self.step % cfg.eval_every == 0) or last)
            if due:
                if self._held_out_eval(bar):
                    continue  # rolled back to the best evaluation's state
            elif self.step % cfg.save_every == 0 or last:
                state.save(self)
        bar.close()
        if self.out_of_time() and self.step < cfg.steps:
            self.log(f"max_minutes {cfg.max_minutes:g} reached: ended at step {self.step} of {cfg.steps}")
            if self.history_eval and self.history_eval[-1]["step"] != self.step:  # a rollback came last
                self._record_eval(self._evaluate_saved())
                state.save(self)
        return self._finish()

    def _evaluate_saved(self) -> dict | None:
        """The held-out evaluation at this step, after a checkpoint that says it is owed (a resume runs
        it first): a signal, a kill or a crash during it loses no step, and a signal stops it at once."""
        self.eval_owed = True
        state.save(self)
        state.stop_if_asked(self, saved=True)  # a signal during the step: stopped before the evaluation
        with self.stop.at_once(self.step) if self.stop is not None else nullcontext():
            return self.evaluate()

    def _record_eval(self, res: dict | None) -> None:
        self.eval_owed = False
        if res:
            self.history_eval.append(res)
            if self.main:
                append_jsonl(self.run_dir / "eval.jsonl", res)

    def _held_out_eval(self, bar) -> bool:
        """The evaluation at this step (`_evaluate_saved`), judged by the collapse guard: True when it
        rolled back (to the best evaluation's state, saved when it was the best); else kept, the best
        updated, and saved again: the checkpoint then holds the evaluation."""
        res = self._evaluate_saved()
        score = (held_out_reward(res) or 0.0) if res else None
        if res and self.best:
            event = self.guard.observe_eval(self.step, score, self.best[0], held_out_se(res, self.best_eval()))
            if event is not None:
                self._act(event)
                bar.n = self.step
                bar.refresh()
                return True
        self._record_eval(res)
        if res and (self.best is None or score > self.best[0]):
            self.best = (score, self.step)
        state.save(self)
        return False

    def best_eval(self) -> dict | None:
        """The evaluation the best score came from (the latest at its step: a rollback redoes steps)."""
        if self.best is None:
            return None
        score, step = self.best
        return next((e for e in reversed(self.history_eval) if e.get("step") == step
                     and held_out_reward(e) == score), None)

    def run_seconds(self) -> float:
        """This process's reading of the run's wall-clock time, resumes included."""
        return self.elapsed_before + time.time() - self.t_start

    def _tick(self) -> None:
        """Agree on the run's time (rank 0's reading on every rank): the lr and the end follow it alike."""
        if self.cfg.max_minutes is not None:
            self.clock = dist.broadcast_object(self.run_seconds())

    def out_of_time(self) -> bool:
        return self.cfg.max_minutes is not None and self.clock >= self.cfg.max_minutes * 60

    def _finish(self) -> dict:  # noqa: C901 - one summary, written once
        """The run's summary; rank 0 writes the final model and summary.json."""
        events = self.run_dir / "events.jsonl"
        final_eval = self.history_eval[-1] if self.history_eval else None
        summary = {"base": self.base_eval, "final": final_eval,
                   "best_step": self.best[1] if self.best else None, "steps": self.step,
                   **({"ended_by_time": self.out_of_time() and self.step < self.cfg.steps,
                       "minutes": round(self.run_seconds() / 60, 2)} if self.cfg.max_minutes is not None else {}),
                   "best": best_summary(self.best, held_out_reward(final_eval), self.step),
                   "guard": {"recoveries": self.guard.recoveries, "nan_rollbacks": self.nan_guard.rollbacks,
                             "events": len(events.read_text().splitlines()) if self.main and events.exists() else 0}}
        if self.main:
            from rookworld_rlvr.data.io import atomic_write_text
            from rookworld_rlvr.model import save_pretrained_atomic

            save_pretrained_atomic(self.sampler(), self.tokenizer, self.run_dir / "final")
            if self.best is not None:  # like transformers' load_best_model_at_end, beside final/
                best = ckpt.checkpoint_dir(self.run_dir, self.best[1])
                if self.best[1] == self.step or not ckpt.state_exists(best, ckpt.STATE_NAME):
                    save_pretrained_atomic(self.sampler(), self.tokenizer, self.run_dir / "best")
                else:
                    ckpt.export_model(best, self.run_dir / "best")
            atomic_write_text(self.run_dir / "summary.json", [json.dumps(summary, indent=2)])
        dist.barrier()  # nobody reports "done" before the final model is written
        return summary

    def evaluate(self) -> dict | None:
        """Greedy held-out evaluation. Under torchrun every rank calls `eval_fn` (the weights are the
        same on every rank; the CLI's shares its work out, `distributed.spread`) and every rank
        keeps rank 0's result, so their states agree. Its completed batches are on disk until it
        returns (state.eval_journal): one stopped or killed part way is not done again whole."""
        if self.eval_fn is None:
            return None
        t0 = time.time()
        model = self.sampler()
        journal = state.eval_journal(self, model)
        res = self.eval_fn(model, self.tokenizer, **({"journal": journal} if journal is not None else {}))
        state.end_eval_journal(self, journal)
        if self.main:
            res["seconds"] = round(time.time() - t0, 1)
            res["step"] = self.step
        return dist.broadcast_object(res if self.main else None)

    # -- controllers and guards ----------------------------------------------------------------------
    def _phase(self, step: int) -> str:
        """What the run samples and rewards at `step`: a change restarts the guard's medians."""
        return json.dumps([self.cfg.sampling_for(t, step) for t in ("P", "A")]
                          + [self.curriculum.weights(t, step, w) for t, w in (("P", self.cfg.policy_weights),
                                                                              ("A", self.cfg.env_weights))],
                          sort_keys=True)

    def _refresh_reference(self) -> None:
        a = self.cfg.ref_mix_alpha
        with torch.no_grad():
            for r, p in zip(self.ref.parameters(), self.policy.parameters()):
                r.copy_(p.to(r.device) if a == 0 else a * p.to(r.device) + (1 - a) * r)

    def _event(self, event: GuardEvent, **more) -> None:
        """Every guard event goes to events.jsonl (cut by a resume only), the log and the summary."""
        self.events.append({**event.record(), **more})
        self.events_logged += 1
        if self.main:
            append_jsonl(self.run_dir / "events.jsonl", {**event.record(), **more})
        self.log(event.message)

    def _act(self, event: GuardEvent) -> None:
        """Recover from a collapse event (or stop with its message). A step's samples come from the
        weights before it, so the first bad record r0 shows the state after r0 - 1 updates: the last
        good state is at step r0 - 2 or before (an evaluation event: the best evaluation's step)."""
        if event.action == "stop":
            self._event(event)
            raise TrainingStopped(event.message)
        to = self.best[1] if event.signal == "eval" and self.best else max(event.first_step - 2, 0)
        target = state.rollback(self, f"{event.signal} out of bounds", to, self.cfg.rollback_kl_factor)
        self._event(event, to_step=target, lr_scale=self.lr_scale, beta_scale=self.beta_scale)
