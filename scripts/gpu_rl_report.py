#!/usr/bin/env python
"""results.md and record.tar for scripts/gpu_rl.sh: `python scripts/gpu_rl_report.py WORK OUT`.

results.md: the GRPO run's (or its control's) verdict (its base and the trained model on the held-out sets, next to
a random mover, with 95% intervals), the two matches, the machine, the minutes each stage took and the stages not
run yet (a deadline, or a GRPO run not done), the base's SFT and GRPO's pace (samples a second; positions, seconds
a step and its phases), and the issue's goals for the base and for GRPO, each met or not.
record.tar: the matches, self-play games, minutes per stage, the base's data log and how its games ended where GRPO
took its prompts from them (--game-positions), as far as each has got. Then a check that everything in OUT would
come back from the GPU machine (at most 8 files of 16 MiB, 64 MiB in all; exit 1 when not). Written after every
stage: it reports what is done so far.
"""

from __future__ import annotations

import io
import json
import platform
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from export_bf16 import report as report_files  # noqa: E402
from sft_history import describe, earlier  # noqa: E402


def machine(work: Path) -> str:
    """The GPU (or CPU) and torch, asked once per WORK (a WORK lives on one machine): torch takes seconds to
    import, and the report is written after every stage."""
    known = work / "machine.txt"
    if known.exists():
        return known.read_text().strip()
    import torch

    where = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({platform.processor() or 'cpu'})"
    cuda = f", CUDA {torch.version.cuda}" if torch.cuda.is_available() else ""
    text = f"{where}; torch {torch.__version__}{cuda}"
    known.write_text(text + "\n")
    return text


def sft_pace(work: Path) -> str | None:
    """The base's SFT as its log and checkpoint have it: steps, rows a step, samples a second (over its training
    minutes, held-out evaluations and the first steps' warm-up included), and the calls before it that trained the
    model it continued."""
    log, state = work / "sft" / "base.sft_log.jsonl", work / "sft" / "base.checkpoint" / "sft_state.json"
    if not (log.exists() and state.exists()):
        return None
    last = json.loads(log.read_text().splitlines()[-1])
    batch = json.loads(state.read_text())["config"]["batch_size"]  # statefile's JSON: plain values as they are
    samples = last["step"] * batch
    text = (f"The base's SFT: {last['step']:,} steps of {batch} rows ({samples / 1e6:.2f}M samples) in "
            f"{last['seconds'] / 60:.1f} minutes, {samples / max(last['seconds'], 1e-9):,.0f} samples a second.")
    calls = earlier(work / "sft" / "export")  # every call that trained it (gpu_base.sh --init): the export's history
    if len(calls) > 1:
        text += (f" It continued {calls[-1]['init']}, trained before in {describe(calls[:-1])}; in all "
                 f"{describe(calls)}.")
    return text


def grpo_pace(run: Path) -> str:
    """The positions GRPO drew and where its steps' time went (metrics.jsonl's phases over every step, a step a
    guard undid included): the goal is tens of thousands of positions in minutes, and a run that waits on scoring
    shows it in `score`."""
    import yaml

    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    if not records:
        return ""
    per_step = yaml.safe_load((run / "config.yaml").read_text())["batch_positions"]
    total = sum(r["time/step"] for r in records)
    phases = {k.removeprefix("time/"): sum(r.get(k, 0.0) for r in records) / max(total, 1e-9)
              for k in records[0] if k.startswith("time/") and k != "time/step"}
    shares = ", ".join(f"{k} {v:.0%}" for k, v in phases.items() if v >= 0.005)
    return (f" {len(records) * per_step:,} positions drawn ({per_step} a step), {total / len(records):.2f} s a step: "
            f"{shares}.")


def minutes(times: list[list[str]]) -> str:
    """Each stage's minutes from times.tsv (name, seconds, start time), the stages that ran at the same time as
    another named: their minutes overlap, so they do not add up to the call's."""
    spans = {row[0]: (int(row[2]), int(row[2]) + int(row[1])) if len(row) > 2 else None for row in times}
    at_once = [a for a, x in spans.items()
               if x and any(b != a and y and x[0] < y[1] and y[0] < x[1] for b, y in spans.items())]
    text = ", ".join(f"{row[0]} {int(row[1]) / 60:.1f}" for row in times)
    return text + (f" ({', '.join(at_once)} at once)" if at_once else "")


