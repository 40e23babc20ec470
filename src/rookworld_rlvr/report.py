"""`rookworld report RUN [RUN ...]`: PNG plots and a self-contained HTML page of GRPO runs.

A run directory holds `metrics.jsonl` (one record per optimizer step, required),
`eval.jsonl` (one evaluation per line, base model first), `summary.json` and `config.yaml`
(all optional: a run still in progress has only some of them). Several runs are overlaid
(one line per run) so runs with different configs can be compared at a glance.

Robustness rules, because a report is most useful for broken runs: a missing key skips that
plot, NaN values are dropped from lines (the panel title says how many), a half-written last
JSONL line is ignored, and an undrawable FEN leaves out only its board.

matplotlib is imported inside functions so `rookworld --help` stays fast; figures are drawn
with the Agg canvas directly (no pyplot, no global backend state).
"""

from __future__ import annotations

import argparse
import html
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from rookworld_rlvr.tasks.rewards import ENV_COMPONENTS, POLICY_COMPONENTS

# -- loading ---------------------------------------------------------------------------------------


@dataclass
class Run:
    """Everything the report reads from one run directory."""

    path: Path
    name: str
    metrics: list[dict]
    evals: list[dict] = field(default_factory=list)
    config: dict = field(default_factory=dict)
    summary: dict = field(default_factory=dict)
    events: list[dict] = field(default_factory=list)  # guard events (events.jsonl): recoveries and stops

    @property
    def stop(self) -> dict | None:
        """The guard event that stopped the run, if one did."""
        return next((e for e in reversed(self.events) if e.get("action") == "stop"), None)

    @property
    def base_eval(self) -> dict | None:
        """The base model's evaluation: summary.json, else the first eval.jsonl line."""
        return self.summary.get("base") or (self.evals[0] if self.evals else None)

    @property
    def final_eval(self) -> dict | None:
        """The last evaluation: summary.json, else the last eval.jsonl line (a run in progress)."""
        return self.summary.get("final") or (self.evals[-1] if self.evals else None)


