"""Training state on disk without pickle: tensors in safetensors, everything else in JSON.

A checkpoint may come from someone else, and unpickling it would run any code it carries.
`save_state(dir, name, state)` writes `name.safetensors` (every tensor, by its path in the
state) and `name.json` (the rest of the tree, with a placeholder where each tensor was).
Loading reads data only: JSON values and raw tensor bytes. The tree may hold dicts (any
int/str keys), lists, tuples, str, int, float, bool, None and tensors: what optimizer and
RNG states are made of. Anything else is refused at save time, naming its path.

Owns the state file format. Imports torch and safetensors; nothing else of the package.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors import safe_open
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


class _Unmatched(ValueError):
    """A placeholder of the JSON tree that the tensors file cannot fill, with its field."""


def _decode(value: Any, tensors: dict[str, torch.Tensor], field: str = "") -> Any:
    if isinstance(value, list):
        return [_decode(v, tensors, f"{field}.{i}") for i, v in enumerate(value)]
    if not isinstance(value, dict):
        return value
    here = field.lstrip(".") or "the state"
    if _TENSOR in value:
        if not isinstance(value[_TENSOR], str) or value[_TENSOR] not in tensors:
            raise _Unmatched(f"field '{here}' names a tensor {value[_TENSOR]!r} that the tensors file does not hold")
        return tensors[value[_TENSOR]]
    if _TUPLE in value:
        if not isinstance(value[_TUPLE], list):
            raise _Unmatched(f"field '{here}' must hold a list of the tuple's items, got {value[_TUPLE]!r}"[:200])
        return tuple(_decode(v, tensors, f"{field}.{i}") for i, v in enumerate(value[_TUPLE]))
    if _ITEMS in value:
        items = value[_ITEMS]
        pairs = isinstance(items, list) and all(isinstance(kv, list) and len(kv) == 2 for kv in items)
        if not pairs or not all(isinstance(k, (str, int)) and not isinstance(k, bool) for k, _ in items):
            raise _Unmatched(f"field '{here}' must hold [key, value] pairs with text or integer keys")
        return {k: _decode(v, tensors, f"{field}.{k}") for k, v in items}
    return {k: _decode(v, tensors, f"{field}.{k}") for k, v in value.items()}


def _shards(tensors: dict[str, torch.Tensor], shard_bytes: int | None) -> list[dict[str, torch.Tensor]]:
    """Tensors in order, cut into groups of at most `shard_bytes` (a bigger tensor goes alone)."""
    groups: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key, t in tensors.items():
        n = t.numel() * t.element_size()
        if shard_bytes and groups[-1] and size + n > shard_bytes:
            groups.append({})
            size = 0
        groups[-1][key] = t
        size += n
    return groups


def _write(final: Path, write) -> None:
    tmp = final.with_name(f".{final.name}.tmp")
    write(tmp)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, final)


def save_state(directory: str | Path, name: str, state: dict[str, Any], shard_bytes: int | None = None) -> None:
    """Write `name.json` and `name.safetensors` in `directory` (each fsynced, then renamed).
    With `shard_bytes`, tensors beyond that size go to `name.1.safetensors`, `name.2...` (a
    state small enough to keep in git, under a hosting service's file size limit)."""
    directory = Path(directory)
    tensors: dict[str, torch.Tensor] = {}
    tree = _encode(state, "", tensors)
    groups = _shards(tensors, shard_bytes)
    for k in range(len(groups) - 1, 0, -1):  # the extra shards first: the main file names how many there are
        _write(directory / f"{name}.{k}.safetensors", lambda p, g=groups[k]: save_file(g, str(p)))
    _write(directory / f"{name}.safetensors",
           lambda p: save_file(groups[0], str(p), metadata={"shards": str(len(groups))}))
    _write(directory / f"{name}.json", lambda p: p.write_text(json.dumps(tree)))
    stale = len(groups)
    while (directory / f"{name}.{stale}.safetensors").exists():  # left by an earlier, bigger save
        (directory / f"{name}.{stale}.safetensors").unlink()
        stale += 1


def state_exists(directory: str | Path, name: str) -> bool:
    directory = Path(directory)
    return (directory / f"{name}.json").exists() and (directory / f"{name}.safetensors").exists()


def load_state(directory: str | Path, name: str) -> dict[str, Any]:
    """The state written by `save_state`: plain values and CPU tensors, no code executed.
    A file that is not what `save_state` wrote is a ValueError naming it (and the field, where a placeholder of
    the JSON tree does not fit the tensors). Whether the values fit the run is `state_check`'s to say."""
    directory = Path(directory)
    tree_path, tensor_path = directory / f"{name}.json", directory / f"{name}.safetensors"
    try:
        tree = json.loads(tree_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{tree_path}: not a state file ({e})") from None
    try:
        tensors = load_file(str(tensor_path))
        with safe_open(str(tensor_path), "pt") as fh:
            shards = int((fh.metadata() or {}).get("shards", "1"))
        for k in range(1, shards):
            tensors.update(load_file(str(directory / f"{name}.{k}.safetensors")))
    except (SafetensorError, FileNotFoundError) as e:
        raise ValueError(f"{tensor_path}: not a complete safetensors state ({e})") from None
    try:
        return _decode(tree, tensors)
    except _Unmatched as e:
        raise ValueError(f"{tree_path}: {e} ({tensor_path.name})") from None
