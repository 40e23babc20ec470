"""`rookworld report RUN [RUN ...]`: PNG plots and a self-contained HTML page of GRPO runs.

Owns the command line of `report.page.write_report` (imported inside `run`, so `rookworld --help`
stays fast).
"""

from __future__ import annotations

import argparse

from rookworld_rlvr.cli_args import output_dir


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories (several: overlaid in one report)")
    p.add_argument("--out", type=output_dir, default=None,
                   help="output directory (default: the run itself, or compare-<names> beside the first run)")
    p.add_argument("--against", metavar="CONTROL", default=None,
                   help="a control run (say `rookworld train --reward-signal false`): each RUN's final model judged "
                        "against its final model on the same held-out items, printed and in the report")


def run(args: argparse.Namespace, name: str) -> int:
    from rookworld_rlvr.report.page import against_text, load_control, load_runs, write_loaded

    runs = load_runs(args.runs)  # read once: the page and the printed verdicts share them
    control = load_control(args.against, runs)
    page = write_loaded(runs, args.out, control)
    if control:
        print(against_text(runs, control) + "\n")
    print(page)
    return 0