def _read_jsonl(path: Path) -> list[dict]:
    """JSON objects, one a line; a bad line is skipped (a live run may be mid-write)."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        return {}
    import yaml

    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return {str(k): v for k, v in data.items()} if isinstance(data, dict) else {}


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def load_run(path: str | Path, name: str | None = None) -> Run:
    """Read a run directory; FileNotFoundError naming the path when metrics.jsonl is missing."""
    path = Path(path)
    metrics_path = path / "metrics.jsonl"
    if not metrics_path.is_file():
        what = "no such directory" if not path.is_dir() else "no metrics.jsonl (not a training run directory?)"
        raise FileNotFoundError(f"{metrics_path}: {what}")
    return Run(path=path, name=name or path.resolve().name, metrics=_read_jsonl(metrics_path),
               evals=_read_jsonl(path / "eval.jsonl"), config=_read_yaml(path / "config.yaml"),
               summary=_read_json(path / "summary.json"), events=_read_jsonl(path / "events.jsonl"))


def _unique_names(paths: Sequence[Path]) -> list[str]:
    """Directory names, with the parent added where two runs share a name (legends must differ)."""
    names = [p.resolve().name for p in paths]
    return [f"{p.resolve().parent.name}/{n}" if names.count(n) > 1 else n for p, n in zip(paths, names)]


# -- series ----------------------------------------------------------------------------------------


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def series(records: Sequence[dict], key: str) -> tuple[list[float], list[float], int]:
    """(steps, finite values, number of non-finite values dropped) of `key`; absent records are skipped."""
    xs, ys, dropped = [], [], 0
    for i, rec in enumerate(records):
        v = _number(rec.get(key))
        if v is None:
            continue
        if not math.isfinite(v):
            dropped += 1
            continue
        x = _number(rec.get("step"))
        xs.append(x if x is not None else float(i + 1))
        ys.append(v)
    return xs, ys, dropped


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over up to `window` points (shorter at the start, so the line starts at step 1)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def is_noisy(values: Sequence[float]) -> bool:
    """Step-to-step jumps large against the range: a smoothed line then shows the trend."""
    if len(values) < 8:
        return False
    span = max(values) - min(values)
    if span <= 0:
        return False
    jumps = sorted(abs(b - a) for a, b in zip(values, values[1:]))
    return jumps[len(jumps) // 2] > 0.05 * span


def smoothing_window(n: int) -> int:
    return max(3, min(50, n // 10))


def _eval_records(evals: Sequence[dict]) -> list[dict]:
    """Flat `section.metric` records with their step, so evaluations plot like metrics."""
    from rookworld_rlvr.evaluate import flatten_metrics

    return [{"step": e.get("step", i), **flatten_metrics(e)} for i, e in enumerate(evals)]


# -- plots -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Panel:
    """One subplot: the keys drawn as lines (key, legend label)."""

    title: str
    lines: tuple[tuple[str, str], ...]
    ylabel: str = ""


@dataclass(frozen=True)
class PlotSpec:
    """One figure (one PNG) of stacked panels sharing the step axis."""

    name: str
    title: str
    panels: tuple[Panel, ...]
    source: str = "metrics"  # "metrics" (per step, smoothed when noisy) or "eval" (sparse, markers)


PHASES = ("generate", "score", "reference", "old", "policy", "optimizer", "other")
TASK_LABELS = {"P": "policy (P:)", "A": "environment (A:)"}

STATIC_PLOTS = (
    PlotSpec("reward", "Reward per task", (
        Panel("mean reward", (("reward/mean", "all"), ("reward/P", "P:"), ("reward/A", "A:")), "reward"),
        Panel("valid completions", (("valid/P", "P:"), ("valid/A", "A:")), "share"),
    )),
    PlotSpec("kl", "KL to the reference and β", (
        Panel("mean KL per token", (("kl_mean", "mean"),), "KL"),
        Panel("max KL per token (own panel: it dwarfs the mean)", (("kl_max", "max"),), "KL"),
        Panel("β (KL coefficient)", (("beta", "β"),), "β"),
    )),
    PlotSpec("entropy", "Policy entropy", (Panel("entropy", (("entropy", "entropy"),), "nats/token"),)),
    PlotSpec("clip", "Clipped ratio share", (
        Panel("clip fraction", (("clip_frac", "total"), ("clip_low", "low"), ("clip_high", "high")), "share"),
    )),
    PlotSpec("grad_norm", "Gradient norm", (Panel("grad norm (before clipping)", (("grad_norm", "grad norm"),),
                                                  "L2 norm"),)),
    PlotSpec("lengths", "Completion lengths and truncation", (
        Panel("completion length", (("completion_len/mean", "mean"), ("completion_len/max", "max")), "tokens"),
        Panel("truncation rate", (("truncation_rate", "hit max tokens"),), "share"),
    )),
    PlotSpec("eval", "Greedy evaluation over training", (
        Panel("policy (P:)", (("policy.legal_best", "legal B:"), ("policy.best_acc", "best acc"),
                              ("policy.mean_reward", "mean reward")), "share / reward"),
        Panel("environment (A:)", (("environment.next_state_acc", "next state acc"),
                                   ("environment.mean_reward", "mean reward")), "share / reward"),
    ), source="eval"),
    PlotSpec("strength", "Playing strength on judged held-out positions, next to a random legal mover", (
        Panel("expected-score loss per legal move", (("strength.loss", "model"), ("strength.random.loss", "random mover")),
              "loss"),
        Panel("blunders (loss >= 0.2) and puzzles", (("strength.blunder", "model blunders"),
                                                     ("strength.random.blunder", "random blunders"),
                                                     ("puzzles.mate1.solved", "mate in one"),
                                                     ("puzzles.tactic.solved", "tactics")), "share"),
    ), source="eval"),
)


def component_plots(runs: Sequence[Run]) -> list[PlotSpec]:
    """One figure per task with the reward components logged by any run (known ones first)."""
    specs = []
    for task, known in (("P", POLICY_COMPONENTS), ("A", ENV_COMPONENTS)):
        prefix = f"reward/{task}/"
        seen = {k[len(prefix):] for r in runs for rec in r.metrics for k in rec if k.startswith(prefix)}
        names = [c for c in known if c in seen] + sorted(seen - set(known))
        if names:
            lines = tuple((prefix + c, c) for c in names)
            specs.append(PlotSpec(f"components_{task}", f"Reward components: {TASK_LABELS[task]}",
                                  (Panel("mean component reward", lines, "reward"),)))
    return specs


def _new_figure(rows: int, title: str):
    """An Agg figure with `rows` stacked axes sharing x."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 0.7 + 2.6 * rows), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]
    fig.suptitle(title, fontsize=12, fontweight="bold")
    return fig, list(axes)


