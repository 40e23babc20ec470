"""Nothing lost: kills injected at the exact points where a save or a rollback used to lose state,
a torn log line, and the best evaluated state kept beside the final one. Real tiny GPT-2s, real
files; monkeypatch only injects the faults."""

from __future__ import annotations

import errno
import functools
import json
import os
import signal
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import as_options
from rookworld_rlvr import atomic
from rookworld_rlvr.config import load_config
from rookworld_rlvr.data.io import DataError, read_log, read_samples
from rookworld_rlvr.grpo import checkpoint as ckpt
from rookworld_rlvr.grpo import state
from rookworld_rlvr.grpo.trainer import Trainer
from rookworld_rlvr.sft import SFTConfig, train as sft_train
from rookworld_rlvr.statefile import state_exists


# a fresh model's `tiny` preset at a small shape here (conftest: small_tiny_preset)
pytestmark = pytest.mark.usefixtures("small_tiny_preset")


class Killed(BaseException):
    """A kill: not an Exception, so nothing on the way catches it."""


class _Result:
    def __init__(self, total):
        self.total, self.components, self.valid_format = total, {"chars": total}, True


def varied_reward(prompts, completions, truths, weights):
    return [_Result(sum(c.isdigit() for c in text) / max(len(text), 1)) for text in completions]


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def trainer(tmp_path, tiny_model_dir, small_data, eval_fn=None, **over) -> Trainer:
    fields = dict(model=str(tiny_model_dir), data=str(small_data / "train.jsonl"), eval_data="",
                  output_dir=str(tmp_path / "run"), steps=4, batch_positions=2, group_size=4, max_new_tokens=16,
                  lr=1e-3, warmup_steps=0, save_every=1, keep_last=10, tensorboard=False, progress=False, report=False,
                  seed=1, engine_cache=None, device="cpu", threads=1)
    fields.update(over)
    cfg = load_config(None, fields)
    return Trainer(cfg, varied_reward, read_samples(cfg.data), eval_fn, log=lambda *_: None)


