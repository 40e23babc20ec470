"""How an error names a path that is not there.

The shipped presets and defaults name files relative to the checkout (`data/train.jsonl.xz`,
`models/rookworld-board`), and a relative path is read from the working directory. A command run
from anywhere else finds none of them: the error then says where it looked, so that the fix (run
from the checkout, or give the path whole) is plain from the message alone.

Owns `here`, `no_such_file`, `blocking_file` and `blocked_directory`, the wording of a missing path and of a
directory a file stands in the way of. Pure Python: imports nothing of the package.
"""

from __future__ import annotations

import os
from pathlib import Path


def here(path: str | os.PathLike) -> str:
    """' in CWD' for a relative path (where it was looked for), '' for an absolute one."""
    return "" if Path(path).expanduser().is_absolute() else f" in {Path.cwd()}"


def no_such_file(path: str | os.PathLike) -> str:
    """`path: no such file`, with the working directory when the path is relative."""
    return f"{path}: no such file{here(path)}"


def blocking_file(path: str | os.PathLike) -> Path | None:
    """The file that stops directory `path` from being made or used (it, or the nearest of its parents that
    exists), or None."""
    p = Path(path).expanduser()
    at = next((a for a in (p, *p.parents) if a.exists()), None)
    return None if at is None or at.is_dir() else at


def blocked_directory(path: str | os.PathLike) -> str | None:
    """Why directory `path` cannot be made or used (it, or the nearest of its parents that exists, is a file),
    or None."""
    at = blocking_file(path)
    if at is None:
        return None
    return f"{path} is a file, not a directory" if at == Path(path).expanduser() else \
        f"{path}: {at} is a file, not a directory"
