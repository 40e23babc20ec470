"""The report page: `write_report` draws the plots and writes one self-contained HTML file.

Sections, the verdict first: a few held-out figures base -> final next to the random mover with
95% intervals, each change coloured by whether it is better for that figure (`verdict`), and the
match against the base where one was played; with a control run (`--against`), each run's final model
judged against the control's the same way; then the runs, their guard events, the training
curves (`report.plots`) and sample completions (`report.samples`); last, folded, every held-out
metric base -> final and the configs side by side.

Owns the HTML tables and the page. Imports no torch and no chess.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Sequence

from rookworld_rlvr.report.plots import make_plots
from rookworld_rlvr.report.runs import Run, load_run, series, unique_names
from rookworld_rlvr.report.markup import esc, fmt, html_page
from rookworld_rlvr.report.samples import samples_section
from rookworld_rlvr.tables import delta, flatten_metrics, fmt_delta, fmt_elo, number

LOWER_IS_BETTER = {"invalid", "reward_mae", "hit_max_tokens", "ended_illegal", "loss", "blunder", "repeated",
                   "repeated_candidates"}
NEUTRAL = {"n", "n_labelled", "games", "seconds", "ended_game_over", "ended_max_plies", "capped_batches"}


def direction(metric: str) -> int:
    """+1 when a higher value is better, -1 when lower is better, 0 for counts and for the random
    mover's baseline (no colour: it moves only with the positions it is paired with). Every share
    of illegal moves (`strength.illegal.*`, by kind) is lower-is-better."""
    if ".random." in metric:
        return 0
    if ".illegal." in metric and not metric.endswith(".n"):
        return -1
    last = metric.rsplit(".", 1)[-1]
    if last in LOWER_IS_BETTER:
        return -1
    return 0 if last in NEUTRAL else 1


def _delta_cell(metric: str, a: Any, b: Any) -> str:
    """A `<td>` with b - a, green when it moved the good way, red the bad way."""
    d = delta(a, b)
    if d is None:
        return '<td class="num">–</td>'
    good = d * direction(metric)
    cls = "num" + (" good" if good > 1e-12 else " bad" if good < -1e-12 else "")
    return f'<td class="{cls}">{fmt_delta(d)}</td>'


def _config_value(v: Any) -> str:
    if isinstance(v, str):
        return v
    return json.dumps(v, default=str)


def config_table(runs: Sequence[Run]) -> str:
    """key | value per run; with several runs the rows that differ are highlighted."""
    keys = list(dict.fromkeys(k for r in runs for k in r.config))
    if not keys:
        return '<p class="muted">No config.yaml.</p>'
    head = "".join(f"<th>{esc(r.name)}</th>" for r in runs) if len(runs) > 1 else "<th>value</th>"
    rows = []
    for k in keys:
        vals = [_config_value(r.config[k]) if k in r.config else "–" for r in runs]
        cls = ' class="differs"' if len(set(vals)) > 1 else ""
        rows.append(f"<tr{cls}><td><code>{esc(k)}</code></td>" + "".join(f"<td><code>{esc(v)}</code></td>"
                                                                          for v in vals) + "</tr>")
    note = '<p class="muted">Highlighted rows differ between runs.</p>' if len(runs) > 1 else ""
    return (f'{note}<table class="config"><thead><tr><th>key</th>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def _flat_numbers(result: dict | None) -> dict[str, Any]:
    if not isinstance(result, dict):
        return {}
    return {k: v for k, v in flatten_metrics(result).items() if number(v) is not None}


def eval_table(runs: Sequence[Run]) -> str:
    """metric | base | final | Δ for each run (base -> final of that run)."""
    pairs = [(_flat_numbers(r.base_eval), _flat_numbers(r.final_eval)) for r in runs]
    keys = list(dict.fromkeys(k for base, final in pairs for k in [*base, *final]))
    if not keys:
        return '<p class="muted">No evaluations (eval.jsonl / summary.json) yet.</p>'
    head = ""
    if len(runs) > 1:
        head = "<tr><th></th>" + "".join(f'<th colspan="3" class="run">{esc(r.name)}</th>' for r in runs) + "</tr>"
    head += "<tr><th>metric</th>" + '<th class="num">base</th><th class="num">final</th><th class="num">Δ</th>' \
        * len(runs) + "</tr>"
    rows = []
    for k in keys:
        cells = "".join(f'<td class="num">{esc(fmt(b.get(k)))}</td><td class="num">{esc(fmt(f.get(k)))}'
                        f"</td>{_delta_cell(k, b.get(k), f.get(k))}" for b, f in pairs)
        rows.append(f"<tr><td><code>{esc(k)}</code></td>{cells}</tr>")
    return f'<table class="eval"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'


def _ci_text(ci: tuple[float, float] | None) -> str:
    return f'<div class="muted small">{ci[0]:.3f} .. {ci[1]:.3f}</div>' if ci else ""


def match_line(match: dict) -> str:
    """The match of the final model against the base (match.json), in one sentence."""
    if not match or number(match.get("score")) is None:
        return ('<p class="muted">No match played. <code>rookworld match RUN/final BASE --games 200 --json '
                'RUN/match.json</code> adds one here.</p>')
    elo = (fmt_elo(match) if all(number(match.get(k)) is not None for k in ("elo", "elo_low", "elo_high")) else "")
    cls = "good" if (number(match.get("elo_low")) or 0) > 0 else "bad" if (number(match.get("elo_high")) or 0) < 0 \
        else "muted"
    verdict = {"good": "won beyond the noise", "bad": "lost beyond the noise", "muted": "within the noise"}[cls]
    return (f'<p>Match: <b>{esc(match.get("a"))}</b> against <b>{esc(match.get("b"))}</b>, {esc(match.get("games"))} '
            f'games, +{esc(match.get("wins"))} ={esc(match.get("draws"))} -{esc(match.get("losses"))}, score '
            f'{esc(fmt(match.get("score")))}, {esc(elo)}: <span class="{cls}">{verdict}</span>.</p>')


def _verdict_html(body: list[dict], left: str, right: str) -> str:
    """One verdict table: label, the two evaluations with their intervals, the random mover, the change
    with its 95% interval, and whether it is beyond the noise (coloured by whether it is better)."""
    trs = []
    for v in body:
        cls = {"better": "good", "worse": "bad"}.get(v["verdict"], "muted")
        change = "–" if v["change"] is None else f'{v["change"]:+.4f}'
        good = (v["change"] or 0) * v["better"]
        ccls = "num" + (" good" if good > 1e-12 and v["verdict"] == "better" else
                        " bad" if good < -1e-12 and v["verdict"] == "worse" else "")
        trs.append(f'<tr><td>{esc(v["label"])}</td><td class="num">{esc(fmt(v["base"]))}{_ci_text(v["base_ci"])}'
                   f'</td><td class="num">{esc(fmt(v["final"]))}{_ci_text(v["final_ci"])}</td>'
                   f'<td class="num">{esc(fmt(v["random"]))}</td><td class="{ccls}">{esc(change)}'
                   f'{_ci_text(v["change_ci"])}</td><td class="{cls}">{esc(v["verdict"] or "–")}</td></tr>')
    return (f'<table class="verdict"><thead><tr><th>held-out figure</th><th class="num">{esc(left)}</th>'
            f'<th class="num">{esc(right)}</th><th class="num">random mover</th><th class="num">change</th>'
            f'<th>verdict</th></tr></thead><tbody>{"".join(trs)}</tbody></table>')


VERDICT_NOTE = ('<p class="muted small">Under each figure its 95% interval; a change is better or worse only when its '
                'interval excludes 0.</p>')


def verdict_section(runs: Sequence[Run]) -> str:
    """Per run: the verdict table (base -> final) and the match against the base."""
    from rookworld_rlvr.verdict import rows as verdict_rows

    parts = []
    for r in runs:
        body = verdict_rows(r.base_eval, r.final_eval)
        title = f"<h3>{esc(r.name)}</h3>" if len(runs) > 1 else ""
        table = _verdict_html(body, "base", "final") if body else '<p class="muted">No held-out evaluation yet.</p>'
        parts.append(f"{title}{table}{match_line(r.match)}")
    return "".join(parts) + VERDICT_NOTE


def check_against(runs: Sequence[Run], control: Run) -> None:
    """A run is judged against a control item by item: both need a final evaluation, and where both
    fingerprinted a held-out section's items (`items_of`), the same items; and the control is another run.
    ValueError naming the run (and the section) otherwise."""
    for r in (control, *runs):
        if r.final_eval is None:
            raise ValueError(f"report --against: {r.path} has no held-out evaluation (eval.jsonl)")
    for r in runs:
        if Path(r.path).resolve() == Path(control.path).resolve():
            raise ValueError(f"report --against {control.path}: {r.path} is the control itself (a run judged against "
                             "itself changes nothing); give the control as its own run, say `rookworld train "
                             "--reward-signal false --output-dir runs/control`")
    for r in runs:
        for section, mine in r.final_eval.items():
            theirs = control.final_eval.get(section)
            if isinstance(mine, dict) and isinstance(theirs, dict) and mine.get("items_of") and \
                    theirs.get("items_of") and mine["items_of"] != theirs["items_of"]:
                raise ValueError(f"report --against {control.path}: {r.path} evaluated other {section} items than "
                                 "the control (another eval_data, eval_limit, ...): a run is judged against its "
                                 "control on the same held-out items")


def against_section(runs: Sequence[Run], control: Run) -> str:
    """Per run: the verdict of its final model against the control's final, paired over the same items."""
    from rookworld_rlvr.verdict import rows as verdict_rows

    parts = [f"<h3>{esc(r.name)}</h3>{_verdict_html(verdict_rows(control.final_eval, r.final_eval), control.name, r.name)}"
             for r in runs]
    return "".join(parts) + VERDICT_NOTE