LINESTYLES = ("-", "--", ":", "-.")


def _draw_line(ax, xs: list[float], ys: list[float], color, style: str, label: str, sparse: bool) -> None:
    """Raw values; noisy series get a faint raw line under a moving average (which carries the label)."""
    if sparse:
        ax.plot(xs, ys, style, color=color, marker="o", markersize=4, linewidth=1.4, label=label)
    elif is_noisy(ys):
        ax.plot(xs, ys, style, color=color, linewidth=0.8, alpha=0.3)
        ax.plot(xs, moving_average(ys, smoothing_window(len(ys))), style, color=color, linewidth=1.8, label=label)
    else:
        ax.plot(xs, ys, style, color=color, linewidth=1.5, label=label)


def _draw_panel(ax, panel: Panel, runs: Sequence[Run], records: dict[str, list[dict]], sparse: bool) -> bool:
    """Draw one panel; False when no run has any value for its keys (the panel is then empty)."""
    import matplotlib

    colors = matplotlib.colormaps["tab10"].colors
    drawn, dropped = False, 0
    for ri, run in enumerate(runs):
        for ki, (key, label) in enumerate(panel.lines):
            xs, ys, nan = series(records[run.name], key)
            dropped += nan
            if not ys:
                continue
            if len(runs) == 1:  # colour per key
                color, style, text = colors[ki % len(colors)], "-", label
            else:  # colour per run, line style per key
                color, style = colors[ri % len(colors)], LINESTYLES[ki % len(LINESTYLES)]
                text = run.name if len(panel.lines) == 1 else f"{run.name}: {label}"
            _draw_line(ax, xs, ys, color, style, text, sparse)
            drawn = True
    title = panel.title + (f"  ({dropped} non-finite dropped)" if dropped else "")
    ax.set_title(title, fontsize=10, loc="left")
    ax.set_ylabel(panel.ylabel, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.tick_params(labelsize=8)
    if drawn:
        ax.legend(fontsize=8, framealpha=0.85, loc="best")
    else:
        ax.text(0.5, 0.5, "not logged", transform=ax.transAxes, ha="center", va="center", color="0.5")
    return drawn


def draw_spec(spec: PlotSpec, runs: Sequence[Run], out: Path) -> Path | None:
    """Save one figure; None (nothing written) when none of its keys has a value in any run."""
    if spec.source == "eval":
        records = {r.name: _eval_records(r.evals) for r in runs}
    else:
        records = {r.name: r.metrics for r in runs}
    keys = [k for p in spec.panels for k, _ in p.lines]
    if not any(series(records[r.name], k)[1] for r in runs for k in keys):
        return None
    fig, axes = _new_figure(len(spec.panels), spec.title)
    for ax, panel in zip(axes, spec.panels):
        _draw_panel(ax, panel, runs, records, sparse=spec.source == "eval")
    axes[-1].set_xlabel("step", fontsize=9)
    path = out / f"{spec.name}.png"
    fig.savefig(path)
    return path


def _phase_names(run: Run) -> list[str]:
    """The time/<phase> keys of a run, in pipeline order (unknown phases last); not the total."""
    seen = {k[5:] for rec in run.metrics for k in rec if k.startswith("time/") and k != "time/step"}
    return [p for p in PHASES if p in seen] + sorted(seen - set(PHASES))


def phase_shares(run: Run, phases: Sequence[str]) -> tuple[list[float], list[list[float]]]:
    """Per step, each phase's share of the summed phase times (steps with no positive total are dropped)."""
    xs: list[float] = []
    shares: list[list[float]] = [[] for _ in phases]
    for i, rec in enumerate(run.metrics):
        vals = [_number(rec.get(f"time/{p}")) for p in phases]
        vals = [v if v is not None and math.isfinite(v) and v > 0 else 0.0 for v in vals]
        total = sum(vals)
        if total <= 0:
            continue
        step = _number(rec.get("step"))
        xs.append(step if step is not None else float(i + 1))
        for s, v in zip(shares, vals):
            s.append(v / total)
    return xs, shares


def draw_timings(runs: Sequence[Run], out: Path) -> Path | None:
    """Stacked share of each phase per step (one panel per run: stacks cannot overlay) + seconds/step."""
    import matplotlib

    with_phases = [(r, _phase_names(r)) for r in runs]
    with_phases = [(r, p) for r, p in with_phases if p]
    if not with_phases:
        return None
    all_phases = list(PHASES) + sorted({p for _, ps in with_phases for p in ps} - set(PHASES))
    colors = matplotlib.colormaps["tab10"].colors
    color_of = {p: colors[i % len(colors)] for i, p in enumerate(all_phases)}
    has_total = any(series(r.metrics, "time/step")[1] for r in runs)
    fig, axes = _new_figure(len(with_phases) + has_total, "Time per phase")
    for ax, (run, phases) in zip(axes, with_phases):
        xs, shares = phase_shares(run, phases)
        ax.stackplot(xs, shares, labels=phases, colors=[color_of[p] for p in phases], alpha=0.85)
        ax.set_ylim(0, 1)
        ax.set_title(f"share of step time{': ' + run.name if len(runs) > 1 else ''}", fontsize=10, loc="left")
        ax.set_ylabel("share", fontsize=9)
        ax.tick_params(labelsize=8)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5), framealpha=0.85)
    if has_total:
        _draw_panel(axes[-1], Panel("seconds per step", (("time/step", "step"),), "s"), runs,
                    {r.name: r.metrics for r in runs}, sparse=False)
    axes[-1].set_xlabel("step", fontsize=9)
    path = out / "timings.png"
    fig.savefig(path)
    return path


