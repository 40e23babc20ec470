"""Sample completions in the report: the board with arrows, the prompt, the answer and its reward.

Owns the sample cards of the report page (their HTML). Reads the chess rules through
`tasks.strength` and the P: answer through `tasks.policy`; imports no torch.
"""

from __future__ import annotations

from typing import Any, Sequence

from rookworld_rlvr.report.runs import Run
from rookworld_rlvr.report.markup import esc, fmt
from rookworld_rlvr.tables import number
from rookworld_rlvr.tasks import policy as pol_task
from rookworld_rlvr.tasks.strength import is_legal

BEST_COLOR, MODEL_COLOR, ILLEGAL_COLOR = "#2e7d32cc", "#1565c0cc", "#c62828cc"


def _arrow(uci: Any, color: str):
    """A chess.svg arrow for a UCI string (legal or not, so illegal A: moves show); None for non-moves."""
    import chess
    import chess.svg

    try:
        move = chess.Move.from_uci(str(uci))
    except ValueError:
        return None
    if move.from_square == move.to_square:
        return None
    return chess.svg.Arrow(move.from_square, move.to_square, color=color)


def _board_arrows(task: str, board, example: dict) -> tuple[list, str]:
    """Arrows and a caption: P: best move (green) and the model's B: (blue); A: the move (red if illegal)."""
    truth = example.get("truth") or {}
    side = "White" if board.turn else "Black"
    if task == "environment":
        move = truth.get("move")
        legal = is_legal(board, move)
        arrow = _arrow(move, BEST_COLOR if legal else ILLEGAL_COLOR)
        note = "" if legal else " (illegal)"
        return [a for a in (arrow,) if a], f"{side} to move · arrow: {move}{note}"
    best = (truth.get("best") or [None])[0]
    mine = pol_task.parse_completion(str(example.get("completion", ""))).move
    arrows = [_arrow(best, BEST_COLOR)] if best else []
    caption = f"{side} to move · green: best {best}"
    if mine and mine != best and is_legal(board, mine):
        arrows.append(_arrow(mine, MODEL_COLOR))
        caption += f" · blue: model {mine}"
    elif mine == best:
        caption += " (model agrees)"
    else:
        caption += f" · model: {mine or 'no B:'}{' (illegal)' if mine else ''}"
    return [a for a in arrows if a], caption


def board_svg(task: str, example: dict) -> str:
    """Inline SVG of the position before the move, or a note when the FEN cannot be drawn."""
    import chess
    import chess.svg

    fen = (example.get("truth") or {}).get("fen")
    try:
        board = chess.Board(fen)
    except (ValueError, TypeError):
        return f'<p class="muted">no board: FEN {esc(fen)} is not drawable</p>'
    arrows, caption = _board_arrows(task, board, example)
    svg = chess.svg.board(board, size=240, arrows=arrows)
    return f'{svg}<div class="caption">{esc(caption)}</div>'


def _truth_text(truth: dict, prompt: str) -> str:
    """`key: value` lines of the truth, leaving out what the prompt already shows (FEN, move, history)."""
    lines = []
    for k, v in truth.items():
        if k == "history" or (isinstance(v, str) and v and v in prompt):
            continue
        if isinstance(v, list):
            v = " ".join(str(x) for x in v)
        elif isinstance(v, bool):
            v = str(v).lower()
        lines.append(f"{k}: {v}")
    return "\n".join(lines)


def _components(example: dict) -> str:
    comps = example.get("components") or {}
    if not isinstance(comps, dict) or not comps:
        return ""
    cells = "".join(f'<span class="comp">{esc(k)} <b>{esc(fmt(v))}</b></span>' for k, v in comps.items())
    return f'<div class="comps">{cells}</div>'


def sample_card(task: str, example: dict) -> str:
    """Board, prompt, completion, truth, reward and components of one evaluation example."""
    prompt = str(example.get("prompt", ""))
    truth = example.get("truth") if isinstance(example.get("truth"), dict) else {}
    correct = example.get("correct")
    mark = "" if correct is None else (' <span class="good">✓ correct</span>' if correct
                                       else ' <span class="bad">✗ not exact</span>')
    notes = example.get("notes") or []
    notes_html = f'<div class="muted small">{esc("; ".join(map(str, notes)))}</div>' if notes else ""
    return (f'<div class="sample"><div class="board">{board_svg(task, {**example, "truth": truth})}</div>'
            f'<div class="text"><div class="label">prompt</div><pre>{esc(prompt)}</pre>'
            f'<div class="label">completion</div><pre class="completion">{esc(example.get("completion", ""))}</pre>'
            f'<div class="label">truth</div><pre class="truth">{esc(_truth_text(truth, prompt))}</pre>'
            f'<div class="reward">reward <b>{esc(fmt(number(example.get("reward"))))}</b>{mark}</div>'
            f"{_components(example)}{notes_html}</div></div>")


def _examples_eval(run: Run) -> dict | None:
    """The final evaluation, or the latest one that kept examples."""
    for result in [run.final_eval, *reversed(run.evals)]:
        if isinstance(result, dict) and isinstance(result.get("examples"), dict):
            return result
    return None


def samples_section(runs: Sequence[Run]) -> str:
    parts = []
    for run in runs:
        result = _examples_eval(run)
        prefix = f"{run.name}: " if len(runs) > 1 else ""
        if result is None:
            parts.append(f'<h3>{esc(prefix)}no examples</h3><p class="muted">The evaluations kept no examples.</p>')
            continue
        for task, label in (("policy", "policy (P:)"), ("environment", "environment (A:)")):
            examples = [x for x in result["examples"].get(task) or [] if isinstance(x, dict)]
            if examples:
                parts.append(f"<h3>{esc(prefix + label)} · step {esc(result.get('step', '?'))}</h3>")
                parts += [sample_card(task, x) for x in examples]
    return "".join(parts)
