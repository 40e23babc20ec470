"""The package's layout, read from the source (ast): every module says what it owns and what it
must not import, chess modules import no torch (directly or through the package), model modules
hold no chess text, and no module outgrows one sitting."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import REPO

PACKAGE = REPO / "src" / "rookworld_rlvr"
LINE_BUDGET = 450
# chess modules: the rules of the game, the data files and the engine; the metrics of answers
CHESS = ("tasks/", "data/", "engine.py", "engine_process.py", "metrics.py", "chess_tokenizers.py")
TORCH = ("torch",)  # third-party roots that load torch
CHESS_WORDS = re.compile(r"chess|\bfen\b|\buci\b|stockfish|checkmate|pawn|\b[PAMEB]:\s|[a-h][1-8][a-h][1-8]", re.I)


def modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(path: Path) -> set[str]:
    """Every module `path` imports, at the top or inside a function (absolute names)."""
    tree = ast.parse(path.read_text())
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}  # `from pkg import module`
    return found


def in_package(names: set[str], known: dict[str, Path]) -> set[str]:
    return {n for n in names if n in known}


def reaches_torch(name: str, known: dict[str, Path], seen: set[str]) -> list[str] | None:
    """A chain of package modules from `name` to one that imports torch, or None."""
    if name in seen:
        return None
    seen.add(name)
    direct = imports(known[name])
    if any(n.split(".")[0] in TORCH for n in direct):
        return [name]
    for dep in sorted(in_package(direct, known)):
        chain = reaches_torch(dep, known, seen)
        if chain:
            return [name, *chain]
    return None


def is_chess(path: Path) -> bool:
    rel = path.relative_to(PACKAGE).as_posix()
    return any(rel == c or (c.endswith("/") and rel.startswith(c)) for c in CHESS)


def test_every_module_says_what_it_owns_and_must_not_import():
    for name, path in modules().items():
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert "Owns" in doc and "mport" in doc, f"{name}: the docstring must say what it owns and what it imports"


def test_no_module_is_over_the_line_budget():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > LINE_BUDGET}
    assert not long, f"modules over {LINE_BUDGET} lines: {long}"


def test_chess_modules_import_no_torch():
    known = modules()
    chess = [name for name, path in known.items() if is_chess(path)]
    assert len(chess) >= 10  # the rules above still name the chess modules
    for name in chess:
        chain = reaches_torch(name, known, set())
        assert chain is None, f"{name} reaches torch: {' -> '.join(chain)} imports torch"


@pytest.mark.parametrize("path", sorted((PACKAGE / "model").glob("*.py")), ids=lambda p: p.name)
def test_model_modules_hold_no_chess(path):
    tree = ast.parse(path.read_text())
    ours = {n for n in imports(path) if n.startswith("rookworld_rlvr")}
    # file renames, the Hub's reach, a missing path's wording: modules that import nothing of ours
    ours = {n for n in ours if not n.startswith(tuple(f"rookworld_rlvr.{m}" for m in ("atomic", "hub", "paths")))}
    assert all(n.startswith("rookworld_rlvr.model") for n in ours), f"{path.name} imports {sorted(ours)}"
    assert not any(n.split(".")[0] == "chess" for n in imports(path)), f"{path.name} imports python-chess"
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        text = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            text = node.value
        elif isinstance(node, (ast.Name, ast.FunctionDef, ast.ClassDef, ast.arg, ast.Attribute)):
            text = getattr(node, "id", None) or getattr(node, "name", None) or getattr(node, "arg", None) \
                or getattr(node, "attr", None)
        assert not (text and CHESS_WORDS.search(text)), f"{path.name}:{node.lineno}: chess text {text!r}"