def make_plots(runs: Sequence[Run], plot_dir: Path) -> list[tuple[str, Path]]:
    """Every figure that has data, as (title, path), in reading order."""
    plot_dir.mkdir(parents=True, exist_ok=True)
    specs = [STATIC_PLOTS[0], *component_plots(runs), *STATIC_PLOTS[1:-1]]
    made = [(s.title, draw_spec(s, runs, plot_dir)) for s in specs]
    made.append(("Time per phase", draw_timings(runs, plot_dir)))
    made.append((STATIC_PLOTS[-1].title, draw_spec(STATIC_PLOTS[-1], runs, plot_dir)))
    return [(t, p) for t, p in made if p is not None]


# -- HTML pieces -----------------------------------------------------------------------------------

LOWER_IS_BETTER = {"invalid", "reward_mae", "hit_max_tokens", "ended_illegal", "loss", "blunder", "repeated",
                   "repeated_candidates"}
NEUTRAL = {"n", "n_labelled", "games", "seconds", "ended_game_over", "ended_max_plies"}


def direction(metric: str) -> int:
    """+1 when a higher value is better, -1 when lower is better, 0 for counts and for the random
    mover's baseline (no colour: it moves only with the positions it is paired with)."""
    if ".random." in metric:
        return 0
    last = metric.rsplit(".", 1)[-1]
    if last in LOWER_IS_BETTER:
        return -1
    return 0 if last in NEUTRAL else 1


def fmt_number(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool) or isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
            return f"{v:.3g}"
        return f"{v:.4f}"
    return str(v)


def _delta_cell(metric: str, a: Any, b: Any) -> str:
    """A `<td>` with b - a, green when it moved the good way, red the bad way."""
    integers = all(isinstance(v, int) and not isinstance(v, bool) for v in (a, b))
    a, b = _number(a), _number(b)
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return '<td class="num">–</td>'
    d = b - a
    good = d * direction(metric)
    cls = "num" + (" good" if good > 1e-12 else " bad" if good < -1e-12 else "")
    return f'<td class="{cls}">{int(d):+d}</td>' if integers else f'<td class="{cls}">{d:+.4f}</td>'


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _config_value(v: Any) -> str:
    if isinstance(v, str):
        return v
    return json.dumps(v, default=str)


