"""`rookworld uci --model DIR`: the model as a UCI engine, for any chess GUI or tournament manager.

It answers each `go` with the `B:` move of a greedy `P:` answer for the current position. A
UCI engine must move legally, so when that move is unreadable or illegal it plays the first
legal move of the answer's `M:` list, else a random legal move, and says so in an
`info string` line (a `rookworld match` game, by contrast, is lost on such a move). With
`--legal-moves` the answer is decoded among legal moves (see legal_decoding), so the move played
is always the model's own.

Owns the UCI protocol; the model answers through `play.ModelPlayer` (imported inside `run`, so
`rookworld --help` stays fast).
"""

from __future__ import annotations

import argparse
import random
import sys
from typing import IO

import chess

from rookworld_rlvr.tasks import policy as pol_task
from rookworld_rlvr.tasks.strength import legal_moves


class UCIEngine:
    """The protocol state: the position, and the player that answers `go`."""

    def __init__(self, player, name: str, out: IO[str], seed: int = 0) -> None:
        self.player = player
        self.name = name
        self.out = out
        self.board = chess.Board()
        self.rng = random.Random(seed)

    def send(self, line: str) -> None:
        self.out.write(line + "\n")
        self.out.flush()

    def handle(self, line: str) -> bool:
        """Answer one command; False on `quit`."""
        words = line.split()
        if not words:
            return True
        cmd = words[0]
        if cmd == "uci":
            self.send(f"id name rookworld {self.name}")
            self.send("id author rookworld-rlvr")
            self.send("uciok")
        elif cmd == "isready":
            self.send("readyok")
        elif cmd == "ucinewgame":
            self.board = chess.Board()
        elif cmd == "position":
            self.board = self._position(words[1:])
        elif cmd == "go":
            self.send(f"bestmove {self.best_move()}")
        elif cmd == "quit":
            return False
        elif cmd not in ("stop", "ponderhit", "setoption", "register", "debug"):
            self.send(f"info string unknown command {cmd}")
        return True

    @staticmethod
    def _position(words: list[str]) -> chess.Board:
        if words[:1] == ["startpos"]:
            board, rest = chess.Board(), words[1:]
        elif words[:1] == ["fen"]:
            end = words.index("moves") if "moves" in words else len(words)
            board, rest = chess.Board(" ".join(words[1:end])), words[end:]
        else:
            raise ValueError(f"position: expected startpos or fen, got {' '.join(words)!r}")
        for mv in rest[1:] if rest[:1] == ["moves"] else []:
            board.push_uci(mv)
        return board

    def best_move(self) -> str:
        legal = legal_moves(self.board)
        if not legal:
            return "0000"
        answer = self.player.answers([self.board])[0]
        if answer.best in legal:
            return answer.best
        fallback = next((m for m in answer.moves or [] if m in legal), None)
        why = "first legal M: candidate" if fallback else "random legal move"
        fallback = fallback or self.rng.choice(sorted(legal))
        self.send(f"info string model move {answer.best or '(none)'} is not legal here; playing {fallback} ({why})")
        return fallback


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("--model", required=True, help="model directory or Hub id")
    p.add_argument("--layout", choices=pol_task.LAYOUTS, default="compact", help="P: prompt layout")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    p.add_argument("--legal-moves", action="store_true", help="decode moves among legal moves only")
    p.add_argument("--device", default="auto")
    p.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace, name: str) -> int:
    from rookworld_rlvr.model.load import load_policy
    from rookworld_rlvr.play import ModelPlayer

    model, tokenizer = load_policy(args.model, device=args.device, verbose=False)
    player = ModelPlayer(model, tokenizer, args.model, layout=args.layout, temperature=args.temperature,
                         seed=args.seed, batch_size=1, legal_moves=args.legal_moves)
    engine = UCIEngine(player, args.model, sys.stdout, args.seed)
    for line in sys.stdin:
        try:
            if not engine.handle(line.strip()):
                break
        except ValueError as e:  # a bad command must not kill the engine a GUI is talking to
            engine.send(f"info string error: {e}")
    return 0
