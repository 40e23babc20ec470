"""The verdict of a run: a few held-out figures, base -> final next to the random mover, each
with its 95% interval and whether the change is beyond the noise.

Owns which figures open the run's final table and its report, which way is better for each,
and the intervals: Wilson's for a share, and for a change of a share the paired interval where
both evaluations kept their per-item outcomes (`NAME_items`) of the same items (their
`items_of` fingerprints agree): base and final answer the same held-out items and most keep
their answer, so the noise of the change is that of the items that changed (Agresti and Min's
interval for matched pairs); else the unpaired normal interval of the difference (wider: it
ignores that pairing). A ratio to the random mover's figure (expected-score loss, blunders)
changes within a bootstrap interval that resamples the same positions for both where both kept
their per-position figures, else the two intervals' half-widths in quadrature (unpaired). Those
ratios count each model's own legal moves; two more rows judge move quality on the positions where
both moved legally, so that a change in which positions are counted is not read as better or worse moves.

Pure Python: imports no torch, no chess and nothing else of the package but `tables`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from rookworld_rlvr.tables import fmt_number, number, render

Z95 = 1.959964


@dataclass(frozen=True)
class Headline:
    """One verdict row: where the figure is in an evaluation, its label, which way is better
    (+1 higher, -1 lower), where the number of items is, and the random mover's figure."""

    key: str
    label: str
    better: int = 1
    n_key: str | None = None
    random_key: str | None = None
    random_value: float | None = None
    ratio_items: tuple[str, str] | None = None  # per-position model and random-mover figures of a ratio figure
    unless: str | None = None  # a figure measuring the same, better: where either evaluation has it, no row


HEADLINES = (
    Headline("puzzles.check.solved", "legal best move, side to move in check", 1, "puzzles.check.n",
             random_value=1.0),
    Headline("strength.legal", "legal best move (judged positions)", 1, "strength.n", random_value=1.0),
    # without judged positions (strength_data null), the held-out P: samples' legality stands in for it
    Headline("policy.legal_best", "legal best move (held-out P: samples)", 1, "policy.n", random_value=1.0,
             unless="strength.legal"),
    Headline("strength.slices.not_in_check.legal", "legal best move, judged positions out of check", 1,
             "strength.slices.not_in_check.n", random_value=1.0),
    Headline("strength.slices.king_can_step_into_check.legal",
             "legal best move, out of check where a king move would step into check", 1,
             "strength.slices.king_can_step_into_check.n", random_value=1.0),
    Headline("strength.loss_below_random", "expected-score loss below the random mover's", 1, random_value=0.0,
             ratio_items=("strength.loss_items", "strength.random_loss_items")),
    Headline("strength.blunder_below_random", "blunders below the random mover's", 1, random_value=0.0,
             ratio_items=("strength.blunder_items", "strength.random_blunder_items")),
    Headline("strength.best", "Stockfish's best move", 1, "strength.n", "strength.random.best"),
    Headline("puzzles.mate1.solved", "mate in one", 1, "puzzles.mate1.n", "puzzles.mate1.random.solved"),
    Headline("puzzles.tactic.solved", "tactics", 1, "puzzles.tactic.n", "puzzles.tactic.random.solved"),
    Headline("environment.next_state_acc", "A: next state exact", 1, "environment.n"),
    Headline("histories.slices.history_1.next_state_acc", "A: next state, game start (1-move history)", 1,
             "histories.slices.history_1.n"),
    Headline("histories.slices.history_2_9.next_state_acc", "A: next state, 2-9 moves of history", 1,
             "histories.slices.history_2_9.n"),
    Headline("environment.slices.game_ending.next_state_acc", "A: next state, game-ending moves", 1,
             "environment.slices.game_ending.n"),
    Headline("environment.slices.illegal.next_state_acc", "A: next state, illegal moves", 1,
             "environment.slices.illegal.n"),
    Headline("selfplay.mean_legal_half_moves", "self-play legal half-moves", 1),
)


def get(result: dict | None, key: str) -> Any:
    """The value at a dotted key of a nested result, None where any part is missing."""
    node: Any = result
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def figure_problem(value: Any, key: str) -> tuple[str, str] | None:
    """The first key at or under `key` that is not what the verdict reads, and what it must be: every figure a number
    or null, every list one of them, `items_of` text."""
    if isinstance(value, dict):
        return next((p for k, v in value.items() if (p := figure_problem(v, f"{key}.{k}"))), None)
    if key.endswith(".items_of"):
        ok, want = isinstance(value, str), "text"
    elif isinstance(value, list):
        ok, want = all(v is None or number(v) is not None for v in value), "a list of numbers or nulls"
    else:
        ok, want = value is None or number(value) is not None, "a number or null"
    return None if ok else (key, f"must be {want}, got {value!r}"[:200])


