"""`rookworld eval`: evaluate a model on held-out samples, judged positions and puzzles.

Owns the command line of `evaluate`: its flags, reading the inputs, one-line errors, the
table and the JSON file, and the answers kept beside that file until it is written. Under
torchrun the processes share the work out and rank 0 alone prints and writes. Imports torch
and the model package inside `run` only, so `rookworld --help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from argparse import SUPPRESS
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from rookworld_rlvr.cli_args import (add_device, add_threads, apply_threads, at_least_one, output_file, temperature,
                                      warn_without_effect, zero_or_more)
from rookworld_rlvr.data.io import Sample, atomic_write_text, iter_samples
from rookworld_rlvr.evaluate import EvalConfig, evaluate, limit_per_task
from rookworld_rlvr.held_out import HeldOut
from rookworld_rlvr.tables import format_table
from rookworld_rlvr.tasks import policy as pol_task
from rookworld_rlvr.tasks.rewards import RewardConfig, RewardScorer

# the options whose values --held-out takes from its config (given beside it, they are refused)
FROM_CONFIG = ("--strength", "--puzzles", "--histories", "--limit", "--layout", "--batch-size", "--max-new-tokens",
               "--depth")


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    d = EvalConfig()
    p.add_argument("--model", required=True, help="model directory or Hub id")
    sets = p.add_mutually_exclusive_group(required=True)
    sets.add_argument("--data", help="our JSONL(.gz) or upstream RookWorld text lines (P: and A: mixed)")
    sets.add_argument("--held-out", metavar="CONFIG",
                      help="the held-out sets of a training config, or of a run directory's config.yaml, judged as "
                           "its run judges them: eval_data (its first eval_limit per task), strength_data, "
                           "puzzle_eval_data, history_eval_data, with its layout, max_new_tokens, eval_batch_size, "
                           "engine_depth and rewards (e.g. configs/default.yaml; instead of --data and the options "
                           f"{', '.join(FROM_CONFIG)})")
    p.add_argument("--strength", metavar="FILE", default=SUPPRESS,
                   help="judged positions (`rookworld data judge`): move quality of the greedy B: next to a random "
                        "legal mover, and why the illegal ones are illegal (strength.illegal.*), e.g. "
                        "data/strength.jsonl.gz")
    p.add_argument("--puzzles", metavar="FILE", default=SUPPRESS,
                   help="puzzles (JSONL from `rookworld data judge`, or `FEN<TAB>mating moves` lines), e.g. "
                        "data/puzzles_eval.jsonl.gz")
    p.add_argument("--histories", metavar="FILE", default=SUPPRESS,
                   help="held-out A: transitions with short histories (`rookworld data histories`), scored apart, "
                        "per history length, e.g. data/eval_histories.jsonl.gz")
    p.add_argument("--limit", type=zero_or_more, default=SUPPRESS, help="samples per task (default: all)")
    p.add_argument("--json", type=output_file, metavar="OUT",
                   help="also write the results as JSON (atomically); until then the "
                        "answers completed so far are kept in OUT.answers.jsonl, so that "
                        "the same command run again after a stop completes only the rest")
    p.add_argument("--selfplay", type=zero_or_more, default=d.selfplay_games, metavar="N",
                   help="self-play games from the start (more than 1 with --selfplay-temperature: greedy ones repeat)")
    p.add_argument("--selfplay-max-plies", type=at_least_one, default=d.selfplay_max_plies,
                   help=f"a self-play game ends after this many plies (default {d.selfplay_max_plies})")
    p.add_argument("--selfplay-temperature", type=temperature, default=d.selfplay_temperature, help="0 = greedy")
    p.add_argument("--temperature", type=temperature, default=d.temperature,
                   help="sample the task completions at this temperature (0 = greedy); 'invalid' then "
                        "measures how often sampled answers are malformed")
    p.add_argument("--seed", type=int, default=d.seed, help="sampling seed (--temperature, self-play)")
    p.add_argument("--legal-moves", action="store_true",
                   help="decode P: answers among legal moves only: measures the model's choice among legal "
                        "moves (legality and distinct candidates are then 100%% by construction)")
    p.add_argument("--layout", choices=pol_task.LAYOUTS, default=SUPPRESS,
                   help=f"P: prompt layout (default {d.layout})")
    p.add_argument("--batch-size", type=at_least_one, default=SUPPRESS,
                   help=f"prompts decoded at once (the same greedy answers at any size; default {d.batch_size})")
    p.add_argument("--max-new-tokens", type=at_least_one, default=SUPPRESS,
                   help=f"tokens at most per answer, capped to the model's context (default {d.max_new_tokens})")
    add_device(p)
    p.add_argument("--dtype", default="float32", help="the model's weights: float32, bfloat16 or float16 "
                                                      "(default float32)")
    add_threads(p)
    p.add_argument("--depth", type=at_least_one, default=SUPPRESS,
                   help=f"Stockfish depth for moves outside the top 5 (default {d.engine_depth})")
    p.add_argument("--against", metavar="EVAL_JSON",
                   help="another model's evaluation on the same sets (what `rookworld eval --json` wrote): this model "
                        "is judged against it, each figure's change with its 95%% interval, paired over the items "
                        "both answered (the verdict `rookworld train` ends with)")
    p.add_argument("--examples", type=zero_or_more, default=0, metavar="N", help="keep N examples per task in the JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--traceback", action="store_true", help="show tracebacks instead of one-line errors")


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1


def _guarded(args: argparse.Namespace, what: str, func: Callable[[], Any]) -> tuple[bool, Any]:
    """Run `func`; on failure print `error: cannot <what>: ...` (unless --traceback)."""
    try:
        return True, func()
    except Exception as e:  # noqa: BLE001 - the message names what failed
        if args.traceback:
            raise
        _fail(f"cannot {what}: {e}")
        return False, None


@dataclass
class _Sets:
    """What one evaluation judges, and how: from the options, or from a config (--held-out)."""

    data: str
    config: EvalConfig
    held: HeldOut
    rewards: RewardConfig | None = None  # None: the default rewards


def _from_config(args: argparse.Namespace) -> _Sets | None:
    """--held-out: the config's sets, read as its run reads them (held_out)."""
    from rookworld_rlvr.config import load_config
    from rookworld_rlvr.held_out import config_file, eval_config, read_held_out

    if given := [flag for flag in FROM_CONFIG if hasattr(args, flag[2:].replace("-", "_"))]:
        _fail(f"--held-out takes {', '.join(given)} from its config: leave {'it' if len(given) == 1 else 'them'} out, "
              "or give --data instead of --held-out")
        return None
    path = config_file(args.held_out)
    cfg = load_config(path)  # its errors name the file, the line and the field
    ok, held = _guarded(args, f"read the held-out sets of {path}", lambda: read_held_out(cfg))
    if not ok:
        return None
    if not held.samples:
        _fail(f"{path}: its eval_data {cfg.eval_data!r} holds no samples, so its run judges nothing")
        return None
    return _Sets(cfg.eval_data, eval_config(cfg), held, cfg.reward_config())


