"""`rookworld match A B`: the command line of a match between two players (models, a random mover, Stockfish).

Reads the openings, starts the players (an engine or a model that does not start is named, and every engine
started is closed whatever fails after), plays the match (`play.play_match`), writes each game's PGN as it ends and
the summary, and keeps a model's moves beside the output until it is written (a stopped match run again replays
them). Options that nothing of the match reads (a model's settings where no model plays, an engine timeout where
no Stockfish does) are warnings of settings without effect.

Owns the match command's options and its run. Imports the players and the referee from `play`; the model is
reached through it (imported inside functions, so `rookworld --help` stays fast).
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack
from pathlib import Path

import chess.engine

from rookworld_rlvr.atomic import write_text
from rookworld_rlvr.cli_args import (add_device, add_threads, apply_threads, at_least_one, output_file, seconds,
                                     temperature, warn_without_effect)
from rookworld_rlvr.play import (Game, ModelPlayer, Player, RandomPlayer, StockfishPlayer, format_summary, play_match,
                                 read_openings)
from rookworld_rlvr.tasks import policy as pol_task


PLAYER_HELP = "a model directory or Hub id, `random`, or `stockfish[:SKILL[:DEPTH]]` (default skill 0, depth 1)"


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("a", help=f"player A: {PLAYER_HELP}")
    p.add_argument("b", help="player B (the same kinds)")
    p.add_argument("--openings", default="data/openings.txt", help="held-out opening FENs, one per line")
    p.add_argument("--games", type=int, default=100, help="games (an even number: two per opening, colours swapped)")
    p.add_argument("--max-plies", type=at_least_one, default=300,
                   help="a game still going after this many plies is a draw")
    p.add_argument("--temperature", type=temperature, default=0.0, help="model sampling temperature (0 = greedy)")
    p.add_argument("--layout", choices=pol_task.LAYOUTS, default="compact", help="P: prompt layout of the models")
    p.add_argument("--pgn", type=output_file, metavar="OUT", help="write the games as PGN")
    p.add_argument("--json", type=output_file, metavar="OUT",
                   help="write the summary as JSON. With --json or --pgn, the greedy "
                        "models' moves are kept beside it (OUT.a-answers.jsonl, "
                        "OUT.b-answers.jsonl) until the match is written: the same command "
                        "run again after a stop replays them instead of computing them")
    p.add_argument("--legal-moves", action="store_true",
                   help="models decode their moves among legal moves only (no game ends on an illegal move)")
    p.add_argument("--seed", type=int, default=0, help="seed of player A's draws (random moves, sampling); B's is "
                                                       "seed + 1 (default 0)")
    p.add_argument("--engine-timeout", type=seconds, default=30.0,
                   help="seconds a Stockfish player may take for any call (start, each move) before the match stops")
    add_device(p)
    p.add_argument("--batch-size", type=int, default=64, help="a model's moves of one ply decoded at once (the same "
                   "games at any size; on a GPU larger is faster)")
    add_threads(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")


ENGINE_FAILURES = (chess.engine.EngineError, chess.engine.EngineTerminatedError, TimeoutError)


def _started(spec: str, args: argparse.Namespace, seed: int, journal: Path | None) -> Player:
    """`make_player`, with an engine or a model that fails to start turned into an error naming the player."""
    from rookworld_rlvr.model.load import ModelLoadError

    try:
        return make_player(spec, args, seed, journal)
    except (*ENGINE_FAILURES, ModelLoadError, OSError) as e:  # OSError: a Hub id that could not be fetched
        import difflib

        kinds = {"random": "random", "stockfish": "stockfish[:SKILL[:DEPTH]]"}
        meant = difflib.get_close_matches(spec.split(":")[0], kinds, n=1, cutoff=0.75)
        hint = f" (did you mean {kinds[meant[0]]}?)" if meant else ""
        raise ValueError(f"player {spec!r} did not start: {type(e).__name__}: {str(e) or 'no answer in time'}"
                         f"{hint}") from None


def _close(player: Player) -> None:
    if isinstance(player, StockfishPlayer):
        player.close()


def make_player(spec: str, args: argparse.Namespace, seed: int, journal: Path | None = None) -> Player:
    """A player from its spec; a model's greedy answers are kept in `journal` (a file) as they come, and
    those an earlier run of the match on the same weights kept there are read back, not computed again."""
    if spec == "random":
        return RandomPlayer(seed)
    if spec == "stockfish" or spec.startswith("stockfish:"):
        parts = spec.split(":")[1:]
        try:
            skill, depth = (int(parts[0]) if parts else 0), (int(parts[1]) if len(parts) > 1 else 1)
        except ValueError:
            raise ValueError(f"player {spec!r}: use stockfish[:SKILL[:DEPTH]] with integers") from None
        return StockfishPlayer(skill, depth, timeout=args.engine_timeout)
    from rookworld_rlvr.model.load import load_policy

    model, tokenizer = load_policy(spec, device=args.device, verbose=False)
    kept = None
    if journal is not None:
        from rookworld_rlvr.model.journal import identity, resume

        kept = resume(journal, identity(model, legal_moves=args.legal_moves))
        if kept.done:
            print(f"match: {spec}: {len(kept.done)} batches of moves from an earlier run of this match, stopped part "
                  f"way, are kept ({journal})", file=sys.stderr)
    return ModelPlayer(model, tokenizer, spec, layout=args.layout, temperature=args.temperature, seed=seed,
                       batch_size=args.batch_size, legal_moves=args.legal_moves, journal=kept)


def _kind(spec: str) -> str:
    return spec if spec == "random" else "stockfish" if spec.split(":")[0] == "stockfish" else "model"


def inert_options(args: argparse.Namespace) -> list[str]:
    """Options given away from their defaults that no player of this match reads, each with the reason."""
    defaults = argparse.ArgumentParser()
    add_arguments(defaults, "match")
    d, kinds = defaults.parse_args(["a", "b"]), {_kind(args.a), _kind(args.b)}
    out = []
    if "model" not in kinds:
        out += [f"--{flag.replace('_', '-')}: no model plays" for flag in ("temperature", "layout", "legal_moves",
                                                                          "batch_size")
                if getattr(args, flag) != getattr(d, flag)]
    if "stockfish" not in kinds and args.engine_timeout != d.engine_timeout:
        out.append("--engine-timeout: no Stockfish plays")
    if args.seed != d.seed and "random" not in kinds and not ("model" in kinds and args.temperature):
        out.append("--seed: nothing is drawn (no random mover and no sampling model; Stockfish draws its own)")
    return out


def run(args: argparse.Namespace, name: str) -> int:
    from rookworld_rlvr.data.io import DataError, atomic_write_text

    warn_without_effect(inert_options(args))

    if args.games < 2 or args.games % 2:
        raise ValueError(f"--games must be an even number >= 2 (two games per opening), got {args.games}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    try:
        openings = read_openings(args.openings)
    except DataError as e:  # the default is relative to the checkout: name the option that sets it
        raise DataError(f"--openings {e}") from None
    if len(openings) < args.games // 2:
        raise ValueError(f"{args.openings} has {len(openings)} openings; {args.games} games need {args.games // 2}")
    if args.a == args.b:
        raise ValueError("players A and B are the same; give two different players")
    apply_threads(args)
    finished: list[Game] = []
    pgn = Path(args.pgn) if args.pgn else None
    if pgn is not None:
        pgn.parent.mkdir(parents=True, exist_ok=True)
        pgn.write_text("")

    def ended(game: Game) -> None:  # each game's PGN as it ends: a crash later loses none of them
        finished.append(game)
        if pgn is not None:
            write_text(pgn, game.pgn() + "\n\n")

    out = args.json or args.pgn  # a model's answers are kept beside it until the match is written
    journals = {role: Path(f"{out}.{role}-answers.jsonl") for role in "ab"} if out else {}
    with ExitStack() as players:  # every engine that started is closed, whatever fails after it
        a = _started(args.a, args, args.seed, journals.get("a"))
        players.callback(_close, a)
        b = _started(args.b, args, args.seed + 1, journals.get("b"))
        players.callback(_close, b)
        try:
            result = play_match(a, b, openings[: args.games // 2], args.max_plies, progress=not args.quiet,
                                on_game_end=ended)
        except BaseException as e:
            for player in (a, b):  # Ctrl-C, a failure: say what is kept (a kill cannot; the files stay)
                journal = getattr(player, "journal", None)
                if journal is not None and journal.done:
                    print(f"match: {player.name}: {len(journal.done)} batches of moves are kept in {journal.path}: "
                          "the same command replays them", file=sys.stderr)
            if not isinstance(e, ENGINE_FAILURES):
                raise
            kept = f" (their PGN is in {pgn})" if pgn is not None and finished else ""
            raise ValueError(f"a player failed after {len(finished)} finished games{kept}: "
                             f"{type(e).__name__}: {str(e) or 'no answer in time'}") from None
    summary = result.summary()
    print(format_summary(summary))
    if pgn is not None:
        print(f"wrote {pgn} ({len(finished)} games)")
    if args.json:
        atomic_write_text(args.json, [json.dumps(summary, indent=2) + "\n"])
        print(f"wrote {args.json}")
    for path in journals.values():
        path.unlink(missing_ok=True)
    return 0
