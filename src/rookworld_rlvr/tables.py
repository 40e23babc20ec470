"""Numbers as text: the one number format, and metric tables (plain text; the report's HTML
uses the same formats).

Owns how a metric prints (`fmt_number`, `fmt_delta`) and how a nested evaluation result flattens
into `section.metric` rows (`flatten_metrics`). Pure Python: imports no torch, no chess and
nothing else of the package.
"""

from __future__ import annotations

import math
from typing import Any

SECTIONS = ("strength", "puzzles", "policy", "environment", "selfplay")
NOT_METRICS = ("examples", "meta")  # sections that the tables skip
NOT_SHOWN = ("items_of",)  # keys that are no figures: a fingerprint of the items an evaluation scored (verdict)


def number(v: Any) -> float | None:
    """v as a float when it is a number (not a bool), else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def fmt_number(v: Any, missing: str = "-") -> str:
    """Four decimals; very small or large floats in 3 significant digits; ints, text and
    non-finite values as they are; `missing` for None."""
    if v is None:
        return missing
    if isinstance(v, float) and math.isfinite(v):
        return f"{v:.3g}" if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3) else f"{v:.4f}"
    return str(v)


def delta(a: Any, b: Any) -> int | float | None:
    """b - a for two finite numbers (an int when both are ints), else None."""
    x, y = number(a), number(b)
    if x is None or y is None or not (math.isfinite(x) and math.isfinite(y)):
        return None
    return b - a if isinstance(a, int) and isinstance(b, int) else y - x


def fmt_delta(d: int | float | None, missing: str = "-") -> str:
    """A signed change: +3 for ints, +0.0123 for floats."""
    if d is None:
        return missing
    return f"{d:+d}" if isinstance(d, int) else f"{d:+.4f}"


def fmt_elo(match: dict) -> str:
    """A match's Elo and its 95% interval. Where one side scored every point the estimate is no
    number (Elo is infinite there; `play.elo_interval` moves the score half a game inward), so only
    the interval's finite end is said: "Elo -7 or lower" after four losses."""
    elo, low, high = (round(match[k]) for k in ("elo", "elo_low", "elo_high"))
    if match.get("score") == 0:
        return f"Elo {high:+d} or lower (95% CI; every game lost)"
    if match.get("score") == 1:
        return f"Elo {low:+d} or higher (95% CI; every game won)"
    return f"Elo {elo:+d} (95% CI {low:+d} .. {high:+d})"


def flatten_metrics(results: dict) -> dict[str, Any]:
    """`section.metric` (and `section.components.name`) -> value, skipping examples, meta, per-item lists
    and the items' fingerprints."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, d: dict) -> None:
        for k, v in d.items():
            if isinstance(v, dict):
                walk(f"{prefix}{k}.", v)
            elif k in NOT_SHOWN:
                continue
            elif v is None or number(v) is not None or isinstance(v, str):
                flat[f"{prefix}{k}"] = v

    known = [s for s in SECTIONS if s in results] + [s for s in results if s not in SECTIONS and s not in NOT_METRICS]
    for section in known:
        if isinstance(results[section], dict):
            walk(f"{section}.", results[section])
    return flat


def render(rows: list[list[str]], numeric_from: int = 1) -> str:
    """Columns padded to their widest cell, ' | ' between, numbers right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for j, row in enumerate(rows):
        cells = [c.ljust(w) if i < numeric_from else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append(" | ".join(cells).rstrip())
        if j == 0:
            lines.append("-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def format_table(results: dict) -> str:
    """A plain-text table: one line per metric (`policy.best_acc | 0.1660`); empty tasks show only n."""
    empty = [f"{k}." for k, v in results.items() if isinstance(v, dict) and v.get("n") == 0]
    flat = {k: v for k, v in flatten_metrics(results).items()
            if not k.startswith(tuple(empty)) or k.endswith(".n")}
    if not flat:
        return "(no metrics)"
    return render([["metric", "value"]] + [[k, fmt_number(v)] for k, v in flat.items()])


def compare_table(base: dict, final: dict) -> str:
    """`metric | base | final | delta` for every numeric metric present in either result."""
    a, b = flatten_metrics(base), flatten_metrics(final)
    keys = list(a) + [k for k in b if k not in a]
    keys = [k for k in keys if number(a.get(k)) is not None or number(b.get(k)) is not None]
    if not keys:
        return "(no numeric metrics)"
    rows = [["metric", "base", "final", "delta"]]
    rows += [[k, fmt_number(a.get(k)), fmt_number(b.get(k)), fmt_delta(delta(a.get(k), b.get(k)))] for k in keys]
    return render(rows)
