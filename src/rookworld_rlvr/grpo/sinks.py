"""The per-step logging sinks: each record's numbers into TensorBoard's event file (`tensorboard`) and into a
Weights & Biases run (`wandb`); `rookworld train` writes them into output_dir (tb/, wandb/, wandb_id), `rookworld
sft` beside its model (OUT.tb, OUT.wandb). Owns only these two; the JSONL logs are runlog.py's and sft.py's.
Imports tensorboard and wandb only where a run asks for them.

A resumed run goes on where its checkpoint stands in both, as its log does: TensorBoard hides the steps logged
after the checkpoint (the resumed run redoes them), and wandb logs into the same run, whose id a file of the run
keeps (offline runs of one id are one run once `wandb sync` sends them); there a redone step's figures stand beside
its first ones, as a guard's rollback's do in both."""
from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rookworld_rlvr.config import TrainConfig

Record = dict


@dataclass(frozen=True)
class Where:
    """Where a run's sinks write, and what they know of it: `name` (wandb's run name), `tb` (TensorBoard's folder),
    `wandb_dir` (wandb's files) and `wandb_id` (the file that keeps the run's id), whether it `resume`s at `step`
    (its checkpoint's), its settings (`config`), its wandb `group`, and how its command turns wandb `off`."""

    name: str
    tb: Path
    wandb_dir: Path
    wandb_id: Path
    config: dict
    resume: bool = False
    step: int = 0
    group: str | None = None
    off: str = "set wandb: false"


class Sinks:
    """Call with each step's record; `close` at the run's end, failed or not: the event file is closed and the
    wandb run ends with the run's exit code (a sweep's next trial then gets a run of its own). As a context manager
    it closes on leaving, failed where an exception leaves it."""

    def __init__(self, where: Where, tensorboard: bool, wandb: bool) -> None:
        self._sinks: list[Callable[[Record], None]] = []
        self._closers: list[Callable[[bool], None]] = []
        try:
            if wandb:
                run = wandb_run(where)
                self._sinks.append(run.log)  # plotted against the record's own "step" (wandb_run)
                self._closers.append(lambda failed: run.finish(exit_code=1 if failed else 0))
            if tensorboard:  # on resume, what was logged after the checkpoint (step) is hidden: it is redone
                log, close = tensorboard_sink(where.tb, where.step + 1 if where.resume else None)
                self._sinks.append(log)
                self._closers.append(lambda failed: close())
        except BaseException:  # one that did not start leaves none of the others open
            self.close(failed=True)
            raise

    def __enter__(self) -> "Sinks":
        return self

    def __exit__(self, kind, *_) -> None:
        self.close(failed=kind is not None)

    def __call__(self, record: Record) -> None:
        for sink in self._sinks:
            sink(record)

    def close(self, failed: bool = False) -> None:
        """Once; a run that failed has said its error, which an error in closing does not replace."""
        closers, self._closers = self._closers, []
        for close in closers:
            try:
                close(failed)
            except Exception:
                if not failed:
                    raise


def writer(cfg: TrainConfig, step: int = 0, group: str | None = None) -> Sinks | None:
    """`rookworld train`'s sinks (output_dir/tb, output_dir/wandb), or None where it asks for neither; `step`:
    where the run starts (a resume's checkpoint); `group`: the wandb group the run belongs to (a sweep's trials:
    the sweep)."""
    if not (cfg.tensorboard or cfg.wandb):
        return None
    out = Path(cfg.output_dir)
    where = Where(out.resolve().name, out / "tb", out, out / "wandb_id", cfg.to_dict(), cfg.resume, step, group)
    return Sinks(where, cfg.tensorboard, cfg.wandb)


def tensorboard_sink(out: Path, purge_step: int | None) -> tuple[Callable[[Record], None], Callable[[], None]]:
    """A sink for each record's numbers into TensorBoard's event file in `out`, and its closer (`rookworld sft`'s
    too). A write the machine refuses (a full disk) raises from the sink as an OSError naming `out`, which the
    command says in one line. `purge_step`: TensorBoard hides this step's events and later ones written before (a
    resume's redone steps)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ValueError("tensorboard: true needs the tensorboard package (pip install tensorboard) "
                         "or set tensorboard: false") from None
    from rookworld_rlvr.atomic import named

    _quiet_tensorboard_thread()
    try:
        tb = SummaryWriter(str(out), purge_step=purge_step)
    except OSError as e:
        raise named(e, out) from e

    def sink(record: Record) -> None:
        try:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key != "step":
                    tb.add_scalar(key, value, record["step"])
            tb.flush()
        except OSError as e:
            raise named(e, out) from e

    def close() -> None:
        try:
            tb.close()
        except OSError as e:
            raise named(e, out) from e
    return sink, close


def wandb_run(where: Where):
    """A wandb run in project rookworld-rlvr named `where.name`; a resume continues the run whose id
    `where.wandb_id` keeps. No login is one line that says how to log in or to log offline."""
    try:
        import wandb
    except ImportError:
        raise ValueError("wandb: true needs the wandb package (pip install wandb)") from None
    from rookworld_rlvr.data.io import atomic_write_text

    run_id = where.wandb_id.read_text().strip() if where.resume and where.wandb_id.exists() else ""
    made = not where.wandb_dir.exists()
    where.wandb_dir.mkdir(parents=True, exist_ok=True)
    try:  # a fresh run's id is new: only a resume asks the server for the run it continues
        run = wandb.init(project="rookworld-rlvr", name=where.name, id=run_id or uuid.uuid4().hex[:12],
                         group=where.group, resume="allow" if where.resume else None, config=where.config,
                         dir=str(where.wandb_dir))
    except wandb.errors.Error as e:  # no login, no server in reach: nothing trained yet, and no run to go on in
        if made and not any(where.wandb_dir.iterdir()):  # left behind, a later fresh run would set it aside
            where.wandb_dir.rmdir()
        said = " ".join(str(e).split())
        raise ValueError(f"wandb: {said}{'' if said.endswith('.') else '.'} Or WANDB_MODE=offline logs on this "
                         f"machine (`wandb sync` sends it later), or {where.off}") from None
    if run.id != run_id:  # kept once the run has started: a resume goes on in it
        where.wandb_id.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(where.wandb_id, [run.id + "\n"])
    # every figure against the record's "step", not wandb's own count: a guard's rollback (or a resume) logs its
    # steps again, and wandb drops a record whose own step goes back ("steps must be monotonically increasing")
    run.define_metric("step")
    run.define_metric("*", step_metric="step")
    return run


def _quiet_tensorboard_thread() -> None:
    """TensorBoard writes from a thread of its own, which hands a failed write to the next call of the thread that
    writes (the sink above, which says it in one line) and also prints its own traceback: the same error twice, the
    traceback around the line. Leave that traceback out; every other thread's error prints as before."""
    previous = threading.excepthook
    if getattr(previous, "quiet_tensorboard", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if type(args.thread).__name__ == "_AsyncWriterThread" and issubclass(args.exc_type, OSError):
            return
        previous(args)

    hook.quiet_tensorboard = True
    threading.excepthook = hook
