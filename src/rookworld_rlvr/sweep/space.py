"""The search space of a sweep: the YAML file, its checks, the grid, the base configuration.

Owns what a trial may set: every name is a `TrainConfig` field, every value is validated before
the first trial runs. Imports no torch and nothing of the trainer; optuna inside functions only.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rookworld_rlvr.config import FIELDS, coerce, load_config
from rookworld_rlvr.config_checks import close_fields
from rookworld_rlvr.paths import no_such_file
from rookworld_rlvr.yaml_text import load_file

SAMPLERS = ("grid", "tpe")
MANAGED = ("output_dir", "resume")  # set by the sweep for every trial
POINT = "points"  # the Optuna parameter holding the index into `points` (not a TrainConfig field)
SPACE_KEYS = ("config", "base", "params", "points", "sampler", "trials")


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
    close = close_fields(name)[:3]
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
        for key, v in (("low", low), ("high", high), ("step", step)):
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool)):
                raise ValueError(f"{key} must be a number, got {v!r}")
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
    if not Path(path).is_file():
        raise ValueError(f"search space {path}: a directory, not a YAML file" if Path(path).is_dir() else
                         f"search space {no_such_file(path)}")
    raw = load_file(path) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a search space must be a mapping with params: (and optional base:, points:, sampler:)")
    extra = set(raw) - set(SPACE_KEYS)
    if extra:
        raise ValueError(f"{path}: unknown keys {sorted(extra)} (expected {', '.join(SPACE_KEYS)})")
    space = SweepSpace(path, config=raw.get("config"), sampler=raw.get("sampler"), trials=raw.get("trials"))
    if space.sampler is not None and space.sampler not in SAMPLERS:
        raise ValueError(f"{path}: sampler must be one of {SAMPLERS}, got {space.sampler!r}")
    if space.config is not None and not isinstance(space.config, str):
        raise ValueError(f"{path}: config must be the path of a preset (a YAML file), got {space.config!r}")
    if space.trials is not None and (not isinstance(space.trials, int) or isinstance(space.trials, bool)
                                     or space.trials < 1):
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


def fmt_overrides(over: dict) -> str:
    """`field=value` pairs of a trial's configuration, as the logs and the summary show them."""
    return " ".join(f"{k}={json.dumps(v)}" for k, v in over.items())


def resolve(space: SweepSpace | str | Path, config: str | None, overrides: dict | None,
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
