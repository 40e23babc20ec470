"""Directories that appear complete or not at all, and renames that survive a power cut.

`write_dir` builds a directory in a temporary sibling, fsyncs every file, moves an existing
directory of that name aside, renames the new one into place, fsyncs the parent (so the rename
itself is on disk before anything relies on it) and only then deletes the old one. A kill at any
point leaves either the old directory or the new one under the name, never neither: if it comes
between the two renames, the old one is still whole beside it (`.NAME.old-*`) and
`restore_aside` puts it back.

A directory published so gets the permissions a plain `mkdir` and file writes would give under
the process's umask (temporary directories and safetensors' files are private: 0700 and 0600),
so that a model saved on a shared machine reads like any other. A save that fails on I/O (a full
disk) raises `SaveError`, which names the directory and says that the one there before is kept.

Owns the rename dance shared by model saves, GRPO checkpoints and SFT checkpoints, and
`write_text`, the appends of logs and journals, whose errors name their file. Pure Python:
imports nothing of the package.
"""

from __future__ import annotations

import errno
import glob
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable


class SaveError(OSError):
    """A directory that could not be written, for a reason of the machine's (a full disk, a read-only
    file system): nothing under its name changed."""


def io_failure(error: BaseException) -> bool:
    """Whether `error` is a failed read or write of the machine's rather than a fault of the code: an
    OSError, or safetensors' own error for one ("I/O error: No space left on device (os error 28)")."""
    return isinstance(error, OSError) or (type(error).__name__ == "SafetensorError" and "I/O error" in str(error))


# the errors of a machine that refuses a write: a full disk, a quota, a file-size limit, a read-only file system, a
# failing device, a folder the user may not write in
REFUSED = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO, errno.EACCES, errno.EPERM})


def refused_write(error: BaseException) -> bool:
    """Whether `error` is the machine refusing a write (`SaveError`, or an OSError of `REFUSED`): said in one line
    by the commands, not as a fault of the code."""
    return isinstance(error, SaveError) or (isinstance(error, OSError) and error.errno in REFUSED)


def named(error: OSError, path: str | os.PathLike) -> OSError:
    """`error` naming `path` where it names no file (a write or close refused on a full disk names none)."""
    return OSError(error.errno, error.strerror, os.fspath(path)) if error.filename is None and error.errno else error


def write_text(path: str | os.PathLike, text: str, append: bool = True) -> None:
    """`text` appended to `path` (or written afresh), an OSError naming `path` where the machine refuses it."""
    try:
        with open(path, "a" if append else "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as e:
        raise named(e, path) from e


def current_umask() -> int:
    """The process's umask, read where Linux shows it: setting it to read it back (os.umask's only way) would
    leave it at 0 for an instant in which another thread's new file (a log, TensorBoard's) is world-writable."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    umask = os.umask(0o077)  # elsewhere: the instant errs on the private side
    os.umask(umask)
    return umask


def publish_modes(root: Path) -> None:
    """Give `root` and everything under it the permissions of a plain mkdir and file write under
    the umask (directories 0777, files 0666, less the umask), as `write_dir` publishes it."""
    umask = current_umask()
    for dirpath, _, files in os.walk(root):
        os.chmod(dirpath, 0o777 & ~umask)
        for name in files:
            os.chmod(os.path.join(dirpath, name), 0o666 & ~umask)


def fsync_tree(root: Path) -> None:
    """fsync every file under `root` (their data is on disk before a rename publishes them)."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as fh:
                os.fsync(fh.fileno())


def fsync_dir(path: Path) -> None:
    """fsync a directory: the renames inside it are on disk (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def restore_aside(final: Path) -> bool:
    """Where a kill came between moving `final` aside and renaming its successor into place,
    put the old directory back; True when one was restored."""
    final = Path(final)
    if final.exists():  # the swap was done: a copy left aside is stale (a kill while it was deleted)
        for stale in final.parent.glob(f".{final.name}.old-*"):
            shutil.rmtree(stale, ignore_errors=True)
        return False
    for old in sorted(final.parent.glob(f".{final.name}.old-*")):
        inner = old / final.name
        if inner.is_dir():
            os.replace(inner, final)
            fsync_dir(final.parent)
            shutil.rmtree(old, ignore_errors=True)
            return True
    return False


def remove_dirs(paths: list[Path]) -> None:
    """Delete directories so that no kill leaves one half-deleted under its own name (where a resume
    would take it for whole): all are renamed to hidden siblings `.NAME.del-*` first, in the order
    given, and only then deleted. `remove_leftovers` deletes what a kill left of them."""
    gone = []
    for path in map(Path, paths):
        hidden = Path(tempfile.mkdtemp(prefix=f".{path.name}.del-", dir=path.parent))
        os.replace(path, hidden / path.name)
        gone.append(hidden)
    for parent in {Path(p).parent for p in paths}:
        fsync_dir(parent)
    for hidden in gone:
        shutil.rmtree(hidden, ignore_errors=True)


def remove_leftovers(parent: Path, pattern: str) -> None:
    """Delete the temporary and half-deleted siblings (`.NAME.tmp-*`, `.NAME.del-*`) that kills left
    in `parent` for names matching `pattern`."""
    for kind in ("tmp", "del"):
        for p in Path(parent).glob(f".{pattern}.{kind}-*"):
            shutil.rmtree(p, ignore_errors=True)


def write_dir(final: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp)` on a fresh temporary directory beside `final`, then swap it into place
    (see the module doc); returns `final`. On any error `final` is left as it was. What a killed
    save of the same name left (`.NAME.tmp-*`, `.NAME.del-*`: one writer per name) is deleted first,
    or each kill during a model's save would leave a model-sized hidden copy for good. A failure
    of the machine's (`io_failure`: a full disk) is raised as a `SaveError` naming `final`."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    restore_aside(final)
    remove_leftovers(final.parent, glob.escape(final.name))
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    old: Path | None = None
    try:
        write(tmp)
        publish_modes(tmp)
        fsync_tree(tmp)
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
            os.replace(final, old / final.name)
        os.replace(tmp, final)
        fsync_dir(final.parent)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            if not final.exists():  # put the previous directory back
                os.replace(old / final.name, final)
            shutil.rmtree(old, ignore_errors=True)
        if io_failure(e) and not isinstance(e, SaveError):
            kept = "the one there before is kept" if final.exists() else "nothing was written under that name"
            raise SaveError(f"cannot write {final}: {e}; {kept}") from e
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final
