"""train.sh: environment variables become config flags, and every one of them is shown.

The script runs for real (bash, the installed `rookworld` entry point, `--dry-run`: config and
data are validated, no model is loaded), from a copy beside a `.venv` link to this interpreter's
environment, so the test needs no setup of the repository checkout.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rookworld_rlvr.config import FIELDS

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> Path:
    entry = Path(sys.prefix) / "bin" / "rookworld"
    if not os.access(entry, os.X_OK):
        pytest.fail(f"{entry} is missing: run the tests from the environment `make test` sets up (.venv)")
    root = tmp_path_factory.mktemp("checkout")
    shutil.copy(REPO / "train.sh", root / "train.sh")
    (root / ".venv").symlink_to(sys.prefix)
    (root / "data").symlink_to(REPO / "data")  # the presets' held-out sets (strength, puzzles) live there
    return root / "train.sh"


def run(script: Path, extra_env: dict, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()  # whatever this shell exports under a field's name must not leak in
           if not k.startswith("ROOKWORLD_") and k.lower() not in FIELDS and k != "CONFIG"}
    env.update(PYTHONPATH=str(REPO / "src"), TOKENIZERS_PARALLELISM="false", **extra_env)
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, env=env, timeout=120)


def banner(stderr: str) -> dict[str, str]:
    """field -> the banner line that lists it."""
    return {m.group(1): line for line in stderr.splitlines() if (m := re.match(r"  (\w+) +=", line))}


def test_every_value_from_the_environment_is_listed_and_reaches_the_run(script, tiny_model_dir, small_data):
    env = {"CONFIG": str(REPO / "configs" / "default.yaml"), "STEPS": "7", "KL_COEF": "0.02",
           "DATA": str(small_data / "train.jsonl"), "ROOKWORLD_EVAL_DATA": str(small_data / "eval.jsonl"),
           "ROOKWORLD_MODEL": str(tiny_model_dir), "MODEL": str(tiny_model_dir),  # both spellings, one value
           "ROOKWORLD_OUTPUT_DIR": "runs/from-env", "NOT_A_FIELD": "1"}
    done = run(script, env, "--dry-run")
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    lines = banner(done.stderr)
    assert "7 setting(s) from the environment" in done.stderr
    assert set(lines) == {"config", "steps", "kl_coef", "data", "eval_data", "model", "output_dir"}
    assert "(from STEPS)" in lines["steps"] and "(from KL_COEF)" in lines["kl_coef"]
    assert "(from ROOKWORLD_MODEL)" in lines["model"] and "(from ROOKWORLD_OUTPUT_DIR)" in lines["output_dir"]
    for field, var in (("config", "CONFIG"), ("steps", "STEPS"), ("data", "DATA")):  # ordinary words: flagged
        assert f"warning: {var} is an ordinary name" in lines[field] and f"ROOKWORLD_{var}" in lines[field]
    for field in ("kl_coef", "model", "eval_data", "output_dir"):  # specific or prefixed: not flagged
        assert "warning" not in lines[field], lines[field]
    command = next(line for line in done.stderr.splitlines() if line.startswith("+ rookworld train"))
    assert "--steps 7" in command and "--kl_coef 0.02" in command and "NOT_A_FIELD" not in command
    # the dry run saw the values: 7 steps, beta 0.02, the data and output directory from the environment
    assert "7 steps x" in done.stdout and "beta 0.02" in done.stdout, done.stdout
    assert str(small_data / "train.jsonl") in done.stdout and "runs/from-env/checkpoints" in done.stdout


@pytest.mark.slow
def test_a_clean_environment_says_so_and_conflicting_spellings_stop(script, tiny_model_dir, small_data):
    files = {"ROOKWORLD_CONFIG": str(REPO / "configs" / "default.yaml"), "ROOKWORLD_MODEL": str(tiny_model_dir),
             "ROOKWORLD_DATA": str(small_data / "train.jsonl"), "ROOKWORLD_EVAL_DATA": str(small_data / "eval.jsonl")}
    done = run(script, files, "--dry-run")
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr[-3000:]
    assert set(banner(done.stderr)) == {"config", "model", "data", "eval_data"}
    done = run(script, {}, "--help")
    assert done.returncode == 0 and "train.sh: no settings from the environment" in done.stderr
    done = run(script, {**files, "SEED": "1", "ROOKWORLD_SEED": "2"}, "--dry-run")
    assert done.returncode == 2 and "SEED='1' and ROOKWORLD_SEED='2' disagree" in done.stderr
    assert "+ rookworld" not in done.stderr  # stopped before running anything


def test_an_exported_empty_variable_is_an_error_naming_the_field(script):
    """`STEPS=` exported empty is a mistake, not "use the default": the run stops, naming the field."""
    done = run(script, {"STEPS": "", "CONFIG": str(REPO / "configs" / "default.yaml")}, "--dry-run")
    assert done.returncode != 0
    assert "config field 'steps' needs a value, got an empty one" in done.stderr, done.stderr[-1500:]


def test_a_prefixed_name_that_is_no_field_stops_the_run_naming_the_fields_it_may_mean(script):
    """ROOKWORLD_KL_COEFF (a typo) is meant for this run and would change nothing: the run does not start. The test
    suite's and the drill's own ROOKWORLD_TEST_* / ROOKWORLD_DRILL_* variables are not fields and pass."""
    config = {"ROOKWORLD_CONFIG": str(REPO / "configs" / "default.yaml")}
    done = run(script, {**config, "ROOKWORLD_KL_COEFF": "0.1"}, "--dry-run")
    assert done.returncode == 2 and "+ rookworld" not in done.stderr
    assert ("train.sh: ROOKWORLD_KL_COEFF: unknown config field 'kl_coeff'; did you mean one of 'kl_coef', "
            in done.stderr)
    done = run(script, {**config, "ROOKWORLD_TEST_STRICT": "1", "ROOKWORLD_DRILL_RUN": "x"}, "--help")
    assert done.returncode == 0 and "+ rookworld train" in done.stderr, done.stderr[-2000:]
