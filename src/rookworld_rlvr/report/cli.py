"""`rookworld report RUN [RUN ...]`: PNG plots and a self-contained HTML page of GRPO runs, or of models
`rookworld sft` made (their log beside them).

Owns the command line of `report.page.write_report` and `report.sft.write_sft_report` (imported inside `run`,
so `rookworld --help` stays fast).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rookworld_rlvr.cli_args import output_dir


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="GRPO run directories, or models `rookworld sft` made, M with M.sft_log.jsonl beside it "
                        "or M/sft_log.jsonl inside (several: overlaid in one report)")
    p.add_argument("--out", type=output_dir, default=None,
                   help="output directory (default: the run itself, or compare-<names> beside the first run; "
                        "for a model M, M.report beside it)")
    p.add_argument("--against", metavar="CONTROL", default=None,
                   help="a control run (say `rookworld train --reward-signal false`): each RUN's final model judged "
                        "against its final model on the same held-out items, printed and in the report")


def run(args: argparse.Namespace, name: str) -> int:
    from rookworld_rlvr.report.page import against_text, load_control, load_runs, write_loaded
    from rookworld_rlvr.report.sft import load_sfts, sft_log, write_sft_report

    models = [p for p in args.runs if not (Path(p) / "metrics.jsonl").is_file() and sft_log(p)]
    if models:
        if len(models) < len(args.runs):
            run = next(p for p in args.runs if p not in models)
            raise ValueError(f"report: {models[0]} is a model `rookworld sft` made and {run} is not: give GRPO "
                             "runs or SFT models, not both")
        if args.against:
            raise ValueError("report: --against judges GRPO runs against a control run; give SFT models alone")
        print(write_sft_report(load_sfts(models), args.out))
        return 0
    runs = load_runs(args.runs)  # read once: the page and the printed verdicts share them
    control = load_control(args.against, runs)
    page = write_loaded(runs, args.out, control)
    if control:
        print(against_text(runs, control) + "\n")
    print(page)
    return 0