def check_evaluation(result: Any) -> None:
    """An evaluation as `rookworld eval --json` writes it, or a ValueError naming the first key that is not what
    the verdict reads (`figure_problem`, outside `meta`); `meta` a mapping, its `config` one too (a hand-edited or
    damaged file, caught before the evaluation's minutes)."""
    if not isinstance(result, dict) or not isinstance(result.get("meta"), dict):
        raise ValueError("not the JSON of an evaluation (`rookworld eval --json` writes one): it has no 'meta'")
    if not isinstance(result["meta"].get("config", {}), dict):
        raise ValueError(f"'meta.config' must be a mapping of settings, got {result['meta']['config']!r}"[:200])
    for name, section in result.items():
        if name != "meta" and (found := figure_problem(section, name)):
            raise ValueError(f"'{found[0]}' {found[1]}")


def _score_test_interval(score: float, draw_share: float, n: int) -> tuple[float, float]:
    """The true scores q with (score - q)^2 <= Z95^2 (q (1 - q) - draw_share / 4) / n: Wilson's test
    inverted, a game's variance at q with a share `draw_share` of draws (0: a share of n items)."""
    k = Z95 ** 2 / n
    a, b, c = 1 + k, -(2 * score + k), score * score + k * draw_share / 4
    half = math.sqrt(max(0.0, b * b - 4 * a * c)) / (2 * a)
    centre = -b / (2 * a)
    return max(0.0, centre - half), min(1.0, centre + half)


def wilson(p: float, n: int) -> tuple[float, float]:
    """Wilson's 95% interval of a share p observed on n items."""
    return _score_test_interval(p, 0.0, n)


def score_interval(score: float, draw_share: float, n: int) -> tuple[float, float]:
    """95% interval of the mean score of n games scored 1, 1/2 or 0, a share `draw_share` of them
    drawn: Wilson's test inverted with a game's variance at a true score q, q(1 - q) - draw_share/4
    (the draws held at their observed share). Without draws it is Wilson's interval; unlike the
    normal approximation it stays honest near a sweep (8 wins in 10 is no proof of the better side).
    Every game drawn leaves no variance to invert, so that case is Wilson's at the score."""
    return wilson(score, n) if draw_share >= 1.0 else _score_test_interval(score, draw_share, n)


def interval(result: dict | None, h: Headline) -> tuple[float, float] | None:
    """The 95% interval of a headline figure: its bootstrap `_ci` where the result has one,
    Wilson's for a share with a known n, else None."""
    ci = get(result, h.key + "_ci")
    if isinstance(ci, dict) and number(ci.get("low")) is not None and number(ci.get("high")) is not None:
        return float(ci["low"]), float(ci["high"])
    value, n = number(get(result, h.key)), number(get(result, h.n_key)) if h.n_key else None
    if value is None or n is None or n < 1 or not 0 <= value <= 1:
        return None
    return wilson(value, int(n))


def paired_interval(before: list, after: list) -> tuple[float, float] | None:
    """95% interval of mean(after) - mean(before) for 0/1 outcomes of the same items, in order
    (Agresti and Min 2005: the Wald interval of matched pairs with half a count added to each
    of the four cells, which keeps its coverage when few items changed). None unless both are
    0/1 lists of one positive length."""
    n = len(before)
    if not n or len(after) != n or not all(x in (0, 1) for x in [*before, *after]):
        return None
    gained = sum(1 for x, y in zip(before, after) if y > x) + 0.5
    lost = sum(1 for x, y in zip(before, after) if x > y) + 0.5
    m = n + 2.0  # the four cells, half a count each
    d = (gained - lost) / m
    half = Z95 * math.sqrt(max(0.0, (gained + lost) / m - d * d) / m)
    return d - half, d + half


def _below(model: list, random_: list, idx: list[int]) -> float | None:
    """1 - sum(model) / sum(random_) over the positions of `idx` where the model moved (not None)."""
    m = r = 0.0
    for i in idx:
        if model[i] is not None and random_[i] is not None:
            m += model[i]
            r += random_[i]
    return 1.0 - m / r if r else None


