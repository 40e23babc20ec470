"""The positions a model reaches in its own greedy games: GRPO prompts from where its matches are played.

    python scripts/game_positions.py --openings 300 --out runs/sp/fens.txt              # 2.5 minutes on 2 cores
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
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import chess

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="models/rookworld-board")
    ap.add_argument("--openings", type=int, default=300, help="games: one greedy self-play game from each opening")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--depth", type=int, default=8, help="Stockfish depth that picks the opening moves")
    ap.add_argument("--last", type=int, default=0, help="keep each game's last N positions (0 = all)")
    ap.add_argument("--but-last", type=int, default=0, help="leave out each game's last N positions")
    ap.add_argument("--exclude", type=Path, action="append", default=[],
                    help="a file of positions to leave out, as the held-out ones are (FENs one a line, openings, "
                    "samples, puzzles); repeatable")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    from rookworld_rlvr.model import load_policy

    held = held_out_positions()
    held |= listed_positions(args.exclude)
    starts = openings(args.openings, args.seed, args.depth, None, EVAL_PERMILLE, max_eval=None, side="train",
                      exclude=held)  # made as the held-out openings are, on the training side
    model, tok = load_policy(args.model, device="cpu", verbose=False)
    result = play_match(ModelPlayer(model, tok, "white"), ModelPlayer(model, tok, "black"), starts, progress=False)
    games = result.games[::2]  # a greedy game's colour-swapped twin is the same game
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
