"""`rookworld report`: plots and the HTML page from synthetic run directories (NaN, missing keys,
a half-written line, real FENs in the examples), the overlay of two runs, the error for a
directory without metrics.jsonl, and a headless Chromium screenshot of the page."""

from __future__ import annotations

import gzip
import html
import json
import math
import random
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from rookworld_rlvr.report.page import write_report
from rookworld_rlvr.report.runs import is_noisy, load_run, moving_average, series
from rookworld_rlvr.report.samples import sample_card
from rookworld_rlvr.tasks.rewards import ENV_COMPONENTS, POLICY_COMPONENTS
from rookworld_rlvr.cli import main

P_FEN = "2b3k1/Q4rqn/p2p4/4p3/p6p/2PP3P/BP3PP1/R5K1 b - - 0 34"
A_FEN = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
A_NEW_FEN = "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1"
P_PROMPT = f"P: {P_FEN} "
A_PROMPT = f"A: {A_FEN}+e2e4+e2e4+"
MARKUP = "<b>&</b>"  # model garbage that must come out escaped


def _metrics(steps: int, seed: int, *, with_entropy: bool = True, with_timings: bool = True) -> list[dict]:
    """Per-step records shaped like the trainer's, with a NaN grad norm and keys that come and go."""
    rng = random.Random(seed)
    rows = []
    for s in range(1, steps + 1):
        trend = s / steps
        rec = {"step": s, "reward/mean": 0.3 + 0.4 * trend + rng.gauss(0, 0.08),
               "reward/P": 0.2 + 0.5 * trend + rng.gauss(0, 0.1), "valid/P": min(1.0, 0.6 + 0.4 * trend),
               "kl_mean": 0.002 * s + rng.random() * 0.01, "kl_max": 0.5 + rng.random(), "kl_min": 0.0,
               "beta": 0.04, "clip_frac": rng.random() * 0.1, "grad_norm": 1.0 + rng.random(),
               "completion_len/mean": 60 + rng.gauss(0, 5), "completion_len/max": 120,
               "truncation_rate": rng.random() * 0.05, "lr": 1e-6, "loss": rng.gauss(0, 0.1)}
        rec.update({f"reward/P/{c}": rng.random() for c in POLICY_COMPONENTS})
        rec.update({"reward/puzzle": rng.random(), "reward/puzzle/format": 1.0, "reward/puzzle/solved": rng.random()})
        if s % 2:  # A: is sampled on odd steps only
            rec.update({"reward/A": 0.5 + rng.gauss(0, 0.1), "valid/A": 0.9})
            rec.update({f"reward/A/{c}": rng.random() for c in ENV_COMPONENTS})
        if s > 5:  # the clip split was added to the log mid-run
            rec.update(clip_low=rng.random() * 0.05, clip_high=rng.random() * 0.05)
        if with_entropy:
            rec["entropy"] = 1.5 - trend + rng.gauss(0, 0.05)
        if with_timings:
            phases = {"generate": 2.0, "score": 0.4, "reference": 0.3, "old": 0.3, "policy": 0.9, "optimizer": 0.1}
            rec.update({f"time/{k}": v * (1 + rng.random() * 0.2) for k, v in phases.items()})
            rec["time/other"] = 0.05
            rec["time/step"] = sum(v for k, v in rec.items() if k.startswith("time/"))
        rows.append(rec)
    rows[6]["grad_norm"] = math.nan  # a skipped step
    rows[6]["kl_max"] = math.inf
    return rows


def _examples() -> dict:
    p_truth = {"fen": P_FEN, "moves": ["a4a3", "c8f5", "h7f6", "h7g5", "h7f8"],
               "evals": [-3.06, -2.82, -3.21, -3.16, -2.3], "best": ["h7f8"], "label": "h7f6"}
    a_truth = {"fen": A_FEN, "move": "e2e4", "history": "e2e4", "new_fen": A_NEW_FEN, "reward": 0.001,
               "terminated": False, "truncated": False}
    completion = f"M: a4a3 c8f5 h7f6 h7g5 h7f8 E: -3.1 -2.8 -3.2 -3.2 -2.3 B: c8f5 {MARKUP}"
    policy = [{"prompt": P_PROMPT, "completion": completion,
               "truth": p_truth, "reward": 0.42, "correct": False, "notes": ["B: not best"],
               "components": {"format": 1.0, "best_legal": 1.0, "quality": 0.5,
                              "candidates": 1.0, "evals": 0.8}}]
    env = [{"prompt": A_PROMPT, "completion": f"{A_NEW_FEN}+0.001+0+0", "truth": a_truth, "reward": 1.0,
            "correct": True, "notes": [],
            "components": {"format": 1.0, "next_state": 1.0, "reward": 1.0, "terminated": 1.0, "truncated": 1.0}}]
    return {"policy": policy, "environment": env}


