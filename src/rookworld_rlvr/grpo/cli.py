"""`rookworld train | check-batch | overfit`: wiring the chess world into the generic trainer.

Owns `build` (data, Stockfish pool, reward scorer and evaluation around a `Trainer`) and the
commands (the per-step sinks are sinks.py's). Imports the chess modules and the trainer inside functions, so
`rookworld --help` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

from rookworld_rlvr.cli_args import at_least_one, share, warn_without_effect
from rookworld_rlvr.config import TrainConfig, add_field_arguments, load_config
from rookworld_rlvr.paths import blocked_directory, no_such_file


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("--config", help="YAML preset (configs/default.yaml is `make train`'s; configs/stable.yaml, ...); "
                   "without one every field keeps the built-in default listed below")
    p.add_argument("--dry-run", action="store_true", help="validate config and data, print the plan, load nothing heavy")
    p.add_argument("--traceback", action="store_true", help="show full tracebacks on errors")
    if name == "check-batch":
        p.add_argument("--max-truncation", type=share, default=0.5,
                       help="fail when more completions hit the length limit")
    if name == "overfit":
        p.add_argument("--overfit-steps", type=at_least_one, default=40, help="training steps on the fixed batch")
        p.add_argument("--max-kl-share", type=share, default=0.7,
                       help="fail when KL is a larger share of the loss")
    group = p.add_argument_group("config fields (any field of TrainConfig; YAML syntax for values)")
    add_field_arguments(group)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    overrides = {k[5:]: v for k, v in vars(args).items() if k.startswith("cfg__") and v is not None}
    return load_config(args.config, overrides)


def preflight(cfg: TrainConfig) -> None:
    """What stops a run before it reads or writes anything: a model path that is not there, a device or an output's
    package this machine lacks (tensorboard, wandb, matplotlib), and every file the run would read that is missing,
    named by its field, all at once (not the first one alone, after the others were read)."""
    from rookworld_rlvr.data.io import DataError
    from rookworld_rlvr.grpo.dryrun import device_problems, package_problems
    from rookworld_rlvr.model.load import ModelLoadError, local_model_problem

    if problem := local_model_problem(cfg.model):
        raise ModelLoadError(problem)
    if lacking := device_problems(cfg) + package_problems(cfg):
        raise ValueError(lacking[0])
    for name in ("output_dir", "eval_cache"):
        if getattr(cfg, name) and (blocked := blocked_directory(getattr(cfg, name))):
            raise ValueError(f"{name}: {blocked}")
    needed = [("data", cfg.data), ("anchor_data", cfg.anchor_data if cfg.anchor_coef else None),
              ("eval_data", cfg.eval_data), ("puzzle_data", cfg.puzzle_data)]
    if cfg.eval_data:
        needed += [("strength_data", cfg.strength_data), ("puzzle_eval_data", cfg.puzzle_eval_data),
                   ("history_eval_data", cfg.history_eval_data)]
    if missing := [f"{name}: {no_such_file(path)}" for name, path in needed if path and not Path(path).exists()]:
        raise DataError("; ".join(missing))


def build(cfg: TrainConfig, log=print):
    """Load data, engine, scorer and evaluation; return a ready Trainer (and the pool to close)."""
    from rookworld_rlvr.data.io import ReadReport, Sample, read_samples
    from rookworld_rlvr.data.judged import read_puzzles
    from rookworld_rlvr.engine import EngineConfig, StockfishPool
    from rookworld_rlvr.evaluate import evaluate
    from rookworld_rlvr.grpo import distributed as dist
    from rookworld_rlvr.grpo.trainer import Trainer
    from rookworld_rlvr.held_out import eval_config, read_held_out
    from rookworld_rlvr.hostmem import for_device
    from rookworld_rlvr.tasks.rewards import RewardScorer

    preflight(cfg)

    def read(field: str, path: str) -> list:
        report = ReadReport()
        rows = read_samples(path, skip_invalid=cfg.skip_invalid, report=report)
        if report.invalid:
            log(f"{field}: skipped {report.invalid} invalid lines of {path} (first: {report.errors[0]})")
        return rows

    train = read("data", cfg.data)
    anchor = read("anchor_data", cfg.anchor_data) if cfg.anchor_data and cfg.anchor_coef else None
    puzzles = [Sample("P", p) for p in read_puzzles(cfg.puzzle_data)] if cfg.puzzle_data else []
    held = read_held_out(cfg)  # what `rookworld eval --held-out` reads for this config too
    pool = StockfishPool(EngineConfig(depth=cfg.engine_depth, workers=cfg.engine_workers, cache_path=cfg.engine_cache))
    scorer = RewardScorer(cfg.reward_config(), engine=pool)  # the reward function (score_batch, prefetch)
    eval_cfg = eval_config(cfg)

    def eval_fn(model, tokenizer, journal=None):
        if not held.samples:
            return None
        # its bars (`progress`): minutes at the start and the end of a CPU run that would otherwise print nothing
        return evaluate(model, tokenizer, held.samples, config=eval_cfg, scorer=scorer, strength_set=held.judged,
                        puzzles=held.puzzles, histories=held.histories, return_examples=3, spread=dist.spread,
                        journal=journal, progress=cfg.progress and dist.is_main())

    try:
        trainer = Trainer(cfg, scorer, train, eval_fn if held.samples else None, log=log, puzzles=puzzles,
                          anchor_samples=anchor)
    except BaseException:
        pool.close()  # no engine outlives a failed start
        raise
    note = for_device(trainer.device)  # CPU runs only: there the steps' big tensors live in host memory
    if note:
        log(note)
    return trainer, pool


def run(args: argparse.Namespace, name: str) -> int:
    cfg = config_from_args(args)
    if not args.config:  # the built-in defaults are not make train's recipe: say so rather than differ silently
        print("no --config: every field at its built-in default (`rookworld train --help`); "
              "`make train` runs --config configs/default.yaml", file=sys.stderr)
    if name == "train" and args.dry_run:
        from rookworld_rlvr.grpo.dryrun import dry_run

        return dry_run(cfg)
    if name == "train":
        return _train(cfg, args.traceback)
    return _sanity(cfg, name, args)


# what check-batch and overfit never read: they run in a scratch directory, evaluate nothing, write nothing, and
# call the trainer's collect and update directly (the training loop's guards, rollbacks and refreshes are not there)
_SCRATCH, _NO_EVAL, _NO_LOOP = "runs in a scratch directory and writes nothing", "evaluates nothing held out", \
    "runs no training loop (its guards, rollbacks and reference refreshes)"
SANITY_IDLE = {**dict.fromkeys(("output_dir", "resume", "save_every", "keep_last", "report", "tensorboard", "wandb",
                                "progress"), _SCRATCH),
               **dict.fromkeys(("eval_data", "eval_limit", "eval_batch_size", "eval_cache", "strength_data",
                                "history_eval_data", "puzzle_eval_data", "eval_every"), _NO_EVAL),
               **dict.fromkeys(("nan_max_consecutive", "nan_max_rollbacks", "rollback_lr_factor", "rollback_kl_factor",
                                "ref_refresh_every", "ref_mix_alpha", "step_timeout_minutes", "guard_valid_drop",
                                "guard_reward_drop", "guard_kl_mean", "guard_kl_max", "guard_entropy_factor",
                                "guard_truncation_rise", "guard_eval_drop", "guard_window", "guard_patience",
                                "guard_max_recoveries", "guard_snapshot_every"), _NO_LOOP)}


def _sanity(cfg: TrainConfig, name: str, args: argparse.Namespace) -> int:
    """check-batch / overfit run in a scratch output directory and write no checkpoints. A field they never read
    (SANITY_IDLE) given on the command line is named; in the preset it is the training run's, and said nothing of."""
    import tempfile

    from rookworld_rlvr.grpo.sanity import check_batch, overfit

    given = [k[5:] for k, v in vars(args).items() if k.startswith("cfg__") and v is not None]
    warn_without_effect([f"--{f.replace('_', '-')}: {name} {SANITY_IDLE[f]}" for f in given if f in SANITY_IDLE])
    with tempfile.TemporaryDirectory(prefix=f"rookworld-{name}-") as tmp:
        cfg.output_dir, cfg.resume, cfg.eval_data = tmp, False, ""
        trainer, pool = build(cfg, log=lambda *_: None)
        try:
            if name == "check-batch":
                return check_batch(trainer, args.max_truncation)
            return overfit(trainer, args.overfit_steps, max_kl_share=args.max_kl_share)
        finally:
            pool.close()


