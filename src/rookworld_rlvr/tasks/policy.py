"""P: policy task: render, parse and import `P: <FEN> M: <moves> E: <evals> B: <best>`.

Upstream layout (byte-identical to the RookWorld generators):
    f"P: {fen:90}" + f"M: {moves:30}" + f"E: {evals:40}" + f"B: {best}"
Compact layout: single spaces between sections. Parsing is by tokens, never by columns.

Owns the P: text: rendering, parsing, and reading the move an answer names (`PolicyParse.move`,
the one place that does). Chess only: imports no torch and nothing of the model or trainer.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import chess

from rookworld_rlvr.tasks.strength import best_of, legal_moves

LAYOUTS = ("padded", "compact")
# Order of the M:/E: candidates in a rendered target. "given": as stored (upstream shuffled them);
# "best-first": by eval, best first, so the first move written is the policy's choice and no two
# slots share a target (a model trained on shuffled lists repeats its top move under greedy decoding).
ORDERS = ("given", "best-first")
UCI_RE = re.compile(r"^[a-h][1-8][a-h][1-8][qrbn]?$")


@dataclass(frozen=True)
class PolicyTruth:
    """What a P: sample's answer should be: candidates with their evals and every best move."""

    fen: str
    moves: tuple[str, ...]  # candidate moves in the order written in the target
    evals: tuple[float, ...]  # pawns, relative to the side to move, same order as moves
    best: tuple[str, ...]  # all moves sharing the highest eval (each is a correct B:)
    label: str | None = None  # the B: label written in the source data, when imported

    @property
    def best_move(self) -> str:
        """The B: we write: the source label when it is a best move, else the first best."""
        return self.label if self.label in self.best else self.best[0]

    def to_dict(self) -> dict:
        d = {"fen": self.fen, "moves": list(self.moves), "evals": list(self.evals), "best": list(self.best)}
        if self.label is not None:
            d["label"] = self.label
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "PolicyTruth":
        return cls(d["fen"], tuple(d["moves"]), tuple(float(e) for e in d["evals"]), tuple(d["best"]), d.get("label"))


def format_eval(x: float) -> str:
    """Upstream writes evals with Python's str(float): -2.0, 0.0, 4.41, 999.99."""
    return str(float(x))


def prompt(fen: str, layout: str = "compact") -> str:
    """The generation prompt: everything before `M:` (deterministic padding included)."""
    _check_layout(layout)
    return f"P: {fen:90}" if layout == "padded" else f"P: {fen} "


def ranked(truth: PolicyTruth) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """The candidates and their evals, best first (ties keep their stored order)."""
    order = sorted(range(len(truth.moves)), key=lambda i: -truth.evals[i])
    return tuple(truth.moves[i] for i in order), tuple(truth.evals[i] for i in order)


def completion(truth: PolicyTruth, layout: str = "compact", order: str = "given") -> str:
    """The target continuation of `prompt(fen, layout)`, candidates in `order` (see ORDERS)."""
    _check_layout(layout)
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    moves_t, evals_t = ranked(truth) if order == "best-first" else (truth.moves, truth.evals)
    moves = " ".join(moves_t)
    evals = " ".join(format_eval(e) for e in evals_t)
    # best-first writes the first best move as B: (the M: slot it copies); else the label if it is a best
    best = moves_t[0] if order == "best-first" else truth.best_move
    if layout == "padded":
        return f"M: {moves:30}" + f"E: {evals:40}" + f"B: {best}"
    return f"M: {moves} E: {evals} B: {best}"


def render(truth: PolicyTruth, layout: str = "compact", order: str = "given") -> str:
    """A full training line."""
    return prompt(truth.fen, layout) + completion(truth, layout, order)


@dataclass
class PolicyParse:
    """What was found in a P: completion and what was wrong with it."""

    moves: list[str] | None = None
    evals: list[float] | None = None
    best: str | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.errors

    @property
    def move(self) -> str | None:
        """The B: move when it is written in UCI (legal or not), else None: the move the answer plays."""
        return self.best if self.best and UCI_RE.match(self.best) else None