def _eval(step: int, quality: float, examples: bool) -> dict:
    res = {"step": step, "seconds": 3.2,
           "policy": {"n": 50, "invalid": 0.2 - 0.1 * quality, "legal_best": 0.7 + 0.2 * quality,
                      "best_acc": 0.2 + 0.1 * quality, "best_acc_raw_labels": None, "top5_overlap": 0.5,
                      "distinct_legal_candidates": 4.5, "mean_reward": 0.4 + 0.2 * quality, "hit_max_tokens": 0.0,
                      "components": {"format": 0.9, "best_legal": 0.8}},
           "environment": {"n": 50, "invalid": 0.1, "next_state_acc": 0.5 + 0.3 * quality, "nls": 0.95,
                           "reward_acc": 0.9, "reward_mae": 0.1 - 0.05 * quality, "terminated_acc": 1.0,
                           "truncated_acc": 1.0, "mean_reward": 0.6 + 0.1 * quality},
           "meta": {"seconds": {"generate": 3.0}}}
    if examples:
        res["examples"] = _examples()
    return res


def make_run(root: Path, name: str, *, seed: int = 0, steps: int = 30, config: dict | None = None,
             **metric_options) -> Path:
    """A finished run directory as the trainer leaves it (plus a half-written metrics line)."""
    run = root / name
    run.mkdir(parents=True)
    lines = [json.dumps(r) for r in _metrics(steps, seed, **metric_options)]
    (run / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 31, "rew')
    evals = [_eval(s, s / steps, examples=s == steps) for s in (0, 10, 20, steps)]
    (run / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    summary = {"base": evals[0], "final": evals[-1], "best_step": steps, "steps": steps}
    (run / "summary.json").write_text(json.dumps(summary))
    cfg = config or {"model": "jrahn/RookWorld-LM-124M", "lr": 1e-6, "group_size": 8, "kl_coef": 0.04,
                     "policy_weights": {"format": 0.1, "best_legal": 0.4}, "phases": []}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return run


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> Path:
    """The report of one run (built once: plotting is the slow part)."""
    run = make_run(tmp_path_factory.mktemp("runs"), "grpo-a")
    return write_report([str(run)])


def test_single_run_writes_plots_next_to_the_run(single):
    assert single == single.parent / "report.html" and (single.parent / "metrics.jsonl").exists()
    plots = {p.stem: p for p in (single.parent / "plots").glob("*.png")}
    expected = {"reward", "components_P", "components_puzzle", "components_A", "kl", "entropy", "clip", "grad_norm", "lengths",
                "timings", "eval"}
    assert expected <= set(plots)
    for p in plots.values():
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


def test_html_has_config_eval_table_plots_and_samples(single):
    page = single.read_text()
    for key in ("model", "group_size", "kl_coef", "policy_weights"):
        assert f"<code>{key}</code>" in page
    assert "jrahn/RookWorld-LM-124M" in page
    assert "<code>policy.best_acc</code>" in page and "<code>environment.reward_mae</code>" in page
    assert "policy.components.format" in page  # nested eval sections are flattened
    assert 'src="plots/reward.png"' in page and 'src="plots/timings.png"' in page
    assert page.count("<svg") == 2 and "viewBox" in page  # one board per example
    assert html.escape(P_PROMPT) in page and html.escape(A_PROMPT) in page
    assert html.escape(MARKUP) in page and MARKUP not in page
    assert "non-finite dropped" not in page  # said on the plot, not the page
    assert "best_legal" in page and "next_state" in page  # reward components of the examples


def test_eval_deltas_are_coloured_by_direction(single):
    page = single.read_text()

    def row(metric: str) -> str:
        start = page.index(f"<tr><td><code>{metric}</code>")
        return page[start:page.index("</tr>", start)]

    assert 'class="num good">+0.1000' in row("policy.best_acc")
    assert 'class="num good">-0.1000' in row("policy.invalid")  # lower is better
    assert 'class="num good">-0.0500' in row("environment.reward_mae")
    assert "good" not in row("policy.n") and "bad" not in row("policy.n") and "+0</td>" in row("policy.n")
    assert page.count("<tr><td><code>policy.best_acc</code>") == 1  # one row per metric


def test_a_samples_draw_the_move_arrow(single):
    page = single.read_text()
    assert "arrow: e2e4" in page and 'class="arrow' in page
    assert "blue: model c8f5" in page  # P: the model's legal B: next to the best move


def test_missing_keys_skip_plots_and_nan_is_dropped(tmp_path):
    run = make_run(tmp_path, "sparse", with_entropy=False, with_timings=False)
    page = write_report([str(run)], str(tmp_path / "out"))
    plots = {p.stem for p in (page.parent / "plots").glob("*.png")}
    assert "entropy" not in plots and "timings" not in plots and "reward" in plots
    assert "plots/entropy.png" not in page.read_text()
    xs, ys, dropped = series(load_run(run).metrics, "grad_norm")
    assert dropped == 1 and len(ys) == 29 and all(math.isfinite(v) for v in ys) and 7 not in xs


def test_a_damaged_run_file_is_named_and_not_read_as_a_shorter_run(tmp_path, capsys):
    """A live run's half-written last line is skipped quietly (make_run leaves one); a bad line in the middle of
    a log, or a summary.json or config.yaml that cannot be read (both written whole), is skipped with a warning
    naming it: it used to vanish from the report without a word."""
    run = make_run(tmp_path, "damaged")
    load_run(run)
    assert capsys.readouterr().err == ""
    lines = (run / "metrics.jsonl").read_text().split("\n")
    (run / "metrics.jsonl").write_text("\n".join(lines[:3] + ["{garbage"] + lines[3:]))
    (run / "summary.json").write_text('{"base": ')
    (run / "config.yaml").write_text("lr: [1\n")
    loaded = load_run(run)
    err = capsys.readouterr().err
    assert f"warning: {run / 'metrics.jsonl'}:4: skipped, not a JSON object: '{{garbage'" in err
    assert f"warning: {run / 'summary.json'}: skipped, not a JSON object (" in err
    assert f"warning: {run / 'config.yaml'}: skipped, not a mapping of settings (" in err
    assert len(loaded.metrics) == 30 and loaded.summary == {} and loaded.config == {}


def test_metrics_only_run_reports_without_evals(tmp_path):
    run = tmp_path / "live"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.1}) + "\n")
    page = write_report([str(run)]).read_text()
    assert "No evaluations" in page and "No config.yaml" in page and "in progress" in page


