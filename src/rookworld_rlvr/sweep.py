"""`rookworld sweep`: hyperparameter sweeps over GRPO runs with Optuna.

    rookworld sweep --space configs/sweeps/stability.yaml                  # run (or join) the sweep
    rookworld sweep --space configs/sweeps/stability.yaml --dry-run        # list and validate the trials
    rookworld sweep --summary --out sweeps/stability                       # summary of a study so far

Search space file (YAML)::

    config: configs/default.yaml        # optional base preset (--config overrides it)
    base: {steps: 30, eval_limit: 100}  # optional field overrides for every trial
    params:                             # swept fields (each must be a TrainConfig field)
      kl_coef: {choices: [0, 0.005, 0.05, 0.2]}
      lr: {low: 1.0e-6, high: 1.0e-4, log: true}    # a range (type: float|int, optional step), TPE only
    points:                             # optional tied axis: each entry sets several fields at once
      - {clip_range: 0.1, group_size: 4}
      - {clip_range: 0.3, group_size: 8}
    sampler: grid                       # grid (every entry has choices) | tpe
    trials: 40                          # optional; the grid defaults to its size

The grid is the product of every `choices` list and the `points` list (one axis). Precedence,
lowest first: preset, `base`, `--key value` on the command line, the trial's values; the sweep
sets `output_dir` (`<out>/trial_<n>`) and `resume: false` itself. Every trial's configuration
goes through `load_config` (the same validation as `rookworld train`), and after the run the
sweep checks that every swept value is in the trainer's saved `config.yaml`.

Each trial is an isolated training run. Objective (maximised): the held-out greedy reward at the
end, the mean of `policy` and `environment` `mean_reward` of the final evaluation. User attrs:
`base_reward`, `final_reward`, `gain`, `steps`, `seconds`, `status`, `overrides`,
`output_dir`, `worker`, `failure` (the reason) for failed trials, `guard_events` and `guard_signals`
(from the run's events.jsonl) and `outcome`. A run that a guard stops (non-finite loss, a collapse
signal, see `TrainingStopped`) or that raises is a FAILED trial; the sweep goes on.

The stability report counts outcomes: intact (every step ran, held-out reward >= base - 0.02),
stopped (a guard stopped it and named the cause), silent collapse (finished, held-out reward
< base - 0.05, no guard event), degraded (finished, neither) and error (any other failure).

Storage and several workers. The study lives in an Optuna RDB storage: by default SQLite at
`sqlite:///<out>/study.db`. Every worker started with the same `--storage URL --study NAME`
(and the same space file) joins the same study; each keeps asking for trials until the study
holds the target number (`--trials`, or the grid size), so start as many as you like::

    rookworld sweep --space S.yaml --out sweeps/s &     # worker 1
    rookworld sweep --space S.yaml --out sweeps/s &     # worker 2, same SQLite file

For several machines use a server database reachable from all of them (install its driver)::

    --storage postgresql://user:pass@host:5432/optuna    (pip install psycopg2-binary)
    --storage mysql+pymysql://user:pass@host/optuna      (pip install pymysql)

Grid points are handed out by Optuna's GridSampler from the shared study (trial n gets point n
of the grid shuffled with `--sampler-seed`, which therefore must be the same on every worker; it
is 0 by default): two workers never run the same point. TPE workers use the constant liar; give
each TPE worker a different `--sampler-seed` (or none). A worker stopped with Ctrl-C or SIGTERM marks
its trial FAILED ("interrupted", excluded from the statistics) and queues the same
configuration again, so a restarted worker redoes it. A worker killed hard leaves its trial
RUNNING: when no worker is alive, `--requeue-running` does the same for those trials.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import itertools
import json
import math
import os
import signal
import socket
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from rookworld_rlvr.config import FIELDS, add_field_arguments, coerce, load_config

SAMPLERS = ("grid", "tpe")
MANAGED = ("output_dir", "resume")  # set by the sweep for every trial
POINT = "points"  # the Optuna parameter holding the index into `points` (not a TrainConfig field)
SPACE_KEYS = ("config", "base", "params", "points", "sampler", "trials")


# -- the search space ------------------------------------------------------------------------------
@dataclass
class Param:
    name: str
    choices: list | None = None
    kind: str | None = None  # "float" | "int" for ranges
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None

    def distribution(self):
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.choices is not None:
            return CategoricalDistribution(self.choices)
        if self.kind == "int":
            return IntDistribution(int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return FloatDistribution(float(self.low), float(self.high), log=self.log, step=self.step)


@dataclass
class SweepSpace:
    path: str
    params: dict[str, Param] = field(default_factory=dict)
    points: list[dict] = field(default_factory=list)
    base: dict = field(default_factory=dict)
    config: str | None = None
    sampler: str | None = None
    trials: int | None = None

    def all_choices(self) -> bool:
        return all(p.choices is not None for p in self.params.values())

    def distributions(self) -> dict:
        from optuna.distributions import CategoricalDistribution

        d = {name: p.distribution() for name, p in self.params.items()}
        if self.points:
            d[POINT] = CategoricalDistribution(list(range(len(self.points))))
        return d

    def grid(self) -> dict[str, list]:
        self.require_grid()
        g = {name: list(p.choices) for name, p in self.params.items()}
        if self.points:
            g[POINT] = list(range(len(self.points)))
        return g

    def grid_size(self) -> int:
        return math.prod(len(v) for v in self.grid().values())

    def require_grid(self) -> None:
        for name, p in self.params.items():
            if p.choices is None:
                raise ValueError(f"{self.path}: params: '{name}' is a range; the grid sampler needs "
                                 "'choices' for every param (or use sampler: tpe)")

    def overrides(self, params: dict) -> dict:
        """Optuna trial params -> the config fields they set."""
        out = {name: params[name] for name in self.params}
        if self.points:
            out.update(self.points[int(params[POINT])])
        return out

    def grid_overrides(self) -> list[dict]:
        """Every configuration of the grid (in product order, not the sampler's shuffled order)."""
        g = self.grid()
        return [self.overrides(dict(zip(g, combo))) for combo in itertools.product(*g.values())]

    def fingerprint(self) -> str:
        return json.dumps({"params": {n: dataclasses.asdict(p) for n, p in self.params.items()},
                           "points": self.points}, sort_keys=True, default=str)


def _field_kind(name: str) -> str:
    return str(FIELDS[name].type).split(" | ")[0]


def _typed(name: str, value: Any) -> Any:
    """A YAML value for field `name` with the field's type (PyYAML reads 1e-5 as a string)."""
    if isinstance(value, str):
        value = coerce(name, value)
    if _field_kind(name) == "float" and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    return value


def _unknown(path: str, where: str, name: str) -> ValueError:
    close = difflib.get_close_matches(name, list(FIELDS), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return ValueError(f"{path}: {where}: '{name}' is not a config field{hint} (fields: rookworld train --help)")


def _check_name(path: str, where: str, name: Any) -> None:
    if not isinstance(name, str) or name not in FIELDS:
        raise _unknown(path, where, str(name))
    if name in MANAGED:
        raise ValueError(f"{path}: {where}: '{name}' is set by the sweep for every trial (<out>/trial_<n>, fresh runs)")


def _param(path: str, name: str, spec: Any) -> Param:
    where = f"params.{name}"
    if isinstance(spec, list):
        spec = {"choices": spec}
    if not isinstance(spec, dict):
        raise ValueError(f"{path}: {where}: expected {{choices: [...]}} or {{low: .., high: .., log: ..}}, got {spec!r}")
    extra = set(spec) - {"choices", "type", "low", "high", "log", "step"}
    if extra:
        raise ValueError(f"{path}: {where}: unknown keys {sorted(extra)} (use choices, or type/low/high/log/step)")
    try:
        if "choices" in spec:
            if set(spec) - {"choices", "type"}:
                raise ValueError("give either choices or low/high, not both")
            choices = spec["choices"]
            if not isinstance(choices, list) or not choices:
                raise ValueError("choices must be a non-empty list")
            choices = [_typed(name, v) for v in choices]
            for v in choices:
                if v is not None and not isinstance(v, (bool, int, float, str)):
                    raise ValueError(f"choice {v!r} is not a scalar; put structured values under points:")
            if len({json.dumps(v) for v in choices}) != len(choices):
                raise ValueError(f"choices repeat a value: {choices}")
            return Param(name, choices=choices)
        kind = _field_kind(name)
        if kind not in ("int", "float"):
            raise ValueError(f"a range needs a numeric field ({name} is {FIELDS[name].type}); use choices")
        if spec.get("type", kind) != kind:
            raise ValueError(f"type {spec['type']!r} does not match the field's type {kind}")
        if "low" not in spec or "high" not in spec:
            raise ValueError("a range needs low and high (or give choices)")
        low, high = _typed(name, spec["low"]), _typed(name, spec["high"])
        step = _typed(name, spec["step"]) if spec.get("step") is not None else None
        p = Param(name, kind=kind, low=low, high=high, log=bool(spec.get("log", False)), step=step)
        if not low < high:
            raise ValueError(f"low {low} must be below high {high}")
        p.distribution()  # Optuna's own checks (log needs low > 0, log and step exclusive)
        return p
    except ValueError as e:
        raise ValueError(f"{path}: {where}: {e}") from None


def load_space(path: str | Path) -> SweepSpace:
    """Read and check a search space file. Every error names the file and the entry."""
    path = str(path)
    if not Path(path).exists():
        raise ValueError(f"search space {path}: no such file")
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a search space must be a mapping with params: (and optional base:, points:, sampler:)")
    extra = set(raw) - set(SPACE_KEYS)
    if extra:
        raise ValueError(f"{path}: unknown keys {sorted(extra)} (expected {', '.join(SPACE_KEYS)})")
    space = SweepSpace(path, config=raw.get("config"), sampler=raw.get("sampler"), trials=raw.get("trials"))
    if space.sampler is not None and space.sampler not in SAMPLERS:
        raise ValueError(f"{path}: sampler must be one of {SAMPLERS}, got {space.sampler!r}")
    if space.trials is not None and (not isinstance(space.trials, int) or space.trials < 1):
        raise ValueError(f"{path}: trials must be a positive integer, got {space.trials!r}")
    params = raw.get("params") or {}
    if not isinstance(params, dict):
        raise ValueError(f"{path}: params must be a mapping of field: {{choices: [...]}} or a range")
    for name, spec in params.items():
        _check_name(path, "params", name)
        space.params[name] = _param(path, name, spec)
    points = raw.get("points") or []
    if not isinstance(points, list):
        raise ValueError(f"{path}: points must be a list of mappings field: value")
    for i, point in enumerate(points):
        if not isinstance(point, dict) or not point:
            raise ValueError(f"{path}: points[{i}] must be a non-empty mapping field: value, got {point!r}")
        for name in point:
            _check_name(path, f"points[{i}]", name)
            if name in space.params:
                raise ValueError(f"{path}: points[{i}]: '{name}' is also under params")
        space.points.append({name: _typed(name, v) for name, v in point.items()})
    if not space.params and not space.points:
        raise ValueError(f"{path}: nothing to sweep: add params: (or points:)")
    base = raw.get("base") or {}
    if not isinstance(base, dict):
        raise ValueError(f"{path}: base must be a mapping of field: value")
    swept = set(space.params) | {n for p in space.points for n in p}
    for name, value in base.items():
        _check_name(path, "base", name)
        if name in swept:
            raise ValueError(f"{path}: base: '{name}' is also swept (remove it from base)")
        space.base[name] = _typed(name, value)
    return space


def check_values(space: SweepSpace, config: str | None, base: dict) -> None:
    """Validate every swept value on its own against the base configuration (a bad value is an
    error now, not a failed trial hours later). Combinations are validated per trial."""
    def check(where: str, over: dict) -> None:
        try:
            load_config(config, {**base, **over})
        except ValueError as e:
            if any(f"'{n}'" in str(e) for n in over):  # only errors about the swept fields themselves
                raise ValueError(f"{space.path}: {where}: {e}") from None

    for name, p in space.params.items():
        for v in (p.choices if p.choices is not None else [p.low, p.high]):
            check(f"params.{name} value {v!r}", {name: v})
    for i, point in enumerate(space.points):
        check(f"points[{i}]", point)


# -- storage and study --------------------------------------------------------------------------------
def default_storage(out: str | Path) -> str:
    return f"sqlite:///{(Path(out) / 'study.db').resolve()}"


def _need_optuna():
    try:
        import optuna
    except ImportError:
        raise ValueError("rookworld sweep needs optuna: pip install 'rookworld-rlvr[sweep]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def open_storage(url: str):
    """An Optuna RDB storage; SQLite waits for locks (several local workers) instead of failing."""
    optuna = _need_optuna()
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        kwargs: dict = {"connect_args": {"timeout": 120}}
    else:
        kwargs = {"pool_pre_ping": True}
    last: Exception | None = None
    for attempt in range(6):  # workers starting together race to create the tables
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
        except Exception as e:  # sqlalchemy OperationalError / IntegrityError
            if type(e).__module__.startswith("sqlalchemy"):
                last = e
                time.sleep(0.3 * (attempt + 1))
                continue
            raise
    raise ValueError(f"storage {url}: {last}")


def make_sampler(kind: str, space: SweepSpace, seed: int | None):
    optuna = _need_optuna()
    if kind == "grid":
        class Grid(optuna.samplers.GridSampler):
            def after_trial(self, study, trial, state, values):
                pass  # GridSampler would call study.stop(), which raises under ask/tell; the worker loop stops

        return Grid(space.grid(), seed=0 if seed is None else seed)
    return optuna.samplers.TPESampler(seed=seed, constant_liar=True)


def open_study(storage: str, name: str, sampler, space: SweepSpace | None = None, kind: str | None = None,
               seed: int | None = None):
    """Create or join the study; a study keeps the search space it was created with."""
    optuna = _need_optuna()
    store = open_storage(storage)
    last: Exception | None = None
    for attempt in range(6):
        try:
            study = optuna.create_study(storage=store, study_name=name, sampler=sampler, direction="maximize",
                                        load_if_exists=True)
            break
        except Exception as e:
            if type(e).__module__.startswith("sqlalchemy"):
                last = e
                time.sleep(0.3 * (attempt + 1))
                continue
            raise
    else:
        raise ValueError(f"storage {storage}: {last}")
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
    optuna = _need_optuna()
    if storage.startswith("sqlite:///") and not Path(storage[len("sqlite:///"):]).exists():
        raise ValueError(f"no study database at {storage[len('sqlite:///'):]} (give --out DIR or --storage URL)")
    store = open_storage(storage)
    names = optuna.get_all_study_names(store)
    if name is None:
        if len(names) != 1:
            raise ValueError(f"{storage} holds studies {names}: pick one with --study")
        name = names[0]
    if name not in names:
        raise ValueError(f"no study '{name}' in {storage} (studies: {names})")
    return optuna.load_study(study_name=name, storage=store)


# -- trials ------------------------------------------------------------------------------------------
def held_out_reward(res: dict | None) -> float | None:
    """Mean of the policy and environment mean_reward of an evaluation (tasks that were evaluated)."""
    if not res:
        return None
    vals = [res[t]["mean_reward"] for t in ("policy", "environment") if (res.get(t) or {}).get("n")]
    return float(sum(vals) / len(vals)) if vals else None


# A run is intact when every step ran and its held-out reward did not fall more than INTACT_MARGIN
# below the base; a silent collapse finished more than COLLAPSE_MARGIN below it without a guard event.
INTACT_MARGIN, COLLAPSE_MARGIN = 0.02, 0.05
OUTCOMES = ("intact", "stopped", "silent_collapse", "degraded", "error")


def outcome(state: str, base: float | None, final: float | None, guard_events: int, stopped: bool) -> str:
    """intact | stopped (a guard stopped it, naming the cause) | silent_collapse (finished, held-out
    reward below base - COLLAPSE_MARGIN, no guard event) | degraded (finished, neither: a smaller loss,
    or a larger one the guards saw but did not undo) | error (any other failure)."""
    if stopped:
        return "stopped"
    if state != "COMPLETE" or base is None or final is None:
        return "error"
    if final >= base - INTACT_MARGIN:
        return "intact"
    if final < base - COLLAPSE_MARGIN and not guard_events:
        return "silent_collapse"
    return "degraded"


def _guard_events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _real(t) -> bool:
    return not t.user_attrs.get("surplus") and not t.user_attrs.get("requeued")


def _fmt(over: dict) -> str:
    return " ".join(f"{k}={json.dumps(v)}" for k, v in over.items())


def _requeue(study, number: int, reason: str) -> None:
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

    running = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)) if _real(t)]
    for t in running:
        _requeue(study, t.number, "requeued: its worker was gone (--requeue-running)")
        log(f"trial {t.number}: marked interrupted and queued again")
    return len(running)


