"""The report of a base trained by `rookworld sft`: its log's curves (training loss, held-out loss and chess
figures at each evaluation, learning rate and gradient norm) and its first and last evaluation side by side.

`rookworld sft --out M` logs to `M.sft_log.jsonl` beside the model (`.jsonl.gz` where a model is shipped; inside
it, `M/sft_log.jsonl`, where the GPU scripts send a base back); the report goes to `M.report/` beside it, not into
the model's folder, which is uploaded and loaded as it is.

Owns finding an SFT log and what its report shows. Imports no torch and no chess (matplotlib through plots.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from rookworld_rlvr.report.markup import esc, fmt, html_page
from rookworld_rlvr.report.plots import Panel, PlotSpec, draw_spec
from rookworld_rlvr.report.runs import Run, read_jsonl, unique_names

EVAL_PREFIXES = ("eval_", "policy/", "environment/")
SFT_PLOTS = (
    PlotSpec("sft_loss", "Training loss", (Panel("loss per target token", (("loss", "train"),), "nats"),)),
    PlotSpec("sft_held_out_loss", "Held-out loss at each evaluation", (
        Panel("loss per target token", (("eval_loss_P", "P:"), ("eval_loss_A", "A:")), "nats"),
        Panel("loss per character", (("eval_nats_per_char_P", "P:"), ("eval_nats_per_char_A", "A:")), "nats"),
    ), source="evals"),
    PlotSpec("sft_held_out", "Held-out answers at each evaluation (greedy)", (
        Panel("policy (P:)", (("policy/legal_best", "legal B:"), ("policy/best_acc", "best move"),
                              ("policy/random/best_acc", "best move: a random legal mover"),
                              ("policy/top5_overlap", "top-5 overlap")), "share"),
        Panel("environment (A:)", (("environment/next_state_acc", "next state"), ("environment/reward_acc", "reward"),
                                   ("environment/terminated_acc", "terminated")), "share"),
    ), source="evals"),
    PlotSpec("sft_schedule", "Learning rate and gradient norm", (
        Panel("learning rate", (("lr", "lr"),), "lr"),
        Panel("gradient norm (before clipping)", (("grad_norm", "grad norm"),), "L2 norm"),
    )),
)
# (key, label, what chance scores: a key of the same record, a number, or None where it has no meaning)
TABLE = (("eval_loss_P", "held-out loss, P:", None), ("eval_loss_A", "held-out loss, A:", None),
         ("policy/legal_best", "legal best move", 1.0),  # a random legal mover's moves are all legal
         ("policy/best_acc", "Stockfish's best move", "policy/random/best_acc"),
         ("policy/top5_overlap", "top-5 overlap", "policy/random/top5_overlap"),
         ("policy/invalid", "P: a format error (a repeated M: move too)", None),
         ("environment/next_state_acc", "A: next state", None),
         ("environment/reward_acc", "A: reward", "environment/constant/reward_acc"),
         ("environment/terminated_acc", "A: terminated", "environment/constant/terminated_acc"),
         ("environment/invalid", "A: a format error", None))


def sft_log(model: str | Path) -> Path | None:
    """The SFT log of model folder `model`: beside it, as `rookworld sft` writes it (`M.sft_log.jsonl`, or
    `.jsonl.gz`), or inside it, as the GPU scripts send a base back (`M/sft_log.jsonl`); else None."""
    model = Path(model)
    for log in (model.parent / f"{model.name}.sft_log.jsonl", model.parent / f"{model.name}.sft_log.jsonl.gz",
                model / "sft_log.jsonl"):
        if log.is_file():
            return log
    return None


def load_sft(model: Path, name: str) -> Run:
    """An SFT log as a run: its steps as metrics, the steps that evaluated as evaluations."""
    log = sft_log(model)
    if log is None:
        raise FileNotFoundError(f"{model}: no {model.name}.sft_log.jsonl beside it (not a model `rookworld sft` "
                                "made?)")
    rows = read_jsonl(log)
    return Run(path=model, name=name, metrics=rows,
               evals=[r for r in rows if any(k.startswith(EVAL_PREFIXES) for k in r)])


def load_sfts(paths: Sequence[str]) -> list[Run]:
    return [load_sft(Path(p), n) for p, n in zip(paths, unique_names([Path(p) for p in paths]))]


def _shape(run: Run) -> str:
    """The model's shape from its config.json; a run still training has saved none yet."""
    try:
        c = json.loads((run.path / "config.json").read_text())
    except (OSError, ValueError):
        return f"{run.name}: no model saved yet (a run in progress, or its folder moved)"
    return (f"{run.name}: {c.get('model_type', '?')}, {c.get('n_layer', '?')} layers x {c.get('n_embd', '?')}, "
            f"{c.get('n_head', '?')} heads, context {c.get('n_positions', '?')}, vocabulary {c.get('vocab_size', '?')}")


def _table(runs: Sequence[Run]) -> str:
    """Each run's first and last evaluation (whole step records: its training loss and minutes too), and what
    chance scores on the last one's rows (logs from before chance was logged leave it empty)."""
    ends = [(r.evals[0], r.evals[-1]) if r.evals else ({}, {}) for r in runs]
    head = "".join(f'<th class="num">{esc(r.name)}: step {fmt(a.get("step"))}</th>'
                   f'<th class="num">step {fmt(b.get("step"))}</th><th class="num">chance</th>'
                   for r, (a, b) in zip(runs, ends))
    body = ""
    for key, label, chance in (("minutes", "minutes", None), ("loss", "training loss (that step)", None), *TABLE):
        if any(key in e for pair in ends for e in pair):
            body += f"<tr><td>{esc(label)}</td>" + "".join(
                f'<td class="num">{fmt(a.get(key))}</td><td class="num">{fmt(b.get(key))}</td>'
                f'<td class="num">{fmt(b.get(chance) if isinstance(chance, str) else chance)}</td>' for a, b in ends)
            body += "</tr>"
    if not body:
        return '<p class="muted">No evaluation logged (eval_data empty?).</p>'
    note = ('<p class="muted">chance: a random legal mover on the same positions (P:), each field\'s commonest '
            "answer (A:)</p>")
    return f"<table><thead><tr><th></th>{head}</tr></thead><tbody>{body}</tbody></table>{note}"


def write_sft_report(runs: Sequence[Run], out_dir: str | None = None) -> Path:
    """Plots into `<out>/plots/` and `<out>/report.html` (default: `M.report` beside model M; for several,
    `compare-<names>` beside the first, as for GRPO runs)."""
    from rookworld_rlvr.data.io import atomic_write_text
    from rookworld_rlvr.report.page import default_out_dir, plots_section

    first = runs[0].path
    out = Path(out_dir) if out_dir else first.parent / f"{first.name}.report" if len(runs) == 1 else \
        default_out_dir([r.path for r in runs], [r.name for r in runs])
    (out / "plots").mkdir(parents=True, exist_ok=True)
    plots = [(s.title, p) for s in SFT_PLOTS if (p := draw_spec(s, runs, out / "plots")) is not None]
    shapes = "".join(f"<li>{esc(_shape(r))}</li>" for r in runs)
    body = (f"<section><h2>Models</h2><ul>{shapes}</ul></section>"
            f"<section><h2>First and last evaluation</h2>{_table(runs)}</section>"
            f"<section><h2>Curves</h2>{plots_section(plots, out)}</section>")
    page = out / "report.html"
    atomic_write_text(page, [html_page(f"SFT of {', '.join(r.name for r in runs)}", body)])
    return page