def test_two_runs_overlay_into_a_compare_dir(tmp_path):
    a = make_run(tmp_path / "runs", "base-lr", seed=1)
    b = make_run(tmp_path / "runs", "high-lr", seed=2, with_entropy=False,
                 config={"model": "jrahn/RookWorld-LM-124M", "lr": 1e-5, "group_size": 8})
    assert main(["report", str(a), str(b)]) == 0
    out = tmp_path / "runs" / "compare-base-lr-high-lr"
    page = (out / "report.html").read_text()
    assert '<th colspan="3" class="run">base-lr</th>' in page and '<th colspan="3" class="run">high-lr</th>' in page
    assert "<th>base-lr</th><th>high-lr</th>" in page  # one config column per run
    assert '<tr class="differs"><td><code>lr</code>' in page
    assert '<tr><td><code>group_size</code>' in page  # equal values are not highlighted
    assert (out / "plots" / "entropy.png").stat().st_size > 0  # drawn from the run that has it
    assert page.count("<svg") == 4


def test_out_option_and_printed_path(tmp_path, capsys):
    run = make_run(tmp_path, "r", steps=12)
    assert main(["report", str(run), "--out", str(tmp_path / "elsewhere")]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == str(tmp_path / "elsewhere" / "report.html") and Path(printed).exists()


def test_a_run_is_judged_against_its_control(tmp_path, capsys):
    """`report RUN --against CONTROL`: the run's final model against the control's, paired over the same
    held-out items, printed and in the page; a control evaluated on other items is refused, naming the field."""
    run, control = make_run(tmp_path, "grpo"), make_run(tmp_path, "control")
    summary = json.loads((control / "summary.json").read_text())
    summary["final"] = summary["base"]  # the control ends where it started: A: next state 0.5, the run's 0.8
    (control / "summary.json").write_text(json.dumps(summary))
    assert main(["report", str(run), "--against", str(control)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("verdict: control -> grpo (final against final")
    a_row = next(line for line in out.splitlines() if line.startswith("A: next state exact"))
    assert "0.5000" in a_row and "0.8000" in a_row and a_row.rstrip().endswith("better")
    page = (run / "report.html").read_text()
    section = page.split("<h2>Verdict: against control")[1].split("</section>")[0]
    assert '<th class="num">control</th><th class="num">grpo</th>' in section
    row = section[section.index("A: next state exact"):].split("</tr>")[0]
    assert "0.366 .. 0.634" in row and "0.670 .. 0.888" in row and '<td class="good">better</td>' in row
    assert "<h2>Verdict: against" not in write_report([str(run)]).read_text()  # only when asked
    for where, items in ((run, "a1b2"), (control, "c3d4")):  # the control evaluated other positions
        summary = json.loads((where / "summary.json").read_text())
        summary["final"]["policy"]["items_of"] = items
        (where / "summary.json").write_text(json.dumps(summary))
    assert main(["report", str(run), "--against", str(control)]) == 1
    err = capsys.readouterr().err
    assert f"{run} evaluated other policy items than the control" in err and "same held-out items" in err
    assert main(["report", str(run), "--against", str(tmp_path / "." / "grpo")]) == 1  # the run itself
    assert f"{run} is the control itself" in capsys.readouterr().err


def test_missing_metrics_names_the_path(tmp_path, capsys):
    empty = tmp_path / "not-a-run"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=f"{empty}: no metrics.jsonl"):
        write_report([str(empty)])
    assert main(["report", str(empty)]) == 1
    assert f"{empty}: no metrics.jsonl (not a GRPO run directory, nor a model with the log `rookworld sft` writes " \
        "beside it, not-a-run.sft_log.jsonl?)" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "no-run")]) == 1  # a typo: the directory, not a file in it
    assert f"error: {tmp_path / 'no-run'}: no such run directory\n" == capsys.readouterr().err
    (empty / "notes.txt").write_text("a file")  # a file in place of the run: said so, not "no such directory"
    assert main(["report", str(empty / "notes.txt")]) == 1
    assert f"error: {empty / 'notes.txt'}: a file, not a run directory (give the folder that holds metrics.jsonl)\n" \
        == capsys.readouterr().err
    (empty / "metrics.jsonl").write_text("")  # metrics.jsonl itself: its folder is named
    assert main(["report", str(empty / "metrics.jsonl")]) == 1
    assert f"{empty / 'metrics.jsonl'}: a file, not a run directory (give the folder that holds metrics.jsonl: " \
        f"{empty})" in capsys.readouterr().err


