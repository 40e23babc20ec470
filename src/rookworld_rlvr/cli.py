"""The `rookworld` command: the subcommand table, and the `data` subcommands.

Owns dispatch and one-line errors. Every other subcommand lives in its own module (the table
`_OPTIONAL`), which registers its flags and imports torch only when it runs, so `--help` is instant.
"""

from __future__ import annotations

import argparse
import json
import sys

from rookworld_rlvr.cli_args import at_least_one, output_dir, output_file, seconds, warn_without_effect, zero_or_more


def _data(args: argparse.Namespace) -> int:
    if args.data_cmd == "generate":
        from rookworld_rlvr.data.generate import GenerateConfig, generate

        cfg = GenerateConfig(out_dir=args.out, games=args.games, seed=args.seed, workers=args.workers,
                             depth=args.depth, time=args.time, games_per_shard=args.games_per_shard,
                             eval_per_task=args.eval_per_task, extra_positions=tuple(args.positions or ()),
                             max_plies=args.max_plies, random_game_share=args.random_game_share,
                             random_move_prob=args.random_move_prob, temperatures=tuple(args.temperatures))
        warn_without_effect(cfg.inert_settings())
        summary = generate(cfg, progress=not args.quiet)
        print(json.dumps(summary))
        return 0
    if args.data_cmd == "replay" and (args.picks is None) != (args.key is None):
        raise ValueError("data replay: --picks and --key go together (the picks file and the recipe it was made for)")
    if args.data_cmd == "replay" and args.picks:
        from pathlib import Path

        from rookworld_rlvr.data.picks import replay_picks

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        print(json.dumps(replay_picks(args.source, args.picks, args.key, out / "more_p.jsonl", out / "more_a.jsonl",
                                      workers=args.workers)))
        return 0
    if args.data_cmd in ("record", "replay"):
        from rookworld_rlvr.data import records

        run = records.record if args.data_cmd == "record" else records.replay
        summary = run(args.source, args.out, workers=args.workers, progress=not args.quiet)
        print(json.dumps(summary))
        return 0
    if args.data_cmd == "picks":
        from rookworld_rlvr.data.picks import make_picks

        print(json.dumps(make_picks(args.record, args.replay, args.merged, args.out, args.key, workers=args.workers)))
        return 0
    if args.data_cmd == "import":
        from rookworld_rlvr.data.importer import import_data

        summary = import_data(args.src, args.out, skip_invalid=args.skip_invalid, split=args.split, limit=args.limit)
        if args.json:
            print(json.dumps({k: summary[k] for k in ("read", "written", "invalid", "labels_corrected")}))
        else:
            for e in summary["errors"]:
                print(f"skipped: {e}", file=sys.stderr)
            print(f"read {summary['read']}, wrote {summary['written']} to {args.out}, "
                  f"skipped {summary['invalid']} invalid, corrected {summary['labels_corrected']} B: labels")
        return 0
    if args.data_cmd == "judge":
        from rookworld_rlvr.data.judged import judge, positions_of_files

        exclude = positions_of_files(args.exclude)
        summary = judge(args.sources, args.out, args.puzzles_out, args.positions, args.tactic_pool, args.depth,
                        args.workers, args.cache, progress=not args.quiet, exclude=exclude, screen=args.screen)
        print(json.dumps(summary))
        return 0
    if args.data_cmd == "checks":
        from rookworld_rlvr.data.judged import check_positions, positions_of_files, write_rows

        exclude = positions_of_files(args.exclude)
        puzzles = check_positions(args.sources, args.derive, exclude, args.n, args.seed)
        write_rows(args.out, (p.to_dict() for p in puzzles))
        print(json.dumps({"positions": len(puzzles), "excluded_positions": len(exclude), "out": args.out}))
        return 0
    if args.data_cmd == "histories":
        import random

        from rookworld_rlvr.data.histories import on_side, opening_transitions, short_history_copies
        from rookworld_rlvr.data.io import read_samples, write_samples

        rng = random.Random(f"{args.seed}:short")
        rows = [s for path in args.sources for s in read_samples(path) if s.task == "A" and on_side(s.fen, args.side)]
        cut = list(short_history_copies(rows, args.cut_share, rng, args.lengths))
        starts = opening_transitions(args.openings, args.max_plies, args.seed, args.side)
        written = write_samples(args.out, cut + starts)
        print(json.dumps({"short_history_copies": len(cut), "opening_transitions": len(starts), "written": written,
                          "out": args.out}))
        return 0
    if args.data_cmd == "openings":
        from rookworld_rlvr.data.io import atomic_write_text
        from rookworld_rlvr.data.judged import openings, positions_of_files

        fens = openings(args.n, args.seed, args.depth, args.cache, exclude=positions_of_files(args.exclude))
        atomic_write_text(args.out, ["# held-out openings for `rookworld match` (rookworld data openings)\n"] +
                          [f + "\n" for f in fens])
        print(json.dumps({"openings": len(fens), "out": args.out}))
        return 0
    if args.data_cmd == "merge":
        from rookworld_rlvr.data.histories import on_side
        from rookworld_rlvr.data.io import merge_samples, read_samples, write_samples
        from rookworld_rlvr.data.judged import board_key, positions_of_files

        held = {board_key(f) for f in positions_of_files(args.exclude)}
        known = {s.render("compact")[0] for path in args.new_only or () for s in read_samples(path)}

        def keep(s) -> bool:  # the tasks and split side asked for; no position of an --exclude file, before or after
            after = {board_key(s.truth.new_fen)} if s.task == "A" else set()
            return (s.task in args.tasks and on_side(s.fen, args.side) and not ({board_key(s.fen)} | after) & held
                    and (not known or s.render("compact")[0] not in known))

        samples, dropped, left_out = merge_samples(args.sources, args.seed, keep)
        written = write_samples(args.out, samples[:args.max], truth_only=args.truth_only)
        print(json.dumps({"written": written, "duplicates": dropped, "left_out": left_out, "out": args.out}))
        return 0
    if args.data_cmd == "near-misses":
        from rookworld_rlvr.data.nearmiss import write_near_misses

        print(json.dumps(write_near_misses(args.source, args.out, args.n, args.seed)))
        return 0
    if args.data_cmd == "stats":
        from rookworld_rlvr.data.importer import stats

        print(json.dumps(stats(args.file), indent=2))
        return 0
    return 2