def run_trial(study, trial, space: SweepSpace, config: str | None, base: dict, out: Path,
              reward_fn: Callable | None = None, log=print) -> dict:
    """One isolated training run for `trial`; tells the study the outcome. Returns the user attrs."""
    from optuna.trial import TrialState

    from rookworld_rlvr.grpo.cli import _writer, build
    from rookworld_rlvr.grpo.trainer import TrainingStopped

    t0 = time.time()
    fields = space.overrides(trial.params)
    run_dir = (out / f"trial_{trial.number}").resolve()
    attrs: dict[str, Any] = {"overrides": fields, "output_dir": str(run_dir),
                             "worker": f"{socket.gethostname()}:{os.getpid()}"}
    trainer = None

    def tlog(*parts) -> None:  # inside the run stdout is the trial's train.log
        print(*parts, flush=True)

    def finish(state, value: float | None = None, **more) -> dict:
        if trainer is not None:
            attrs.setdefault("steps", trainer.step)
            if trainer.base_eval is not None:
                attrs.setdefault("base_reward", held_out_reward(trainer.base_eval))
        events = _guard_events(run_dir)
        attrs["guard_events"] = len(events)
        attrs["guard_signals"] = sorted({e["signal"] for e in events})
        attrs.update(more)
        attrs["outcome"] = outcome("COMPLETE" if state == TrialState.COMPLETE else "FAIL", attrs.get("base_reward"),
                                   attrs.get("final_reward"), len(events), attrs.get("status") == "stopped")
        attrs["seconds"] = round(time.time() - t0, 1)
        attrs.setdefault("status", "complete" if state == TrialState.COMPLETE else "failed")
        for k, v in attrs.items():
            trial.set_user_attr(k, v)
        study.tell(trial, value if state == TrialState.COMPLETE else None, state=state)
        return attrs

    log(f"trial {trial.number}: {_fmt(fields)} -> {run_dir}")
    for k, v in attrs.items():  # visible while the trial runs (summary, --requeue-running)
        trial.set_user_attr(k, v)
    try:
        cfg = load_config(config, {**base, **fields, "output_dir": str(run_dir), "resume": False})
        missing = {k: getattr(cfg, k) for k, v in fields.items() if getattr(cfg, k) != v}
        if missing:
            raise RuntimeError(f"swept values did not reach the configuration: {missing} != {fields}")
        if run_dir.exists() and any(run_dir.iterdir()):  # left by an earlier study in the same --out
            aside = run_dir.with_name(f"{run_dir.name}-{time.strftime('%Y%m%d-%H%M%S')}")
            run_dir.rename(aside)
            log(f"trial {trial.number}: moved an older {run_dir.name} aside to {aside.name}")
        run_dir.mkdir(parents=True, exist_ok=True)
        # the trainer's warnings and progress bar (stdout) go to the trial's log, not the sweep's terminal
        with open(run_dir / "train.log", "a") as fh, contextlib.redirect_stdout(fh):
            trainer, pool = build(cfg, log=tlog)
            if reward_fn is not None:
                trainer.reward_fn = reward_fn
            try:
                summary = trainer.train(writer=_writer(cfg))
            finally:
                pool.close()
        saved = yaml.safe_load((run_dir / "config.yaml").read_text())
        lost = {k: saved.get(k) for k, v in fields.items() if saved.get(k) != v}
        if lost:
            raise RuntimeError(f"swept values are not in the trainer's config.yaml: {lost} != {fields}")
        if cfg.report:
            try:
                from rookworld_rlvr.report import write_report

                write_report([cfg.output_dir])
            except ImportError as e:
                tlog(f"report: not written: {e}")
        base_r, final_r = held_out_reward(summary["base"]), held_out_reward(summary["final"])
        if final_r is None:
            a = finish(TrialState.FAIL, failure="no held-out evaluation (set eval_data)", steps=summary["steps"])
        elif not math.isfinite(final_r):
            a = finish(TrialState.FAIL, failure=f"non-finite held-out reward {final_r}", steps=summary["steps"])
        else:
            a = finish(TrialState.COMPLETE, final_r, base_reward=base_r, final_reward=final_r,
                       gain=final_r - base_r if base_r is not None else None, steps=summary["steps"])
    except TrainingStopped as e:
        a = finish(TrialState.FAIL, failure=f"stopped at step {trainer.step if trainer else 0}: {e}", status="stopped")
    except KeyboardInterrupt:
        log(f"trial {trial.number}: interrupted; its configuration is queued again")
        trial.set_user_attr("seconds", round(time.time() - t0, 1))
        _requeue(study, trial.number, "interrupted (Ctrl-C / SIGTERM)")
        raise
    except Exception as e:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "error.txt").write_text(traceback.format_exc())
        a = finish(TrialState.FAIL, failure=f"{type(e).__name__}: {e}")
    if a["status"] == "complete":
        gain = a.get("gain")
        log(f"trial {trial.number}: held-out reward {a['final_reward']:.4f}"
            + (f" (base {a['base_reward']:.4f}, gain {gain:+.4f})" if gain is not None else "")
            + f" in {a['seconds'] / 60:.1f} min: {a['outcome']}"
            + (f" after {a['guard_events']} guard event(s)" if a["guard_events"] else ""))
    else:
        log(f"trial {trial.number}: FAILED after {a['seconds'] / 60:.1f} min: {a['failure']}")
    return a


