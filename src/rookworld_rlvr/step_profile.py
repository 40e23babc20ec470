"""torch.profiler over a few training steps, written as text tables: where a step of a run's own shapes
spends its time, and on a GPU whether the kernels or the host's launches set the step's pace (the device
busy for a small share of the step's wall time means the host's launches do). A GPU machine's run sends
the file back, where a trace would be too large.

Owns the profile's window of steps and its tables. Imports torch inside functions only; nothing of chess
or of a trainer.
"""

from __future__ import annotations

import time
from pathlib import Path


class StepProfile:
    """Profile steps `after + 2` to `after + 1 + steps` of this invocation (its first `after` steps are
    CUDA's start and the allocator's warm-up; step `after + 1` warms the profiler up, unrecorded), then
    write the tables to `path`. `steps` 0: nothing is profiled. Call `before(step)` before each step and
    `after(step)` after it (`step`: the run's steps done); `close(step)` where the loop ends."""

    def __init__(self, steps: int, after: int, path: str | Path, device, label: str) -> None:
        self.steps, self.skip, self.path, self.device, self.label = steps, after, Path(path), device, label
        self.seen = 0  # steps of this invocation begun
        self.prof = None
        self.first = self.t0 = None
        self.done = steps == 0

    def before(self, step: int) -> None:
        self.seen += 1
        if self.done or self.prof is not None or self.seen <= self.skip:
            return
        from torch.profiler import ProfilerActivity, profile, schedule

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self._cuda() else [])
        try:
            self.prof = profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=self.steps, repeat=1))
            self.prof.start()
        except Exception as e:  # noqa: BLE001 - a diagnostic that fails must not end the training it watches
            self._failed("did not start", e)
            return
        self.first = step + 2  # the run's number of the first recorded step

    def after(self, step: int) -> None:
        if self.prof is None:
            return
        if step + 1 == self.first:  # the warm-up step is done: the recorded steps' clock starts
            self._sync()
            self.t0 = time.perf_counter()
        try:
            self.prof.step()
        except Exception as e:  # noqa: BLE001
            self._failed(f"failed at step {step}", e)
            return
        if step + 1 - self.first >= self.steps:
            self._finish(step)

    def close(self, step: int) -> None:
        """The loop ended: a window still open is written with the steps it recorded."""
        if self.prof is not None:
            self._finish(step)

    def _cuda(self) -> bool:
        return getattr(self.device, "type", str(self.device)) == "cuda"

    def _sync(self) -> None:
        if self._cuda():
            import torch

            torch.cuda.synchronize(self.device)

    def _failed(self, what: str, error: Exception) -> None:
        """The profiler's failure, said and written where its tables would be; the run goes on unprofiled."""
        self.prof, self.done = None, True
        line = f"{self.label}: the profiler {what}: {type(error).__name__}: {error}"
        print(f"warning: {line}", flush=True)
        self.path.write_text(f"# {line}\n")

    def _finish(self, step: int) -> None:
        self._sync()
        wall = time.perf_counter() - self.t0 if self.t0 is not None else 0.0
        prof, self.prof, self.done = self.prof, None, True
        try:
            prof.stop()
            self._write(prof, step, wall)
        except Exception as e:  # noqa: BLE001
            self._failed(f"failed at its end (step {step})", e)

    def _write(self, prof, step: int, wall: float) -> None:
        n = step - self.first + 1
        if n < 1:
            self.path.write_text(f"# {self.label}: no step profiled (the run ended in the profiler's warm-up step "
                                 f"{step})\n")
            return
        events = prof.key_averages()
        by = "self_device_time_total" if self._cuda() else "self_cpu_time_total"
        which = f"steps {self.first}-{step}" if n > 1 else f"step {step}"
        head = f"# {self.label}: {which} on {self.device}, {wall / n:.4f} s a step"
        if self._cuda():  # the kernels' and copies' own time, as the table's total counts it (not the ranges)
            from torch.autograd import DeviceType

            busy = sum(e.self_device_time_total for e in events
                       if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)) / 1e6
            head += (f"; the device busy {busy / n:.4f} s a step ({busy / wall:.0%} of the wall time: far below "
                     "100%, the host's launches set the pace)" if wall else "")
        self.path.write_text(head + f"\n\n## by {by}\n" + events.table(sort_by=by, row_limit=40,
                                                                        max_name_column_width=70)
                             + "\n## by calls\n" + events.table(sort_by="count", row_limit=25,
                                                               max_name_column_width=70))