def _from_options(args: argparse.Namespace) -> _Sets | None:
    """--data and the sets and settings given beside it (the defaults of EvalConfig where none is given)."""
    from rookworld_rlvr.data.judged import read_judged, read_puzzles

    d = EvalConfig()
    limit, strength, puzzles, histories = (getattr(args, k, None)
                                           for k in ("limit", "strength", "puzzles", "histories"))
    config = EvalConfig(layout=getattr(args, "layout", d.layout), batch_size=getattr(args, "batch_size", d.batch_size),
                        max_new_tokens=getattr(args, "max_new_tokens", d.max_new_tokens), limit=limit,
                        engine_depth=getattr(args, "depth", d.engine_depth))
    ok, samples = _guarded(args, f"read data {args.data}", lambda: limit_per_task(iter_samples(args.data), limit))
    if not ok:
        return None
    if not samples and not puzzles and not strength and not histories and not args.selfplay:
        took = f"--limit 0 takes no sample of {args.data}" if limit == 0 else f"no samples in {args.data}"
        _fail(f"{took}, and no other set was asked for (--strength, --puzzles, --histories, --selfplay)")
        return None
    read = {"judged positions": (strength, read_judged), "puzzles": (puzzles, read_puzzles),
            "histories": (histories, lambda path: [s for s in iter_samples(path) if s.task == "A"])}
    rows = {}
    for what, (path, reader) in read.items():
        if path:
            ok, rows[what] = _guarded(args, f"read {what} {path}", lambda: reader(path))
            if not ok:
                return None
    return _Sets(args.data, config, HeldOut(samples, rows.get("judged positions"), rows.get("puzzles"),
                                            rows.get("histories")))


def _evaluation(path: str) -> dict:
    """An evaluation's results as `rookworld eval --json` wrote them (--against)."""
    from rookworld_rlvr.verdict import check_evaluation

    result = json.loads(Path(path).read_text())
    check_evaluation(result)
    return result


def inert_options(args: argparse.Namespace) -> list[str]:
    """Options given away from their defaults that nothing of this evaluation reads, each with the reason."""
    d, out = EvalConfig(), []
    if not args.selfplay:
        out += [f"{flag}: no self-play games (--selfplay 0)" for flag, value, default in (
            ("--selfplay-max-plies", args.selfplay_max_plies, d.selfplay_max_plies),
            ("--selfplay-temperature", args.selfplay_temperature, d.selfplay_temperature)) if value != default]
    if args.examples and not args.json:
        out.append("--examples: examples are kept in the JSON, and no --json is given")
    if args.seed != d.seed and not args.temperature and not (args.selfplay and args.selfplay_temperature):
        out.append("--seed: nothing is drawn (greedy answers: --temperature 0, and no sampled self-play)")
    return out