def paired_ratio_interval(before: list, after: list, random_: list, resamples: int = 1000,
                          seed: int = 0) -> tuple[float, float] | None:
    """95% interval of the change of a ratio below the random mover (1 - model / random over the
    positions where the model moved legally; None where it did not), from a bootstrap that
    resamples the same positions for both evaluations (percentile, fixed seed). None unless all
    three lists have one length of 2 or more."""
    n = len(random_)
    if n < 2 or len(before) != n or len(after) != n:
        return None
    rng = random.Random(seed)
    changes = []
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        a, b = _below(before, random_, idx), _below(after, random_, idx)
        if a is not None and b is not None:
            changes.append(b - a)
    if not changes:
        return None
    changes.sort()
    return changes[int(0.025 * (len(changes) - 1))], changes[int(0.975 * (len(changes) - 1))]


def items_of(result: dict | None, key: str) -> str | None:
    """The fingerprint of the items behind a figure: the nearest `items_of` on its dotted path
    (a slice's items are drawn from its section's, in order)."""
    parts = key.split(".")
    for i in range(len(parts) - 1, 0, -1):
        found = get(result, ".".join(parts[:i] + ["items_of"]))
        if isinstance(found, str):
            return found
    return None


def _paired(base: dict | None, final: dict | None, h: Headline) -> tuple[float, float] | None:
    """The paired interval of a headline's change where both evaluations kept its items and
    scored the same items (their fingerprints agree)."""
    of = items_of(base, h.key)
    if of is None or of != items_of(final, h.key):
        return None
    if h.ratio_items:
        model, rand = h.ratio_items
        before, after, r = get(base, model), get(final, model), get(base, rand)
        if isinstance(before, list) and isinstance(after, list) and isinstance(r, list):
            return paired_ratio_interval(before, after, r)
        return None
    before, after = get(base, h.key + "_items"), get(final, h.key + "_items")
    if isinstance(before, list) and isinstance(after, list):
        return paired_interval(before, after)
    return None


def change_interval(base: dict | None, final: dict | None, h: Headline) -> tuple[float, float] | None:
    """95% interval of final - base: paired over the items where both evaluations kept them
    (`NAME_items`, or a ratio's `ratio_items`), else the half-widths of the two intervals in
    quadrature around the change (see the module doc)."""
    if paired := _paired(base, final, h):
        return paired
    a, b = number(get(base, h.key)), number(get(final, h.key))
    ia, ib = interval(base, h), interval(final, h)
    if a is None or b is None or ia is None or ib is None:
        return None
    half = math.hypot((ia[1] - ia[0]) / 2, (ib[1] - ib[0]) / 2)
    return b - a - half, b - a + half


def verdict_of(ci: tuple[float, float] | None, better: int) -> str:
    """better | worse (the change's 95% interval `ci` beyond 0, `better` saying which way is
    better) | within noise | '' (no interval)."""
    if ci is None:
        return ""
    if ci[0] > 0 or ci[1] < 0:
        return "better" if (ci[0] > 0) == (better > 0) else "worse"
    return "within noise"


def judge(base: dict | None, final: dict | None, h: Headline) -> str:
    """The verdict of a headline's change from base to final (see verdict_of)."""
    return verdict_of(change_interval(base, final, h), h.better)


def _mean_interval(xs: list[float]) -> tuple[float, float]:
    """The normal 95% interval of a mean."""
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / max(1, len(xs) - 1))
    return m - Z95 * sd / math.sqrt(len(xs)), m + Z95 * sd / math.sqrt(len(xs))


def _paired_mean_interval(before: list[float], after: list[float], resamples: int = 1000,
                          seed: int = 0) -> tuple[float, float]:
    """Bootstrap 95% interval of mean(after) - mean(before) over the same items (percentile, fixed seed)."""
    rng, n = random.Random(seed), len(before)
    changes = sorted(sum(after[i] - before[i] for i in idx) / n
                     for idx in ([rng.randrange(n) for _ in range(n)] for _ in range(resamples)))
    return changes[int(0.025 * (resamples - 1))], changes[int(0.975 * (resamples - 1))]


