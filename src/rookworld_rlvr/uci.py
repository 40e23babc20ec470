"""`rookworld uci --model DIR`: the model as a UCI engine, for any chess GUI or tournament manager.

It answers each `go` with the `B:` move of a greedy `P:` answer for the current position. A
UCI engine must move legally, so when that move is unreadable or illegal it plays the first
legal move of the answer's `M:` list, else a random legal move, and says so in an
`info string` line (a `rookworld match` game, by contrast, is lost on such a move). With
`--legal-moves` the answer is decoded among legal moves (see legal_decoding), so the move played
is always the model's own.

The protocol as GUIs expect it: a `position` that cannot be read leaves no position (the next
`go` answers `bestmove 0000` with an `info string` saying why), never the previous board;
`go infinite` and `go ponder` hold the move until `stop` (or `ponderhit`); `go searchmoves` keeps
the move among those given; the time controls of `go` are read (a bad value is named; the model
answers at once whatever they allow); a line that is not valid UTF-8, or any error while
answering, is reported and the engine keeps running.
Before each `bestmove` an `info depth 1 score ... pv MOVE` line gives the model's own `E:` eval of
the move it plays, so a GUI's analysis pane shows what the model thinks; with the `MultiPV` option
(1-5) the answer's other legal `M:` candidates follow as lines 2.. by their evals.

Owns the UCI protocol; the model answers through `play.ModelPlayer` (imported inside `run`, so
`rookworld --help` stays fast).
"""

from __future__ import annotations

import argparse
import io
import random
import sys
from typing import IO, Iterable

import chess

from rookworld_rlvr.cli_args import add_device, add_threads, apply_threads, temperature
from rookworld_rlvr.engine import MATE_SCORE, faults  # MATE_SCORE: an E: eval of mate in n is (MATE_SCORE - n) / 100
from rookworld_rlvr.tasks import policy as pol_task
from rookworld_rlvr.tasks.strength import legal_moves


TIME_CONTROLS = ("wtime", "btime", "winc", "binc", "movestogo", "depth", "nodes", "mate", "movetime")
MULTIPV_MAX = 5  # an answer's M: holds at most 5 candidates


def score_words(pawns: float) -> str:
    """UCI `score` of an `E:` eval (pawns for the side to move): `cp N`, or `mate N` (negative: mated)
    for the mate encoding (100000 - n) / 100."""
    cp = round(pawns * 100)
    if abs(cp) < MATE_SCORE - 10_000:
        return f"cp {cp}"
    n = max(1, MATE_SCORE - abs(cp))
    return f"mate {n if cp > 0 else -n}"


def candidate_lines(answer, played: str, legal: set[str], multipv: int) -> list[str]:
    """`info` lines for the move played, then (MultiPV) the answer's other legal candidates by eval;
    a line has a score where the answer's `E:` gives that move one."""
    evals = dict(zip(answer.moves or [], answer.evals or []))
    others = sorted((m for m in evals if m in legal and m != played), key=lambda m: -evals[m])
    lines = []
    for i, move in enumerate([played, *others][:multipv], start=1):
        rank = f" multipv {i}" if multipv > 1 else ""
        score = f" score {score_words(evals[move])}" if move in evals else ""
        lines.append(f"info depth 1{rank}{score} pv {move}")
    return lines