# The GPU base's goals, each judged on the base's held-out evaluation at the start of GRPO: (figure, at least, label,
# chance: a random legal mover's figure on the same items, as a number or where the evaluation holds it; None: none)
BASE_GOALS = (
    ("strength.legal", 0.97, "legal best move (judged positions)", 1.0),
    ("puzzles.mate1.solved", 0.32, "mate in one (RookWorld-LM-124M: 32.1%)", "puzzles.mate1.random.solved"),
    ("strength.best", 0.20, "Stockfish's best move", "strength.random.best"),
    ("strength.loss_below_random", 0.50, "expected-score loss below the random mover's", 0.0),
    ("environment.next_state_acc", 0.97, "A: next state", None),
    ("histories.slices.history_1.next_state_acc", 0.97, "A: next state, game starts (1-move history)", None),
    ("histories.slices.history_2_9.next_state_acc", 0.97, "A: next state, short histories (2-9 moves)", None),
    ("environment.slices.ordinary.next_state_acc", 0.97, "A: next state, ordinary moves", None),
    ("environment.slices.game_ending.next_state_acc", 0.97, "A: next state, game-ending moves", None),
    ("environment.slices.illegal.next_state_acc", 0.97, "A: next state, illegal moves", None),
)
# GRPO's goals against its base: (verdict row, the verdict it needs, or None: anything but "worse")
GRPO_GOALS = (
    ("strength.loss_below_random", "better"), ("strength.blunder_below_random", "better"),
    ("strength.both_legal.loss", "better"), ("strength.both_legal.blunder", "better"),
    ("puzzles.mate1.solved", None), ("puzzles.tactic.solved", None), ("environment.next_state_acc", None),
)


def _match_row(label: str, match: dict | None, chance: str = "") -> str:
    """A goal row for a match that must be won: the 95% interval of its Elo above 0 (`chance`: the cell of a
    table with a random mover's column)."""
    if match is None:
        return f"| {label} | won | {chance}not played | - |"
    from rookworld_rlvr.tables import fmt_elo

    elo = fmt_elo(match).replace(" (95% CI ", " (")  # the goal's column says which interval
    return (f"| {label} | won | {chance}+{match['wins']} ={match['draws']} -{match['losses']}, {elo} | "
            f"{'yes' if match['elo_low'] > 0 else 'no'} |")


def goals(summary: dict | None, matches: dict[str, dict | None], selfplay: float | None) -> list[str]:
    """The issue's goals as a table each: the base's (needs GRPO's start evaluation, the base's self-play
    game and its match against models/rookworld-board), then GRPO's against its base."""
    from rookworld_rlvr.verdict import get, rows

    base = summary["base"] if summary else None
    lines = ["## Goals", "", "| the base | needed | random mover | reached | met |", "|---|---|---|---|---|"]
    for key, least, label, chance in BASE_GOALS:
        value = get(base, key)
        chance = get(base, chance) if isinstance(chance, str) else chance
        lines.append(f"| {label} | {least:.0%} | {'-' if chance is None else f'{chance:.1%}'} | " + (
            "not measured | - |" if value is None else f"{value:.1%} | {'yes' if value >= least else 'no'} |"))
    lines.append("| self-play from the start, legal half-moves | 60 | - | " + (
        "not played | - |" if selfplay is None else f"{selfplay:.0f} | {'yes' if selfplay >= 60 else 'no'} |"))
    lines.append(_match_row("match against models/rookworld-board", matches["match_base_vs_board"], chance="- | "))
    lines += ["", "| GRPO against its base | needed | reached | met |", "|---|---|---|---|",
              _match_row("200-game match", matches["match_trained_vs_base"])]
    verdicts = {r["key"]: r for r in rows(base, summary["final"])} if summary else {}
    for key, needed in GRPO_GOALS:
        r = verdicts.get(key)
        got = "not measured | -" if r is None or r["change"] is None else (
            f"{r['change']:+.3f}, {r['verdict'] or 'no interval'} | "
            + ("yes" if (r["verdict"] == needed if needed else r["verdict"] not in ("worse", "")) else "no"))
        label = r["label"] if r else key
        lines.append(f"| {label} | {needed + ' beyond the noise' if needed else 'not worse'} | {got} |")
    return lines + [""]


