"""A training state read back from a file is checked before any of it is used.

A checkpoint may have been handed over, edited by hand, or damaged. Used as it is, a value of the wrong kind
fails far from its cause: a list where Adam's moment was ends in a TypeError inside the optimizer's first step,
a missing key in a KeyError inside a controller, a float key in a crash at the next save. `check` compares the
state with a template of what this code saves and names the file and the first field that differs.

A template is a value or a check. A tensor asks for a tensor of its dtype and shape; a bool, int, float or
str for one of the same kind (an int >= 0 for one >= 0, an int or a float for a float); None for anything; a
dict for a mapping with its keys (`optional` ones may be missing; others are not read); a list for a list
whose items are each like the list's last item (any items if it is empty); a tuple for a sequence of its
length, item by item. A check is a function (value, field) -> (field, what is wrong) or None: `each`,
`maybe`, `usable`, `rng`, `python_rng`, `tensors_like`, `optimizer`.

Owns no state; imports torch and nothing of the package.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

Problem = tuple[str, str]  # the field, and what is wrong with it ("must be ...", "is missing")
Check = Callable[[Any, str], "Problem | None"]


class optional:  # noqa: N801 - reads as a marker in a template: {"guard": optional({...})}
    """A key of a template dict that a state may lack (written by an older version, or not used by its run)."""

    def __init__(self, template: Any) -> None:
        self.template = template


def _shown(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {list(value.shape)}"
    return repr(value)[:80]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def problem(value: Any, template: Any, field: str) -> Problem | None:
    """The first field of `value` unlike `template` (the module's rules) and what is wrong with it; None if none."""
    if callable(template) and not isinstance(template, type):
        return template(value, field)
    if template is None:
        return None
    want = None
    if isinstance(template, torch.Tensor):
        if not (isinstance(value, torch.Tensor) and value.dtype == template.dtype and value.shape == template.shape):
            want = _shown(template)
    elif isinstance(template, bool):
        want = None if isinstance(value, bool) else "true or false"
    elif isinstance(template, int):
        ok = isinstance(value, int) and not isinstance(value, bool) and (value >= 0 or template < 0)
        want = None if ok else "an integer" + (" >= 0" if template >= 0 else "")
    elif isinstance(template, float):
        want = None if _number(value) else "a number"
    elif isinstance(template, str):
        want = None if isinstance(value, str) else "text"
    elif isinstance(template, Mapping):
        if not isinstance(value, Mapping):
            want = "a mapping"
        else:
            for key, item in template.items():
                if key not in value:
                    if isinstance(item, optional):
                        continue
                    return f"{field}.{key}", "is missing"
                found = problem(value[key], item.template if isinstance(item, optional) else item, f"{field}.{key}")
                if found:
                    return found
    elif isinstance(template, (list, tuple)):
        fixed = isinstance(template, tuple)
        if not isinstance(value, (list, tuple)) or (fixed and len(value) != len(template)):
            want = f"a list of {len(template)} items" if fixed else "a list"
        elif template:
            for i, item in enumerate(value):
                found = problem(item, template[i] if fixed else template[-1], f"{field}.{i}")
                if found:
                    return found
    return (field, f"must be {want}, got {_shown(value)}") if want else None


def each(template: Any) -> Check:
    """A mapping (any keys) whose every value is like `template`."""
    def check(value: Any, field: str) -> Problem | None:
        if not isinstance(value, Mapping):
            return field, f"must be a mapping, got {_shown(value)}"
        return next((p for k, v in value.items() if (p := problem(v, template, f"{field}.{k}"))), None)
    return check


def maybe(template: Any) -> Check:
    """None, or a value like `template`."""
    return lambda value, field: None if value is None else problem(value, template, field)


def usable(use: Callable[[Any], Any], what: str) -> Check:
    """A value that `use` accepts (an RNG state set on a scratch generator): whatever it raises names the field."""
    def check(value: Any, field: str) -> Problem | None:
        try:
            use(value)
        except Exception as e:  # noqa: BLE001 - any refusal is the answer
            return field, f"must be {what} ({type(e).__name__}: {str(e)[:120]})"
        return None
    return check


def rng(device: str | torch.device = "cpu") -> Check:
    """A state of torch's generator on `device`: one a generator made there takes."""
    return usable(lambda v: torch.Generator(device).set_state(v), f"a state of torch's generator on {device}")


# a state of Python's `random`: one a fresh `random.Random` takes
python_rng = usable(lambda v: random.Random().setstate(v), "a state of Python's random module")


def tensors_like(reference: Mapping[str, torch.Tensor]) -> Check:
    """A mapping of `reference`'s names to floating-point tensors of its shapes (weights: their dtype may differ)."""
    def check(value: Any, field: str) -> Problem | None:
        if not isinstance(value, Mapping) or set(value) != set(reference):
            return field, f"must map the {len(reference)} tensors of this model by name, got {_shown(value)[:80]}"
        for name, ours in reference.items():
            got = value[name]
            if not (isinstance(got, torch.Tensor) and got.is_floating_point() and got.shape == ours.shape):
                return f"{field}.{name}", f"must be a tensor of shape {list(ours.shape)}, got {_shown(got)}"
        return None
    return check


# how the update is computed: a state saved with other values is not one this code wrote (the kernels, fused or
# foreach or capturable, are this machine's choice: `grpo.control.load_optimizer` keeps its own)
_MATH_FLAGS = ("amsgrad", "maximize", "differentiable", "decoupled_weight_decay")


def _step(value: Any, field: str) -> Problem | None:
    if _number(value) or (isinstance(value, torch.Tensor) and value.numel() == 1):
        return None
    return field, f"must be a number or a one-element tensor, got {_shown(value)}"


def _group(got: Any, ours: dict, ids: list[int], where: str) -> Problem | None:
    """A saved parameter group against this optimizer's: the same parameter numbers, finite numbers where it has
    numbers, its update rule's flags."""
    if not isinstance(got, Mapping):
        return where, f"must be a mapping, got {_shown(got)}"
    if got.get("params") != ids:
        return f"{where}.params", f"must be the parameter numbers {ids[0]} to {ids[-1]}, got " \
            f"{_shown(got.get('params'))}"
    for key, mine in ours.items():
        pair = isinstance(mine, tuple)  # betas
        numeric = pair or _number(mine)
        if key == "params" or (key not in got and not numeric):
            continue  # a flag an older torch did not save: loading gives it its default
        if key not in got:
            return f"{where}.{key}", "is missing"
        if key in _MATH_FLAGS and not (type(got[key]) is type(mine) and got[key] == mine):
            return f"{where}.{key}", f"must be {mine!r} (this code's AdamW), got {_shown(got[key])}"
        if numeric:
            values = list(got[key]) if pair and isinstance(got[key], (list, tuple)) else [got[key]]
            if len(values) != (len(mine) if pair else 1) or not all(_number(v) and math.isfinite(v) for v in values):
                want = f"{len(mine)} finite numbers" if pair else "a finite number"
                return f"{where}.{key}", f"must be {want}, got {_shown(got[key])}"
    return None


def optimizer(opt: torch.optim.Optimizer) -> Check:
    """A saved state of `opt` (AdamW, as `grpo.control.adamw` builds it): its groups number the same parameters
    in order (0, 1, ...), with finite hyperparameters and the same update rule; each parameter's state holds
    its step and moments, tensors of that parameter's shape."""
    groups, params = opt.param_groups, [p for g in opt.param_groups for p in g["params"]]
    moments = ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if groups[0].get("amsgrad") else ())

    def check(value: Any, field: str) -> Problem | None:
        if not (isinstance(value, Mapping) and isinstance(value.get("state"), Mapping)
                and isinstance(value.get("param_groups"), list)):
            return field, "must be an optimizer's state (a mapping with 'state' and 'param_groups')"
        saved, first = value["param_groups"], 0
        if len(saved) != len(groups):
            return f"{field}.param_groups", f"must hold {len(groups)} groups, got {len(saved)}"
        for i, (group, got) in enumerate(zip(groups, saved)):
            ids = list(range(first, first + len(group["params"])))
            first += len(ids)
            if found := _group(got, group, ids, f"{field}.param_groups.{i}"):
                return found
        for key, entry in value["state"].items():
            if isinstance(key, bool) or not isinstance(key, int) or not 0 <= key < len(params):
                return f"{field}.state", f"has a key {key!r}: the parameter numbers are 0 to {len(params) - 1}"
            shape = torch.empty(params[key].shape, dtype=params[key].dtype, device="meta")
            if found := problem(entry, {"step": _step, **{m: shape for m in moments}}, f"{field}.state.{key}"):
                return found
        return None
    return check


def check(state: Any, template: Any, path: str | Path) -> None:
    """A ValueError naming `path`, the first field of `state` unlike `template` (the module's rules) and why."""
    found = problem(state, template, "state")
    if found:
        field, wrong = found
        raise ValueError(f"{path}: field '{field.removeprefix('state.')}' {wrong} (a damaged or edited checkpoint: "
                         "move it aside, and --resume continues from the one before, if any)")
