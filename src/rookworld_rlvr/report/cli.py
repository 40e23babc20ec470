"""`rookworld report RUN [RUN ...]`: PNG plots and a self-contained HTML page of GRPO runs.

Owns the command line of `report.page.write_report` (imported inside `run`, so `rookworld --help`
stays fast).
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories (several: overlaid in one report)")
    p.add_argument("--out", default=None, help="output directory (default: the run itself, or "
                                               "compare-<names> beside the first run)")


def run(args: argparse.Namespace, name: str) -> int:
    from rookworld_rlvr.report.page import write_report

    print(write_report(args.runs, args.out))
    return 0
