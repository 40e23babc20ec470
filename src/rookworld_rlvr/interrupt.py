"""Stopping a long job where it stands when asked to: Ctrl-C, a scheduler's or a timeout's SIGTERM,
the terminal closed under it (SIGHUP: an SSH connection lost), or torchrun passing its own on to
every rank. The job finishes the step it is in, saves a checkpoint there and exits, so `--resume`
continues from that step, not from the last periodic checkpoint; a second Ctrl-C or SIGTERM ends it
at once, as it would have without this. Work that follows a checkpoint and changes nothing in it (a
held-out evaluation, minutes long on a CPU) stops at once.

Owns the signal handlers (installed by the command-line entry points only: a library caller keeps
its own), the exception that says a run stopped on request, and the forked worker pools, which must
start without a handler of the parent's. Imports nothing of the package.
"""

from __future__ import annotations

import contextlib
import errno
import multiprocessing as mp
import os
import signal
import sys
import threading
from typing import Iterator


class Interrupted(Exception):
    """A run stopped on a signal at a step boundary, its checkpoint of `step` saved."""

    def __init__(self, signum: int, step: int) -> None:
        self.signum, self.step = signum, step
        super().__init__(f"stopped at step {step} on {signal.Signals(signum).name}: checkpoint saved, --resume "
                         "continues from it")

    @property
    def exit_code(self) -> int:  # the shell's convention for a process ended by a signal
        return 128 + self.signum


def pool_size(cap: int = 16) -> int:
    """How many workers a forked pool takes by default: the cores this process may run on (a taskset's or a
    container's CPU set, not the machine's count, which a GPU machine's pinned data preparation would
    oversubscribe), at most `cap`."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cap, cores))


def chunk_size(n: int, workers: int) -> int:
    """Items a chunk where `n` are shared out among `workers` processes: about four chunks each, so that a slow
    chunk does not keep the other workers waiting at the end; at least 1."""
    return max(-(-n // (workers * 4)), 1)


def forked_pool(workers: int) -> mp.pool.Pool:
    """A multiprocessing Pool of `workers` forked processes that start with SIGTERM's default action,
    whatever handler this process has. A process forked under a Python handler loses a signal that comes
    before its interpreter runs again (CPython clears pending signals after a fork), and Pool.terminate(),
    at the end of every `with` block, sends SIGTERM to workers that may have just been forked: one that
    lost it waited forever for the lock its pool held (a data preparation hung 14 minutes)."""
    main = threading.current_thread() is threading.main_thread()
    found = signal.getsignal(signal.SIGTERM) if main else None
    if found is not None:  # None: set outside Python, or not the main thread: left as it is
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        return mp.get_context("fork").Pool(workers)
    finally:
        if found is not None:
            signal.signal(signal.SIGTERM, found)


class StopOnSignal:
    """Once entered and `arm`ed by the job at its first step (in the main thread), the first SIGINT,
    SIGTERM or SIGHUP only sets `asked` to its number and says so on stderr; the job checks `asked` between
    steps. A SIGHUP also points stdout and stderr, where they were a terminal, at /dev/null (that terminal is
    gone), and one that comes again is no second signal; so does a write the hung-up terminal fails first
    (`_TerminalStream`, sys.stdout and sys.stderr while armed).
    Before that (reading or encoding data: no step to end, no checkpoint to save), after the block and at
    a second signal, the handlers found at `arm` take the signal as they would have (Ctrl-C raises
    KeyboardInterrupt, SIGTERM ends the process); so do the processes this one forks.

    Only from the first step: the data a job reads first is read by forked workers, and those must start
    with SIGTERM's default action (`forked_pool`)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, verbose: bool = True) -> None:
        self.asked: int | None = None
        self.armed = False
        self.verbose = verbose
        self._entered = False
        self._at_once: int | None = None
        self._previous: dict[int, object] = {}
        self._terminal: list[int] = []
        self._pid = os.getpid()

    def __enter__(self) -> StopOnSignal:
        self._entered = True
        return self

    def arm(self) -> None:
        """From here (the job's first step) a first signal is asked, not acted on; safe to call again."""
        if self.armed or not self._entered or threading.current_thread() is not threading.main_thread():
            return
        self.armed, self._pid = True, os.getpid()
        self._terminal = [fd for fd in (1, 2) if os.isatty(fd)]  # asked now: a hung-up terminal says it is none
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if _fd(stream) in self._terminal:
                setattr(sys, name, _TerminalStream(stream))
        self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS
                          if signal.getsignal(s) not in (signal.SIG_IGN, None)}  # ignored (nohup, `&`), or
        # set outside Python (None: it could not be restored): left as it is

    def __exit__(self, *exc) -> None:
        self._entered = False
        self._restore()

    def _restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}
        for name in ("stdout", "stderr"):
            if isinstance(stream := getattr(sys, name), _TerminalStream):
                setattr(sys, name, stream.stream)

    @contextlib.contextmanager
    def at_once(self, step: int) -> Iterator[None]:
        """Within the block (work that a checkpoint of `step`, already written, does not need: an
        evaluation) the first signal raises Interrupted where the job stands, not at the next step."""
        self._at_once = step
        try:
            yield
        finally:
            self._at_once = None

    def _handle(self, signum: int, frame) -> None:
        if signum == signal.SIGHUP and os.getpid() == self._pid:
            _off_the_terminal(self._terminal)
            if self.asked is not None:  # a hangup comes twice (the terminal's, its shell's): it never means "now"
                return
        if self.asked is not None or os.getpid() != self._pid:
            self._restore()
            signal.raise_signal(signum)
            return
        self.asked = signum
        name = signal.Signals(signum).name
        if self._at_once is not None:
            if self.verbose:
                os.write(2, f"\n{name}: stopping now; the checkpoint of step {self._at_once} is saved\n".encode())
            raise Interrupted(signum, self._at_once)
        if self.verbose:  # os.write, not print: a handler may run while the main thread is inside a print
            again = "" if signum == signal.SIGHUP else "; send it again to stop at once"
            os.write(2, f"\n{name}: stopping after this step with a checkpoint (--resume continues from it){again}\n"
                     .encode())


