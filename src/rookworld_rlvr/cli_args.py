"""Command-line argument types and options that several subcommands share.

Owns `at_least_one` (a count that must be positive) and `--threads` for the commands that run a
model outside the trainer (`eval`, `match`, `uci`): two torch processes on the same cores, each
with torch's default of one thread per core, wait on each other's spinning threads (a 78-second
match took 30 minutes beside a training run on 2 cores), so such a command takes a share.
Imports only argparse; torch is imported when the threads are set.
"""

from __future__ import annotations

import argparse


def at_least_one(text: str) -> int:
    """An argparse type: an integer >= 1, or an error naming the value."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_threads(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=at_least_one, default=None, metavar="N",
                   help="torch threads for the model (default: torch's choice, one per core); give a share of the "
                        "cores when another torch job runs beside this one")


def apply_threads(args: argparse.Namespace) -> None:
    """Set torch's intra-op threads from `--threads`; without it torch keeps its own choice."""
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