_SECTION_RE = re.compile(r"(?<!\S)([MEB]):")


def parse_completion(text: str) -> PolicyParse:
    """Parse `M: ... E: ... B: ...` whitespace-insensitively; never raises."""
    out = PolicyParse()
    if "P:" in text and "M:" in text:  # tolerate a full line
        text = text[text.index("M:"):]
    marks = [(m.group(1), m.start(), m.end()) for m in _SECTION_RE.finditer(text)]
    names = [m[0] for m in marks]
    for sec in "MEB":
        if names.count(sec) == 0:
            out.errors.append(f"missing {sec}:")
        elif names.count(sec) > 1:
            out.errors.append(f"repeated {sec}:")
    if [n for n in names if n in "MEB"] != sorted(set(names), key="MEB".index) or (names and text[: marks[0][1]].strip()):
        if not out.errors:
            out.errors.append("sections out of order or text before M:")
    spans = {}
    for i, (name, _, end) in enumerate(marks):
        stop = marks[i + 1][1] if i + 1 < len(marks) else len(text)
        spans.setdefault(name, text[end:stop].split())
    if "M" in spans:
        out.moves = spans["M"]
        bad = [m for m in out.moves if not UCI_RE.match(m)]
        if bad:
            out.errors.append(f"bad UCI in M: {' '.join(bad[:3])}")
        if not out.moves:
            out.errors.append("empty M:")
        elif len(out.moves) > 5:
            out.errors.append(f"{len(out.moves)} moves in M: (at most 5)")
        if len(set(out.moves)) != len(out.moves):
            out.errors.append("repeated move in M:")
    if "E" in spans:
        evals: list[float] = []
        for tok in spans["E"]:
            try:
                v = float(tok)
            except ValueError:
                out.errors.append(f"bad eval {tok!r}")
                break
            if not math.isfinite(v):
                out.errors.append(f"bad eval {tok!r}")
                break
            evals.append(v)
        else:
            out.evals = evals
            if out.moves is not None and len(evals) != len(out.moves):
                out.errors.append(f"eval count mismatch ({len(out.moves)} moves, {len(evals)} evals)")
    if "B" in spans:
        toks = spans["B"]
        if len(toks) != 1:
            out.errors.append("B: needs exactly one move" if not toks else "text after B: move")
        if toks:
            out.best = toks[0]
            if not UCI_RE.match(toks[0]):
                out.errors.append(f"bad UCI in B: {toks[0]}")
    return out


class FormatError(ValueError):
    """A source line that is not a valid sample; the message says which field is wrong."""


def parse_line(line: str) -> PolicyTruth:
    """Parse a full upstream/compact P: line into its truth (keeps the written B: as `label`).

    Ground truth `best` is recomputed from the evals: upstream wrote the 5th-ranked move
    as B: for black, so the label is kept only as a record.
    """
    line = line.strip()
    if not line.startswith("P:"):
        raise FormatError("P: line must start with 'P:'")
    toks = line.split()
    try:
        m = toks.index("M:")
    except ValueError:
        raise FormatError("missing M:") from None
    fen = " ".join(toks[1:m])
    try:
        board = chess.Board(fen)
    except ValueError as e:
        raise FormatError(f"bad FEN {fen!r}: {e}") from None
    parsed = parse_completion(" ".join(toks[m:]))
    if not parsed.valid:
        raise FormatError("; ".join(parsed.errors))
    assert parsed.moves is not None and parsed.evals is not None and parsed.best is not None
    legal = legal_moves(board)
    for mv in parsed.moves + [parsed.best]:
        if mv not in legal:
            raise FormatError(f"illegal move {mv} in {fen}")
    if len(set(parsed.moves)) != len(parsed.moves):
        raise FormatError("duplicate move in M:")
    return PolicyTruth(fen, tuple(parsed.moves), tuple(parsed.evals), best_of(parsed.moves, parsed.evals), parsed.best)


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