def against_text(runs: Sequence[Run], control: Run) -> str:
    """The plain-text verdicts of `against_section`, for the terminal."""
    from rookworld_rlvr.verdict import verdict_table

    return "\n\n".join(f"verdict: {control.name} -> {r.name} (final against final, held-out, greedy)\n"
                        + verdict_table(control.final_eval, r.final_eval, (control.name, r.name)) for r in runs)


def _last_step(run: Run) -> Any:
    steps = [s for s in (number(r.get("step")) for r in run.metrics) if s is not None]
    return int(max(steps)) if steps else None


def _status(r: Run) -> str:
    if r.stop:
        return f"stopped by the guard at step {r.stop.get('step')}: {r.stop.get('signal')}"
    return "finished" if r.summary else "in progress (no summary.json)"


def runs_table(runs: Sequence[Run]) -> str:
    """One line per run: where it is, how far it got, its best evaluation step, what the guards did."""
    rows = []
    for r in runs:
        last_reward = series(r.metrics, "reward/mean")[1][-1:] or [None]
        recoveries = sum(e.get("action") == "recover" for e in r.events)
        rows.append(f"<tr><td>{esc(r.name)}</td><td><code>{esc(r.path)}</code></td>"
                    f'<td class="num">{esc(fmt(r.summary.get("steps", _last_step(r))))}</td>'
                    f'<td class="num">{esc(fmt(r.summary.get("best_step")))}</td>'
                    f'<td class="num">{len(r.evals)}</td><td class="num">{esc(fmt(last_reward[0]))}</td>'
                    f'<td class="num">{recoveries}</td><td>{esc(_status(r))}</td></tr>')
    return ('<table class="runs"><thead><tr><th>run</th><th>directory</th><th class="num">steps</th>'
            '<th class="num">best eval step</th><th class="num">evaluations</th><th class="num">last reward/mean</th>'
            f'<th class="num">guard recoveries</th><th>status</th></tr></thead><tbody>{"".join(rows)}</tbody></table>')