def run(args: argparse.Namespace, name: str) -> int:
    if os.environ.get("RANK", "0") == "0":  # once under torchrun
        warn_without_effect(inert_options(args))
    other = None
    if args.against:  # before the minutes of the evaluation
        ok, other = _guarded(args, f"read --against {args.against}", lambda: _evaluation(args.against))
        if not ok:
            return 1
    sets = _from_config(args) if args.held_out else _from_options(args)
    if sets is None:
        return 1
    config = replace(sets.config, selfplay_games=args.selfplay, selfplay_max_plies=args.selfplay_max_plies,
                     selfplay_temperature=args.selfplay_temperature, temperature=args.temperature, seed=args.seed,
                     legal_moves=args.legal_moves)
    config.validate()
    from rookworld_rlvr.config import TrainConfig
    from rookworld_rlvr.grpo import distributed as dist
    from rookworld_rlvr.model import resolve_device
    from rookworld_rlvr.model.load import load_policy

    apply_threads(args)
    with dist.joined(args.device, TrainConfig.step_timeout_minutes):  # under torchrun: the ranks share the work
        main = dist.is_main()

        def load():  # on cuda:LOCAL_RANK under torchrun
            device = dist.local_device(resolve_device(args.device))
            return load_policy(args.model, device=str(device), dtype=args.dtype, verbose=main)

        ok, loaded = _guarded(args, "load the model", load)  # its errors name it
        if not ok:
            return 1
        model, tokenizer = loaded
        journal = _journal(args, model, main, dist.broadcast_object) if args.json else None
        with ExitStack() as stack:
            held = sets.held
            scorer = _cli_scorer(held.samples, config.engine_depth, sets.rewards, stack)
            try:
                results = evaluate(model, tokenizer, held.samples, config=config, scorer=scorer,
                                   strength_set=held.judged, puzzles=held.puzzles, histories=held.histories,
                                   progress=not args.quiet and main,
                                   return_examples=args.examples, spread=dist.spread, journal=journal)
            except BaseException:  # Ctrl-C, an error: say what is kept (a kill cannot; the file is there all the same)
                if journal is not None and journal.done and main:
                    print(f"eval: {len(journal.done)} batches of answers are kept in {journal.path}: the same command "
                          "completes only the rest", file=sys.stderr)
                raise
    if not main:
        return 0
    results["meta"].update(model=args.model, data=sets.data, **({"held_out": args.held_out} if args.held_out else {}))
    print(format_table(results))
    from rookworld_rlvr.verdict import headline_table

    print(f"\n{headline_table(results, args.model)}")
    if args.json:  # before the verdict against --against: what this evaluation found is kept whatever follows
        atomic_write_text(args.json, [json.dumps(results, indent=2) + "\n"])
        print(f"wrote {args.json}")
        journal.path.unlink(missing_ok=True)
    if other is not None:  # a failure here (a hand-edited --against) is one line: the evaluation is written above
        ok, _ = _guarded(args, f"judge against {args.against}", lambda: _print_against(other, results, args))
        return 0 if ok else 1
    return 0


def _print_against(other: dict, results: dict, args: argparse.Namespace) -> None:
    """The verdict of this model against the --against evaluation's, and the sets whose items differ."""
    from rookworld_rlvr.verdict import unpaired_sections, verdict_table

    before = str(other["meta"].get("model") or args.against)
    names = (args.against if before == args.model else before, args.model)
    print(f"\n{verdict_table(other, results, names)}")
    if unpaired := unpaired_sections(other, results):
        print(f"note: {args.against} judged other items in {', '.join(unpaired)} (another --data, --limit or set): "
              "the changes there have unpaired, wider intervals")
    theirs, ours = other["meta"].get("config") or {}, results["meta"]["config"]
    if differ := [f"{k} {ours[k]} here, {theirs[k]} there" for k in ours
                  if k != "batch_size" and k in theirs and theirs[k] != ours[k]]:  # the batch changes no answer
        print(f"note: the two evaluations ran with other settings ({'; '.join(differ)}): a change may be theirs")


def _journal(args: argparse.Namespace, model, main: bool, share: Callable[[Any], Any]):
    """The answers of this evaluation kept beside --json until it is written (model.journal): those an
    earlier run of it on the same weights and options completed before it was stopped are read back
    on rank 0 and shared (`share`) with the other ranks, which form the same batches."""
    from rookworld_rlvr.model import journal as answers

    path = Path(f"{args.json}.answers.jsonl")
    journal = answers.resume(path, answers.identity(model, legal_moves=args.legal_moves) if main else None, share)
    if journal.done and main:
        print(f"eval: {len(journal.done)} batches completed by an earlier run of this evaluation, stopped part way, "
              f"are kept ({path})", file=sys.stderr)
    return journal


def _cli_scorer(samples: Sequence[Sample], depth: int, rewards: RewardConfig | None,
                stack: ExitStack) -> RewardScorer:
    """A scorer of `rewards`, with a Stockfish pool when there are P: samples (engines start lazily)."""
    if not any(s.task == "P" for s in samples):
        return RewardScorer(rewards)
    from rookworld_rlvr.engine import EngineConfig, StockfishNotFound, StockfishPool

    try:
        pool = stack.enter_context(StockfishPool(EngineConfig(depth=depth)))
    except StockfishNotFound as e:  # evaluate asks again only if a completion needs it
        print(f"warning: {e}", file=sys.stderr)
        return RewardScorer(rewards)
    return RewardScorer(rewards, engine=pool)
