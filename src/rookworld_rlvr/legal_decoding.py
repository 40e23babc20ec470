"""Legal-move decoding: `P:` answers whose moves are legal by construction.

Off by default. With it, each decoding step of a `P:` answer may only pick tokens that keep
the answer on a legal path: `M:` lists min(5, legal) distinct legal moves, then `E:` one eval
per move (`-?d.d` with up to 3 and 2 digits; the values are the model's), then `B:` one legal
move, then the end. The `A:` task decodes as the model wants. The model still chooses: greedy
takes its most likely allowed token.

Why: an illegal move ends a game at once, so a model that knows some chess but slips on the
rules loses every game in a few plies and its match score says nothing about its moves. With
legal-move decoding, a match or the UCI engine plays whole games, and the strength tables
measure the model's *choice among legal moves*. They do not measure whether it knows the rules:
legality and distinct candidates are 100% by construction, so compare those without it.

Owns the constraint. Works with any tokenizer (a token is allowed when its text is a prefix of
an allowed continuation; tokens that would run past a move's end are not). Imports chess, torch
and tasks.strength, nothing of the model or trainer: the sampler (`model.generate`) only sees a
logits processor.
"""

from __future__ import annotations

import re
from typing import Sequence

import chess
import torch

from rookworld_rlvr.tasks.strength import legal_moves

CANDIDATES = 5  # M: lists this many moves, or every legal move when there are fewer
PADDED_M_WIDTH = 30  # the padded layout's `M: {moves:30}`


def fen_of_prompt(prompt: str) -> str | None:
    """The FEN of a `P:` prompt (either layout), or None for any other prompt."""
    if not prompt.startswith("P: "):
        return None
    fen = " ".join(prompt[3:].split())
    try:
        chess.Board(fen)
    except ValueError:
        return None
    return fen


EVAL_RE = re.compile(r"-?\d{1,3}\.\d{1,2}")  # upstream writes evals as str(float) of pawns: 0.3, -1.14, 999.99
EVAL_PREFIX_RE = re.compile(r"-?(\d{1,3}(\.\d{0,2})?)?")
EVAL_CHARS = set("0123456789.- B:")
PADDED_E_WIDTH = 40  # the padded layout's `E: {evals:40}`


def eval_section(text: str) -> tuple[str, int] | None:
    """(the text after `E:`, how many moves `M:` lists) while `text` is in the `E:` section."""
    if "M:" not in text:
        return None
    after_m = text[text.index("M:") + 2:]
    if "E:" not in after_m or "B:" in after_m:
        return None
    cut = after_m.index("E:")
    return after_m[cut + 2:], len(after_m[:cut].split())


def evals_ok(body: str, n: int, padded: bool = False) -> bool:
    """Can `body` (the text after `E:`) still become n evals and then `B:`? A token that reaches
    `B:` must end there (what follows is the `B:` grammar's). `padded`: the padded layout."""
    if not body:
        return True
    if body[0] != " ":
        return False
    *done, last = body[1:].split(" ")
    evals = [w for w in done if w]
    if any(not EVAL_RE.fullmatch(w) for w in evals) or len(evals) > n:
        return False
    if "" in done:  # spaces pad the column after the last eval (padded layout), nowhere else
        k = done.index("")
        if not padded or k < n or any(done[k:]) or (last == "" and len(body) > PADDED_E_WIDTH + 1):
            return False
    if len(evals) == n:
        return "B:".startswith(last)
    return bool(EVAL_PREFIX_RE.fullmatch(last))


def continuations(text: str, legal: set[str], padded: bool = False) -> tuple[set[str], bool] | None:
    """What may follow the partial `P:` answer `text`: strings any allowed token must be a prefix
    of, and whether the answer may end here. None: not constrained at this point (the `E:`
    section, text after the answer, or text that left the format before the constraint began)."""
    if "M:" not in text:
        return ({"M: "[len(text):]}, False) if "M: ".startswith(text) else None
    after_m = text[text.index("M:") + 2:]
    if "B:" in after_m:
        section = after_m[after_m.index("B:") + 2:]
        if not section:
            return {" "}, False
        word = section[1:]
        if not section.startswith(" ") or " " in word:
            return None
        rest = {m[len(word):] for m in legal if m.startswith(word) and m != word}
        return rest, word in legal
    if "E:" in after_m:
        return None
    if not after_m:
        return {" "}, False
    if not after_m.startswith(" "):
        return None
    *done, word = after_m[1:].split(" ")
    written = [w for w in done if w]
    if any(w not in legal for w in written) or len(set(written)) != len(written):
        return None
    remaining = legal - set(written)
    if len(written) >= min(CANDIDATES, len(legal)):
        options = {"E:"}
        if padded and word == "" and len(after_m) <= PADDED_M_WIDTH:
            options.add(" ")  # the padded layout fills the M: column with spaces, no further
    else:
        options = {m + " " for m in remaining}
    return {o[len(word):] for o in options if o.startswith(word) and len(o) > len(word)}, False


class LegalMoveDecoding:
    """Builds, for a batch of prompts, the logits processor that `model.generate` calls each step."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.eos_token_id
        special = set(tokenizer.all_special_ids)
        self._ids: dict[str, list[int]] = {}  # token text -> ids
        for i in range(len(tokenizer)):
            if i in special:
                continue
            text = tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            if text:
                self._ids.setdefault(text, []).append(i)
        self._eval_tokens = [(t, ids) for t, ids in self._ids.items() if set(t) <= EVAL_CHARS]

    def allowed(self, text: str, legal: set[str], padded: bool = False) -> list[int] | None:
        """Token ids allowed after `text` (None: any token); `padded`: the padded layout."""
        in_evals = eval_section(text)
        if in_evals is not None:
            body, n = in_evals
            return [i for t, ids in self._eval_tokens for i in ids if evals_ok(body + t, n, padded)] or None
        found = continuations(text, legal, padded)
        if found is None:
            return None
        rest, may_end = found
        ids = {i for r in rest for k in range(1, len(r) + 1) for i in self._ids.get(r[:k], ())}
        if may_end:
            ids.add(self.eos_id)
        return sorted(ids) if ids else None

    def __call__(self, prompts: Sequence[str]):
        """The processor for these prompts (rows of other prompts are not constrained)."""
        legal: list[set[str] | None] = []
        for p in prompts:
            fen = fen_of_prompt(p)
            legal.append(legal_moves(fen) if fen is not None and legal_moves(fen) else None)
        padded = [p.endswith("  ") for p in prompts]  # compact prompts end in one space (policy.prompt)

        def process(prompt_index: torch.Tensor, completion: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
            masked = None
            for row, (p, ids) in enumerate(zip(prompt_index.tolist(), completion.tolist())):
                if legal[p] is None:
                    continue
                text = self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
                allowed = self.allowed(text, legal[p], padded[p])
                if allowed is None:
                    continue
                if masked is None:
                    masked = logits.clone()
                keep = masked[row, allowed].clone()
                masked[row] = float("-inf")
                masked[row, allowed] = keep
            return logits if masked is None else masked

        return process