def report(work: Path) -> str:
    from rookworld_rlvr.play import format_summary
    from rookworld_rlvr.verdict import verdict_table

    summary_path = work / "grpo" / "summary.json"
    summary = json.loads(summary_path.read_text()) if (work / "grpo.done").exists() else None
    times = [line.split("\t") for line in (work / "times.tsv").read_text().splitlines() if line.strip()]
    skipped = (work / "skipped.txt").read_text().splitlines() if (work / "skipped.txt").exists() else []
    data = work / "sft" / "train.summary"
    told = data.read_text().strip().removeprefix("gpu_base: ").removesuffix(".") if data.exists() else ""
    base = (work / "base_model").read_text().strip() if (work / "base_model").exists() else ""
    given = base and Path(base).resolve() != (work / "sft" / "base").resolve()
    control = (work / "mode").exists() and (work / "mode").read_text().strip() == "control"
    run = "GRPO's control (--control: reward_signal false, every advantage 0: the anchor and KL alone)" if control \
        else "GRPO"
    lines = ["# GPU base and GRPO (scripts/gpu_rl.sh)", "", f"Machine: {machine(work)}.", "",
             *([f"Base: {base} (--base).", ""] if given else []),
             told[:1].upper() + told[1:] + "." if told else "Training data: not recorded.", "",
             "Minutes per stage: " + minutes(times) + ".", ""]
    pace = sft_pace(work) if not given else None
    if pace:
        lines += [pace, ""]
    profile = work / "sft" / "base.profile.txt"  # torch.profiler's tables of a few SFT steps: record.tar
    if profile.exists() and not given:
        lines += ["The base's SFT, profiled (sft/base.profile.txt): "
                  + profile.read_text().splitlines()[0].removeprefix("# rookworld sft of ") + ".", ""]
    prompts = work / "positions" / "summary.txt"  # --game-positions: where GRPO's prompts came from
    if prompts.exists() and (work / "positions.done").exists():
        lines += [prompts.read_text().strip() + ".", ""]
    if skipped:
        lines += ["Not run in this call (the same command runs them): " + "; ".join(skipped) + ".", ""]
    if summary is None:
        lines += [f"{run}: not run.", ""]
    else:
        lines += [f"{run}: {summary['steps']} steps"
                  + (f" in {summary['minutes']} minutes" if "minutes" in summary else "")
                  + (" (ended by max_minutes)" if summary.get("ended_by_time") else "") + "."
                  + grpo_pace(work / "grpo"), "",
                  f"## Verdict: the base -> the {'control' if control else 'trained'} model (held-out, greedy)", "",
                  "```",
                  verdict_table(summary["base"], summary["final"]), "```", ""]
    matches = {name: json.loads((work / f"{name}.json").read_text()) if (work / f"{name}.json").exists() else None
               for name in ("match_trained_vs_base", "match_base_vs_board")}
    lines += ["## Matches", ""]
    for name, match in matches.items():
        lines += ["```", format_summary(match), "```", ""] if match else [f"{name}: not played", ""]
    lines += ["## Self-play from the start (greedy, one game)", ""]
    for name in ("base", "trained"):
        path = work / f"selfplay_{name}.json"
        if not path.exists():
            lines.append(f"- {name}: not played")
            continue
        sp = json.loads(path.read_text())["selfplay"]
        end = next(k.removeprefix("ended_").replace("_", " ") for k in ("ended_illegal", "ended_game_over",
                                                                        "ended_max_plies") if sp[k])
        lines.append(f"- {name}: {sp['mean_legal_half_moves']:.0f} legal half-moves (ended by: {end})")
    path = work / "selfplay_base.json"
    plies = json.loads(path.read_text())["selfplay"]["mean_legal_half_moves"] if path.exists() else None
    return "\n".join(lines + ["", *goals(summary, matches, plies)])


RECORD = ("times.tsv", "match_*.json", "match_*.pgn", "selfplay_*.json", "sft/prepare.log", "sft/base.profile.txt",
          "positions/games.txt")


def write_record(work: Path, out: Path) -> None:
    """OUT/record.tar from WORK's RECORD files as they stand. Each is read once, whole: a match still appending its
    games to its PGN (the judging stages run at once) is archived as far as it has got, where GNU tar fails on a
    file that grows while it reads it ("file changed as we read it")."""
    files = [p for pattern in RECORD for p in sorted(work.glob(pattern)) if p.is_file()]
    if not files:
        return
    tmp = out / ".record.tar.tmp"
    with tarfile.open(tmp, "w") as tar:
        for path in files:
            data = path.read_bytes()
            info = tarfile.TarInfo(path.relative_to(work).as_posix())
            info.size, info.mtime, info.mode = len(data), int(path.stat().st_mtime), 0o644
            tar.addfile(info, io.BytesIO(data))
    tmp.replace(out / "record.tar")  # a call stopped meanwhile leaves the last one whole


def main(argv: list[str] | None = None) -> int:
    work, out = (Path(a) for a in (argv if argv is not None else sys.argv[1:]))
    write_record(work, out)
    text = report(work)
    (out / ".results.md.tmp").write_text(text + "\n")
    (out / ".results.md.tmp").replace(out / "results.md")  # a call stopped meanwhile leaves the last one whole
    print(text)
    return report_files(sorted(p for p in out.rglob("*") if p.is_file()), "gpu_rl", out)


if __name__ == "__main__":
    sys.exit(main())
