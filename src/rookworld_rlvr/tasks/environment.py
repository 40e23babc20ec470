"""A: environment task: `A: {fen}+{move}+{history}+{new_fen}+{reward}+{terminated}+{truncated}`.

The prompt is everything up to and including the third `+`; the model writes the rest.
Truth comes from python-chess with the upstream conventions:
- FENs use the standard en-passant convention (square written after every double push);
- history = the last up to 10 UCI half-moves, oldest first, including the current move;
- reward 0.001 for an ordinary legal move, 1.0 when the mover wins, 0.5 for a draw,
  -1.0 with truncated 1 for an illegal move (board unchanged);
- terminated = game over in the resulting position, judged from the position alone
  (repetition cannot be seen in a FEN, so it never terminates an A: transition).

Owns the A: text and the true transitions. Chess only: imports no torch and nothing of the
model or trainer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import chess

from rookworld_rlvr.tasks.policy import UCI_RE, FormatError
from rookworld_rlvr.tasks.strength import is_legal

HISTORY_LEN = 10
REWARD_MOVE, REWARD_WIN, REWARD_DRAW, REWARD_ILLEGAL = 0.001, 1.0, 0.5, -1.0
REWARD_VALUES = (REWARD_MOVE, REWARD_WIN, REWARD_DRAW, REWARD_ILLEGAL)


@dataclass(frozen=True)
class EnvTruth:
    """One true transition of the chess environment."""

    fen: str
    move: str
    history: str  # space-separated UCI, oldest first, includes `move`
    new_fen: str
    reward: float
    terminated: bool
    truncated: bool

    def to_dict(self) -> dict:
        return {
            "fen": self.fen, "move": self.move, "history": self.history, "new_fen": self.new_fen,
            "reward": self.reward, "terminated": self.terminated, "truncated": self.truncated,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "EnvTruth":
        return cls(d["fen"], d["move"], d["history"], d["new_fen"], float(d["reward"]),
                   bool(d["terminated"]), bool(d["truncated"]))


def fen_of(board: chess.Board) -> str:
    """FEN with the en-passant square written after every double push (upstream convention)."""
    return board.fen(en_passant="fen")


def transition(fen: str, move: str, previous: list[str] | tuple[str, ...] = ()) -> EnvTruth:
    """The true result of playing `move` in `fen`; `previous` = moves before it, oldest first."""
    board = chess.Board(fen)
    history = " ".join((list(previous) + [move])[-HISTORY_LEN:])
    if not is_legal(board, move):
        return EnvTruth(fen, move, history, fen_of(board), REWARD_ILLEGAL, False, True)
    board.push_uci(move)
    outcome = board.outcome()  # position-only: no repetition claims
    if outcome is None:
        reward, terminated = REWARD_MOVE, False
    else:
        reward, terminated = (REWARD_WIN if outcome.winner is not None else REWARD_DRAW), True
    return EnvTruth(fen, move, history, fen_of(board), reward, terminated, False)


def _flag(b: bool) -> str:
    return "1" if b else "0"


def prompt(fen: str, move: str, history: str) -> str:
    return f"A: {fen}+{move}+{history}+"


def completion(truth: EnvTruth) -> str:
    return f"{truth.new_fen}+{truth.reward}+{_flag(truth.terminated)}+{_flag(truth.truncated)}"


def render(truth: EnvTruth, prefix: bool = True) -> str:
    """A full line; upstream environment data has no `A: ` prefix, the combined data adds it."""
    line = prompt(truth.fen, truth.move, truth.history) + completion(truth)
    return line if prefix else line[3:]


@dataclass
class EnvParse:
    """What was found in an A: completion and what was wrong with it."""

    new_fen: str | None = None
    reward: float | None = None
    terminated: bool | None = None
    truncated: bool | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.errors


def parse_completion(text: str) -> EnvParse:
    """Parse `{new_fen}+{reward}+{terminated}+{truncated}`; never raises."""
    out = EnvParse()
    parts = [p.strip() for p in text.strip().split("+")]
    if len(parts) != 4:
        out.errors.append(f"expected 4 '+'-separated fields, found {len(parts)}")
    if parts and parts[0]:
        fen = " ".join(parts[0].split())
        out.new_fen = fen
        try:
            chess.Board(fen)
        except ValueError:
            out.errors.append("new FEN is not a valid position")
    else:
        out.errors.append("missing new FEN")
    if len(parts) > 1:
        try:
            out.reward = float(parts[1])
        except ValueError:
            out.errors.append(f"bad reward {parts[1]!r}")
    for i, name in ((2, "terminated"), (3, "truncated")):
        if len(parts) > i:
            if parts[i] in ("0", "1"):
                setattr(out, name, parts[i] == "1")
            else:
                out.errors.append(f"bad {name} flag {parts[i]!r}")
    return out


def split_line(line: str) -> tuple[str, str]:
    """(prompt, completion) of a full A: line; accepts lines without the `A: ` prefix."""
    line = line.strip()
    if line.startswith("A:"):
        line = line[2:].lstrip()
    parts = line.split("+")
    if len(parts) != 7:
        raise FormatError(f"A: line needs 7 '+'-separated fields, found {len(parts)}")
    return "A: " + "+".join(parts[:3]) + "+", "+".join(parts[3:])


def parse_line(line: str) -> EnvTruth:
    """Parse a full A: line and check it against python-chess (the data must be true)."""
    prompt_text, comp = split_line(line)
    fen, move, history = prompt_text[3:-1].split("+")
    try:
        chess.Board(fen)
    except ValueError as e:
        raise FormatError(f"bad FEN {fen!r}: {e}") from None
    if not UCI_RE.match(move) and move != "0000":
        raise FormatError(f"bad UCI move {move!r}")
    hist = history.split()
    if not hist or hist[-1] != move:
        raise FormatError("history must end with the current move")
    parsed = parse_completion(comp)
    if not parsed.valid:
        raise FormatError("; ".join(parsed.errors))
    truth = transition(fen, move, hist[:-1])
    got = (parsed.new_fen, parsed.reward, parsed.terminated, parsed.truncated)
    want = (truth.new_fen, truth.reward, truth.terminated, truth.truncated)
    if got != want:
        fields = [n for n, a, b in zip(("new_fen", "reward", "terminated", "truncated"), got, want) if a != b]
        raise FormatError(f"completion disagrees with python-chess in {', '.join(fields)}")
    return EnvTruth(fen, move, history, truth.new_fen, truth.reward, truth.terminated, truth.truncated)


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insert, delete, substitute), two-row dynamic programme. A shared prefix and suffix cost
    nothing and are cut first: a move changes a few squares of a FEN, so most of it is shared."""
    start = 0
    while start < min(len(a), len(b)) and a[start] == b[start]:
        start += 1
    end = 0
    while end < min(len(a), len(b)) - start and a[-1 - end] == b[-1 - end]:
        end += 1
    a, b = a[start:len(a) - end], b[start:len(b) - end]
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def fen_similarity(a: str, b: str) -> float:
    """Normalized Levenshtein similarity in [0, 1]: 1 - distance / longer length."""
    if a == b:
        return 1.0
    return 1.0 - levenshtein(a, b) / max(len(a), len(b))


