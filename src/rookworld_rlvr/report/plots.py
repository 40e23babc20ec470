"""Report figures: PNG plots of runs (training curves, evaluations, time per phase) and of sweeps.

Several runs are overlaid (one line per run) so runs with different configs can be compared at
a glance; a missing key skips that plot, NaN values are dropped from lines (the panel title says
how many). matplotlib is imported inside functions so `rookworld --help` stays fast; figures are
drawn with the Agg canvas directly (no pyplot, no global backend state).

Owns what is drawn and how. Imports no torch and no chess.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from rookworld_rlvr.report.runs import Run, eval_records, is_noisy, moving_average, series, smoothing_window
from rookworld_rlvr.tables import number
from rookworld_rlvr.tasks.rewards import ENV_COMPONENTS, POLICY_COMPONENTS, PUZZLE_COMPONENTS

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
    # "metrics" (per step, smoothed when noisy), "eval" (the evaluations, sparse: markers) or "evals" (the same,
    # records already flat: an SFT log's)
    source: str = "metrics"


PHASES = ("generate", "score", "reference", "old", "policy", "anchor", "optimizer", "other")
TASK_LABELS = {"P": "policy (P:)", "puzzle": "puzzles (P:)", "A": "environment (A:)"}

STATIC_PLOTS = (
    PlotSpec("reward", "Reward per task", (
        Panel("mean reward", (("reward/mean", "all"), ("reward/P", "P:"), ("reward/puzzle", "puzzles"),
                                ("reward/A", "A:")), "reward"),
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
    for task, known in (("P", POLICY_COMPONENTS), ("puzzle", PUZZLE_COMPONENTS), ("A", ENV_COMPONENTS)):
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
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(7.5, 0.7 + 2.6 * rows), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]
    for ax in axes:  # steps are whole numbers: a 3-step run is not labelled 1.25, 1.50, ...
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
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
        records = {r.name: eval_records(r.evals) for r in runs}
    else:
        records = {r.name: r.evals if spec.source == "evals" else r.metrics for r in runs}
    keys = [k for p in spec.panels for k, _ in p.lines]
    if not any(series(records[r.name], k)[1] for r in runs for k in keys):
        return None
    fig, axes = _new_figure(len(spec.panels), spec.title)
    for ax, panel in zip(axes, spec.panels):
        _draw_panel(ax, panel, runs, records, sparse=spec.source != "metrics")
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
        vals = [number(rec.get(f"time/{p}")) for p in phases]
        vals = [v if v is not None and math.isfinite(v) and v > 0 else 0.0 for v in vals]
        total = sum(vals)
        if total <= 0:
            continue
        step = number(rec.get("step"))
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


def sweep_plot(rows: list[dict], path: Path, title: str, best: int | None,
               margins: Sequence[float] = ()) -> str | None:
    """A sweep's held-out reward gain per trial (rows of its summary's trial table), coloured by
    outcome (runs without a final evaluation sit at 0 as x); dashed lines at -margin for each of
    `margins` (the outcome bounds). None when matplotlib is missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    colors = {"intact": "tab:green", "stopped": "tab:orange", "silent_collapse": "tab:red", "degraded": "gold",
              "error": "darkred", "running": "tab:gray"}
    fig = Figure(figsize=(max(6.0, 0.35 * len(rows) + 2), 4.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    kind = lambda r: r.get("outcome") or ("running" if r["state"] in ("RUNNING", "WAITING") else "error")  # noqa: E731
    for name, color in colors.items():
        sel = [r for r in rows if kind(r) == name]
        label = name.replace("_", " ")
        with_gain = [r for r in sel if r["gain"] is not None]
        if with_gain:
            ax.bar([r["trial"] for r in with_gain], [r["gain"] for r in with_gain], color=color, label=label)
        without = [r for r in sel if r["gain"] is None]
        if without:
            ax.scatter([r["trial"] for r in without], [0.0] * len(without), marker="x", color=color,
                       label=f"{label} (no final eval)", zorder=3)
    for margin in margins:
        ax.axhline(-margin, color="gray", linewidth=0.6, linestyle="--")
    if best is not None:
        b = next(r for r in rows if r["trial"] == best)
        ax.annotate("best", (best, b["gain"] or 0.0), textcoords="offset points", xytext=(0, 6), ha="center")
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xlabel("trial")
    ax.set_ylabel("held-out reward gain (final - base)")
    ax.set_title(f"{title}: gain per trial")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.png")
    fig.savefig(tmp, dpi=100, bbox_inches="tight")
    os.replace(tmp, path)
    return str(path)
