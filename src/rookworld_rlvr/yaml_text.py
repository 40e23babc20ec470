"""YAML that a person writes (presets, search spaces, values on the command line), read with each key once.

PyYAML keeps the last of two equal keys of a mapping without a word: a preset that sets `lr` twice ran with the
second, and an edit of the first did nothing. YAML itself says that a mapping's keys are unique; this reader holds to
it and names the line of each. Errors are one line: `file:line:column: not valid YAML: what`.

Owns reading hand-written YAML. Imports PyYAML only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class _UniqueKeys(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that holds a key twice (a merge, `<<: *base`, may still be
    overridden by the mapping's own key: only the keys written in the mapping itself are compared)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"{key!r} is set twice (first on line {seen[key] + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


def load_text(text: str) -> Any:
    """`text` as YAML (yaml.YAMLError where it is not, or holds a key twice)."""
    return yaml.load(text, Loader=_UniqueKeys)  # noqa: S506 (a safe loader)


def load_file(path: str | Path) -> Any:
    """A YAML file's content; not YAML, or a key twice, is a ValueError `file:line:column: not valid YAML: what`."""
    try:
        return load_text(Path(path).read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        raise ValueError(f"{where}: not valid YAML: {getattr(e, 'problem', None) or e}") from None
