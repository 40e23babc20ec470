"""`rookworld sweep`: run or join a sweep, list it (--dry-run), summarize it, requeue its trials.

Owns the command line and its signals (SIGTERM interrupts like Ctrl-C: the worker requeues its
trial). Imports optuna and the trainer inside functions only.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from rookworld_rlvr.cli_args import at_least_one, output_dir, warn_without_effect
from rookworld_rlvr.config import add_field_arguments, load_config
from rookworld_rlvr.paths import no_such_file
from rookworld_rlvr.sweep.space import SAMPLERS, fmt_overrides, resolve
from rookworld_rlvr.sweep.study import need_optuna, default_storage, load_existing_study, requeue_running
from rookworld_rlvr.sweep.summary import summarize
from rookworld_rlvr.sweep.trials import run_sweep

def dry_run(space, config, base, kind, target, out: Path, log=print) -> int:
    """List the trials (grid) or the distributions (TPE) and validate each grid configuration."""
    problems = []
    log(f"search space {space.path}: sampler {kind}, {target} trials; base preset {config or '(defaults)'}")
    if base:
        log(f"base overrides: {fmt_overrides(base)}")
    if kind == "grid":
        configs = space.grid_overrides()
        log(f"grid of {len(configs)} configurations"
            + (f" (the first {target} of the shuffled grid will run)" if target < len(configs) else "") + ":")
        for i, over in enumerate(configs):
            try:
                load_config(config, {**base, **over, "output_dir": str(out / "trial_x"), "resume": False})
                status = ""
            except ValueError as e:
                status = f"  INVALID: {e}"
                problems.append(f"{fmt_overrides(over)}: {e}")
            log(f"  {i:>3}  {fmt_overrides(over)}{status}")
    else:
        for name, p in space.params.items():
            log(f"  {name}: {p.choices if p.choices is not None else f'{p.kind} [{p.low}, {p.high}]' + (' log' if p.log else '')}")
        for i, point in enumerate(space.points):
            log(f"  points[{i}]: {fmt_overrides(point)}")
    cfg = load_config(config, base)
    for what, p in (("data", cfg.data), ("anchor_data", cfg.anchor_data), ("eval_data", cfg.eval_data)):
        if p and not Path(p).exists():
            problems.append(f"{what}: {no_such_file(p)}")
    from rookworld_rlvr.model.load import local_model_problem

    if problem := local_model_problem(cfg.model):
        problems.append(f"model: {problem}")
    for p in problems:
        log(f"problem: {p}")
    log("dry run: ok" if not problems else f"dry run: {len(problems)} problem(s)")
    return 0 if not problems else 1


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.description = ("Hyperparameter sweep: every trial is a fresh `rookworld train` run in <out>/trial_<n>; "
                     "the objective is the held-out reward at the end. Workers sharing --storage and --study "
                     "share the work. See configs/sweeps/README.md.")
    p.add_argument("--space", help="search space YAML (configs/sweeps/stability.yaml)")
    p.add_argument("--config", help="base preset (default: the space file's config:, else the built-in defaults)")
    p.add_argument("--trials", type=at_least_one,
                   help="trials in the study (default: the grid size, or trials: in the file)")
    p.add_argument("--storage", help="Optuna storage URL (default: sqlite:///<out>/study.db; "
                                     "postgresql://... or mysql+pymysql://... for several machines)")
    p.add_argument("--study", help="study name (default: the space file's name)")
    p.add_argument("--out", type=output_dir,
                   help="directory for trial runs, summary.json and sweep.png (default: sweeps/<study>)")
    p.add_argument("--sampler", choices=SAMPLERS, help="override the space file's sampler")
    p.add_argument("--sampler-seed", type=int, help="sampler seed (grid: the order of the points, must be the same "
                                                    "on every worker, default 0; TPE: one per worker). "
                                                    "--seed is the training seed field")
    p.add_argument("--summary", action="store_true", help="print and write the summary of a study, run nothing")
    p.add_argument("--dry-run", action="store_true", help="validate the space and list the trials, run nothing")
    p.add_argument("--requeue-running", action="store_true",
                   help="mark RUNNING trials of dead workers interrupted and queue them again (no worker may be alive)")
    p.add_argument("--traceback", action="store_true", help="show full tracebacks on errors")
    group = p.add_argument_group("config fields for every trial (any TrainConfig field; YAML syntax for values)")
    add_field_arguments(group, show_defaults=False)


def _interrupt_on_sigterm() -> None:
    def handler(signum, frame):
        raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        pass


def inert_options(args: argparse.Namespace) -> list[str]:
    """Options given that nothing of this call reads, each with the reason: `--summary` and
    `--requeue-running` run no trial, so every setting of a trial or of the sampler is idle there."""
    given = {a.dest: a.option_strings[0] for a in _parser()._actions
             if a.option_strings and getattr(args, a.dest, None) is not None and getattr(args, a.dest) is not False}
    if args.summary or args.requeue_running:
        mode = "--summary" if args.summary else "--requeue-running"
        idle = [d for d in given if d not in ("summary", "requeue_running", "storage", "study", "out", "traceback")
                and not (d == "space" and not args.study)]  # --space names the study where --study does not
        return [f"{given[d]}: {mode} runs no trial" for d in idle]
    if args.dry_run:
        return [f"{given[d]}: --dry-run lists the trials, it opens no study" for d in ("storage", "sampler_seed")
                if d in given]
    return []


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rookworld sweep")
    add_arguments(p, "sweep")
    return p


def run(args: argparse.Namespace, name: str) -> int:
    warn_without_effect(inert_options(args))
    overrides = {k[5:]: v for k, v in vars(args).items() if k.startswith("cfg__") and v is not None}
    if args.summary or args.requeue_running:
        study_name = args.study or (Path(args.space).stem if args.space else None)
        out = Path(args.out) if args.out else (Path("sweeps") / study_name if study_name else None)
        if args.storage is None and out is None:
            raise ValueError("--summary needs --out DIR, --storage URL or --study NAME")
        study = load_existing_study(args.storage or default_storage(out), study_name)
        if args.requeue_running:
            print(f"{requeue_running(study)} running trial(s) queued again")
        if args.summary:
            summarize(study, out or Path("sweeps") / study.study_name)
        return 0
    if not args.space:
        raise ValueError("rookworld sweep needs --space FILE (or --summary)")
    space, config, base, kind, target = resolve(args.space, args.config, overrides, args.trials, args.sampler)
    study_name = args.study or Path(space.path).stem
    out = Path(args.out) if args.out else Path("sweeps") / study_name
    if args.dry_run:
        return dry_run(space, config, base, kind, target, out)
    _interrupt_on_sigterm()
    need_optuna()
    summary = run_sweep(space, config=config, overrides=overrides, trials=args.trials, storage=args.storage,
                        study_name=study_name, out=out, sampler=kind, seed=args.sampler_seed)
    if summary["finished"] and not summary["complete"]:
        print("error: no trial completed; see the failures above and <out>/trial_<n>/train.log", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m rookworld_rlvr.sweep ...`: the same as `rookworld sweep ...`."""
    args = _parser().parse_args(argv)
    try:
        return run(args, "sweep")
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError) as e:
        if args.traceback:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 1
