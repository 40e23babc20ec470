"""One run at a time in an output directory.

Two runs into one directory (`make train` started in a second terminal, a run started again while the
first still trains) would interleave their logs and checkpoints, and the second, starting fresh, would
set the first one's directory aside under its feet. The second one stops at once instead, naming the
first. The lock is an exclusive POSIX record lock (`lockf`) on a file beside the directory (`.NAME.lock`
in its parent, as the directory itself may be renamed): the kernel drops it when the process ends,
however it ends, so a killed run never leaves a stale lock and `--resume` after a kill goes on at once.
Not `flock`: a process the run forks (its data-reading workers) would hold that one too, and outlive a
killed run holding it; a record lock belongs to the process alone.

Owns that lock. Pure Python: imports nothing of the package.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


class RunInUse(RuntimeError):
    """Another live process holds the output directory."""


@contextmanager
def one_run_in(directory: str | os.PathLike, option: str = "--output-dir") -> Iterator[None]:
    """Hold `directory` for this process until the block ends; RunInUse if another process holds it.
    `option` names the setting that picks another directory, for the message."""
    path = Path(directory).expanduser().absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.parent / f".{path.name}.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _take(fd, lock, directory, option)
        yield
    finally:
        os.close(fd)  # the lock goes with it (this process opens the file once: no other close drops it early)


def _take(fd: int, lock: Path, directory: str | os.PathLike, option: str) -> None:
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):  # no locks here (some network disks)
            print(f"warning: {lock}: cannot lock ({e.strerror}); two runs into {directory} at once would mix their "
                  "files", file=sys.stderr)
            return
        holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "a process that has not said which"
        raise RunInUse(f"{directory} is in use by another run ({holder}); wait for it to end, or give another "
                       f"{option}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}".encode(),
              0)
