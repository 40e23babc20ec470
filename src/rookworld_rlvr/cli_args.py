"""Command-line argument types and options that several subcommands share.

Owns the argument types `at_least_one`, `zero_or_more`, `share`, `temperature`, `output_file` and
`output_dir` (an output path a file stands in the way of is named before any work), and `--threads`
for the commands that run a model outside the trainer (`eval`, `match`, `uci`): two torch processes
on the same cores, each with torch's default of one thread per core, wait on each other's spinning
threads (a 78-second match took 30 minutes beside a training run on 2 cores), so such a command
takes a share.
Also `parse`: argparse's parsing, where an option no command takes is named with the options of
that command it may mean. Imports argparse and `paths`; torch is imported when the threads are set.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from rookworld_rlvr.paths import blocked_directory, blocking_file


def _integer(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
    return value


def at_least_one(text: str) -> int:
    """An argparse type: an integer >= 1, or an error naming the value."""
    return _integer(text, 1)


def zero_or_more(text: str) -> int:
    """An argparse type: an integer >= 0 (a count that may be none), or an error naming the value."""
    return _integer(text, 0)


def output_file(text: str) -> str:
    """An argparse type: a file the command writes ('' where the option allows none), checked before any work:
    not a directory, and no file stands where one of its folders must be."""
    path = Path(text).expanduser()
    if text and path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give a file name")
    if text and (at := blocking_file(path.parent)):
        raise argparse.ArgumentTypeError(f"{text}: {at} is a file, not a directory")
    return text


def output_dir(text: str) -> str:
    """An argparse type: a folder the command writes into, checked before any work (no file in its place)."""
    if why := blocked_directory(text):
        raise argparse.ArgumentTypeError(why)
    return text


def _number(text: str, ok, rule: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
    return value


def share(text: str) -> float:
    """An argparse type: a number in [0, 1], or an error naming the value."""
    return _number(text, lambda v: 0 <= v <= 1, "a share in [0, 1]")


def seconds(text: str) -> float:
    """An argparse type: a finite number of seconds > 0 (a wait that can end), or an error naming the value."""
    return _number(text, lambda v: 0 < v < float("inf"), "a finite number of seconds > 0")


def temperature(text: str) -> float:
    """An argparse type: a finite number >= 0 (0 = greedy), or an error naming the value."""
    return _number(text, lambda v: 0 <= v < float("inf"), "a finite number >= 0 (0 = greedy)")


DEVICE_HELP = "auto (CUDA, then MPS, then the CPU), cpu, cuda, cuda:N or mps"


def add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", help=f"{DEVICE_HELP} (default auto)")


def add_threads(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=at_least_one, default=None, metavar="N",
                   help="torch threads for the model (default: torch's choice, one per core); give a share of the "
                        "cores when another torch job runs beside this one")


def apply_threads(args: argparse.Namespace) -> None:
    """Set torch's intra-op threads from `--threads`; without it torch keeps its own choice."""
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)


def warn_without_effect(notes: list[str], prefix: str = "") -> None:
    """A command's settings that nothing of its run reads, one warning line each on stderr (before the work)."""
    for note in notes:
        print(f"{prefix}warning: setting without effect: {note}", file=sys.stderr)


def parse(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """`parser.parse_args(argv)`, but arguments no option takes are an error of the (sub)command given, with its
    options that a mistyped one may mean (`--stepz 3`: did you mean --steps?)."""
    args, extra = parser.parse_known_args(argv)
    if not extra:
        return args
    while subs := [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]:
        if getattr(args, subs[0].dest, None) not in subs[0].choices:
            break
        parser = subs[0].choices[getattr(args, subs[0].dest)]
    options = [o for a in parser._actions for o in a.option_strings]
    hints = [f"; {name}: did you mean {' or '.join(close)}?" for name in (w.split("=")[0] for w in extra)
             if name.startswith("-") and (close := difflib.get_close_matches(name, options, n=3, cutoff=0.75))]
    parser.exit(2, f"{parser.prog}: error: unrecognized arguments: {' '.join(extra)}{''.join(hints)} "
                   f"({parser.prog} --help lists its options)\n")
