"""A checkpoint's state read back (`--resume`, a rollback to a checkpoint): whatever a damaged or hand-edited
trainer_state.json or sft_state.json holds, the run goes on or stops with one line naming the file and the
field, never with a TypeError from inside the optimizer's first step or a crash at the next save."""

import copy
import io
import json
import random
import shutil
from contextlib import redirect_stderr, redirect_stdout

import pytest

from conftest import as_options, held_out_fields
from rookworld_rlvr import cli

# values a hand-edited file may hold where a field is due
_VALUES = [None, True, False, 0, -1, 7, 2**40, 0.5, float("nan"), "", "text", [], [1, 2], {}, {"a": 1}, [[0.5]]]


def _places(value, at: tuple = ()):
    """Every place in a state's JSON tree (keys and indices), but inside the run's config only the config itself
    (a resume compares it and says what differs) and in a list only its first 3 items."""
    yield at
    if at[:1] == ("config",):
        return
    inside = value.items() if isinstance(value, dict) else enumerate(value[:3]) if isinstance(value, list) else ()
    for key, v in inside:
        yield from _places(v, at + (key,))


def _edit(rng: random.Random, tree: dict) -> tuple[dict, list[str]]:
    """`tree` with one or two places given another value or left out, and what was done."""
    tree, done = copy.deepcopy(tree), []
    for _ in range(rng.randint(1, 2)):
        places = list(_places(tree))[1:]
        top = rng.choice(list(tree))  # each top-level field as likely as another (the optimizer's are most places)
        at = rng.choice([p for p in places if p[0] == top])
        parent = tree
        for key in at[:-1]:
            parent = parent[key]
        value = rng.choice(_VALUES + ["left out"])
        if value == "left out":
            del parent[at[-1]]
        else:
            parent[at[-1]] = copy.deepcopy(value)
        done.append(f"{'.'.join(map(str, at))} = {value!r}")
    return tree, done


def _run(args: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        rc = cli.main(args)
    return rc, err.getvalue()


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory, tiny_model_dir, small_data, stockfish_path):
    """A GRPO run of 2 steps with a held-out evaluation at each (so its state holds evaluations, a best one,
    the anchor's cursors and every controller's), a checkpoint at each step."""
    root = tmp_path_factory.mktemp("grpo_state")
    fields = dict(model=str(tiny_model_dir), data=str(small_data / "train.jsonl"),
                  eval_data=str(small_data / "eval.jsonl"), eval_limit=4, output_dir=str(root / "run"), steps=2, batch_positions=2, group_size=2,
                  max_new_tokens=16, anchor_coef=1.0, anchor_batch=2, save_every=1, eval_every=1, keep_last=3,
                  tensorboard=False, progress=False, report=False, seed=1, engine_cache=None, device="cpu", threads=1,
                  **held_out_fields(small_data))
    args = ["train"] + as_options(fields)
    rc, err = _run(args)
    assert rc == 0, err
    return root / "run", args


def _edited_states_resume_or_are_named(tmp_path, source, state_file: str, args, prepare=lambda copy_: None) -> None:
    """40 seeded edits of the state in a copy of `source`, each resumed with `args(copy)`: it runs, or it stops
    with one line naming the state file and a field."""
    rng = random.Random(0)
    for _ in range(40):
        copy_ = tmp_path / "copy"
        shutil.rmtree(copy_, ignore_errors=True)
        shutil.copytree(source, copy_)
        prepare(copy_)
        state = copy_ / state_file
        tree, done = _edit(rng, json.loads(state.read_text()))
        state.write_text(json.dumps(tree))
        rc, err = _run(args(copy_))
        assert rc == 0 or err.strip().splitlines()[-1].startswith(f"error: {state}: field '"), (done, err[-2000:])


@pytest.mark.slow(seconds=15)
def test_any_field_of_a_grpo_checkpoints_state_edited_resumes_or_names_the_file_and_field(tmp_path, grpo_run):
    run, args = grpo_run
    _edited_states_resume_or_are_named(
        tmp_path, run, "checkpoints/step_000001/trainer_state.json",
        lambda copy_: args + ["--output-dir", str(copy_), "--resume", "true"],
        # --resume continues from step 1: step 2, its evaluation and its save run again
        prepare=lambda copy_: shutil.rmtree(copy_ / "checkpoints" / "step_000002"))


def test_a_damaged_grpo_state_names_the_file_the_field_and_what_it_must_be(tmp_path, grpo_run):
    run, args = grpo_run
    for edit, said in [
        (lambda s: s["optimizer"]["state"]["__items__"][1][1].update(exp_avg_sq=[]),
         "field 'optimizer.state.1.exp_avg_sq' must be a float32 tensor of shape"),
        (lambda s: s["optimizer"]["param_groups"][1].pop("eps"), "field 'optimizer.param_groups.1.eps' is missing"),
        (lambda s: s["optimizer"]["param_groups"][0].update(maximize=True),
         "field 'optimizer.param_groups.0.maximize' must be False (this code's AdamW), got True"),
        (lambda s: s["python_rng"]["__tuple__"][1].update(__tuple__=[1, 2]),
         "field 'python_rng' must be a state of Python's random module (ValueError: state vector is the wrong size)"),
        (lambda s: s["prompts"]["P"].update(cursor=-1), "field 'prompts.P.cursor' must be an integer >= 0, got -1"),
        (lambda s: s.update(best={"__tuple__": ["high", 1]}), "field 'best.0' must be a number, got 'high'"),
        (lambda s: s["history_eval"][0]["policy"].update(mean_reward="high"),
         "field 'history_eval.0.policy.mean_reward' must be a number or null, got 'high'"),
        (lambda s: s["monitor"].pop("kl"), "field 'monitor.kl' is missing"),
    ]:
        copy_ = tmp_path / "run"
        shutil.rmtree(copy_, ignore_errors=True)
        shutil.copytree(run, copy_)
        state = copy_ / "checkpoints" / "step_000002" / "trainer_state.json"
        tree = json.loads(state.read_text())
        edit(tree)
        state.write_text(json.dumps(tree))
        rc, err = _run(args + ["--output-dir", str(copy_), "--steps", "3", "--resume", "true"])
        last = err.strip().splitlines()[-1]
        assert rc == 1 and last.startswith(f"error: {state}: {said}") and "Traceback" not in err, (said, err[-2000:])
        assert last.endswith("(a damaged or edited checkpoint: move it aside, and --resume continues from the one "
                             "before, if any)")


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory, small_data):
    root = tmp_path_factory.mktemp("sft_state")
    args = ["sft", "--data", str(small_data / "train.jsonl"), "--eval-data", "", "--preset", "tiny",
            "--batch-size", "4", "--save-every", "1", "--quiet"]
    rc, err = _run(args + ["--steps", "2", "--out", str(root / "model")])
    assert rc == 0, err
    return root, args


@pytest.mark.slow(seconds=10)
def test_any_field_of_an_sft_checkpoints_state_edited_resumes_or_names_the_file_and_field(tmp_path, sft_run):
    root, args = sft_run
    _edited_states_resume_or_are_named(tmp_path, root, "model.checkpoint/sft_state.json",
                                       lambda copy_: args + ["--steps", "3", "--out", str(copy_ / "model"), "--resume"])
