"""Training state on disk without pickle: tensors in safetensors, everything else in JSON.

A checkpoint may come from someone else, and unpickling it would run any code it carries.
`save_state(dir, name, state)` writes `name.safetensors` (every tensor, by its path in the
state) and `name.json` (the rest of the tree, with a placeholder where each tensor was).
Loading reads data only: JSON values and raw tensor bytes. The tree may hold dicts (any
int/str keys), lists, tuples, str, int, float, bool, None and tensors: what optimizer and
RNG states are made of. Anything else is refused at save time, naming its path.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

_TENSOR, _TUPLE, _ITEMS = "__tensor__", "__tuple__", "__items__"


def _encode(value: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        key = path or "root"
        tensors[key] = value.detach().cpu().clone()  # a copy: safetensors refuses shared storage
        return {_TENSOR: key}
    if isinstance(value, tuple):
        return {_TUPLE: [_encode(v, f"{path}.{i}", tensors) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, f"{path}.{i}", tensors) for i, v in enumerate(value)]
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in value):
            return {k: _encode(v, f"{path}.{k}", tensors) for k, v in value.items()}
        if not all(isinstance(k, (str, int)) and not isinstance(k, bool) for k in value):
            raise TypeError(f"state{path}: dict keys must be str or int")
        return {_ITEMS: [[k, _encode(v, f"{path}.{k}", tensors)] for k, v in value.items()]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"state{path}: cannot store a {type(value).__name__} (only tensors and plain values)")


def _decode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if _TENSOR in value:
        return tensors[value[_TENSOR]]
    if _TUPLE in value:
        return tuple(_decode(v, tensors) for v in value[_TUPLE])
    if _ITEMS in value:
        return {k: _decode(v, tensors) for k, v in value[_ITEMS]}
    return {k: _decode(v, tensors) for k, v in value.items()}


def save_state(directory: str | Path, name: str, state: dict[str, Any]) -> None:
    """Write `name.safetensors` and `name.json` in `directory` (each fsynced, then renamed)."""
    directory = Path(directory)
    tensors: dict[str, torch.Tensor] = {}
    tree = _encode(state, "", tensors)
    for suffix, write in ((".safetensors", lambda p: save_file(tensors, str(p))),
                          (".json", lambda p: p.write_text(json.dumps(tree)))):
        final = directory / f"{name}{suffix}"
        tmp = directory / f".{name}{suffix}.tmp"
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)


def state_exists(directory: str | Path, name: str) -> bool:
    directory = Path(directory)
    return (directory / f"{name}.json").exists() and (directory / f"{name}.safetensors").exists()


def load_state(directory: str | Path, name: str) -> dict[str, Any]:
    """The state written by `save_state`: plain values and CPU tensors, no code executed.
    A file that is not what `save_state` wrote is a ValueError naming it."""
    directory = Path(directory)
    tree_path, tensor_path = directory / f"{name}.json", directory / f"{name}.safetensors"
    try:
        tree = json.loads(tree_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{tree_path}: not a state file ({e})") from None
    try:
        tensors = load_file(str(tensor_path))
    except SafetensorError as e:
        raise ValueError(f"{tensor_path}: not a safetensors file ({e})") from None
    try:
        return _decode(tree, tensors)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{tree_path}: does not match {tensor_path.name} ({type(e).__name__}: {e})") from None