def config_table(runs: Sequence[Run]) -> str:
    """key | value per run; with several runs the rows that differ are highlighted."""
    keys = list(dict.fromkeys(k for r in runs for k in r.config))
    if not keys:
        return '<p class="muted">No config.yaml.</p>'
    head = "".join(f"<th>{_e(r.name)}</th>" for r in runs) if len(runs) > 1 else "<th>value</th>"
    rows = []
    for k in keys:
        vals = [_config_value(r.config[k]) if k in r.config else "–" for r in runs]
        cls = ' class="differs"' if len(set(vals)) > 1 else ""
        rows.append(f"<tr{cls}><td><code>{_e(k)}</code></td>" + "".join(f"<td><code>{_e(v)}</code></td>"
                                                                          for v in vals) + "</tr>")
    note = '<p class="muted">Highlighted rows differ between runs.</p>' if len(runs) > 1 else ""
    return (f'{note}<table class="config"><thead><tr><th>key</th>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def _flat_numbers(result: dict | None) -> dict[str, Any]:
    from rookworld_rlvr.evaluate import flatten_metrics

    if not isinstance(result, dict):
        return {}
    return {k: v for k, v in flatten_metrics(result).items() if _number(v) is not None}


def eval_table(runs: Sequence[Run]) -> str:
    """metric | base | final | Δ for each run (base -> final of that run)."""
    pairs = [(_flat_numbers(r.base_eval), _flat_numbers(r.final_eval)) for r in runs]
    keys = list(dict.fromkeys(k for base, final in pairs for k in [*base, *final]))
    if not keys:
        return '<p class="muted">No evaluations (eval.jsonl / summary.json) yet.</p>'
    head = ""
    if len(runs) > 1:
        head = "<tr><th></th>" + "".join(f'<th colspan="3" class="run">{_e(r.name)}</th>' for r in runs) + "</tr>"
    head += "<tr><th>metric</th>" + '<th class="num">base</th><th class="num">final</th><th class="num">Δ</th>' \
        * len(runs) + "</tr>"
    rows = []
    for k in keys:
        cells = "".join(f'<td class="num">{_e(fmt_number(b.get(k)))}</td><td class="num">{_e(fmt_number(f.get(k)))}'
                        f"</td>{_delta_cell(k, b.get(k), f.get(k))}" for b, f in pairs)
        rows.append(f"<tr><td><code>{_e(k)}</code></td>{cells}</tr>")
    return f'<table class="eval"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'


def _last_step(run: Run) -> Any:
    steps = [s for s in (_number(r.get("step")) for r in run.metrics) if s is not None]
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
        rows.append(f"<tr><td>{_e(r.name)}</td><td><code>{_e(r.path)}</code></td>"
                    f'<td class="num">{_e(fmt_number(r.summary.get("steps", _last_step(r))))}</td>'
                    f'<td class="num">{_e(fmt_number(r.summary.get("best_step")))}</td>'
                    f'<td class="num">{len(r.evals)}</td><td class="num">{_e(fmt_number(last_reward[0]))}</td>'
                    f'<td class="num">{recoveries}</td><td>{_e(_status(r))}</td></tr>')
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
            rows.append(f"<tr><td>{_e(r.name)}</td><td class=\"num\">{_e(fmt_number(e.get('step')))}</td>"
                        f"<td><code>{_e(e.get('signal'))}</code></td><td class=\"num\">{_e(fmt_number(e.get('value')))}</td>"
                        f"<td class=\"num\">{_e(fmt_number(e.get('bound')))}</td>"
                        f"<td class=\"num\">{_e(fmt_number(e.get('reference')))}</td><td>{_e(action)}</td>"
                        f"<td>{_e(', '.join(e.get('also') or []))}</td></tr>")
    if not rows:
        return '<p class="muted">No guard event: no collapse signal crossed its bound, no non-finite step.</p>'
    return ('<table class="events"><thead><tr><th>run</th><th class="num">step</th><th>signal</th>'
            '<th class="num">value</th><th class="num">bound</th><th class="num">reference</th><th>action</th>'
            f'<th>also out of bounds</th></tr></thead><tbody>{"".join(rows)}</tbody></table>')


def plots_section(plots: Sequence[tuple[str, Path]], out_dir: Path) -> str:
    if not plots:
        return '<p class="muted">No plottable metrics.</p>'
    figs = "".join(f'<figure><img src="{_e(p.relative_to(out_dir).as_posix())}" alt="{_e(t)}" title="{_e(t)}">'
                   "</figure>" for t, p in plots)  # the title is drawn in the PNG
    return ('<p class="muted">Faint lines are per-step values; solid lines over them are trailing moving '
            f'averages (drawn only where a series is noisy).</p><div class="plots">{figs}</div>')


# -- samples ---------------------------------------------------------------------------------------

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


def _is_legal(board, uci: Any) -> bool:
    import chess

    try:
        return chess.Move.from_uci(str(uci)) in board.legal_moves
    except ValueError:
        return False


def _model_best(completion: str) -> str | None:
    """The B: move a P: completion names (None when it does not parse)."""
    from rookworld_rlvr.tasks import policy as pol_task

    best = pol_task.parse_completion(completion).best
    return best if best and pol_task.UCI_RE.match(best) else None


def _board_arrows(task: str, board, example: dict) -> tuple[list, str]:
    """Arrows and a caption: P: best move (green) and the model's B: (blue); A: the move (red if illegal)."""
    truth = example.get("truth") or {}
    side = "White" if board.turn else "Black"
    if task == "environment":
        move = truth.get("move")
        legal = _is_legal(board, move)
        arrow = _arrow(move, BEST_COLOR if legal else ILLEGAL_COLOR)
        note = "" if legal else " (illegal)"
        return [a for a in (arrow,) if a], f"{side} to move · arrow: {move}{note}"
    best = (truth.get("best") or [None])[0]
    mine = _model_best(str(example.get("completion", "")))
    arrows = [_arrow(best, BEST_COLOR)] if best else []
    caption = f"{side} to move · green: best {best}"
    if mine and mine != best and _is_legal(board, mine):
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
        return f'<p class="muted">no board: FEN {_e(fen)} is not drawable</p>'
    arrows, caption = _board_arrows(task, board, example)
    svg = chess.svg.board(board, size=240, arrows=arrows)
    return f'{svg}<div class="caption">{_e(caption)}</div>'


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
    cells = "".join(f'<span class="comp">{_e(k)} <b>{_e(fmt_number(v))}</b></span>' for k, v in comps.items())
    return f'<div class="comps">{cells}</div>'


def sample_card(task: str, example: dict) -> str:
    """Board, prompt, completion, truth, reward and components of one evaluation example."""
    prompt = str(example.get("prompt", ""))
    truth = example.get("truth") if isinstance(example.get("truth"), dict) else {}
    correct = example.get("correct")
    mark = "" if correct is None else (' <span class="good">✓ correct</span>' if correct
                                       else ' <span class="bad">✗ not exact</span>')
    notes = example.get("notes") or []
    notes_html = f'<div class="muted small">{_e("; ".join(map(str, notes)))}</div>' if notes else ""
    return (f'<div class="sample"><div class="board">{board_svg(task, {**example, "truth": truth})}</div>'
            f'<div class="text"><div class="label">prompt</div><pre>{_e(prompt)}</pre>'
            f'<div class="label">completion</div><pre class="completion">{_e(example.get("completion", ""))}</pre>'
            f'<div class="label">truth</div><pre class="truth">{_e(_truth_text(truth, prompt))}</pre>'
            f'<div class="reward">reward <b>{_e(fmt_number(_number(example.get("reward"))))}</b>{mark}</div>'
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
            parts.append(f'<h3>{_e(prefix)}no examples</h3><p class="muted">The evaluations kept no examples.</p>')
            continue
        for task, label in (("policy", "policy (P:)"), ("environment", "environment (A:)")):
            examples = [x for x in result["examples"].get(task) or [] if isinstance(x, dict)]
            if examples:
                parts.append(f"<h3>{_e(prefix + label)} · step {_e(result.get('step', '?'))}</h3>")
                parts += [sample_card(task, x) for x in examples]
    return "".join(parts)


CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1f2328;
       margin: 0; background: #f6f8fa; }
main { max-width: 1240px; margin: 0 auto; padding: 20px 28px 48px; background: #fff; }
h1 { font-size: 24px; margin: 8px 0 4px; } h2 { font-size: 19px; margin: 32px 0 10px;
  border-bottom: 1px solid #d0d7de; padding-bottom: 4px; } h3 { font-size: 15px; margin: 22px 0 8px; }
code, pre { font: 12px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
table { border-collapse: collapse; margin: 6px 0; font-size: 13px; }
th, td { border: 1px solid #d0d7de; padding: 3px 9px; text-align: left; vertical-align: top; }
thead th { background: #f0f3f6; } tbody tr:nth-child(even) { background: #fafbfc; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
th.run { text-align: center; }
table.config td code { white-space: pre-wrap; word-break: break-word; }
table.config td:last-child { max-width: 640px; }
tr.differs td { background: #fff8c5; }
.good { color: #1a7f37; font-weight: 600; } .bad { color: #cf222e; font-weight: 600; }
.muted { color: #656d76; } .small { font-size: 12px; }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 16px;
          align-items: start; }
figure { margin: 0; border: 1px solid #d0d7de; border-radius: 6px; padding: 6px; background: #fff; }
figure img { width: 100%; height: auto; display: block; }
.sample { display: flex; gap: 18px; border: 1px solid #d0d7de; border-radius: 6px; padding: 12px;
          margin: 10px 0; align-items: flex-start; }
.sample .board { flex: 0 0 240px; } .sample .board svg { display: block; }
.sample .text { flex: 1 1 auto; min-width: 0; }
.caption { font-size: 12px; color: #656d76; margin-top: 4px; }
.label { font-size: 11px; text-transform: uppercase; letter-spacing: .04em; color: #656d76; margin-top: 6px; }
pre { margin: 2px 0; padding: 6px 8px; background: #f6f8fa; border-radius: 4px;
      white-space: pre-wrap; word-break: break-all; }
pre.completion { background: #eef4ff; }
.reward { margin-top: 8px; }
.comps { display: flex; flex-wrap: wrap; gap: 6px; margin-top: 6px; }
.comp { font-size: 12px; background: #f0f3f6; border-radius: 10px; padding: 1px 9px; }
"""


def render_html(runs: Sequence[Run], plots: Sequence[tuple[str, Path]], out_dir: Path) -> str:
    names = ", ".join(r.name for r in runs)
    title = f"GRPO run {names}" if len(runs) == 1 else f"GRPO runs compared: {names}"
    sections = [
        ("Runs", runs_table(runs)),
        ("Guard events", events_table(runs)),
        ("Config", config_table(runs)),
        ("Evaluation: base → final", eval_table(runs)),
        ("Training curves", plots_section(plots, out_dir)),
        ("Sample completions (final evaluation)", samples_section(runs)),
    ]
    body = "".join(f"<section><h2>{_e(h)}</h2>{content}</section>" for h, content in sections)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_e(title)}</title><style>{CSS}</style></head>"
            f"<body><main><h1>{_e(title)}</h1>{body}</main></body></html>\n")


# -- entry points ----------------------------------------------------------------------------------


def default_out_dir(paths: Sequence[Path], names: Sequence[str]) -> Path:
    """The run itself for one run; `<parent of the first>/compare-<names>` for several."""
    if len(paths) == 1:
        return paths[0]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(names))[:120]
    return paths[0].resolve().parent / f"compare-{slug}"


def write_report(run_dirs: list[str], out_dir: str | None = None) -> Path:
    """Plots into `<out>/plots/` and `<out>/report.html`; returns the HTML path."""
    if not run_dirs:
        raise ValueError("report needs at least one run directory")
    paths = [Path(p) for p in run_dirs]
    names = _unique_names(paths)
    runs = [load_run(p, n) for p, n in zip(paths, names)]
    out = Path(out_dir) if out_dir else default_out_dir(paths, names)
    out.mkdir(parents=True, exist_ok=True)
    plots = make_plots(runs, out / "plots")
    from rookworld_rlvr.data.io import atomic_write_text

    page = out / "report.html"
    atomic_write_text(page, [render_html(runs, plots, out)])
    return page


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories (several: overlaid in one report)")
    p.add_argument("--out", default=None, help="output directory (default: the run itself, or "
                                               "compare-<names> beside the first run)")


def run(args: argparse.Namespace, name: str) -> int:
    print(write_report(args.runs, args.out))
    return 0