def _elements(fen: str) -> list[str]:
    """A FEN as 69 comparable elements: the 64 squares (a8 .. h1; "?" where a malformed rank has
    no square) and the other five fields ("?" when missing)."""
    fields = fen.split()
    ranks = (fields[0] if fields else "").split("/")
    squares = []
    for i in range(8):
        row = "".join("." * int(ch) if ch.isdigit() else ch for ch in (ranks[i] if i < len(ranks) else ""))
        squares += list(row[:8].ljust(8, "?"))
    return squares + [fields[i] if i < len(fields) else "?" for i in range(1, 6)]


def change_credit(fen: str, true_new: str, predicted: str) -> float:
    """Credit in [0, 1] for a predicted next FEN, counting only what the move changed.

    Of the elements (squares and FEN fields) that differ between `fen` and `true_new`, the share the
    prediction got right, less one for each element it changed that should have stayed. A copy of
    the input board earns 0; moving the right piece to a wrong square keeps most of the credit.
    When nothing changes (an illegal move), only the exact answer counts, so this gives 0."""
    old, new, got = _elements(fen), _elements(true_new), _elements(predicted)
    changed = [i for i in range(len(new)) if old[i] != new[i]]
    if not changed:
        return 0.0
    right = sum(got[i] == new[i] for i in changed)
    spoiled = sum(got[i] != new[i] for i in range(len(new)) if old[i] == new[i])
    return max(0.0, right - spoiled) / len(changed)