def _train(cfg: TrainConfig, traceback: bool = False) -> int:
    """One process, or one rank of `torchrun --nproc_per_node N -m rookworld_rlvr train ...`
    (torch.distributed: gloo on CPU, NCCL on GPUs); under torchrun rank 0 alone prints and writes."""
    from rookworld_rlvr.grpo import distributed as dist

    with dist.joined(cfg.device, cfg.step_timeout_minutes):
        if not dist.is_main():  # rank 0 alone writes, and holds the directory for the run
            return _train_here(cfg, traceback)
        from rookworld_rlvr.runlock import one_run_in

        preflight(cfg)  # a run that cannot start leaves no lock file behind
        with one_run_in(cfg.output_dir):  # not a second run into it at once
            return _train_here(cfg, traceback)


def _train_here(cfg: TrainConfig, traceback: bool = False) -> int:
    from rookworld_rlvr.atomic import SaveError, refused_write
    from rookworld_rlvr.tables import compare_table
    from rookworld_rlvr.grpo import distributed as dist
    from rookworld_rlvr.grpo.guards import TrainingStopped
    from rookworld_rlvr.grpo.sinks import writer
    from rookworld_rlvr.interrupt import Interrupted, StopOnSignal
    from rookworld_rlvr.oom import OutOfMemory, is_out_of_memory

    t0 = time.time()
    main = dist.is_main()
    trainer, pool = build(cfg, log=print if main else (lambda *_: None))
    try:  # the sinks close as the run ends, a wandb run marked failed where an exception ends it
        with (writer(cfg, trainer.step) if main else None) or contextlib.nullcontext() as sinks, \
                StopOnSignal(verbose=main) as trainer.stop:  # Ctrl-C, SIGTERM, SIGHUP: saved at the step's end
            summary = trainer.train(writer=sinks)
    except TrainingStopped as e:  # every rank took the same decision
        if main:
            print(f"training stopped at step {trainer.step}: {e}", file=sys.stderr)
        return 3
    except Interrupted as e:
        if main:
            print(f"train: {e}", file=sys.stderr)
        return e.exit_code
    except OSError as e:  # a full disk: what was saved before stands
        if traceback or not refused_write(e):
            raise
        if main:
            from rookworld_rlvr.grpo.checkpoint import latest_checkpoint

            latest = latest_checkpoint(cfg.output_dir)
            where = "" if e.filename or isinstance(e, SaveError) else f"writing in {cfg.output_dir}: "
            go_on = f"once there is room, the same command with --resume continues from {latest}" if latest \
                else "no checkpoint of this run was written"
            print(f"error: {where}{e}\n{go_on}", file=sys.stderr)
        return 1
    except Exception as e:
        if not is_out_of_memory(e):
            raise
        from rookworld_rlvr.grpo.checkpoint import latest_checkpoint

        rows = cfg.batch_positions * cfg.group_size
        anchor = f", anchor_batch (now {cfg.anchor_batch})" if cfg.anchor_coef else ""
        raise OutOfMemory(e, f"a smaller minibatch_size needs less (completions a forward and backward take at once: "
                             f"now {cfg.minibatch_size or f'0, all {rows}'}), as does eval_batch_size (a held-out "
                             f"evaluation's prompts at once: now {cfg.eval_batch_size}){anchor}", run=True,
                          checkpoint=latest_checkpoint(cfg.output_dir)) from e
    finally:
        pool.close()
    if not main:
        return 0
    if summary["base"] and summary["final"]:
        from rookworld_rlvr.verdict import verdict_table

        print("\nevery held-out metric, base -> final")  # first, so that the verdict ends what a terminal shows
        print(compare_table(summary["base"], summary["final"]))
        print("\nverdict: base -> final (held-out, greedy; a change is better or worse only beyond its 95% interval)")
        print(verdict_table(summary["base"], summary["final"]))
    if cfg.report:  # matplotlib is there: preflight stops a run without it
        try:  # the run is done and saved: a report that fails is said, and `rookworld report` writes it later
            from rookworld_rlvr.report.page import write_report

            print(f"report: {write_report([cfg.output_dir])}")
        except Exception as e:  # noqa: BLE001 - any failure of the report alone
            if traceback:
                raise
            print(f"report: not written: {type(e).__name__}: {e}; the run is saved, and `rookworld report "
                  f"{cfg.output_dir}` writes it (--traceback shows where it failed)", file=sys.stderr)
    print(f"done in {(time.time() - t0) / 60:.1f} min; final model in {cfg.output_dir}/final")
    return 0