def events_table(runs: Sequence[Run]) -> str:
    """Every guard event of every run: what crossed which bound, and what the trainer did."""
    rows = []
    for r in runs:
        for e in r.events:
            action = "stopped the run" if e.get("action") == "stop" else (
                f"rolled back to step {e.get('to_step')}, LR x{e.get('lr_scale', 1):.3g}"
                + (f", beta x{e.get('beta_scale', 1):.3g}" if e.get("beta_scale", 1) != 1 else ""))
            rows.append(f"<tr><td>{esc(r.name)}</td><td class=\"num\">{esc(fmt(e.get('step')))}</td>"
                        f"<td><code>{esc(e.get('signal'))}</code></td><td class=\"num\">{esc(fmt(e.get('value')))}</td>"
                        f"<td class=\"num\">{esc(fmt(e.get('bound')))}</td>"
                        f"<td class=\"num\">{esc(fmt(e.get('reference')))}</td><td>{esc(action)}</td>"
                        f"<td>{esc(', '.join(e.get('also') or []))}</td></tr>")
    if not rows:
        return '<p class="muted">No guard event: no collapse signal crossed its bound, no non-finite step.</p>'
    return ('<table class="events"><thead><tr><th>run</th><th class="num">step</th><th>signal</th>'
            '<th class="num">value</th><th class="num">bound</th><th class="num">reference</th><th>action</th>'
            f'<th>also out of bounds</th></tr></thead><tbody>{"".join(rows)}</tbody></table>')


