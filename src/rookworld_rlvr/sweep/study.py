"""A sweep's Optuna study: the storage, creating or joining the study, requeueing trials.

Owns the shared state of several workers: which trials exist and which are real (not surplus
asks, not interrupted ones queued again). Imports no torch; optuna inside functions only.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, TypeVar

from rookworld_rlvr.sweep.space import SweepSpace

T = TypeVar("T")

def default_storage(out: str | Path) -> str:
    return f"sqlite:///{(Path(out) / 'study.db').resolve()}"


def need_optuna():
    try:
        import optuna
    except ImportError:
        raise ValueError("rookworld sweep needs optuna: pip install 'rookworld-rlvr[sweep]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def open_storage(url: str):
    """An Optuna RDB storage; SQLite waits for locks (several local workers) instead of failing."""
    optuna = need_optuna()
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        kwargs: dict = {"connect_args": {"timeout": 120}}
    else:
        kwargs = {"pool_pre_ping": True}
    return _retried(url, lambda: optuna.storages.RDBStorage(url, engine_kwargs=kwargs))


def _retried(storage: str, make: Callable[[], T]) -> T:
    """`make()`, tried again while the database answers with SQLAlchemy's OperationalError or IntegrityError
    (workers starting together race to create the tables and the study); its other errors end it at once."""
    last: Exception | None = None
    for attempt in range(6):
        try:
            return make()
        except Exception as e:
            if not type(e).__module__.startswith("sqlalchemy"):
                raise
            last = e
            if type(e).__name__ not in ("OperationalError", "IntegrityError"):  # not a race: "file is not a database"
                break
            time.sleep(0.3 * (attempt + 1))
    raise ValueError(f"storage {storage}: {str(last).splitlines()[0]}")  # SQLAlchemy's next lines: its SQL, a link


@contextmanager
def _named(storage: str) -> Iterator[None]:
    """Optuna's StorageInternalError, with SQLAlchemy's words beneath it, as one line naming the storage: a
    database another program made (`no such column: studies.study_id`), or a damaged one."""
    optuna = need_optuna()
    try:
        yield
    except optuna.exceptions.StorageInternalError as e:
        said = str(e.__cause__ or e).splitlines()[0]
        raise ValueError(f"storage {storage}: {said} (not an Optuna study database, or a damaged one?)") from e


def make_sampler(kind: str, space: SweepSpace, seed: int | None):
    optuna = need_optuna()
    if kind == "grid":
        class Grid(optuna.samplers.GridSampler):
            def after_trial(self, study, trial, state, values):
                pass  # GridSampler would call study.stop(), which raises under ask/tell; the worker loop stops

        return Grid(space.grid(), seed=0 if seed is None else seed)
    return optuna.samplers.TPESampler(seed=seed, constant_liar=True)


def open_study(storage: str, name: str, sampler, space: SweepSpace | None = None, kind: str | None = None,
               seed: int | None = None):
    """Create or join the study; a study keeps the search space it was created with."""
    optuna = need_optuna()
    store = open_storage(storage)
    with _named(storage):
        study = _retried(storage, lambda: optuna.create_study(storage=store, study_name=name, sampler=sampler,
                                                              direction="maximize", load_if_exists=True))
    if space is not None:
        info = {"space": space.fingerprint(), "sampler": kind,
                "grid_seed": (0 if seed is None else seed) if kind == "grid" else None}
        stored = {k: study.user_attrs.get(k) for k in info}
        if stored["space"] is None:
            for k, v in info.items():
                study.set_user_attr(k, v)
            study.set_user_attr("space_file", space.path)
        elif stored != info:
            what = [k for k in info if stored[k] != info[k]]
            raise ValueError(f"study '{name}' in {storage} was created with a different {' and '.join(what)} "
                             f"(from {study.user_attrs.get('space_file')}); workers of one study must use the same "
                             "space file, sampler and --sampler-seed, or pick another --study")
    return study


def load_existing_study(storage: str, name: str | None):
    optuna = need_optuna()
    if storage.startswith("sqlite:///") and not Path(storage[len("sqlite:///"):]).exists():
        raise ValueError(f"no study database at {storage[len('sqlite:///'):]} (give --out DIR or --storage URL)")
    store = open_storage(storage)
    with _named(storage):
        names = optuna.get_all_study_names(store)
    if name is None:
        if len(names) != 1:
            raise ValueError(f"{storage} holds studies {names}: pick one with --study")
        name = names[0]
    if name not in names:
        raise ValueError(f"no study '{name}' in {storage} (studies: {names})")
    return optuna.load_study(study_name=name, storage=store)


def real(t) -> bool:
    return not t.user_attrs.get("surplus") and not t.user_attrs.get("requeued")


def requeue(study, number: int, reason: str) -> None:
    """Mark a trial FAILED as interrupted (left out of the statistics) and queue its configuration again."""
    from optuna.trial import TrialState

    t = study.get_trials(deepcopy=True)[number]
    study._storage.set_trial_user_attr(t._trial_id, "requeued", True)
    study._storage.set_trial_user_attr(t._trial_id, "failure", reason)
    study._storage.set_trial_user_attr(t._trial_id, "status", "interrupted")
    study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
    study.enqueue_trial(dict(t.params), user_attrs={"retry_of": number,
                                                    **({"overrides": t.user_attrs["overrides"]} if "overrides" in t.user_attrs else {})})


def requeue_running(study, log=print) -> int:
    from optuna.trial import TrialState

    running = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)) if real(t)]
    for t in running:
        requeue(study, t.number, "requeued: its worker was gone (--requeue-running)")
        log(f"trial {t.number}: marked interrupted and queued again")
    return len(running)


def all_finished(study) -> bool:
    return all(t.state.is_finished() for t in study.get_trials(deepcopy=False) if real(t))