def _resolve(space: SweepSpace | str | Path, config: str | None, overrides: dict | None,
             trials: int | None, sampler: str | None):
    space = space if isinstance(space, SweepSpace) else load_space(space)
    config = config or space.config
    overrides = dict(overrides or {})
    for name in overrides:
        if name not in FIELDS:
            raise _unknown("command line", "override", name)
        if name in MANAGED:
            raise ValueError(f"--{name.replace('_', '-')} is set by the sweep for every trial")
        if name in space.params or any(name in p for p in space.points):
            raise ValueError(f"--{name.replace('_', '-')}: {name} is swept by {space.path}; remove one of the two")
    base = {**space.base, **{k: _typed(k, v) for k, v in overrides.items()}}
    load_config(config, base)  # the base alone must be a valid configuration
    check_values(space, config, base)
    kind = sampler or space.sampler or ("grid" if space.all_choices() else "tpe")
    if kind not in SAMPLERS:
        raise ValueError(f"sampler must be one of {SAMPLERS}, got {kind!r}")
    target = trials or space.trials
    if kind == "grid":
        size = space.grid_size()
        target = min(target or size, size)
    elif not target:
        raise ValueError(f"{space.path}: sampler tpe needs a number of trials: --trials N (or trials: in the file)")
    return space, config, base, kind, target