def test_undrawable_fen_leaves_out_only_the_board():
    example = {**_examples()["policy"][0], "truth": {"fen": "not a fen", "best": ["e2e4"]}}
    card = sample_card("policy", example)
    assert "<svg" not in card and "not drawable" in card and html.escape(P_PROMPT) in card


def test_moving_average_and_noise():
    assert moving_average([1, 2, 3, 4], 2) == [1, 1.5, 2.5, 3.5]
    assert not is_noisy([float(i) for i in range(30)])
    assert is_noisy([float(i % 2) for i in range(30)])


def test_the_page_opens_with_the_verdict_and_folds_the_config_and_the_full_table(single, tmp_path):
    """The verdict comes first: the held-out figures base -> final next to the random mover, with
    95% intervals, each change judged against its interval; the config and the full metric table
    come last, folded. A rise in illegal moves is red; a match against the base is reported."""
    from rookworld_rlvr.report.page import direction

    page = single.read_text()
    order = [page.index(f"<h2>{h}") for h in ("Verdict", "Runs", "Guard events", "Training curves")]
    assert order == sorted(order) and order[0] < page.index("<details>")
    assert page.index("<details>") < page.index('<h2 class="fold">Every held-out metric') < \
        page.index('<h2 class="fold">Config')
    verdict = page.split("<h2>Verdict")[1].split("</section>")[0]
    row = verdict[verdict.index("A: next state exact"):].split("</tr>")[0]
    # 0.5 -> 0.8 on 50 transitions each: Wilson intervals 0.366 .. 0.634 and 0.670 .. 0.888
    assert "0.366 .. 0.634" in row and "0.670 .. 0.888" in row and '<td class="good">better</td>' in row
    assert "No match played" in verdict
    assert direction("strength.illegal.king_in_check") == -1 and direction("strength.legal") == 1
    assert direction("strength.loss_below_random") == 1 and direction("strength.loss") == -1
    run = make_run(tmp_path, "matched")
    (run / "match.json").write_text(json.dumps({"a": "final", "b": "base", "games": 200, "wins": 120, "draws": 4,
                                                "losses": 76, "score": 0.61, "elo": 77.0, "elo_low": 28.0,
                                                "elo_high": 128.0}))
    matched = write_report([str(run)]).read_text().split("<h2>Verdict")[1].split("</section>")[0]
    assert "+120 =4 -76" in matched and "Elo +77 (95% CI +28 .. +128)" in matched
    assert '<span class="good">won beyond the noise</span>' in matched


