"""The README's library example runs as written: a user's first lines of code against the package."""

import ast
import math
import re

from conftest import REPO


def readme_python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", (REPO / "README.md").read_text(), re.S | re.M)


def test_readme_library_example_runs_and_scores(tmp_path, monkeypatch, stockfish_path):
    """Run the README's Python block in a fresh folder holding only the shipped model (its cache file
    lands there, not in the checkout): the A: example scores 1.0, the four sampled P: answers are
    scored by Stockfish, and the TRL reward function returns the same totals as the scorer."""
    blocks = readme_python_blocks()
    assert len(blocks) == 1, "the README's library section holds one Python example"
    (tmp_path / "models").symlink_to(REPO / "models")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STOCKFISH_PATH", stockfish_path)
    tree = ast.parse(blocks[0])
    namespace: dict = {}
    values = []  # the value of each bare expression, as a notebook would show it
    for node in tree.body:
        if isinstance(node, ast.Expr):
            values.append(eval(compile(ast.Expression(node.value), "README.md", "eval"), namespace))
        else:
            exec(compile(ast.Module([node], type_ignores=[]), "README.md", "exec"), namespace)
    assert values[0] == 1.0, "the README says the exact A: transition scores 1.0"
    texts, results, totals = namespace["out"].texts, namespace["results"], namespace["totals"]
    assert len(texts) == 4 and all(t.startswith("M: ") for t in texts), texts
    assert len(results) == 4 and all(math.isfinite(r.total) for r in results)
    assert list(totals) == [r.total for r in results]
    assert (tmp_path / "engine.sqlite").exists(), "the example's engine cache is written where it says"
