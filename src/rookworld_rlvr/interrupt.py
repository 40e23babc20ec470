"""Stopping a long job where it stands when asked to: Ctrl-C, a scheduler's or a timeout's SIGTERM,
or torchrun passing its own SIGTERM on to every rank. The job finishes the step it is in, saves a
checkpoint there and exits, so `--resume` continues from that step, not from the last periodic
checkpoint; a second signal ends it at once, as it would have without this.

Owns the signal handlers (installed by the command-line entry points only: a library caller keeps
its own) and the exception that says a run stopped on request. Imports nothing of the package.
"""

from __future__ import annotations

import os
import signal
import threading


class Interrupted(Exception):
    """A run stopped on a signal at a step boundary, its checkpoint saved."""

    def __init__(self, signum: int, step: int) -> None:
        self.signum, self.step = signum, step
        super().__init__(f"stopped at step {step} on {signal.Signals(signum).name}: checkpoint saved, --resume "
                         "continues from it")

    @property
    def exit_code(self) -> int:  # the shell's convention for a process ended by a signal
        return 128 + self.signum


class StopOnSignal:
    """While entered (in the main thread) and once the job has `armed` it (at its first step: reading data
    or encoding it there is no step to end, and no checkpoint to save), the first SIGINT or SIGTERM only
    sets `asked` to its number and says so on stderr; the job checks `asked` between steps. Otherwise, and
    at a second signal, the handlers found on entry take the signal as they would have (Ctrl-C raises
    KeyboardInterrupt, SIGTERM ends the process); so do the processes this one forks (they inherit the
    handler, not the job's steps)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, verbose: bool = True) -> None:
        self.asked: int | None = None
        self.armed = False
        self.verbose = verbose
        self._previous: dict[int, object] = {}
        self._pid = os.getpid()

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            self._pid = os.getpid()
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS
                              if signal.getsignal(s) not in (signal.SIG_IGN, None)}  # ignored (nohup, `&`), or
            # set outside Python (None: it could not be restored): left as it is
        return self

    def __exit__(self, *exc) -> None:
        self._restore()

    def _restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def _handle(self, signum: int, frame) -> None:
        if self.asked is not None or not self.armed or os.getpid() != self._pid:
            self._restore()
            signal.raise_signal(signum)
            return
        self.asked = signum
        if self.verbose:  # os.write, not print: a handler may run while the main thread is inside a print
            os.write(2, f"\n{signal.Signals(signum).name}: stopping after this step with a checkpoint (--resume "
                        f"continues from it); send it again to stop at once\n".encode())