def test_report_renders_in_headless_chromium(single, tmp_path, chromium_path):
    shot = tmp_path / "report.png"
    cmd = [chromium_path, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,2000", f"--screenshot={shot}",
           single.resolve().as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[:2] == (2000, 1280)
    flat = pixels[..., :3].reshape(-1, 3)
    assert (flat.max(axis=0) - flat.min(axis=0)).max() > 0.5  # not one uniform colour
    assert (flat.std(axis=0) > 0.05).any()
    # the first screen (1280 x 800) shows the verdict: the green of a change judged better (#1a7f37)
    first = (pixels[:800, :, :3] * 255).round()
    green = (abs(first[..., 0] - 0x1a) < 24) & (abs(first[..., 1] - 0x7f) < 24) & (abs(first[..., 2] - 0x37) < 24)
    assert green.sum() > 20, "no verdict colour on the first screen"


def test_guard_events_are_listed_and_a_stopped_run_says_why(tmp_path):
    run = make_run(tmp_path, "guarded", steps=12)
    (run / "summary.json").unlink()  # a stopped run writes no summary
    events = [{"action": "recover", "signal": "valid/P", "value": 0.1, "reference": 0.95, "bound": 0.65, "step": 9,
               "first_step": 8, "recoveries": 1, "message": "...", "also": ["reward/P"], "to_step": 6,
               "lr_scale": 0.5, "beta_scale": 2.0},
              {"action": "stop", "signal": "kl_mean", "value": 3.2, "reference": None, "bound": 1.0, "step": 11,
               "first_step": 10, "recoveries": 1, "message": "...", "also": []}]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    page = write_report([str(run)]).read_text()
    section = page.split("<h2>Guard events</h2>")[1].split("</section>")[0]
    assert "valid/P" in section and "rolled back to step 6, LR x0.5, beta x2" in section and "reward/P" in section
    assert "kl_mean" in section and "stopped the run" in section
    assert "stopped by the guard at step 11: kl_mean" in page.split("<h2>Runs</h2>")[1].split("</section>")[0]
    quiet = write_report([str(make_run(tmp_path, "quiet"))]).read_text()
    assert "No guard event" in quiet and "stopped by the guard" not in quiet


def test_the_step_axis_of_a_short_run_is_labelled_in_whole_steps():
    """A 3-step run's plots label steps 1, 2, 3 (matplotlib's own choice was 1.00, 1.25, 1.50, ...)."""
    from rookworld_rlvr.report.plots import _new_figure

    fig, axes = _new_figure(2, "short run")
    axes[0].plot([1, 2, 3], [0.1, 0.3, 0.2])
    fig.canvas.draw()
    ticks = [x for ax in axes for x in ax.get_xticks() if 1 <= x <= 3]
    assert ticks and all(float(x).is_integer() for x in ticks)


def test_a_report_that_fails_at_the_end_of_a_run_is_said_and_the_run_stands(tmp_path, tiny_model_dir, small_data,
                                                                             capsys, monkeypatch):
    """The report is written after the run is saved: where it fails (a plotting bug, a font the machine lacks), the
    run does not end in its traceback with exit 1 as if training had failed. One line says what failed and that
    `rookworld report RUN` writes it; that command then does; --traceback shows where it failed."""
    from conftest import as_options

    from rookworld_rlvr.report import page

    def broken(_runs):
        raise RuntimeError("no font")

    run = tmp_path / "run"
    fields = dict(model=tiny_model_dir, data=small_data / "train.jsonl", eval_data="", output_dir=run, steps=1,
                  batch_positions=2, group_size=2, max_new_tokens=8, tensorboard="false", progress="false",
                  engine_cache="null", device="cpu", threads=1)
    monkeypatch.setattr(page, "write_report", broken)
    assert main(["train"] + as_options(fields)) == 0
    err = capsys.readouterr().err
    assert f"report: not written: RuntimeError: no font; the run is saved, and `rookworld report {run}` writes it" \
        in err and "Traceback" not in err
    assert (run / "final" / "model.safetensors").exists() and not (run / "report.html").exists()
    with pytest.raises(RuntimeError, match="no font"):
        main(["train"] + as_options({**fields, "output_dir": tmp_path / "again"}) + ["--traceback"])
    monkeypatch.undo()
    assert main(["report", str(run)]) == 0 and (run / "report.html").exists()


def test_a_model_sft_made_is_reported_from_its_log_beside_it(tmp_path, capsys):
    """`rookworld report M` of a base `rookworld sft` made (the shipped one, whose log is gzipped; one a GPU machine
    sent back, its log inside) draws its log's curves and puts its first and last evaluation side by side, into
    M.report beside the model (not into the model's folder); it said "no metrics.jsonl". Mixed with a GRPO run, or
    against a control, it is one line."""
    from conftest import REPO

    base = REPO / "models" / "rookworld-board"
    log = [json.loads(x) for x in gzip.decompress((REPO / "models" / "rookworld-board.sft_log.jsonl.gz").read_bytes())
           .decode().splitlines()]
    evals = [r for r in log if "eval_loss_P" in r]
    model = tmp_path / "rookworld-board"  # a copy of its log alone, so that M.report goes beside it here
    model.mkdir()
    (tmp_path / "rookworld-board.sft_log.jsonl.gz").write_bytes(
        (REPO / "models" / "rookworld-board.sft_log.jsonl.gz").read_bytes())
    assert main(["report", str(model)]) == 0
    page = tmp_path / "rookworld-board.report" / "report.html"
    assert capsys.readouterr().out == f"{page}\n" and not list(model.iterdir())
    assert sorted(p.name for p in (page.parent / "plots").iterdir()) == [
        "sft_held_out.png", "sft_held_out_loss.png", "sft_loss.png", "sft_schedule.png"]
    text = page.read_text()
    first, last = evals[0], evals[-1]
    assert f"rookworld-board: step {first['step']}</th>" in text and f"step {last['step']}</th>" in text
    row = re.search(r"<tr><td>legal best move</td>(.*?)</tr>", text).group(1)
    # beside them what chance scores: a random legal mover plays legal moves alone
    assert re.findall(r">([\d.]+)</td>", row) == [f"{e['policy/legal_best']:.4f}" for e in (first, last)] + ["1.0000"]

    kept = tmp_path / "b1"  # a base a GPU machine sent back: its log inside the folder
    kept.mkdir()
    (kept / "sft_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log[:3] + evals[:2]))
    assert main(["report", str(kept)]) == 0
    assert f"b1: step {first['step']}</th>" in (tmp_path / "b1.report" / "report.html").read_text()
    capsys.readouterr()
    assert main(["report", str(model), str(kept)]) == 0  # two bases overlaid, beside the first
    both = (tmp_path / "compare-rookworld-board-b1" / "report.html").read_text()
    assert f"rookworld-board: step {first['step']}</th>" in both and f"b1: step {first['step']}</th>" in both
    assert "<li>rookworld-board: no model saved yet (a run in progress, or its folder moved)</li>" in both
    assert main(["report", str(base), "--out", str(tmp_path / "shipped")]) == 0  # the shipped folder itself
    assert (tmp_path / "shipped" / "report.html").exists() and capsys.readouterr().out.endswith("report.html\n")
    shape = json.loads((base / "config.json").read_text())
    assert (f"<li>rookworld-board: gpt2, {shape['n_layer']} layers x {shape['n_embd']}, {shape['n_head']} heads, "
            f"context {shape['n_positions']}, vocabulary {shape['vocab_size']}</li>") in \
        (tmp_path / "shipped" / "report.html").read_text()
    run = make_run(tmp_path, "grpo")
    assert main(["report", str(model), str(run)]) == 1
    assert capsys.readouterr().err == (f"error: report: {model} is a model `rookworld sft` made and {run} is not: give "
                                       "GRPO runs or SFT models, not both\n")
    assert main(["report", str(model), "--against", str(run)]) == 1
    assert "--against judges GRPO runs" in capsys.readouterr().err
