"""scripts/ensure_venv.sh, the first thing `make train` and `make test` run: a virtual environment with pip, made
again where a failed attempt left one half made, and a clear error where the Python cannot make one; and .ci/run,
which runs `make test` and then `make drills`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "ensure_venv.sh"
VERSION = "%d.%d" % sys.version_info[:2]


def ensure(python: str | Path, venv: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), str(python), str(venv)], capture_output=True, text=True, timeout=300)


def fake_python(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "python3"
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)
    return path


def has_pip(venv: Path) -> bool:
    return subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "--version"], capture_output=True).returncode == 0


def test_a_venv_a_failed_attempt_left_without_pip_is_made_again(tmp_path):
    """Debian's and Ubuntu's python3 without python3-venv: `python3 -m venv` fails and leaves the folder without
    pip. The error says which package to install and leaves nothing behind; once it is installed (here: the real
    Python), `make` goes on, also over a half-made folder left by an older checkout."""
    debian = fake_python(tmp_path, f"""if [ "$1 $2" = "-m venv" ]; then
  {sys.executable} -m venv --without-pip "$3"
  echo "The virtual environment was not created successfully because ensurepip is not available." >&2
  exit 1
fi
exec {sys.executable} "$@\"""")
    venv = tmp_path / ".venv"
    proc = ensure(debian, venv)
    assert proc.returncode == 1 and f"could not make the virtual environment {venv} with pip" in proc.stderr
    assert f"apt-get install python{VERSION}-venv" in proc.stderr
    assert not venv.exists()  # the next attempt starts afresh

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)  # half made
    assert not has_pip(venv)
    proc = ensure(sys.executable, venv)
    assert proc.returncode == 0, proc.stderr
    assert f"{venv} has no pip (a virtual environment left half made): making it again" in proc.stderr
    assert has_pip(venv)
    made = (venv / "pyvenv.cfg").stat().st_mtime_ns
    assert ensure(sys.executable, venv).returncode == 0 and (venv / "pyvenv.cfg").stat().st_mtime_ns == made


def test_a_python_too_old_or_missing_and_a_folder_that_is_no_venv_are_named(tmp_path):
    old = fake_python(tmp_path, 'case "$2" in *print*) echo 3.10 ;; *) exit 1 ;; esac')  # its version, then the test
    proc = ensure(old, tmp_path / ".venv")
    assert proc.returncode == 1 and f"{old} is Python 3.10; rookworld-rlvr needs 3.11 or later" in proc.stderr
    proc = ensure("python3.99", tmp_path / ".venv")
    assert proc.returncode == 1 and "python3.99 not found: install Python 3.11 or later" in proc.stderr
    folder = tmp_path / "mine"
    (folder / "bin").mkdir(parents=True)
    (folder / "notes.txt").write_text("keep")
    proc = ensure(sys.executable, folder)
    assert proc.returncode == 1 and f"{folder} is there and is not a virtual environment" in proc.stderr
    assert (folder / "notes.txt").read_text() == "keep"
    assert not (tmp_path / ".venv").exists()


def test_torch_index_reaches_pip_only_when_given():
    """PyPI's Linux torch is a CUDA build of several GB; `make train TORCH_INDEX=<the CPU index>` hands the index to
    pip (the pins then take its CPU build of the same version). Read from `make -n`: nothing is installed."""
    def install_line(*args: str) -> str:
        proc = subprocess.run(["make", "-n", "-B", ".venv/.installed", *args], cwd=REPO, capture_output=True,
                              text=True, timeout=60, check=True)
        return next(line for line in proc.stdout.splitlines() if "pip install -q -c constraints.txt" in line)

    url = "https://download.pytorch.org/whl/cpu"
    assert f"--extra-index-url {url}" in install_line(f"TORCH_INDEX={url}")
    assert "--extra-index-url" not in install_line()


def test_make_makes_its_venv_through_the_script():
    """The Makefile's recipe calls the script (a bare `python3 -m venv` would leave the half-made folder)."""
    makefile = (REPO / "Makefile").read_text()
    assert "@bash scripts/ensure_venv.sh $(PYTHON) $(VENV)" in makefile and "-m venv" not in makefile
    assert os.access(SCRIPT, os.X_OK)


def test_as_root_on_debian_the_venv_package_is_installed_with_apt_get(tmp_path):
    """As root on Debian/Ubuntu the script installs python3.X-venv itself (as Stockfish is installed), falling
    back to python3-venv where the versioned package is unknown, and then makes the venv. apt-get and `id` are
    stand-ins on PATH that log what they were asked; the python can make a venv with pip once a package is in."""
    installed = tmp_path / "installed"
    log = tmp_path / "apt.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in {
        "id": 'echo 0',
        # the versioned package is unknown to this archive; python3-venv is there
        "apt-get": f'echo "$*" >> {log}\ncase "$*" in *python{VERSION}-venv*) exit 100 ;; '
                   f'*"install -y -qq python3-venv"*) touch {installed} ;; esac',
    }.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    debian = fake_python(tmp_path, f"""if [ ! -e {installed} ]; then
  case "$*" in
    *"import ensurepip, venv"*) exit 1 ;;
    "-m venv "*) {sys.executable} -m venv --without-pip "$3"; exit 1 ;;
  esac
fi
exec {sys.executable} "$@\"""")
    venv = tmp_path / ".venv"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    proc = subprocess.run(["bash", str(SCRIPT), str(debian), str(venv)], capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"cannot make a virtual environment with pip: installing python{VERSION}-venv with apt-get" in proc.stderr
    assert log.read_text().splitlines() == ["update -qq", f"install -y -qq python{VERSION}-venv",
                                            "install -y -qq python3-venv"]
    assert has_pip(venv)


@pytest.mark.parametrize("codes,status", [({}, 0), ({"test": 1}, 1), ({"drills": 2}, 2), ({"test": 5}, 1),
                                          ({"drills": 5}, 1)])
def test_ci_runs_the_suite_and_then_the_drills_it_leaves_out_and_fails_where_either_fails(tmp_path, codes, status):
    """.ci/run: `make test`, then `make drills` whatever the first gave (every failure is seen in one run); pytest's
    5 (nothing collected) is a failure. `make` is a stand-in on PATH that logs its target and exits as asked."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    make = bin_dir / "make"
    make.write_text(f'#!/bin/bash\necho "$1 $ROOKWORLD_TEST_STRICT" >> {tmp_path / "make.log"}\n'
                    f'case "$1" in test) exit {codes.get("test", 0)};; drills) exit {codes.get("drills", 0)};; esac\n')
    make.chmod(0o755)
    proc = subprocess.run(["bash", str(REPO / ".ci" / "run")], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert proc.returncode == status, proc.stderr
    assert (tmp_path / "make.log").read_text().splitlines() == ["test 1", "drills 1"]
    assert ("collected no tests" in proc.stderr) == (5 in codes.values())
    pyproject = (REPO / "pyproject.toml").read_text()  # the drills are what `make test` leaves out
    assert "-m 'not gpu and not drill'" in pyproject and "-m drill" in (REPO / "Makefile").read_text()
