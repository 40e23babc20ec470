"""One sweep trial, an isolated `rookworld train` run in <out>/trial_<n>, and the worker loop.

Owns running trials and telling the study how each ended. Imports the trainer inside functions
only (so `rookworld --help` stays fast).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import yaml

from rookworld_rlvr.config import load_config
from rookworld_rlvr.metrics import held_out_reward, held_out_se
from rookworld_rlvr.sweep.space import SweepSpace, fmt_overrides, resolve
from rookworld_rlvr.sweep.study import all_finished, default_storage, make_sampler, open_study, real, requeue
from rookworld_rlvr.sweep.summary import outcome, summarize


def _guard_events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def run_trial(study, trial, space: SweepSpace, config: str | None, base: dict, out: Path,
              reward_fn: Callable | None = None, log=print) -> dict:
    """One isolated training run for `trial`; tells the study the outcome. Returns the user attrs."""
    from optuna.trial import TrialState

    from rookworld_rlvr.grpo.cli import build
    from rookworld_rlvr.grpo.sinks import writer
    from rookworld_rlvr.grpo.guards import TrainingStopped

    t0 = time.time()
    fields = space.overrides(trial.params)
    run_dir = (out / f"trial_{trial.number}").resolve()
    attrs: dict[str, Any] = {"overrides": fields, "output_dir": str(run_dir),
                             "worker": f"{socket.gethostname()}:{os.getpid()}"}
    trainer = None

    def tlog(*parts) -> None:  # inside the run stdout is the trial's train.log
        print(*parts, flush=True)

    def finish(state, value: float | None = None, **more) -> dict:
        if trainer is not None:
            attrs.setdefault("steps", trainer.step)
            if trainer.base_eval is not None:
                attrs.setdefault("base_reward", held_out_reward(trainer.base_eval))
        events = _guard_events(run_dir)
        attrs["guard_events"] = len(events)
        attrs["guard_signals"] = sorted({e["signal"] for e in events})
        attrs.update(more)
        attrs["outcome"] = outcome("COMPLETE" if state == TrialState.COMPLETE else "FAIL", attrs.get("base_reward"),
                                   attrs.get("final_reward"), len(events), attrs.get("status") == "stopped")
        attrs["seconds"] = round(time.time() - t0, 1)
        attrs.setdefault("status", "complete" if state == TrialState.COMPLETE else "failed")
        for k, v in attrs.items():
            trial.set_user_attr(k, v)
        study.tell(trial, value if state == TrialState.COMPLETE else None, state=state)
        return attrs

    log(f"trial {trial.number}: {fmt_overrides(fields)} -> {run_dir}")
    for k, v in attrs.items():  # visible while the trial runs (summary, --requeue-running)
        trial.set_user_attr(k, v)
    try:
        cfg = load_config(config, {**base, **fields, "output_dir": str(run_dir), "resume": False})
        missing = {k: getattr(cfg, k) for k, v in fields.items() if getattr(cfg, k) != v}
        if missing:
            raise RuntimeError(f"swept values did not reach the configuration: {missing} != {fields}")
        if run_dir.exists() and any(run_dir.iterdir()):  # left by an earlier study in the same --out
            aside = run_dir.with_name(f"{run_dir.name}-{time.strftime('%Y%m%d-%H%M%S')}")
            run_dir.rename(aside)
            log(f"trial {trial.number}: moved an older {run_dir.name} aside to {aside.name}")
        run_dir.mkdir(parents=True, exist_ok=True)
        # the trainer's warnings and progress bar (stdout) go to the trial's log, not the sweep's terminal
        with open(run_dir / "train.log", "a") as fh, contextlib.redirect_stdout(fh):
            trainer, pool = build(cfg, log=tlog)
            if reward_fn is not None:
                trainer.reward_fn = reward_fn
            try:  # a sink that cannot start (wandb without a login) fails the trial with the engines closed
                # wandb: the sweep's trials in one group, each a run of its own (closed as the trial ends)
                with writer(cfg, group=out.resolve().name) or contextlib.nullcontext() as sinks:
                    summary = trainer.train(writer=sinks)
            finally:
                pool.close()
        saved = yaml.safe_load((run_dir / "config.yaml").read_text())
        lost = {k: saved.get(k) for k, v in fields.items() if saved.get(k) != v}
        if lost:
            raise RuntimeError(f"swept values are not in the trainer's config.yaml: {lost} != {fields}")
        if cfg.report:
            try:
                from rookworld_rlvr.report.page import write_report

                write_report([cfg.output_dir])
            except Exception as e:  # noqa: BLE001 - the trial is done and saved: its result is not lost to its report
                tlog(f"report: not written: {type(e).__name__}: {e}")
        base_r, final_r = held_out_reward(summary["base"]), held_out_reward(summary["final"])
        if final_r is None:
            a = finish(TrialState.FAIL, failure="no held-out evaluation (set eval_data)", steps=summary["steps"])
        elif not math.isfinite(final_r):
            a = finish(TrialState.FAIL, failure=f"non-finite held-out reward {final_r}", steps=summary["steps"])
        else:
            best = summary.get("best") or {}
            a = finish(TrialState.COMPLETE, final_r, base_reward=base_r, final_reward=final_r,
                       gain=final_r - base_r if base_r is not None else None,
                       gain_se=held_out_se(summary["final"], summary["base"]), steps=summary["steps"],
                       best_step=best.get("step"), best_reward=best.get("held_out_reward"))
    except TrainingStopped as e:
        a = finish(TrialState.FAIL, failure=f"stopped at step {trainer.step if trainer else 0}: {e}", status="stopped")
    except KeyboardInterrupt:
        log(f"trial {trial.number}: interrupted; its configuration is queued again")
        trial.set_user_attr("seconds", round(time.time() - t0, 1))
        requeue(study, trial.number, "interrupted (Ctrl-C / SIGTERM)")
        raise
    except Exception as e:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "error.txt").write_text(traceback.format_exc())
        a = finish(TrialState.FAIL, failure=f"{type(e).__name__}: {e}")
    if a["status"] == "complete":
        gain = a.get("gain")
        log(f"trial {trial.number}: held-out reward {a['final_reward']:.4f}"
            + (f" (base {a['base_reward']:.4f}, gain {gain:+.4f})" if gain is not None else "")
            + f" in {a['seconds'] / 60:.1f} min: {a['outcome']}"
            + (f" after {a['guard_events']} guard event(s)" if a["guard_events"] else ""))
    else:
        log(f"trial {trial.number}: FAILED after {a['seconds'] / 60:.1f} min: {a['failure']}")
    return a


def run_sweep(space: SweepSpace | str | Path, *, config: str | None = None, overrides: dict | None = None,
              trials: int | None = None, storage: str | None = None, study_name: str | None = None,
              out: str | Path | None = None, sampler: str | None = None, seed: int | None = None,
              reward_fn: Callable | None = None, log: Callable[[str], None] = print) -> dict:
    """Run trials until the study holds `trials` of them (the grid size by default), then summarize.

    Several calls (processes, machines) with the same storage and study name share the work.
    `reward_fn` replaces the chess reward of the training runs (tests); evaluation stays real."""
    space, config, base, kind, target = resolve(space, config, overrides, trials, sampler)
    # read the configuration file once: editing it while the sweep runs must not change later trials
    base, config = load_config(config, base).to_dict(), None
    name = study_name or Path(space.path).stem
    out = Path(out) if out else Path("sweeps") / name
    storage = storage or default_storage(out)
    study = open_study(storage, name, make_sampler(kind, space, seed), space, kind, seed)
    from optuna.trial import TrialState

    distributions = space.distributions()
    if kind == "grid" and (trials or space.trials or 0) > target:
        log(f"the grid has {target} points: running {target} trials, not {trials or space.trials}")
    log(f"sweep '{name}' ({kind}, {target} trials) in {storage}; trial runs in {out}/trial_<n>")
    done_here = 0
    while True:
        trials_now = study.get_trials(deepcopy=False)
        waiting = [t for t in trials_now if t.state == TrialState.WAITING and real(t)]
        if sum(real(t) for t in trials_now) >= target and not waiting:
            break
        trial = study.ask(distributions)
        if "retry_of" not in trial.user_attrs:
            before = sum(real(t) for t in study.get_trials(deepcopy=False) if t.number < trial.number)
            if before >= target:  # another worker took the last one between our count and our ask
                trial.set_user_attr("surplus", True)
                study.tell(trial, state=TrialState.PRUNED)
                continue
        run_trial(study, trial, space, config, base, out, reward_fn, log)
        done_here += 1
    log(f"this worker ran {done_here} trial(s); the study is {'complete' if all_finished(study) else 'still running'}")
    return summarize(study, out, log)