def build_parser() -> argparse.ArgumentParser:
    from rookworld_rlvr import __version__

    from rookworld_rlvr.data.generate import GenerateConfig

    p = argparse.ArgumentParser(prog="rookworld", description="GRPO with verifiable chess rewards for RookWorld LMs")
    p.add_argument("--version", action="version", version=f"rookworld-rlvr {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)

    d = sub.add_parser("data", help="generate, import and inspect datasets")
    dsub = d.add_subparsers(dest="data_cmd", required=True)
    g = dsub.add_parser("generate", help="self-play + random games annotated by Stockfish -> train/eval JSONL")
    g.add_argument("--out", type=output_dir, default="data",
                   help="output folder: train.jsonl.gz, eval.jsonl.gz, the shards and the "
                        "engine cache (default: data)")
    g.add_argument("--games", type=int, default=700, help="games played (default 700; 0 with --positions: those "
                                                          "positions alone)")
    g.add_argument("--games-per-shard", type=int, default=10, help="games per shard, each written whole: the unit "
                                                                   "a stopped run resumes from (default 10)")
    g.add_argument("--seed", type=int, default=0, help="seed of the games' moves (default 0)")
    g.add_argument("--workers", type=int, default=2, help="Stockfish processes at once (default 2)")
    g.add_argument("--depth", type=int, default=8, help="Stockfish depth of each position's annotation "
                                                        "(default 8)")
    g.add_argument("--time", type=seconds, default=None, help="seconds per position (instead of or with --depth)")
    g.add_argument("--max-plies", type=int, default=160, help="plies at most per game (default 160)")
    gd = GenerateConfig()
    g.add_argument("--random-game-share", type=float, default=gd.random_game_share,
                   help="share of games played with uniformly random moves only")
    g.add_argument("--random-move-prob", type=float, default=gd.random_move_prob,
                   help="chance of a random move at each ply of an engine game (lower: more realistic positions)")
    g.add_argument("--temperatures", type=float, nargs="+", default=list(gd.temperatures),
                   help="softmax temperatures (pawns) over Stockfish's top 5 that engine games draw from")
    g.add_argument("--eval-per-task", type=int, default=1000, help="held-out samples per task at most in "
                                                                   "eval.jsonl.gz (default 1000)")
    g.add_argument("--positions", nargs="*", help="extra PGN (.pgn, .pgn.gz, .pgn.xz: the position before each move of "
                                                  "each game) or FEN-per-line files, read whole before any game, each "
                                                  "position labelled as a P: sample (with --games 0: those alone; one "
                                                  "without a legal move is not)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    for name, about, source, out in (
            ("record", "a finished generation's Stockfish answers as a small game record (xz): `data replay` makes "
                       "the same data from it with no engine",
             "a `data generate` output folder (its shards and engine cache)", "the record (JSONL; .xz compresses it)"),
            ("replay", "a game record's generation made again (shards, train and eval files) without Stockfish",
             "a game record (`data record`)", "the output folder, as `data generate --out`")):
        r = dsub.add_parser(name, help=about)
        r.add_argument("source", help=source)
        r.add_argument("--out", type=output_file if name == "record" else output_dir, required=True, help=out)
        r.add_argument("--workers", type=at_least_one, default=2, help="processes at once (default 2)")
        r.add_argument("--quiet", action="store_true", help="no progress bar")
        if name == "replay":
            r.add_argument("--picks", help="a picks file (`data picks`): write only the samples it names, as "
                                           "OUT/more_p.jsonl and OUT/more_a.jsonl (truth only; no shards, no merge)")
            r.add_argument("--key", help="with --picks: the recipe key it must have been made for")
    k = dsub.add_parser("picks", help="which samples of a record's replay the merges kept (a few hundred KB): `data "
                                      "replay --picks` then takes them again without the merges")
    k.add_argument("record", help="the game record (`data record`)")
    k.add_argument("--replay", required=True, help="its replay's output folder (`data replay --out`, shards kept)")
    k.add_argument("--merged", nargs="+", required=True, help="the sample files the merges wrote from that replay")
    k.add_argument("--key", required=True, help="names what the merges depended on besides the record (a caller's "
                                                "recipe: known set, held-out files, caps); replay checks it")
    k.add_argument("--out", type=output_file, required=True, help="the picks file (xz JSON lines)")
    k.add_argument("--workers", type=at_least_one, default=2, help="processes at once (default 2)")
    i = dsub.add_parser("import", help="upstream RookWorld text lines or a Hugging Face dataset -> our JSONL")
    i.add_argument("src", help="a text/JSONL file, a Hub dataset name such as jrahn/rookworld_7m, or a folder of a "
                               "dataset's files (a Hub snapshot: parquet, JSON or CSV; its `text` column)")
    i.add_argument("--out", type=output_file, required=True,
                   help="the sample file written (JSONL; .gz or .xz compresses it)")
    i.add_argument("--skip-invalid", action="store_true", help="count and skip malformed lines instead of stopping")
    i.add_argument("--split", default="train", help="the dataset's split (a Hub name or a folder)")
    i.add_argument("--limit", type=at_least_one, default=None, help="import at most this many samples (default: all)")
    i.add_argument("--json", action="store_true", help="print a one-line JSON summary")
    j = dsub.add_parser("judge", help="held-out positions with every legal move judged by Stockfish, and puzzles "
                                      "(the strength sets `rookworld eval` and training runs report on)")
    j.add_argument("sources", nargs="+", help="held-out sample files (JSONL); their P: positions are judged")
    j.add_argument("--out", type=output_file, default="data/strength.jsonl.gz",
                   help="judged positions (JSONL); '' = none (with "
                        "--positions 0)")
    j.add_argument("--puzzles-out", type=output_file, default="data/puzzles_eval.jsonl.gz",
                   help="mates in one (all source positions) and tactics (among the judged ones); '' = none. "
                        "With --positions 0 --tactic-pool 0: the mates alone, python-chess without Stockfish")
    j.add_argument("--positions", type=zero_or_more, default=600, help="positions in the strength set (0: none)")
    j.add_argument("--tactic-pool", type=zero_or_more, default=0, help="further positions judged only to find tactics")
    j.add_argument("--screen", action="store_true", help="the tactic pool takes only positions whose recorded "
                                                         "evals could make a tactic (the best keeps a win, the "
                                                         "third best loses much): a large source, judged faster")
    j.add_argument("--exclude", nargs="*", help="files whose positions are left out (compared without the move "
                                                "clocks): training sets, puzzles already held out")
    j.add_argument("--depth", type=int, default=10, help="Stockfish depth of the judging search")
    j.add_argument("--workers", type=int, default=2, help="Stockfish processes at once (default 2)")
    j.add_argument("--cache", default="data/.cache/engine.sqlite", help="engine cache (SQLite)")
    j.add_argument("--quiet", action="store_true", help="no progress bar")
    c = dsub.add_parser("checks", help="positions in check as `check` puzzles (every legal move solves): a held-out "
                                       "legality test, or P: prompts for training; python-chess alone, no engine")
    c.add_argument("sources", nargs="+", help="sample files: their P: positions and A: results in check")
    c.add_argument("--out", type=output_file, required=True, help="puzzle rows (JSONL)")
    c.add_argument("--derive", action="store_true", help="add every position one checking move away from a P: position")
    c.add_argument("--exclude", nargs="*", help="files whose positions are left out (the other split's samples, "
                                                "puzzles or judged positions)")
    c.add_argument("--n", type=at_least_one, default=None, help="at most this many (a seeded shuffle; default: all)")
    c.add_argument("--seed", type=int, default=0, help="seed of the shuffle --n draws from (default 0)")
    h = dsub.add_parser("histories", help="A: transitions of every history length (game starts, short histories): "
                                          "python-chess alone; `data merge` adds them to a training set")
    h.add_argument("sources", nargs="*", help="sample files whose A: rows are copied with a shorter history")
    h.add_argument("--out", type=output_file, required=True,
                   help="the A: samples written (JSONL; .gz or .xz compresses it)")
    h.add_argument("--cut-share", type=float, default=0.2, help="share of the sources' A: rows copied with their "
                                                                "history cut to 1 .. len - 1 moves")
    h.add_argument("--lengths", type=at_least_one, nargs="+",
                   help="cut to one of these history lengths, drawn uniformly (default: any of 1 .. len - 1)")
    h.add_argument("--openings", type=int, default=0, help="random games from the start position whose every "
                                                           "transition is written with its true history")
    h.add_argument("--max-plies", type=int, default=10, help="plies of each opening game (drawn from 1 .. this)")
    h.add_argument("--side", choices=("train", "eval", "any"), default="train",
                   help="keep positions on this side of the FEN-hash split of `data generate`")
    h.add_argument("--seed", type=int, default=0, help="seed of the cuts and the opening games (default 0)")
    o = dsub.add_parser("openings", help="held-out opening positions for `rookworld match`")
    o.add_argument("--out", type=output_file, default="data/openings.txt",
                   help="the FEN list written, one per line (default: "
                        "data/openings.txt, what `rookworld match` reads)")
    o.add_argument("--n", type=at_least_one, default=100, help="openings to write: each gives a match two games, "
                                                               "colours swapped (default 100)")
    o.add_argument("--seed", type=int, default=0, help="seed of the moves drawn (default 0)")
    o.add_argument("--depth", type=int, default=6, help="Stockfish depth that picks the moves and checks balance")
    o.add_argument("--cache", default="data/.cache/engine.sqlite", help="engine cache (SQLite)")
    o.add_argument("--exclude", nargs="*", default=[], metavar="FILE", help="leave out the positions of these files "
                   "(openings, FEN lists, samples, puzzles; without the move clocks): openings no earlier match used")
    m = dsub.add_parser("merge", help="sample files -> one shuffled training set, each prompt once (the first "
                                      "file's sample wins)")
    m.add_argument("sources", nargs="+", help="our JSONL(.gz/.xz) files, in order of precedence")
    m.add_argument("--out", type=output_file, required=True, help="JSONL; .gz or .xz compresses it")
    m.add_argument("--seed", default="merge", help="the shuffle's seed (a string)")
    m.add_argument("--tasks", nargs="+", choices=("P", "A"), default=["P", "A"], help="keep samples of these tasks")
    m.add_argument("--side", choices=("train", "eval", "any"), default="any",
                   help="keep positions on this side of the FEN-hash split of `data generate` (its shards hold both)")
    m.add_argument("--exclude", nargs="*", help="files whose positions are left out, compared without the move clocks "
                                                "(held-out samples, puzzles, judged positions, openings)")
    m.add_argument("--new-only", nargs="*", metavar="FILE", help="leave out samples whose prompt these sample files "
                                                                 "hold (an A: transition of the same position, move "
                                                                 "and history; a P: position)")
    m.add_argument("--max", type=at_least_one, default=None, help="write at most this many (the first of the shuffle)")
    m.add_argument("--truth-only", action="store_true", help="write each row's truth alone (prompt and completion "
                                                               "are re-rendered on reading): a third of the bytes")
    nm = dsub.add_parser("near-misses", help="A: samples with near-miss illegal moves (king left in check, a piece "
                                             "in the way, onto an own piece) from a training set's A: positions")
    nm.add_argument("source", help="our JSONL(.gz) training set; its A: positions and histories are used")
    nm.add_argument("--out", type=output_file, required=True,
                    help="the A: samples written (JSONL; .gz or .xz compresses it)")
    nm.add_argument("--n", type=at_least_one, default=15000, help="samples to write, one per position")
    nm.add_argument("--seed", type=int, default=0, help="seed of the positions and moves drawn (default 0)")
    s = dsub.add_parser("stats", help="counts per task, sources, label quirks")
    s.add_argument("file", help="a sample file (JSONL; .gz or .xz)")
    d.set_defaults(func=_data)

    for name in _OPTIONAL:
        _add_optional(sub, name)
    return p


_OPTIONAL = {
    "eval": ("rookworld_rlvr.eval_cli", "evaluate a model on the held-out set (greedy)"),
    "sft": ("rookworld_rlvr.sft_cli", "supervised bootstrap of a base model"),
    "train": ("rookworld_rlvr.grpo.cli", "GRPO training (the main job)"),
    "check-batch": ("rookworld_rlvr.grpo.cli", "collect one batch and check it"),
    "overfit": ("rookworld_rlvr.grpo.cli", "overfit-one-batch sanity test"),
    "report": ("rookworld_rlvr.report.cli", "plots and an HTML report of runs"),
    "sweep": ("rookworld_rlvr.sweep.cli", "hyperparameter sweeps with Optuna"),
    "match": ("rookworld_rlvr.match_cli", "play games between models, a random mover and Stockfish (score, Elo, PGN)"),
    "uci": ("rookworld_rlvr.uci", "run a model as a UCI chess engine"),
}


def _add_optional(sub, name: str) -> None:
    """Subcommands whose module registers its own arguments (`add_arguments(parser, name)`);
    the modules keep torch imports inside functions, so `--help` stays fast."""
    import importlib

    module_name, help_text = _OPTIONAL[name]
    module = importlib.import_module(module_name)
    sp = sub.add_parser(name, help=help_text)
    module.add_arguments(sp, name)
    sp.set_defaults(func=lambda a, m=module, n=name: m.run(a, n))


def main(argv: list[str] | None = None) -> int:
    from rookworld_rlvr.cli_args import parse

    args = parse(build_parser(), argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # user-facing errors: one clear line, no traceback, unless asked
        from rookworld_rlvr.atomic import refused_write
        from rookworld_rlvr.data.io import DataError
        from rookworld_rlvr.engine import EngineError, StockfishNotFound
        from rookworld_rlvr.grpo.distributed import RankTimeout
        from rookworld_rlvr.model.load import ModelLoadError
        from rookworld_rlvr.oom import OutOfMemory, is_out_of_memory
        from rookworld_rlvr.runlock import RunInUse

        if is_out_of_memory(e):  # the commands that run long say more (train, sft: the settings, the resume)
            e = OutOfMemory(e, "a smaller --batch-size needs less, where the command has one")
        if (isinstance(e, (DataError, StockfishNotFound, EngineError, ModelLoadError, RankTimeout, RunInUse,
                           OutOfMemory, ValueError, FileNotFoundError))
                or refused_write(e)) and \
                not getattr(args, "traceback", False):
            print(f"error: {e}", file=sys.stderr)
            return 1
        raise