def plots_section(plots: Sequence[tuple[str, Path]], out_dir: Path) -> str:
    if not plots:
        return '<p class="muted">No plottable metrics.</p>'
    figs = "".join(f'<figure><img src="{esc(p.relative_to(out_dir).as_posix())}" alt="{esc(t)}" title="{esc(t)}">'
                   "</figure>" for t, p in plots)  # the title is drawn in the PNG
    return ('<p class="muted">Faint lines are per-step values; solid lines over them are trailing moving '
            f'averages (drawn only where a series is noisy).</p><div class="plots">{figs}</div>')


# -- samples ---------------------------------------------------------------------------------------




def render_html(runs: Sequence[Run], plots: Sequence[tuple[str, Path]], out_dir: Path,
                control: Run | None = None) -> str:
    names = ", ".join(r.name for r in runs)
    title = f"GRPO run {names}" if len(runs) == 1 else f"GRPO runs compared: {names}"
    sections = [
        ("Verdict: base → final, held out", verdict_section(runs)),
        *([(f"Verdict: against {control.name} (final against final, held out)", against_section(runs, control))]
          if control else []),
        ("Runs", runs_table(runs)),
        ("Guard events", events_table(runs)),
        ("Training curves", plots_section(plots, out_dir)),
        ("Sample completions (final evaluation)", samples_section(runs)),
    ]
    folded = [("Every held-out metric: base → final", eval_table(runs)), ("Config", config_table(runs))]
    body = "".join(f"<section><h2>{esc(h)}</h2>{content}</section>" for h, content in sections)
    body += "".join(f'<section><details><summary><h2 class="fold">{esc(h)}</h2></summary>{content}</details>'
                    "</section>" for h, content in folded)
    return html_page(title, body)


# -- entry points ----------------------------------------------------------------------------------


def default_out_dir(paths: Sequence[Path], names: Sequence[str]) -> Path:
    """The run itself for one run; `<parent of the first>/compare-<names>` for several."""
    if len(paths) == 1:
        return paths[0]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(names))[:120]
    return paths[0].resolve().parent / f"compare-{slug}"


def load_runs(run_dirs: Sequence[str]) -> list[Run]:
    """The runs, named by their directories (the parent added where two share a name)."""
    if not run_dirs:
        raise ValueError("report needs at least one run directory")
    paths = [Path(p) for p in run_dirs]
    return [load_run(p, n) for p, n in zip(paths, unique_names(paths))]


def load_control(against: str | None, runs: Sequence[Run]) -> Run | None:
    """The control run `against` names, checked against `runs` (`check_against`); None without one."""
    if not against:
        return None
    control = load_run(against, Path(against).resolve().name)
    check_against(runs, control)
    return control


def write_report(run_dirs: list[str], out_dir: str | None = None) -> Path:
    """Plots into `<out>/plots/` and `<out>/report.html`; returns the HTML path."""
    return write_loaded(load_runs(run_dirs), out_dir)


def write_loaded(runs: Sequence[Run], out_dir: str | None = None, control: Run | None = None) -> Path:
    """`write_report` of runs (and a control) already loaded."""
    paths = [r.path for r in runs]
    out = Path(out_dir) if out_dir else default_out_dir(paths, [r.name for r in runs])
    out.mkdir(parents=True, exist_ok=True)
    plots = make_plots(runs, out / "plots")
    from rookworld_rlvr.data.io import atomic_write_text

    page = out / "report.html"
    atomic_write_text(page, [render_html(runs, plots, out, control)])
    return page
