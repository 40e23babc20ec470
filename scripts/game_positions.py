"""The positions a model reaches in its own greedy games: GRPO prompts from where its matches are played.

    python scripts/game_positions.py --openings 300 --out runs/sp/fens.txt              # 2 minutes on 2 cores
    rookworld data generate --out runs/sp/gen --games 0 --workers 2 --depth 8 --positions runs/sp/fens.txt
    make train ARGS="--data runs/sp/gen/train.jsonl.gz --check-share null --anchor-data data/train.jsonl.xz \\
        --output-dir runs/sp"

`rookworld match` plays from held-out openings and nearly every game ends on an illegal move after
about 11 plies, so a match measures legality in early game positions. This script makes openings
the way `rookworld data openings` does (4 to 10 plies of Stockfish's top-5 moves at random), but on
the training side of the FEN-hash split; the model plays each greedily against itself, and every
position of every game is kept (with `--last N`, each game's last N: where it was decided; with
`--but-last N`, the others), the one where it ended included (where the illegal move was written):
on the training side, not game over, and none a position of a held-out file (`scripts/held_out.sh`)
or of an `--exclude` file (compared without the move clocks). `data generate --positions` then labels
them with Stockfish. One FEN a line, in the order the games reached them.

The openings take Stockfish most of the time where the games run on a GPU: `--openings-only` writes them and stops,
and `--openings-file` plays from such a file instead (`data/train_openings.txt`, 2,000 of them, is what
`scripts/gpu_rl.sh --game-positions` reads); `--device` and `--batch-size` place and batch the model's moves.
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import chess

from rookworld_rlvr.cli_args import at_least_one
from rookworld_rlvr.data.generate import is_eval_fen
from rookworld_rlvr.data.judged import board_key, openings, positions_of_files
from rookworld_rlvr.play import ModelPlayer, play_match
from rookworld_rlvr.tasks.environment import fen_of

REPO = Path(__file__).resolve().parents[1]
EVAL_PERMILLE = 40  # the shipped data's split (data/manifest.json)


def held_out_positions() -> set[str]:
    """Every position of the held-out files scripts/held_out.sh lists, without its move clocks."""
    names = subprocess.run(["bash", "-c", ". scripts/held_out.sh; printf '%s\\n' \"${held[@]}\""], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split()
    return {board_key(f) for f in positions_of_files([REPO / n for n in names])}


def listed_positions(paths: list[Path]) -> set[str]:
    """The positions of the files (FEN lists, openings, samples, puzzles: `positions_of_files`), without
    their move clocks: what --exclude leaves out."""
    return {board_key(f) for f in positions_of_files(paths)}


def game_positions(games, held: set[str], last: int = 0, but_last: int = 0) -> list[str]:
    """Every position of the games (or each game's `last` ones; 0 = all; then without its `but_last`
    ones), the last one included, kept as the docstring says, in order, once each."""
    found: dict[str, None] = {}
    for game in games:
        board = game.board.root()
        fens = []
        for move in game.board.move_stack:
            fens.append(fen_of(board))
            board.push(move)
        fens.append(fen_of(board))
        fens = fens[-last:] if last else fens
        found.update(dict.fromkeys(fens[:-but_last] if but_last else fens))
    return [f for f in found if not is_eval_fen(f, EVAL_PERMILLE) and board_key(f) not in held
            and not chess.Board(f).is_game_over()]


def training_openings(path: Path, n: int, held: set[str]) -> list[str]:
    """The first `n` openings of a file `--openings-only` wrote (`play.read_openings`: one FEN a line, each a
    position with a legal move), each on the training side: a held-out position stops with its line."""
    from rookworld_rlvr.data.io import DataError
    from rookworld_rlvr.play import read_openings

    try:
        found = read_openings(path, n)
    except DataError as e:
        raise SystemExit(f"game_positions: {e}") from None
    for number, fen in enumerate(found, 1):
        if is_eval_fen(fen, EVAL_PERMILLE) or board_key(fen) in held:
            raise SystemExit(f"game_positions: {path}: opening {number} ({fen}) is a held-out position")
    if len(found) < n:
        raise SystemExit(f"game_positions: {path} holds {len(found)} openings, not the {n} asked for")
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="models/rookworld-board")
    ap.add_argument("--openings", type=at_least_one, default=300,
                    help="games: one greedy self-play game from each opening")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--depth", type=int, default=8, help="Stockfish depth that picks the opening moves")
    ap.add_argument("--last", type=int, default=0, help="keep each game's last N positions (0 = all)")
    ap.add_argument("--but-last", type=int, default=0, help="leave out each game's last N positions")
    ap.add_argument("--exclude", type=Path, action="append", default=[],
                    help="a file of positions to leave out, as the held-out ones are (FENs one a line, openings, "
                    "samples, puzzles); repeatable")
    ap.add_argument("--openings-file", type=Path, help="play from the first --openings of this file's openings "
                    "(one FEN a line, as --openings-only writes them) instead of making them")
    ap.add_argument("--openings-only", action="store_true", help="write the openings to --out and stop")
    ap.add_argument("--device", default="cpu", help="where the model plays (cpu, cuda, ...)")
    ap.add_argument("--batch-size", type=at_least_one, default=64,
                    help="the model's moves decoded at once (one per game)")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    if args.openings_file and args.openings_only:
        ap.error("--openings-only makes openings; --openings-file reads them: one of them")
    from rookworld_rlvr.model import load_policy

    held = held_out_positions()
    held |= listed_positions(args.exclude)
    if args.openings_file:
        starts = training_openings(args.openings_file, args.openings, held)
    else:  # made as the held-out openings are, on the training side
        starts = openings(args.openings, args.seed, args.depth, None, EVAL_PERMILLE, max_eval=None, side="train",
                          exclude=held)
    if args.openings_only:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(f"# {len(starts)} training-side openings: scripts/game_positions.py --openings "
                            f"{args.openings} --seed {args.seed} --depth {args.depth} --openings-only\n"
                            + "".join(f + "\n" for f in starts))
        print(f"{len(starts)} openings written to {args.out}")
        return
    model, tok = load_policy(args.model, device=args.device, verbose=False)
    players = [ModelPlayer(model, tok, colour, batch_size=args.batch_size) for colour in ("white", "black")]
    games = play_match(*players, starts, progress=False, both_colours=False).games  # greedy: its twin is the same
    fens = game_positions(games, held, args.last, args.but_last)
    ends: dict[str, int] = {}
    for g in games:
        ends[g.termination] = ends.get(g.termination, 0) + 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(f + "\n" for f in fens))
    print(f"{len(games)} games ({', '.join(f'{k} {v}' for k, v in sorted(ends.items()))}); {len(fens)} positions "
          f"written to {args.out}")


if __name__ == "__main__":
    main()