class UCIEngine:
    """The protocol state: the position, and the player that answers `go`."""

    def __init__(self, player, name: str, out: IO[str], seed: int = 0) -> None:
        self.player = player
        self.name = name
        self.out = out
        self.board: chess.Board | None = chess.Board()
        self.why_no_board = ""
        self.pending: str | None = None  # a move held until `stop` (go infinite / ponder)
        self.rng = random.Random(seed)
        self.multipv = 1

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
            self.send(f"option name MultiPV type spin default 1 min 1 max {MULTIPV_MAX}")
            self.send("uciok")
        elif cmd == "isready":
            self.send("readyok")
        elif cmd == "ucinewgame":
            self.board = chess.Board()
        elif cmd == "position":
            self.board = None  # a position that cannot be read leaves none, never the previous one
            try:
                self.board = self._position(words[1:])
            except ValueError as e:
                self.why_no_board = str(e)
                raise
        elif cmd == "go":
            self._go(words[1:])
        elif cmd in ("stop", "ponderhit"):
            if self.pending is not None:
                move, self.pending = self.pending, None
                self.send(f"bestmove {move}")
        elif cmd == "quit":
            return False
        elif cmd == "setoption":
            self._setoption(words[1:])
        elif cmd not in ("register", "debug"):
            self.send(f"info string unknown command {cmd}")
        return True

    def _go(self, words: list[str]) -> None:
        """Read the time controls and `searchmoves`, answer; `infinite` and `ponder` hold the answer until `stop`."""
        hold = "infinite" in words or "ponder" in words
        only: list[str] = []  # searchmoves: the moves after it, up to the next keyword
        i = 0
        while i < len(words):
            word = words[i]
            if word == "searchmoves":
                while i + 1 < len(words) and words[i + 1] not in (*TIME_CONTROLS, "infinite", "ponder"):
                    i += 1
                    only.append(words[i])
            elif word in TIME_CONTROLS:
                value = words[i + 1] if i + 1 < len(words) else ""
                if not value.lstrip("-").isdigit():
                    self.send(f"info string go: {word} needs an integer, got {value!r}")
                else:
                    i += 1
            i += 1
        if self.board is None:
            self.send(f"info string no position: {self.why_no_board or 'send position first'}")
            move = "0000"
        else:
            move = self.best_move(set(only) if only else None)
        if hold:
            self.pending = move
        else:
            self.send(f"bestmove {move}")

    def _setoption(self, words: list[str]) -> None:
        """`setoption name MultiPV value N`; any other option is named as unknown."""
        rest = " ".join(words)
        name, _, value = rest.removeprefix("name ").partition(" value ")
        if name.strip().lower() != "multipv":
            self.send(f"info string unknown option {name.strip()!r}")
        elif not value.strip().isdigit() or not 1 <= int(value) <= MULTIPV_MAX:
            self.send(f"info string setoption: MultiPV needs an integer 1-{MULTIPV_MAX}, got {value.strip()!r}")
        else:
            self.multipv = int(value)

    @staticmethod
    def _position(words: list[str]) -> chess.Board:
        if words[:1] == ["startpos"]:
            board, rest = chess.Board(), words[1:]
        elif words[:1] == ["fen"]:
            end = words.index("moves") if "moves" in words else len(words)
            fen = " ".join(words[1:end])
            try:
                board = chess.Board(fen)
            except ValueError as e:
                raise ValueError(f"position: bad FEN {fen!r} ({e})") from None
            # python-chess reads it, but no game reaches it (no king, say): no move to give. Castling rights or an
            # en-passant square that do not fit the board are left to python-chess, which drops them, as engines do
            if board.status() & ~(chess.STATUS_BAD_CASTLING_RIGHTS | chess.STATUS_INVALID_EP_SQUARE):
                raise ValueError(f"position: bad FEN {fen!r} (not a legal position: {faults(board)})")
            rest = words[end:]
        else:
            raise ValueError(f"position: expected startpos or fen, got {' '.join(words)!r}")
        if rest and rest[0] != "moves":
            raise ValueError(f"position: expected 'moves' before {' '.join(rest)!r}")
        for mv in rest[1:]:
            try:
                board.push_uci(mv)
            except ValueError:
                raise ValueError(f"position: {mv!r} is not a legal move in {board.fen()}") from None
        return board

    def best_move(self, searchmoves: set[str] | None = None) -> str:
        """The model's move; with `searchmoves` (go searchmoves ...) one of the legal moves among them."""
        legal = allowed = legal_moves(self.board)
        if searchmoves is not None and legal:
            if searchmoves & legal:
                allowed = legal & searchmoves
            else:
                self.send(f"info string go: no legal move among searchmoves {' '.join(sorted(searchmoves))}; "
                          "searching every move")
        if not legal:
            return "0000"
        answer = self.player.answers([self.board])[0]
        move = answer.best if answer.best in allowed else None
        if move is None:
            move = next((m for m in answer.moves or [] if m in allowed), None)
            kind = "legal" if allowed == legal else "searched"
            why = f"first {kind} M: candidate" if move else f"random {kind} move"
            move = move or self.rng.choice(sorted(allowed))
            where = "legal here" if answer.best not in legal else "among searchmoves"
            self.send(f"info string model move {answer.best or '(none)'} is not {where}; playing {move} ({why})")
        for line in candidate_lines(answer, move, allowed, self.multipv):
            self.send(line)
        return move


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.description = ("The model as a UCI engine on stdin/stdout, for a chess GUI or tournament manager: each `go` is "
                     "answered with the B: move of a greedy P: answer (an illegal one is replaced by the answer's "
                     "first legal M: candidate, else a random legal move, and an `info string` says so), after "
                     "`info depth 1 score ... pv MOVE` lines with the model's own E: evals (option MultiPV, 1-5: "
                     "its other legal candidates too).")
    p.add_argument("--model", required=True, help="model directory or Hub id")
    p.add_argument("--layout", choices=pol_task.LAYOUTS, default="compact", help="P: prompt layout")
    p.add_argument("--temperature", type=temperature, default=0.0, help="sampling temperature (0 = greedy)")
    p.add_argument("--legal-moves", action="store_true", help="decode moves among legal moves only")
    add_device(p)
    add_threads(p)
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling (--temperature) and of the random "
                                                       "legal move played when the model's has no legal "
                                                       "fallback (default 0)")


def run(args: argparse.Namespace, name: str) -> int:
    from rookworld_rlvr.model.load import load_policy
    from rookworld_rlvr.play import ModelPlayer

    apply_threads(args)
    model, tokenizer = load_policy(args.model, device=args.device, verbose=False)
    player = ModelPlayer(model, tokenizer, args.model, layout=args.layout, temperature=args.temperature,
                         seed=args.seed, batch_size=1, legal_moves=args.legal_moves)
    engine = UCIEngine(player, args.model, sys.stdout, args.seed)
    return serve(engine, io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="surrogateescape"))


def serve(engine: UCIEngine, lines: Iterable[str]) -> int:
    """Answer every line until `quit`: a line that is not UTF-8, a bad command or any error while
    answering is reported as an `info string`, and the engine a GUI is talking to keeps running."""
    for line in lines:
        if any("\udc80" <= ch <= "\udcff" for ch in line):
            engine.send("info string error: the line is not valid UTF-8; ignored")
            continue
        try:
            if not engine.handle(line.strip()):
                break
        except Exception as e:  # noqa: BLE001 - never die under a GUI
            engine.send(f"info string error: {e}")
    return 0