def weights(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


# -- 1. an SFT checkpoint is weights and state together, or the one before it ------------------------------


def _sft(tmp_path, small_data, **over) -> SFTConfig:
    fields = dict(data=str(small_data / "train.jsonl"), eval_data="", out=str(tmp_path / "m"), steps=2,
                  batch_size=4, eval_every=100, eval_samples=0, save_every=1, device="cpu", threads=1)
    fields.update(over)
    return SFTConfig(**fields)


def test_an_sft_save_killed_after_the_weights_keeps_the_checkpoint_before_it(tmp_path, small_data, monkeypatch):
    """Killed while writing the state of step 3 (the weights already written): the checkpoint of
    step 2 is whole, and --resume continues from step 2, not from step 0."""
    import rookworld_rlvr.statefile as statefile

    sft_train(_sft(tmp_path, small_data), progress=False)
    ckpt_dir = tmp_path / "m.checkpoint"
    assert statefile.load_state(ckpt_dir, "sft_state")["step"] == 2
    real = statefile.save_state

    def dies(directory, name, st, **kw):
        if st["step"] == 3:
            raise Killed
        return real(directory, name, st, **kw)

    monkeypatch.setattr(statefile, "save_state", dies)
    with pytest.raises(Killed):
        sft_train(_sft(tmp_path, small_data, steps=4), resume=True, progress=False)
    monkeypatch.setattr(statefile, "save_state", real)
    assert state_exists(ckpt_dir, "sft_state") and statefile.load_state(ckpt_dir, "sft_state")["step"] == 2
    assert not list(tmp_path.glob(".m.checkpoint.*"))  # nothing half-written left beside it
    sft_train(_sft(tmp_path, small_data, steps=4), resume=True, progress=False)
    steps = [r["step"] for r in read_log(tmp_path / "m.sft_log.jsonl")]
    assert steps == [1, 2, 3, 4]  # resumed at 2: no step lost, none twice


def test_weights_without_state_are_an_error_never_a_fresh_start(tmp_path, small_data, capsys):
    sft_train(_sft(tmp_path, small_data), progress=False)
    ckpt_dir = tmp_path / "m.checkpoint"
    for f in ckpt_dir.glob("sft_state*"):
        f.unlink()
    with pytest.raises(ValueError, match=r"m\.checkpoint: model weights without sft_state"):
        sft_train(_sft(tmp_path, small_data, steps=4), resume=True, progress=False)
    assert (ckpt_dir / "model.safetensors").exists()  # nothing overwritten
    sft_train(_sft(tmp_path / "fresh", small_data), resume=True, progress=False)
    assert "no checkpoint at" in capsys.readouterr().out  # --resume without any checkpoint says so


def test_an_sft_run_killed_before_its_first_checkpoint_logs_each_step_once_when_resumed(tmp_path, small_data,
                                                                                         monkeypatch):
    """Found by scripts/fault_drill.py: a kill before the first save left steps 1-2 in the log, and
    the resumed run (no checkpoint: it starts over) appended them again."""
    import rookworld_rlvr.statefile as statefile

    def dies(*a, **kw):
        raise Killed

    monkeypatch.setattr(statefile, "save_state", dies)
    with pytest.raises(Killed):
        sft_train(_sft(tmp_path, small_data, steps=3, save_every=2), progress=False)
    monkeypatch.undo()
    assert [r["step"] for r in read_log(tmp_path / "m.sft_log.jsonl")] == [1, 2]
    assert not (tmp_path / "m.checkpoint").exists()
    sft_train(_sft(tmp_path, small_data, steps=3, save_every=2), resume=True, progress=False)
    assert [r["step"] for r in read_log(tmp_path / "m.sft_log.jsonl")] == [1, 2, 3]


def test_an_sft_run_out_of_device_memory_is_one_line_and_resume_goes_on(tmp_path, small_data, monkeypatch, capsys):
    """`rookworld sft` out of device memory at step 2 (torch's OutOfMemoryError, injected as CUDA raises it): one
    line naming the batch size and the checkpoint of step 1, not a traceback; --resume then ends the run."""
    import rookworld_rlvr.sft as sft
    from rookworld_rlvr.cli import main

    out = tmp_path / "m"
    args = ["sft", "--data", str(small_data / "train.jsonl"), "--eval-data", "", "--out", str(out), "--steps", "3",
            "--batch-size", "4", "--save-every", "1", "--device", "cpu", "--threads", "1", "--quiet"]
    real, calls = sft._accumulate, []

    def short_of_memory(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity "
                                         "of 15.70 GiB of which 0.9 GiB is free. Including non-PyTorch memory, ...")
        return real(*a, **k)

    monkeypatch.setattr(sft, "_accumulate", short_of_memory)
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines() == [
        "error: out of memory (CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 15.70 GiB "
        "of which 0.9 GiB is free): a smaller --batch-size needs less (rows a step, over all processes: now 4; fewer "
        "rows a step also change what each step learns); the same command with --resume continues from "
        f"{out}.checkpoint"]
    monkeypatch.setattr(sft, "_accumulate", real)
    assert main(args + ["--resume"]) == 0
    assert [r["step"] for r in read_log(tmp_path / "m.sft_log.jsonl")] == [1, 2, 3]


def test_a_fresh_sft_run_sets_an_older_one_aside_and_never_appends_to_its_log(tmp_path, small_data, capsys):
    sft_train(_sft(tmp_path, small_data), progress=False)
    sft_train(_sft(tmp_path, small_data, steps=1), progress=False)
    assert [r["step"] for r in read_log(tmp_path / "m.sft_log.jsonl")] == [1]
    old_logs = list(tmp_path.glob("m.sft_log-*.jsonl"))
    assert len(old_logs) == 1 and [r["step"] for r in read_log(old_logs[0])] == [1, 2]
    (old_ckpt,) = tmp_path.glob("m.checkpoint-*")
    assert state_exists(old_ckpt, "sft_state") and len(list(tmp_path.glob("m-*"))) == 1  # nothing deleted
    assert "moved the previous run's" in capsys.readouterr().out


def test_a_grpo_run_killed_before_its_first_checkpoint_evaluates_the_base_once_when_resumed(
        tmp_path, tiny_model_dir, small_data, monkeypatch):
    """Found by scripts/fault_drill.py: a kill after the base evaluation and before the step-0
    checkpoint left eval.jsonl with a step-0 record, and the resumed run wrote a second one."""
    def evaluate(model, tokenizer):
        return {"policy": {"n": 1, "mean_reward": 0.5}}

    def dies(tr):
        raise Killed

    real = state.save
    monkeypatch.setattr(state, "save", dies)
    with pytest.raises(Killed):
        trainer(tmp_path, tiny_model_dir, small_data, evaluate, steps=1).train()
    monkeypatch.setattr(state, "save", real)
    assert [r["step"] for r in read_log(tmp_path / "run" / "eval.jsonl")] == [0]
    trainer(tmp_path, tiny_model_dir, small_data, evaluate, steps=1, resume=True).train()
    assert [r["step"] for r in read_log(tmp_path / "run" / "eval.jsonl")] == [0, 1]


def test_a_kill_between_the_two_renames_of_a_save_loses_neither(tmp_path, small_data):
    """A save moves the old checkpoint aside, then renames the new one into place. Killed in between
    (SIGKILL: no handler runs), the old one is whole beside the name, and the next resume puts it back."""
    import tempfile

    sft_train(_sft(tmp_path, small_data), progress=False)
    aside = Path(tempfile.mkdtemp(prefix=".m.checkpoint.old-", dir=tmp_path))
    os.replace(tmp_path / "m.checkpoint", aside / "m.checkpoint")  # what the kill leaves
    sft_train(_sft(tmp_path, small_data, steps=3), resume=True, progress=False)
    assert [r["step"] for r in read_log(tmp_path / "m.sft_log.jsonl")] == [1, 2, 3]
    assert not list(tmp_path.glob(".m.checkpoint.*"))


# -- 2, 3. a GRPO rollback leaves no newer checkpoint; saving a step again never loses it -----------------------


def test_a_rollback_removes_the_abandoned_checkpoints(tmp_path, tiny_model_dir, small_data):
    tr = trainer(tmp_path, tiny_model_dir, small_data)
    tr.train()
    assert [s for s, _ in ckpt.list_checkpoints(tr.run_dir)] == [0, 1, 2, 3, 4]
    state.rollback(tr, "drill", to_step=2)
    assert [s for s, _ in ckpt.list_checkpoints(tr.run_dir)] == [0, 1, 2]
    assert ckpt.latest_checkpoint(tr.run_dir).name == "step_000002" and tr.step == 2
    assert [r["step"] for r in read_log(tr.run_dir / "metrics.jsonl")] == [1, 2]
    resumed = trainer(tmp_path, tiny_model_dir, small_data, resume=True)
    assert resumed.step == 2  # continues from the rollback target, not from the collapsed step 4


def test_saving_a_step_again_killed_mid_swap_keeps_the_old_copy(tmp_path, tiny_model_dir, small_data, monkeypatch):
    tr = trainer(tmp_path, tiny_model_dir, small_data, steps=1)
    tr.train()
    path = ckpt.checkpoint_dir(tr.run_dir, 1)
    before = ckpt.load_state(path)
    real = os.replace

    def replace(src, dst):
        if Path(dst) == path and ".tmp-" in Path(src).name:
            raise Killed  # the new copy never arrives
        return real(src, dst)

    monkeypatch.setattr(atomic.os, "replace", replace)
    with pytest.raises(Killed):
        state.save(tr)
    monkeypatch.setattr(atomic.os, "replace", real)
    assert ckpt.latest_checkpoint(tr.run_dir) == path  # put back from aside
    assert ckpt.load_state(path)["step"] == before["step"] == 1
    import tempfile  # a SIGKILL between the two renames runs no handler: the old copy waits aside

    aside = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
    os.replace(path, aside / path.name)
    assert ckpt.latest_checkpoint(tr.run_dir) == path and ckpt.load_state(path)["step"] == 1
    assert not list(path.parent.glob(".step_*"))


def _dies_while_deleting(monkeypatch):
    """shutil.rmtree that deletes one file of the directory, then is killed."""
    real = atomic.shutil.rmtree

    def rmtree(path, ignore_errors=False):
        for f in sorted(Path(path).rglob("model.safetensors")):
            f.unlink()
            raise Killed
        return real(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(atomic.shutil, "rmtree", rmtree)


@pytest.mark.parametrize("deletion", ["prune", "rollback"])
def test_a_kill_while_checkpoints_are_deleted_leaves_none_half_deleted_under_its_name(
        tmp_path, tiny_model_dir, small_data, monkeypatch, deletion):
    """Found by reading prune and drop_after for the fault drill: they deleted `step_N` in place, so a
    kill midway left a directory with its state and without its weights, which a rollback or
    --resume would take for a checkpoint."""
    from transformers import AutoModelForCausalLM

    tr = trainer(tmp_path, tiny_model_dir, small_data, steps=4)
    tr.train()
    _dies_while_deleting(monkeypatch)
    with pytest.raises(Killed):
        ckpt.prune(tr.run_dir, keep_last=1) if deletion == "prune" else state.rollback(tr, "drill", to_step=1)
    monkeypatch.undo()
    kept = [s for s, _ in ckpt.list_checkpoints(tr.run_dir)]
    assert kept == ([4] if deletion == "prune" else [0, 1])  # all renamed out of sight before any deletion
    for _, path in ckpt.list_checkpoints(tr.run_dir):
        ckpt.load_state(path)
        AutoModelForCausalLM.from_pretrained(path)
    if deletion == "rollback":
        assert ckpt.latest_checkpoint(tr.run_dir).name == "step_000001"
    ckpt.prune(tr.run_dir, keep_last=1)  # the next prune deletes what the kill left
    assert not list((tr.run_dir / "checkpoints").glob(".*"))


def test_a_run_resumed_at_its_end_deletes_what_killed_saves_and_deletions_left(tmp_path, tiny_model_dir, small_data):
    """Found by the ddp drill at lr 1e-3: a kill while a prune deleted step 8 left `.step_000008.del-*`; the
    run resumed from step 12, its last, saved no checkpoint, so no prune came to delete it and a finished
    run kept a checkpoint-sized leftover. A resume deletes them first."""
    import tempfile

    tr = trainer(tmp_path, tiny_model_dir, small_data, steps=2)
    tr.train()
    root = tr.run_dir / "checkpoints"
    left = [Path(tempfile.mkdtemp(prefix=".step_000001.del-", dir=root)),
            Path(tempfile.mkdtemp(prefix=".step_000003.tmp-", dir=root)),
            Path(tempfile.mkdtemp(prefix=".best.del-", dir=tr.run_dir))]
    for p in left:
        (p / "model.safetensors").write_bytes(b"what a killed deletion left")
    resumed = trainer(tmp_path, tiny_model_dir, small_data, steps=2, resume=True)
    assert resumed.step == 2
    resumed.train()
    assert not any(p.exists() for p in left)
    assert [s for s, _ in ckpt.list_checkpoints(tr.run_dir)] == [0, 1, 2]


def test_a_copy_left_aside_after_its_successor_arrived_is_deleted_never_put_back(tmp_path, small_data):
    """A kill while the old copy was being deleted (after the new one was in place) leaves a stale,
    partial copy beside it; a later kill between the two renames must not restore that one."""
    import tempfile

    sft_train(_sft(tmp_path, small_data), progress=False)
    stale = Path(tempfile.mkdtemp(prefix=".m.checkpoint.old-", dir=tmp_path)) / "m.checkpoint"
    stale.mkdir()
    (stale / "sft_state.json").write_text("{}")  # what a half-done rmtree left
    sft_train(_sft(tmp_path, small_data, steps=3), resume=True, progress=False)
    assert not list(tmp_path.glob(".m.checkpoint.*"))
    assert [r["step"] for r in read_log(tmp_path / "m.sft_log.jsonl")] == [1, 2, 3]


# -- 4. a torn last log line ----------------------------------------------------------------------------------


def test_a_torn_last_log_line_is_dropped_with_a_warning_and_a_bad_middle_line_is_named(tmp_path, tiny_model_dir,
                                                                                       small_data, capsys):
    tr = trainer(tmp_path, tiny_model_dir, small_data, steps=2)
    tr.train()
    log = tr.run_dir / "metrics.jsonl"
    with open(log, "a") as fh:
        fh.write('{"step": 3, "reward/me')  # killed mid-write
    resumed = trainer(tmp_path, tiny_model_dir, small_data, steps=3, resume=True)
    resumed.train()
    err = capsys.readouterr().err
    assert f"{log}:3: ignoring a torn last line" in err
    assert [r["step"] for r in read_log(log)] == [1, 2, 3]
    log.write_text('{"step": 1}\n{"step": 2, "re\n{"step": 3}\n')
    with pytest.raises(DataError, match=rf"{log}:2: not a JSON record"):
        read_log(log)


# -- 10. a run never ends worse than its best --------------------------------------------------------------------


def test_the_best_evaluated_state_is_written_beside_the_final_one(tmp_path, tiny_model_dir, small_data):
    """Evaluations that only fall after step 2 (within the guard's tolerance): best/ holds step 2's
    weights, final/ the last ones, and the summary says which is better and by how much."""
    from transformers import AutoModelForCausalLM

    scores = iter([0.50, 0.52, 0.55, 0.54, 0.53])  # base, steps 1-4 (eval_every 1)

    def eval_fn(model, tokenizer):
        s = next(scores)
        return {"policy": {"n": 1, "mean_reward": s}, "environment": {"n": 0}}

    kept = {}
    tr = trainer(tmp_path, tiny_model_dir, small_data, eval_fn=eval_fn, eval_every=1, eval_data="x",
                 guard_eval_drop=0.05)
    real_save = state.save

    def save(t):
        real_save(t)
        kept[t.step] = weights(t.policy)

    state_save = state.save
    try:
        state.save = save
        summary = tr.train()
    finally:
        state.save = state_save
    best = summary["best"]
    assert best["step"] == 2 and best["better"] == "best" and best["final_minus_best"] == pytest.approx(-0.02)
    on_disk = json.loads((tr.run_dir / "summary.json").read_text())["best"]
    assert on_disk == best
    loaded = AutoModelForCausalLM.from_pretrained(tr.run_dir / "best")
    assert all(torch.equal(a, b) for a, b in zip(weights(loaded), kept[2], strict=True))
    final = AutoModelForCausalLM.from_pretrained(tr.run_dir / "final")
    assert all(torch.equal(a, b) for a, b in zip(weights(final), kept[4], strict=True))
    assert not any(p.name.startswith("trainer_state") for p in (tr.run_dir / "best").iterdir())


# -- 7. a bad config value: a clear error naming the field (or the file and line), never a silent change ------


@pytest.mark.parametrize("text,message", [
    ("steps: 1.5\n", "bad.yaml:1: config field 'steps' needs an integer, got 1.5"),
    ("threads: four\n", "bad.yaml:1: config field 'threads' needs an integer, got 'four'"),
    ('policy_weights: "x"\n', "bad.yaml:1: config field 'policy_weights' needs a mapping, got 'x'"),
    ("task_sampling: {P: 5}\n", "bad.yaml:1: config field 'task_sampling': P needs a mapping of sampling settings"),
    # a phase's or a task's own sampling settings follow the rules of the fields of their names
    ("steps: 3\nphases: [{start: 2, temperature: hot}]\n",
     "bad.yaml:2: config field 'phases': entry 0 temperature must be a number > 0, got 'hot'"),
    ("task_sampling: {A: {top_p: -3}}\n",
     "bad.yaml:1: config field 'task_sampling': A top_p must be a number in (0, 1]"),
    ("phases: [{start: 0}, {start: 9, task_sampling: {P: {tempreature: 1}}}]\n",
     "bad.yaml:1: config field 'phases': entry 1 task_sampling P has unknown keys ['tempreature']"),
    ("phases: [{start: 0, mix_env_ratio: 5}]\n", "bad.yaml:1: config field 'phases': entry 0 mix_env_ratio must be a "
     "number in [0, 1], got 5"),
    ("phases: [warmup]\n", "bad.yaml:1: config field 'phases': entry 0 needs a mapping with an integer 'start'"),
    # two phases from one step: the later won over the whole of the earlier, which did nothing; a start before step 0
    ("phases: [{start: 3, temperature: 1}, {start: 3, temperature: 2}]\n", "bad.yaml:1: config field 'phases' must "
     "start at steps >= 0, in order, no two at one step (there the later would leave the earlier nothing to do)"),
    ("phases: [{start: -1, temperature: 1}]\n", "bad.yaml:1: config field 'phases' must start at steps >= 0"),
    ("phases: [{start: 5, top_k: 1}, {start: 2, top_k: 3}]\n", "bad.yaml:1: config field 'phases' must start at "
     "steps >= 0, in order"),
    ("curriculum: {P: 7}\n", "bad.yaml:1: config field 'curriculum': P needs a list of [step, {component: weight}] pairs"),
    ("kl_coef: yes\n", "bad.yaml:1: config field 'kl_coef' needs a number, got True"),
    ("steps: [1\nlr: 2\n", "bad.yaml:2:3: not valid YAML"),
    # a key set twice: PyYAML kept the last without a word, so an edit of the first did nothing
    ("lr: 1e-5\nsteps: 3\nlr: 3e-5\n", "bad.yaml:3:1: not valid YAML: 'lr' is set twice (first on line 1)"),
    ("phases:\n  - {start: 0, temperature: 1.0, temperature: 0.5}\n",
     "bad.yaml:2:34: not valid YAML: 'temperature' is set twice (first on line 2)"),
    ("# a preset\nsteps: 3\n\nkl_coef: -1\n", "bad.yaml:4: config field 'kl_coef' must be >= 0 (got -1.0)"),
    ("steps: 3\npolicy_weights:\n  format: -1\n", "bad.yaml:2: reward.policy_weights: weights must be finite"),
    ("env_weights: {next_state: x}\n", "bad.yaml:1: reward.env_weights: weights must be finite numbers >= 0"),
    # a key inside a field's value that the error names: its own line, not its field's
    ("steps: 3\ntask_sampling:\n  A: {temperature: 0.9}\n  P:\n    max_new_tokenz: 30\n",
     "bad.yaml:5: config field 'task_sampling': P has unknown keys ['max_new_tokenz']"),
    ("phases:\n  - start: 0\n  - start: 9\n    task_sampling:\n      P: {tempreature: 1}\n",
     "bad.yaml:5: config field 'phases': entry 1 task_sampling P has unknown keys ['tempreature']"),
])
def test_a_bad_config_file_names_the_field_or_the_line(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as e:
        load_config(str(path))
    assert message in str(e.value)


def test_a_directory_given_as_a_config_or_search_space_is_one_error_line(tmp_path, capsys):
    """`--config configs` (the folder, not a preset in it) ended in IsADirectoryError's traceback; `sweep --space`
    alike. Now one line naming it, for `train` and `sweep`."""
    from rookworld_rlvr.cli import main

    with pytest.raises(ValueError, match=f"^config file {tmp_path}: a directory, not a YAML file$"):
        load_config(str(tmp_path))
    assert main(["train", "--config", str(tmp_path), "--dry-run"]) == 1
    assert capsys.readouterr().err.strip().endswith(f"error: config file {tmp_path}: a directory, not a YAML file")
    assert main(["sweep", "--space", str(tmp_path), "--dry-run"]) == 1
    assert capsys.readouterr().err.strip().endswith(f"error: search space {tmp_path}: a directory, not a YAML file")


def test_a_key_set_twice_in_a_search_space_or_an_option_value_is_named_and_a_merge_may_override(tmp_path, capsys):
    """A sweep's search space holding a parameter twice (the first was searched never), and a mapping given on the
    command line holding a setting twice, are one line naming them; a key written beside a YAML merge (`<<: *base`)
    overrides the merged one, as YAML means."""
    from rookworld_rlvr.cli import main
    from rookworld_rlvr.config import coerce
    from rookworld_rlvr.yaml_text import load_file

    space = tmp_path / "space.yaml"
    space.write_text("params:\n  lr: {choices: [1e-5]}\n  kl_coef: {choices: [0.0]}\n  lr: {choices: [2e-5]}\n")
    assert main(["sweep", "--space", str(space), "--dry-run"]) == 1
    assert capsys.readouterr().err.strip().endswith(f"error: {space}:4:3: not valid YAML: 'lr' is set twice (first on "
                                                    "line 2)")
    with pytest.raises(ValueError, match=r"'task_sampling': cannot read .*'temperature' is set twice"):
        coerce("task_sampling", "{P: {temperature: 1, temperature: 2}}")
    merged = tmp_path / "merge.yaml"
    merged.write_text("base: &b {lr: 1.0e-5, steps: 3}\nrun:\n  <<: *b\n  lr: 2.0e-5\n")
    assert load_file(merged)["run"] == {"lr": 2e-5, "steps": 3}


def test_a_bad_value_given_on_the_command_line_is_not_blamed_on_the_file(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("steps: 3\nkl_coef: 0.1\n")
    with pytest.raises(ValueError) as e:
        load_config(str(path), {"kl_coef": "-1"})
    assert str(e.value) == "config field 'kl_coef' must be >= 0 (got -1.0)"
    with pytest.raises(ValueError) as e:
        load_config(str(path), {"lr": "-1"})  # a field the file does not set
    assert str(e.value) == "config field 'lr' must be > 0 (got -1.0)"


def test_numbers_read_the_same_from_a_file_and_the_command_line_and_an_empty_override_is_refused(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("lr: 1e-5\nsteps: 2.0\nkl_coef: 0\n")  # YAML 1.1 reads 1e-5 as text
    cfg = load_config(str(path))
    assert (cfg.lr, cfg.steps, cfg.kl_coef) == (1e-5, 2, 0.0) and type(cfg.steps) is int
    assert load_config(None, {"lr": "1e-5"}).lr == cfg.lr
    with pytest.raises(ValueError, match="config field 'steps' needs a value, got an empty one"):
        load_config(None, {"steps": ""})
    assert load_config(None, {"eval_data": ""}).eval_data == ""  # an empty path is a choice: no evaluation
    from rookworld_rlvr.cli import main

    assert main(["train", "--steps", "", "--dry-run"]) == 1


# -- 9. a missing Stockfish stops sft before it trains; another engine version is cached apart ---------------


def test_sft_without_stockfish_fails_before_the_first_step(tmp_path, small_data, monkeypatch):
    monkeypatch.setenv("STOCKFISH_PATH", str(tmp_path / "no-stockfish"))
    from rookworld_rlvr.engine import StockfishNotFound

    with pytest.raises(StockfishNotFound, match="no-stockfish"):
        sft_train(_sft(tmp_path, small_data, eval_data=str(small_data / "eval.jsonl"), eval_samples=2),
                  progress=False)
    assert not (tmp_path / "m.checkpoint").exists() and not (tmp_path / "m.sft_log.jsonl").exists()


def test_the_engine_cache_key_names_the_engine(tmp_path, stockfish_path):
    """Two engines that answer `uci` with different names never share cached analyses; one that answers
    without its name is known by its file."""
    from rookworld_rlvr.engine import EngineConfig, StockfishPool

    from rookworld_rlvr.engine import engine_identity

    fake = tmp_path / "fakefish"
    fake.write_text("#!/bin/sh\necho 'id name Fakefish 0.1'\necho uciok\n")
    fake.chmod(0o755)
    assert engine_identity(str(fake)) == "Fakefish 0.1"
    nameless = tmp_path / "nameless"
    nameless.write_text("#!/bin/sh\necho uciok\ncat >/dev/null\n")
    nameless.chmod(0o755)
    assert engine_identity(str(nameless)).startswith(f"unnamed engine {nameless} (")
    cache = str(tmp_path / "engine.sqlite")
    with StockfishPool(EngineConfig(path=stockfish_path, depth=4, workers=1, cache_path=cache)) as pool:
        assert pool.identity.startswith("Stockfish")
        pool.analyse("6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1")
        key = pool._limits_key
    assert pool.identity in key
    import sqlite3

    keys = [k for (k,) in sqlite3.connect(cache).execute("SELECT key FROM cache")]
    assert keys and all(pool.identity in k for k in keys)


# -- 8. a data row that is valid JSON but wrong chess, and files that are not what they say ----------------------


def _rows():
    import gzip

    from conftest import REPO

    rows = [json.loads(x) for x in gzip.open(REPO / "data" / "eval.jsonl.gz", "rt")]
    return next(r for r in rows if r["task"] == "P"), next(r for r in rows if r["task"] == "A")


def _bad(tmp_path, row) -> str:
    import copy

    good, _ = _rows()
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(copy.deepcopy(row)) + "\n")
    with pytest.raises(DataError) as e:
        read_samples(path)
    return str(e.value)


def test_a_jsonl_row_is_checked_like_a_text_row_and_the_error_names_file_line_and_field(tmp_path):
    import copy

    pol, env = _rows()
    row = copy.deepcopy(env)
    row["truth"]["terminated"] = "false"  # a string is not a boolean ("false" would read as True)
    assert _bad(tmp_path, row) == f"{tmp_path / 'bad.jsonl'}:2: field 'truth.terminated' must be true or false, got 'false'"
    row = copy.deepcopy(env)
    row.pop("prompt")
    row["truth"]["move"] = "a1a1"
    row["truth"]["history"] = " ".join(row["truth"]["history"].split()[:-1] + ["a1a1"])
    assert "field 'truth.truncated' is False but a1a1 is not legal in the position" in _bad(tmp_path, row)
    row = copy.deepcopy(pol)
    row["truth"]["evals"][0] = float("inf")
    assert "bad.jsonl:2: field 'truth.evals' must be finite numbers" in _bad(tmp_path, row)
    row = copy.deepcopy(pol)
    row.pop("prompt")
    row["truth"]["moves"][0] = "a1a1"
    row["truth"]["best"] = [row["truth"]["moves"][1]]
    assert "field 'truth.moves' holds moves that are not legal in the position: ['a1a1']" in _bad(tmp_path, row)
    row = copy.deepcopy(pol)
    row.pop("prompt")
    row["truth"]["fen"] = "not a fen"
    assert "bad.jsonl:2: field 'truth.fen' is not a position" in _bad(tmp_path, row)


# any JSON value: what a hand-edited file or another tool's output may hold where a field is due
_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                 max_size=3), max_leaves=6)


def _places(value, at: tuple = ()):
    """Every place in a JSON value (the path of keys and indices to it), the value itself first."""
    yield at
    inside = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, v in inside:
        yield from _places(v, at + (key,))


@functools.lru_cache(maxsize=1)
def _data_files() -> list[tuple[str, object, str, list[str]]]:
    """(name, reader, file suffix, lines) of each kind of data file a user hands a command: samples (P: and A:
    rows), judged positions, puzzles, and a game record (its header line, then one game)."""
    import gzip
    import lzma

    from conftest import REPO
    from rookworld_rlvr.data.judged import read_judged, read_puzzles
    from rookworld_rlvr.data.records import read_records

    pol, env = _rows()
    judged = gzip.open(REPO / "data" / "strength.jsonl.gz", "rt").readline()
    puzzles = [json.loads(x) for x in gzip.open(REPO / "data" / "puzzles_eval.jsonl.gz", "rt")]
    with lzma.open(REPO / "data" / "more_games_3.jsonl.xz", "rt") as fh:
        header, game = json.loads(fh.readline()), fh.readline()
    header["config"]["games"] = 1
    kinds = {p["kind"]: p for p in puzzles}
    return [("samples", read_samples, ".jsonl", [json.dumps(row)]) for row in (pol, env)] + \
        [("judged", read_judged, ".jsonl", [judged])] + \
        [("puzzles", read_puzzles, ".jsonl", [json.dumps(kinds[k])]) for k in sorted(kinds)] + \
        [("record", read_records, ".jsonl.xz", [json.dumps(header), game])]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_field_of_a_data_row_given_any_json_value_or_left_out_reads_or_names_file_and_line(tmp_path, data):
    """A row of valid JSON whose field holds another type (a number where a FEN is due, a list where a move is,
    an object where evals are) or lacks a field is either read or refused with a DataError naming the file and
    the line: never an AttributeError or TypeError from deep in the reader."""
    import copy
    import lzma

    files = _data_files()
    name, reader, suffix, lines = files[data.draw(st.integers(0, len(files) - 1), label="file")]
    row = json.loads(lines[-1])
    for _ in range(data.draw(st.integers(1, 2), label="edits")):
        places = list(_places(row))[1:]
        at = places[data.draw(st.integers(0, len(places) - 1), label="place")]
        parent = row
        for key in at[:-1]:
            parent = parent[key]
        if data.draw(st.booleans(), label="leave out"):
            del parent[at[-1]]
        else:
            parent[at[-1]] = copy.deepcopy(data.draw(_JSON, label="value"))
    path = tmp_path / f"{name}{suffix}"
    text = "".join(x.rstrip("\n") + "\n" for x in lines[:-1] + [json.dumps(row)])
    if suffix.endswith(".xz"):
        with lzma.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    try:
        reader(path)
    except DataError as e:
        assert str(e).startswith(f"{path}:{len(lines)}: "), str(e)


def test_a_file_that_is_not_what_it_says_is_named(tmp_path):
    from conftest import REPO

    nested = tmp_path / "nested.jsonl"
    nested.write_text("[" * 100000 + "\n")
    with pytest.raises(DataError, match=rf"{nested}:1: JSON nested too deeply"):
        read_samples(nested)
    fake = tmp_path / "fake.jsonl.gz"
    fake.write_text('{"task": "P"}\n')
    with pytest.raises(DataError, match=rf"{fake}: cannot be read after line 0 \(BadGzipFile"):
        read_samples(fake)
    cut = tmp_path / "cut.jsonl.gz"
    data = (REPO / "data" / "eval.jsonl.gz").read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=rf"{cut}: cannot be read after line \d+ \(EOFError.*truncated or corrupt"):
        read_samples(cut)
    fake_xz, cut_xz = tmp_path / "fake.jsonl.xz", tmp_path / "cut.jsonl.xz"
    fake_xz.write_text('{"task": "P"}\n')
    with pytest.raises(DataError, match=rf"{fake_xz}: cannot be read after line 0 \(LZMAError"):
        read_samples(fake_xz)
    data = (REPO / "data" / "train.jsonl.xz").read_bytes()
    cut_xz.write_bytes(data[: len(data) // 50])
    with pytest.raises(DataError, match=rf"{cut_xz}: cannot be read after line \d+ \(EOFError.*truncated or corrupt"):
        read_samples(cut_xz)
    with pytest.raises(DataError, match=rf"{tmp_path}: is a directory, not a data file"):
        read_samples(tmp_path)


# -- 5. a match never hangs, closes what it opened and keeps every finished game ---------------------------------

_FAKE_ENGINE = """#!{python}
# A UCI engine that plays legal moves for its first {moves} searches, then never answers again.
import sys, chess
board, searches = chess.Board(), 0
for line in sys.stdin:
    cmd = line.split()
    if not cmd:
        continue
    if cmd[0] == "uci":
        print("id name Hangfish 1", "option name Skill Level type spin default 20 min 0 max 20",
              "option name Threads type spin default 1 min 1 max 64",
              "option name Hash type spin default 16 min 1 max 1024", "uciok", sep="\\n", flush=True)
    elif cmd[0] == "isready":
        print("readyok", flush=True)
    elif cmd[0] == "position":
        board = chess.Board() if cmd[1] == "startpos" else chess.Board(" ".join(cmd[2:8]))
        for m in cmd[cmd.index("moves") + 1:] if "moves" in cmd else []:
            board.push_uci(m)
    elif cmd[0] == "go":
        searches += 1
        if searches <= {moves}:
            print("bestmove", sorted(m.uci() for m in board.legal_moves)[0], flush=True)
    elif cmd[0] == "quit":
        break
"""


def test_a_hung_engine_stops_the_match_with_a_clear_error_and_the_finished_games_kept(tmp_path, monkeypatch, capsys):
    import sys
    import time

    from conftest import REPO
    from rookworld_rlvr.cli import main

    fake = tmp_path / "hangfish"
    fake.write_text(_FAKE_ENGINE.format(python=sys.executable, moves=2))
    fake.chmod(0o755)
    monkeypatch.setenv("STOCKFISH_PATH", str(fake))
    pgn = tmp_path / "games.pgn"
    t = time.monotonic()
    rc = main(["match", "stockfish:0:1", "random", "--games", "4", "--max-plies", "2", "--engine-timeout", "2",
               "--pgn", str(pgn), "--quiet", "--openings", str(REPO / "data" / "openings.txt")])
    err = capsys.readouterr().err
    assert rc == 1 and time.monotonic() - t < 30
    assert "a player failed after 2 finished games" in err and str(pgn) in err
    assert pgn.read_text().count("[Event ") == 2  # each finished game written as it ended


def test_a_player_that_fails_to_start_closes_the_engine_already_started(tmp_path, monkeypatch, stockfish_path, capsys):
    from conftest import REPO
    from rookworld_rlvr import play
    from rookworld_rlvr.cli import main

    closed = []
    real = play.StockfishPlayer.close
    monkeypatch.setattr(play.StockfishPlayer, "close", lambda self: (closed.append(self.name), real(self)))
    rc = main(["match", "stockfish:0:1", str(tmp_path / "no-model"), "--games", "2", "--quiet",
               "--openings", str(REPO / "data" / "openings.txt")])
    assert rc == 1 and "no-model" in capsys.readouterr().err
    assert closed == ["stockfish:0:1"]


_KILLED_SAVE = """
import os, signal, sys
from pathlib import Path
from rookworld_rlvr.atomic import write_dir

def write(tmp):
    (tmp / "model.safetensors").write_bytes(b"half a model")
    os.kill(os.getpid(), signal.SIGKILL)  # killed in the middle of the save: no handler runs

write_dir(Path(sys.argv[1]), write)
"""


def test_a_model_save_killed_midway_leaves_nothing_behind_once_saved_again(tmp_path):
    """`final/` and `best/` are written through a temporary sibling; a SIGKILL in the middle leaves it
    (`.final.tmp-*`, model-sized). The next save of that name deletes it: under the name only ever the
    old or the new copy, and beside it nothing once the save is done."""
    import subprocess
    import sys

    from rookworld_rlvr.atomic import write_dir

    final = tmp_path / "final"
    write_dir(final, lambda tmp: (tmp / "model.safetensors").write_bytes(b"old"))
    for _ in range(2):  # two kills: each leaves its own, and the second save (killed too) deleted the first's
        proc = subprocess.run([sys.executable, "-c", _KILLED_SAVE, str(final)], capture_output=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")})
        assert proc.returncode == -9, proc.stderr
        assert len(list(tmp_path.glob(".final.tmp-*"))) == 1 and (final / "model.safetensors").read_bytes() == b"old"
    (tmp_path / "final2").mkdir()  # another name's own directory is not touched
    write_dir(final, lambda tmp: (tmp / "model.safetensors").write_bytes(b"new"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final", "final2"]
    assert (final / "model.safetensors").read_bytes() == b"new"


def test_a_write_the_machine_refuses_names_its_file_in_one_line(capsys, stockfish_path):
    """/dev/full refuses every write (ENOSPC), as a full disk does, and a write or close refused so names no file:
    the logs, journals and game records the commands append to name theirs, and a command says it in one line."""
    from rookworld_rlvr.cli import main
    from rookworld_rlvr.grpo.runlog import append_jsonl
    from rookworld_rlvr.model.journal import Journal

    refused = r"\[Errno 28\] No space left on device: '/dev/full'"
    with pytest.raises(OSError, match=refused):
        append_jsonl(Path("/dev/full"), {"step": 1})
    with pytest.raises(OSError, match=refused):
        Journal(Path("/dev/full"), {}).add(["P: x"], 8, ["y"], ["eos"])
    from rookworld_rlvr.atomic import refused_write  # which errors are the machine's: said in one line

    assert all(refused_write(OSError(n, os.strerror(n), "f")) for n in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG,
                                                                       errno.EROFS, errno.EACCES))
    assert not refused_write(IsADirectoryError(errno.EISDIR, "Is a directory", "f")) and not refused_write(KeyError())
    assert main(["match", "random", "stockfish:0:1", "--games", "2", "--pgn", "/dev/full"]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"error: {refused}".replace("\\", "")


@pytest.mark.parametrize("writes", [0, 40], ids=["at-the-start", "mid-run"])
def test_tensorboard_refused_a_write_is_one_error_line_naming_its_folder_and_resume_goes_on(
        tmp_path, tiny_model_dir, small_data, capsys, monkeypatch, writes):
    """TensorBoard writes from a thread of its own, which printed its traceback around the run's one-line error when
    the disk was full (at the run's first event, or later); now the line alone names TensorBoard's folder, and once
    there is room `--resume` goes on, each step logged once."""
    import threading

    from tensorboard.summary.writer.record_writer import RecordWriter

    from rookworld_rlvr.cli import main

    done, thread_errors, write = [0], [], RecordWriter.write

    def full_disk(self, data):  # the fault: the disk fills after `writes` events
        done[0] += 1
        if done[0] > writes:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        write(self, data)

    monkeypatch.setattr(RecordWriter, "write", full_disk)
    monkeypatch.setattr(threading, "excepthook", thread_errors.append)  # what a thread's error would print
    run = tmp_path / "run"
    fields = dict(model=tiny_model_dir, data=small_data / "train.jsonl", eval_data="", output_dir=run, steps=3,
                  batch_positions=2, group_size=4, max_new_tokens=16, save_every=1, tensorboard="true",
                  progress="false", report="false", engine_cache="null", device="cpu", threads=1)
    args = ["train"] + as_options(fields)
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert not thread_errors and not any("Traceback" in line for line in err)
    assert err[-2] == f"error: [Errno 28] No space left on device: '{run / 'tb'}'"
    latest = ckpt.latest_checkpoint(run)
    if writes == 0:
        assert latest is None and err[-1] == "no checkpoint of this run was written"
        return
    assert err[-1] == f"once there is room, the same command with --resume continues from {latest}"
    monkeypatch.setattr(RecordWriter, "write", write)
    assert main(args + ["--resume", "true"]) == 0
    assert [r["step"] for r in read_log(run / "metrics.jsonl")] == [1, 2, 3] and not thread_errors


def test_a_second_run_into_a_directory_in_use_stops_at_once_and_a_killed_holder_leaves_no_lock(
        tmp_path, tiny_model_dir, small_data, capsys, stockfish_path):
    """`make train` started again in a second terminal, or `rookworld sft` twice with one --out: the second run
    stops at once naming the first (its pid) and touches nothing of its files (a fresh run would have set the
    directory aside under it). The holder here is another process, which forks a child as a run forks its
    data-reading workers; killed (SIGKILL: no clean-up of its own runs), it leaves the directory free at once, for
    `--resume` or a new run, though its child lives on."""
    import subprocess
    import sys

    from rookworld_rlvr.cli import main

    run, out = tmp_path / "run", tmp_path / "sft" / "model"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')  # the first run's files
    holder = subprocess.Popen(
        [sys.executable, "-c", "import os, sys, time\nfrom rookworld_rlvr.runlock import one_run_in\n"
         "with one_run_in(sys.argv[1]), one_run_in(sys.argv[2], '--out'):\n    child = os.fork()\n"
         "    if child == 0:\n        time.sleep(600)\n        os._exit(0)\n    print(child, flush=True)\n"
         "    time.sleep(600)", str(run), str(out)], stdout=subprocess.PIPE, text=True)
    train = ["train", "--model", str(tiny_model_dir), "--data", str(small_data / "train.jsonl"), "--eval-data", "",
             "--steps", "1", "--batch-positions", "2", "--group-size", "2", "--output-dir", str(run), "--device",
             "cpu", "--report", "false"]
    sft = ["sft", "--data", str(small_data / "train.jsonl"), "--eval-data", "", "--out", str(out), "--steps", "1",
           "--batch-size", "4", "--device", "cpu", "--quiet"]
    child = None
    try:
        child = int(holder.stdout.readline())
        for command, option in ((train, "--output-dir"), (sft, "--out")):
            assert main(command) == 1
            (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
            where = run if command is train else out
            assert line.startswith(f"error: {where} is in use by another run (pid {holder.pid} on ") and \
                line.endswith(f"wait for it to end, or give another {option}"), line
        assert sorted(p.name for p in run.parent.iterdir()) == [".run.lock", "run", "sft"]  # nothing set aside
        assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n' and not out.exists()
        holder.kill()
        holder.wait()
        os.kill(child, 0)  # the child lives on
        assert main(train) == 0 and main(sft) == 0  # the killed holder's locks went with it, not to its child
        assert (run / "final").is_dir() and out.is_dir()
    finally:
        holder.kill()
        holder.wait()
        if child:
            os.kill(child, signal.SIGKILL)


def test_an_output_directory_a_file_stands_in_is_one_error_line_before_any_work(tmp_path, tiny_model_dir,
                                                                                  small_data, capsys):
    """`--output-dir` (or sft's `--out`, or `--eval-cache`) where a file is, or under one: before, a FileExistsError traceback from
    the first mkdir (after the data was read); now one line naming the file, and nothing written (no lock file)."""
    from rookworld_rlvr.cli import main

    file = tmp_path / "afile"
    file.write_text("kept\n")
    train = ["train", "--model", str(tiny_model_dir), "--data", str(small_data / "train.jsonl"), "--eval-data", "",
             "--steps", "1", "--device", "cpu"]
    sft = ["sft", "--data", str(small_data / "train.jsonl"), "--eval-data", "", "--steps", "1", "--device", "cpu"]
    for argv, said in ((train + ["--output-dir", str(file)], f"output_dir: {file} is a file, not a directory"),
                       (train + ["--output-dir", str(file / "sub")],
                        f"output_dir: {file / 'sub'}: {file} is a file, not a directory"),
                       (train + ["--output-dir", str(tmp_path / "run"), "--eval-cache", str(file)],
                        f"eval_cache: {file} is a file, not a directory"),
                       (sft + ["--out", str(file / "m")], f"sft.out: {file / 'm'}: {file} is a file, not a directory")):
        assert main(argv) == 1
        assert capsys.readouterr().err.strip().splitlines()[-1] == f"error: {said}"
    assert list(tmp_path.iterdir()) == [file] and file.read_text() == "kept\n"