def both_legal_rows(base: dict | None, final: dict | None) -> list[dict[str, Any]]:
    """Move quality on the judged positions where both evaluations moved legally, with the random
    mover's on the same positions. The ratio rows count each model's own legal moves, so a model that
    turns hard positions legal is judged on harder ones (and one that plays illegally there, on easier
    ones); these rows compare the two on the same positions, paired."""
    key = "strength.loss_items"
    if items_of(base, key) is None or items_of(base, key) != items_of(final, key):
        return []
    names = ("loss", "blunder", "random_loss", "random_blunder")  # per position; the random mover's from base's
    mine = {(n, who): get(ev, f"strength.{n}_items")
            for n in names[:2] for who, ev in (("base", base), ("final", final))}
    theirs = {n: get(base, f"strength.{n}_items") for n in names[2:]}
    lists = [*mine.values(), *theirs.values()]
    if not all(isinstance(x, list) for x in lists) or len({len(x) for x in lists}) != 1:
        return []
    idx = [i for i in range(len(lists[0])) if all(x[i] is not None for x in lists)]
    if len(idx) < 2:
        return []
    out = []
    for f, label in (("loss", "expected-score loss per move"), ("blunder", "blunders (a loss of 0.2 or more)")):
        b, a, rand = ([x[i] for i in idx] for x in (mine[f, "base"], mine[f, "final"], theirs[f"random_{f}"]))
        ci_of = _mean_interval if f == "loss" else (lambda xs: wilson(sum(xs) / len(xs), len(xs)))
        ci = _paired_mean_interval(b, a) if f == "loss" else paired_interval(b, a)
        out.append({"key": f"strength.both_legal.{f}", "label": f"{label}, where both moved legally ({len(idx)} "
                    "judged positions)", "better": -1, "base": sum(b) / len(b), "final": sum(a) / len(a),
                    "base_ci": ci_of(b), "final_ci": ci_of(a), "random": sum(rand) / len(rand),
                    "change": (sum(a) - sum(b)) / len(b), "change_ci": ci, "verdict": verdict_of(ci, -1)})
    return out


def rows(base: dict | None, final: dict | None) -> list[dict[str, Any]]:
    """The verdict rows present in either evaluation, as plain values (for tables and HTML)."""
    out = []
    for h in HEADLINES:
        a, b = number(get(base, h.key)), number(get(final, h.key))
        if (a is None and b is None) or (h.unless and (get(base, h.unless), get(final, h.unless)) != (None, None)):
            continue
        rand = number(get(final if final is not None else base, h.random_key)) if h.random_key else h.random_value
        ci = change_interval(base, final, h)  # once: a paired ratio's bootstrap takes a fraction of a second
        out.append({"key": h.key, "label": h.label, "better": h.better, "base": a, "final": b,
                    "base_ci": interval(base, h), "final_ci": interval(final, h), "random": rand,
                    "change": None if a is None or b is None else b - a,
                    "change_ci": ci, "verdict": verdict_of(ci, h.better)})
        if h.key == "strength.blunder_below_random":
            out += both_legal_rows(base, final)
    return out


def unpaired_sections(base: dict | None, final: dict | None) -> list[str]:
    """The sections both evaluations hold but over other items (their `items_of` differ): their changes get the
    unpaired, wider intervals."""
    out = []
    for name in ("policy", "environment", "histories", "strength", "puzzles"):
        a, b = get(base, f"{name}.items_of"), get(final, f"{name}.items_of")
        if isinstance(a, str) and isinstance(b, str) and a != b:
            out.append(name)
    return out


def fmt_ci(value: float | None, ci: tuple[float, float] | None) -> str:
    if value is None:
        return "-"
    return fmt_number(value) + (f" ({ci[0]:.3f} .. {ci[1]:.3f})" if ci else "")


def headline_table(result: dict | None, name: str = "model") -> str:
    """One evaluation's verdict figures, each with its 95% interval, beside the random legal mover's on the
    same items (`rookworld eval` ends with it): label | the model | random mover."""
    body = [r for r in rows(result, None) if r["base"] is not None]
    if not body:
        return "(no held-out figures)"
    table = [["held-out figure (95% CI)", name, "random mover"]]
    table += [[r["label"], fmt_ci(r["base"], r["base_ci"]), fmt_number(r["random"])] for r in body]
    return render(table)


def verdict_table(base: dict | None, final: dict | None, names: tuple[str, str] = ("base", "final")) -> str:
    """The plain-text verdict: label | base | final | random mover | change (95% CI) | verdict; `names`
    head the two evaluations' columns (a run judged against its control: the control's, the run's)."""
    body = rows(base, final)
    if not body:
        return "(no held-out figures)"
    table = [["held-out figure (95% CI)", *names, "random mover", "change", "verdict"]]
    for r in body:
        change = "-" if r["change"] is None else f"{r['change']:+.4f}" + (
            f" ({r['change_ci'][0]:+.3f} .. {r['change_ci'][1]:+.3f})" if r["change_ci"] else "")
        table.append([r["label"], fmt_ci(r["base"], r["base_ci"]), fmt_ci(r["final"], r["final_ci"]),
                      fmt_number(r["random"]), change, r["verdict"] or "-"])
    return render(table)