def _off_the_terminal(fds: list[int]) -> None:
    """Point `fds` (this process's stdout and stderr where they were a terminal) at /dev/null, as nohup would:
    once the terminal has hung up every write to it fails (EIO), and a print or a progress bar would end the
    job before its step is saved. A log redirected to a file or a pipe is not a terminal and keeps its lines."""
    if not fds:
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in fds:
            os.dup2(null, fd)
    finally:
        os.close(null)


def _fd(stream) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by a test runner's capture, say, or closed
        return None


class _TerminalStream:
    """sys.stdout or sys.stderr of an armed job, where a terminal: a write the terminal fails because it hung up
    (EIO) points it at /dev/null, as SIGHUP's handler does, instead of ending the job. A lost SSH connection
    stalls first: nobody reads the terminal, the job waits in its next write, and the hangup fails that write
    before the job's SIGHUP handler runs. (tqdm's bars take EIO themselves; a print or `tqdm.write` did not.)"""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        with self._hung_up():
            return self.stream.write(text)
        return len(text)  # what the write kept in its buffer goes to /dev/null with the next flush

    def flush(self) -> None:
        with self._hung_up():
            self.stream.flush()

    @contextlib.contextmanager
    def _hung_up(self) -> Iterator[None]:
        """EIO from the terminal: point it at /dev/null and go on; any other error raises."""
        try:
            yield
        except OSError as e:
            if e.errno != errno.EIO:
                raise
            _off_the_terminal([self.stream.fileno()])

    def __getattr__(self, name: str):
        return getattr(self.stream, name)
