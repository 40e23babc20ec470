"""What the README and the docs point at is there: every `rookworld ...` command and `make train ARGS="..."` they
give is one the command line takes (an option renamed or removed since fails here, not in a user's terminal), and
every test they cite as a claim's proof and every file and heading they link to exists. Parsing only (nothing
runs); placeholders in capitals (RUN, DIR, N) stand for a value, and a command mentioned by name alone (`rookworld
eval`, without its required options) is prose, not a command to run."""

import contextlib
import io
import re
import shlex

import pytest
from conftest import REPO

from rookworld_rlvr.cli import build_parser
from rookworld_rlvr.cli_args import parse

DOCS = sorted({REPO / "README.md", *REPO.glob("docs/*.md"), *REPO.glob("*/README.md"), *REPO.glob("*/*/README.md")}
              - set(REPO.glob("runs/**/*.md")))  # (a run's own files, not docs)
PLACEHOLDER = re.compile(r"^(?!(P|A|PA|AP)$)[A-Z][A-Z_0-9]*$")  # RUN, N, S; not the task letters P, A, PA


def filled(words: list[str], standalone: str | None) -> list[str]:
    """Placeholders given a value ("1"): an option's, or a positional one's (`standalone` "1"); a placeholder
    that stands for options (ARGS="--lr 3e-5 CHANGE") is left out (`standalone` None)."""
    out = []
    for i, w in enumerate(words):
        if not PLACEHOLDER.match(w):
            out.append(w)
        elif (i and words[i - 1].startswith("--")) or standalone is not None:
            out.append("1")
    return out


def documented_commands() -> list[tuple[str, str, list[str]]]:
    """(file, the command as written, the arguments `rookworld` would get) of every command in the docs."""
    found = []
    for path in DOCS:
        text = path.read_text().replace("\\\n", " ")  # a shell line continued on the next
        name = str(path.relative_to(REPO))
        for args in sorted(set(re.findall(r'make train[^`\n]*ARGS="([^"]+)"', text))):
            words = filled(shlex.split(args), None)
            found.append((name, f'make train ARGS="{args}"', ["train", "--config", "configs/default.yaml", *words]))
        commands = re.findall(r"`(rookworld [^`]+)`", text) + re.findall(r"^\s*(rookworld [^\n#]+)", text, re.M)
        for command in sorted(set(commands)):
            command = command.strip().rstrip("&").strip()
            if re.search(r"\.\.\.|…|\||^rookworld \S+:", command):  # an elided list, alternatives, an error shown
                continue
            words = shlex.split(re.sub(r"\[[^\]]*\]", "", command))[1:]  # [optional parts] left out
            found.append((name, command, filled(words, "1")))
    return found


def test_the_docs_hold_commands_to_check():
    found = documented_commands()
    assert len(found) > 100 and {"README.md", "docs/gpu.md", "docs/grpo-experiments.md"} <= {f for f, _, _ in found}


@pytest.mark.parametrize("where,command,argv", documented_commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_a_documented_command_is_one_the_command_line_takes(where, command, argv):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parse(build_parser(), argv)
    except SystemExit as e:
        said = err.getvalue().strip()
        prose = "are required" in said or ("expected one argument" in said and argv[-1].startswith("--"))
        if e.code and not prose:  # prose names `rookworld eval` without its --model, `rookworld sweep --storage`
            pytest.fail(f"{where}: {command}\n{said}", pytrace=False)


def test_every_test_the_docs_cite_exists():
    """docs/reliability.md and the others give a test as the proof of each claim (`test_faults.py::test_...`,
    `::test_...` for another of the same file): a test renamed or removed leaves a claim without its proof."""
    defined = {path.name: set(re.findall(r"^\s*def (test_\w+)", path.read_text(), re.M))
               for path in (REPO / "tests").rglob("test_*.py")}
    everywhere = set().union(*defined.values())
    missing, cited = [], 0
    for path in DOCS:
        text = path.read_text()
        for m in re.finditer(r"(?<![\w/])(test_\w+\.py)((?:::\w+)*)", text):
            names = m.group(2).split("::")[1:]
            cited += 1
            if m.group(1) not in defined:
                missing.append(f"{path.name}: {m.group(1)}")
            missing += [f"{path.name}: {m.group(1)}::{n}" for n in names if n not in defined.get(m.group(1), names)]
        missing += [f"{path.name}: ::{n}" for n in re.findall(r"(?<![\w.])::(test_\w+)", text) if n not in everywhere]
    assert cited > 100 and not missing, missing


def test_every_link_between_the_docs_reaches_its_file_and_heading():
    """A relative link's file exists and its #anchor is one of that file's headings (as GitHub makes them: lower
    case, punctuation dropped, spaces as hyphens)."""
    def headings(path) -> set[str]:
        return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                for h in re.findall(r"^#+ (.+)$", path.read_text(), re.M)}

    broken, links = [], 0
    for path in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            links += 1
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in headings(dest)):
                broken.append(f"{path.relative_to(REPO)}: {target}")
    assert links > 40 and not broken, broken
