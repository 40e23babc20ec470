"""Progress bars that read as well in a log file as on a terminal.

On a terminal a bar opened while another runs (an evaluation inside `rookworld train`'s `grpo` bar) stacks
below it, tqdm's way: it moves the cursor down and back up (ESC [A) on every update. Into a file or a pipe
(`nohup make train > log`, CI) those moves have no line to act on: the log fills with `^[[A`, and `tail -f`
moves the reader's cursor up over earlier lines. There, every bar writes on the line it is on.

Owns `bar`, the one way the package makes a bar. Imports tqdm when a bar is made, nothing of the package.
"""

from __future__ import annotations

import sys
from typing import Any, Iterable


def bar(iterable: Iterable | None = None, *, enabled: bool = True, **kwargs: Any) -> Any:
    """A tqdm bar on stderr (`kwargs` as tqdm's); shown only where `enabled`, and without cursor moves where
    stderr is not a terminal."""
    from tqdm import tqdm

    if not sys.stderr.isatty():
        kwargs["position"] = 0
    return tqdm(iterable, disable=not enabled, **kwargs)