def run_sweep(space: SweepSpace | str | Path, *, config: str | None = None, overrides: dict | None = None,
              trials: int | None = None, storage: str | None = None, study_name: str | None = None,
              out: str | Path | None = None, sampler: str | None = None, seed: int | None = None,
              reward_fn: Callable | None = None, log: Callable[[str], None] = print) -> dict:
    """Run trials until the study holds `trials` of them (the grid size by default), then summarize.

    Several calls (processes, machines) with the same storage and study name share the work.
    `reward_fn` replaces the chess reward of the training runs (tests); evaluation stays real."""
    space, config, base, kind, target = _resolve(space, config, overrides, trials, sampler)
    # read the configuration file once: editing it while the sweep runs must not change later trials
    base, config = load_config(config, base).to_dict(), None
    name = study_name or Path(space.path).stem
    out = Path(out) if out else Path("sweeps") / name
    storage = storage or default_storage(out)
    study = open_study(storage, name, make_sampler(kind, space, seed), space, kind, seed)
    from optuna.trial import TrialState

    distributions = space.distributions()
    if kind == "grid" and (trials or space.trials or 0) > target:
        log(f"the grid has {target} points: running {target} trials, not {trials or space.trials}")
    log(f"sweep '{name}' ({kind}, {target} trials) in {storage}; trial runs in {out}/trial_<n>")
    done_here = 0
    while True:
        trials_now = study.get_trials(deepcopy=False)
        waiting = [t for t in trials_now if t.state == TrialState.WAITING and _real(t)]
        if sum(_real(t) for t in trials_now) >= target and not waiting:
            break
        trial = study.ask(distributions)
        if "retry_of" not in trial.user_attrs:
            before = sum(_real(t) for t in study.get_trials(deepcopy=False) if t.number < trial.number)
            if before >= target:  # another worker took the last one between our count and our ask
                trial.set_user_attr("surplus", True)
                study.tell(trial, state=TrialState.PRUNED)
                continue
        run_trial(study, trial, space, config, base, out, reward_fn, log)
        done_here += 1
    log(f"this worker ran {done_here} trial(s); the study is {'complete' if _all_finished(study) else 'still running'}")
    return summarize(study, out, log)


def _all_finished(study) -> bool:
    return all(t.state.is_finished() for t in study.get_trials(deepcopy=False) if _real(t))


# -- summary -------------------------------------------------------------------------------------------
def summarize(study, out: str | Path | None = None, log: Callable[[str], None] | None = print) -> dict:
    """Success rate, best configuration, distribution of gains; writes summary.json and sweep.png."""
    from optuna.trial import TrialState

    all_trials = study.get_trials(deepcopy=False)
    trials = [t for t in all_trials if _real(t)]
    requeued = [t for t in all_trials if t.user_attrs.get("requeued")]
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.FAIL)]
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    failed = [t for t in trials if t.state == TrialState.FAIL]

    def row(t) -> dict:
        a = t.user_attrs
        return {"trial": t.number, "state": t.state.name, "value": t.value, "base_reward": a.get("base_reward"),
                "final_reward": a.get("final_reward"), "gain": a.get("gain"), "steps": a.get("steps"),
                "seconds": a.get("seconds"), "overrides": a.get("overrides", dict(t.params)),
                "failure": a.get("failure"), "output_dir": a.get("output_dir"), "worker": a.get("worker"),
                "outcome": a.get("outcome"), "guard_events": a.get("guard_events"),
                "guard_signals": a.get("guard_signals")}

    rows = [row(t) for t in trials]
    gains = [r["gain"] for r in rows if r["state"] == "COMPLETE" and r["gain"] is not None]
    best = max(complete, key=lambda t: t.value) if complete else None
    seen: dict[str, list[int]] = {}
    for r in rows:
        if r["state"] == "COMPLETE":
            seen.setdefault(json.dumps(r["overrides"], sort_keys=True), []).append(r["trial"])
    summary = {
        "study": study.study_name,
        "trials": len(trials),
        "finished": len(finished),
        "complete": len(complete),
        "failed": len(failed),
        "running": sum(t.state == TrialState.RUNNING for t in trials),
        "waiting": sum(t.state == TrialState.WAITING for t in trials),
        "interrupted_and_requeued": len(requeued),
        "success_rate": len(complete) / len(finished) if finished else None,
        "best": row(best) if best else None,
        "gain": {"n": len(gains), "min": min(gains), "median": statistics.median(gains), "max": max(gains),
                 "mean": statistics.fmean(gains), "improved": sum(g > 0 for g in gains),
                 "share_improved": sum(g > 0 for g in gains) / len(gains)} if gains else None,
        "duplicates": [v for v in seen.values() if len(v) > 1],
        "outcomes": _outcome_counts(rows),
        "failures": [{"trial": r["trial"], "overrides": r["overrides"], "reason": r["failure"]}
                     for r in rows if r["state"] == "FAIL"],
        "trial_table": rows,
    }
    if out is not None:
        from rookworld_rlvr.data.io import atomic_write_text

        out = Path(out)
        atomic_write_text(out / "summary.json", [json.dumps(summary, indent=2, default=str)])
        summary["plot"] = plot(rows, out / "sweep.png", study.study_name, best.number if best else None)
    if log:
        log(format_summary(summary))
        if out is not None:
            log(f"summary: {out / 'summary.json'}" + (f"; plot: {summary['plot']}" if summary.get("plot") else ""))
    return summary


def _outcome_counts(rows: list[dict]) -> dict:
    """The stability report: how many finished trials ended each way (and intact after a recovery)."""
    done = [r for r in rows if r["state"] in ("COMPLETE", "FAIL") and r.get("outcome")]
    counts = {o: sum(r["outcome"] == o for r in done) for o in OUTCOMES}
    counts["intact_after_recovery"] = sum(r["outcome"] == "intact" and bool(r.get("guard_events")) for r in done)
    counts["stop_causes"] = sorted({(r.get("guard_signals") or ["?"])[-1] for r in done if r["outcome"] == "stopped"})
    counts["counted"] = len(done)
    return counts


def format_summary(s: dict) -> str:
    lines = [f"sweep '{s['study']}': {s['finished']} finished of {s['trials']} trials "
             f"({s['complete']} complete, {s['failed']} failed, {s['running']} running, {s['waiting']} queued)"]
    if s["success_rate"] is not None:
        lines.append(f"success rate: {s['success_rate']:.0%} ({s['complete']}/{s['finished']})")
    if s["best"]:
        b = s["best"]
        lines.append(f"best: trial {b['trial']}, held-out reward {b['value']:.4f}"
                     + (f" (gain {b['gain']:+.4f})" if b["gain"] is not None else "") + f": {_fmt(b['overrides'])}")
    if s["gain"]:
        g = s["gain"]
        lines.append(f"gain (final - base held-out reward): min {g['min']:+.4f}  median {g['median']:+.4f}  "
                     f"max {g['max']:+.4f}; improved {g['improved']}/{g['n']} ({g['share_improved']:.0%})")
    o = s.get("outcomes")
    if o and o["counted"]:
        lines.append(f"outcomes of {o['counted']} runs: {o['intact']} intact"
                     + (f" ({o['intact_after_recovery']} after a guard recovery)" if o["intact_after_recovery"] else "")
                     + f", {o['stopped']} stopped with a named cause"
                     + (f" ({', '.join(o['stop_causes'])})" if o["stop_causes"] else "")
                     + f", {o['silent_collapse']} silent collapses, {o['degraded']} degraded, {o['error']} errors "
                     f"(intact: held-out >= base - {INTACT_MARGIN}; silent collapse: < base - {COLLAPSE_MARGIN} "
                     "without a guard event)")
    if s["duplicates"]:
        lines.append(f"warning: configurations completed more than once: {s['duplicates']}")
    if s["trial_table"]:
        lines.append(f"{'trial':>5}  {'state':<8} {'outcome':<15} {'base':>7} {'final':>7} {'gain':>8} {'mins':>5}  "
                     "configuration / guard events / failure")
        for r in s["trial_table"]:
            num = lambda v, f: format(v, f) if isinstance(v, (int, float)) else "-"  # noqa: E731
            tail = _fmt(r["overrides"]) + (f"  guard: {', '.join(r['guard_signals'])}" if r.get("guard_signals") else "") \
                + (f"  [{r['failure']}]" if r["failure"] else "")
            lines.append(f"{r['trial']:>5}  {r['state']:<8} {r.get('outcome') or '-':<15} "
                         f"{num(r['base_reward'], '7.4f'):>7} "
                         f"{num(r['final_reward'], '7.4f'):>7} {num(r['gain'], '+8.4f'):>8} "
                         f"{num(r['seconds'] / 60 if r['seconds'] is not None else None, '5.1f'):>5}  {tail}")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, title: str, best: int | None) -> str | None:
    """Gain per trial, coloured by outcome (runs without a final evaluation sit at 0 as x); dashed lines:
    the intact and silent-collapse bounds."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    colors = {"intact": "tab:green", "stopped": "tab:orange", "silent_collapse": "tab:red", "degraded": "gold",
              "error": "darkred", "running": "tab:gray"}
    fig = Figure(figsize=(max(6.0, 0.35 * len(rows) + 2), 4.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    kind = lambda r: r.get("outcome") or ("running" if r["state"] in ("RUNNING", "WAITING") else "error")  # noqa: E731
    for name, color in colors.items():
        sel = [r for r in rows if kind(r) == name]
        label = name.replace("_", " ")
        with_gain = [r for r in sel if r["gain"] is not None]
        if with_gain:
            ax.bar([r["trial"] for r in with_gain], [r["gain"] for r in with_gain], color=color, label=label)
        without = [r for r in sel if r["gain"] is None]
        if without:
            ax.scatter([r["trial"] for r in without], [0.0] * len(without), marker="x", color=color,
                       label=f"{label} (no final eval)", zorder=3)
    for margin in (INTACT_MARGIN, COLLAPSE_MARGIN):  # the outcome bounds, as gains
        ax.axhline(-margin, color="gray", linewidth=0.6, linestyle="--")
    if best is not None:
        b = next(r for r in rows if r["trial"] == best)
        ax.annotate("best", (best, b["gain"] or 0.0), textcoords="offset points", xytext=(0, 6), ha="center")
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xlabel("trial")
    ax.set_ylabel("held-out reward gain (final - base)")
    ax.set_title(f"{title}: gain per trial")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.png")
    fig.savefig(tmp, dpi=100, bbox_inches="tight")
    os.replace(tmp, path)
    return str(path)


# -- dry run ----------------------------------------------------------------------------------------
def dry_run(space, config, base, kind, target, out: Path, log=print) -> int:
    """List the trials (grid) or the distributions (TPE) and validate each grid configuration."""
    problems = []
    log(f"search space {space.path}: sampler {kind}, {target} trials; base preset {config or '(defaults)'}")
    if base:
        log(f"base overrides: {_fmt(base)}")
    if kind == "grid":
        configs = space.grid_overrides()
        log(f"grid of {len(configs)} configurations"
            + (f" (the first {target} of the shuffled grid will run)" if target < len(configs) else "") + ":")
        for i, over in enumerate(configs):
            try:
                load_config(config, {**base, **over, "output_dir": str(out / "trial_x"), "resume": False})
                status = ""
            except ValueError as e:
                status = f"  INVALID: {e}"
                problems.append(f"{_fmt(over)}: {e}")
            log(f"  {i:>3}  {_fmt(over)}{status}")
    else:
        for name, p in space.params.items():
            log(f"  {name}: {p.choices if p.choices is not None else f'{p.kind} [{p.low}, {p.high}]' + (' log' if p.log else '')}")
        for i, point in enumerate(space.points):
            log(f"  points[{i}]: {_fmt(point)}")
    cfg = load_config(config, base)
    for what, p in (("data", cfg.data), ("eval_data", cfg.eval_data)):
        if p and not Path(p).exists():
            problems.append(f"{what}: {p}: no such file")
    model = Path(cfg.model)
    if not model.exists() and (cfg.model.startswith((".", "/")) or model.parent.is_dir()):
        problems.append(f"model: {cfg.model}: no such directory")
    for p in problems:
        log(f"problem: {p}")
    log("dry run: ok" if not problems else f"dry run: {len(problems)} problem(s)")
    return 0 if not problems else 1


# -- command line -------------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.description = ("Hyperparameter sweep: every trial is a fresh `rookworld train` run in <out>/trial_<n>; "
                     "the objective is the held-out reward at the end. Workers sharing --storage and --study "
                     "share the work. See configs/sweeps/README.md.")
    p.add_argument("--space", help="search space YAML (configs/sweeps/stability.yaml)")
    p.add_argument("--config", help="base preset (default: the space file's config:, else the built-in defaults)")
    p.add_argument("--trials", type=int, help="trials in the study (default: the grid size, or trials: in the file)")
    p.add_argument("--storage", help="Optuna storage URL (default: sqlite:///<out>/study.db; "
                                     "postgresql://... or mysql+pymysql://... for several machines)")
    p.add_argument("--study", help="study name (default: the space file's name)")
    p.add_argument("--out", help="directory for trial runs, summary.json and sweep.png (default: sweeps/<study>)")
    p.add_argument("--sampler", choices=SAMPLERS, help="override the space file's sampler")
    p.add_argument("--sampler-seed", type=int, help="sampler seed (grid: the order of the points, must be the same "
                                                    "on every worker, default 0; TPE: one per worker). "
                                                    "--seed is the training seed field")
    p.add_argument("--summary", action="store_true", help="print and write the summary of a study, run nothing")
    p.add_argument("--dry-run", action="store_true", help="validate the space and list the trials, run nothing")
    p.add_argument("--requeue-running", action="store_true",
                   help="mark RUNNING trials of dead workers interrupted and queue them again (no worker may be alive)")
    p.add_argument("--traceback", action="store_true", help="show full tracebacks on errors")
    group = p.add_argument_group("config fields for every trial (any TrainConfig field; YAML syntax for values)")
    add_field_arguments(group, show_defaults=False)


def _interrupt_on_sigterm() -> None:
    def handler(signum, frame):
        raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        pass


def run(args: argparse.Namespace, name: str) -> int:
    overrides = {k[5:]: v for k, v in vars(args).items() if k.startswith("cfg__") and v is not None}
    if args.summary or args.requeue_running:
        study_name = args.study or (Path(args.space).stem if args.space else None)
        out = Path(args.out) if args.out else (Path("sweeps") / study_name if study_name else None)
        if args.storage is None and out is None:
            raise ValueError("--summary needs --out DIR, --storage URL or --study NAME")
        study = load_existing_study(args.storage or default_storage(out), study_name)
        if args.requeue_running:
            print(f"{requeue_running(study)} running trial(s) queued again")
        if args.summary:
            summarize(study, out or Path("sweeps") / study.study_name)
        return 0
    if not args.space:
        raise ValueError("rookworld sweep needs --space FILE (or --summary)")
    space, config, base, kind, target = _resolve(args.space, args.config, overrides, args.trials, args.sampler)
    study_name = args.study or Path(space.path).stem
    out = Path(args.out) if args.out else Path("sweeps") / study_name
    if args.dry_run:
        return dry_run(space, config, base, kind, target, out)
    _interrupt_on_sigterm()
    _need_optuna()
    summary = run_sweep(space, config=config, overrides=overrides, trials=args.trials, storage=args.storage,
                        study_name=study_name, out=out, sampler=kind, seed=args.sampler_seed)
    if summary["finished"] and not summary["complete"]:
        print("error: no trial completed; see the failures above and <out>/trial_<n>/train.log", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m rookworld_rlvr.sweep ...`: the same as `rookworld sweep ...`."""
    from rookworld_rlvr.cli import _tune_allocator

    _tune_allocator()
    parser = argparse.ArgumentParser(prog="rookworld sweep")
    add_arguments(parser, "sweep")
    args = parser.parse_args(argv)
    try:
        return run(args, "sweep")
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError) as e:
        if args.traceback:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
