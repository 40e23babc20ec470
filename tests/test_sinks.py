"""The per-step sinks a user watches a run in: TensorBoard (`tensorboard`) and Weights & Biases (`wandb`, offline
here: the records land in the run's .wandb file on this machine, read back as `wandb sync` would send them)."""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
import torch
from conftest import as_options
from test_faults import _fields, _records


def _failing_at(call: int, real):
    """`real`, raising torch's OutOfMemoryError at its `call`-th call (as CUDA raises it): a run stopped there."""
    calls = []

    def wrapped(*a, **k):
        calls.append(1)
        if len(calls) == call:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.50 GiB")
        return real(*a, **k)
    return wrapped


@pytest.fixture(autouse=True)
def fresh_wandb():
    """wandb keeps its settings (WANDB_MODE, the config folder) for the process once a run started: each test
    starts with none, and ends its own."""
    import wandb

    wandb.teardown()
    yield
    wandb.teardown()


def _wandb_records(path: Path):
    """The records of an offline wandb run's file (`:W&B` header, then LevelDB's log format of 32 KiB blocks)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B", path
    pos, part = 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, size, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if size == 0 and kind == 0:
            pos += block - pos % block
            continue
        part, pos = part + data[pos + 7:pos + 7 + size], pos + 7 + size
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(part)
            part = b""
            yield record


def _wandb_run(path: Path) -> dict:
    """An offline run's id, name, group, the steps of its records in their order (`steps`), each step's last
    reward/mean (`history`) and its exit code. wandb's own process writes the file and may still be at it when the
    run has finished: it is ended first (`teardown`, as a process's exit ends it)."""
    import wandb

    wandb.teardown()
    run: dict = {"steps": [], "history": {}}
    for r in _wandb_records(path):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            run.update(id=r.run.run_id, name=r.run.display_name, group=r.run.run_group)
        elif kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            run["steps"].append(items["step"])  # the record's own step, which the figures are plotted against
            run["history"][items["step"]] = items.get("reward/mean")
        elif kind == "exit":
            run["exit_code"] = r.exit.exit_code
    return run


def test_a_resumed_run_logs_each_step_once_to_tensorboard_and_goes_on_in_the_same_wandb_run(
        tmp_path, tiny_model_dir, small_data, stockfish_path, monkeypatch, capsys):
    """Killed after step 3 was logged (its checkpoint at step 2), a run resumes at step 2 and redoes step 3.
    metrics.jsonl drops what the resume redoes; TensorBoard showed step 3 twice (and a sweep's trials, one
    process, logged into one wandb run), and each resume was a wandb run of its own. Now TensorBoard shows each
    step once and the resume logs into the first wandb run, which ended marked failed."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rookworld_rlvr.cli import main
    from rookworld_rlvr.grpo import trainer as trainer_module

    monkeypatch.setenv("STOCKFISH_PATH", stockfish_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    run = tmp_path / "run"
    args = ["train"] + as_options(_fields(tiny_model_dir, small_data, run, steps=4, save_every=2, tensorboard=True,
                                          wandb=True))
    real = trainer_module.policy_pass
    monkeypatch.setattr(trainer_module, "policy_pass", _failing_at(4, real))  # once a step: killed in step 4
    assert main(args) == 1
    assert capsys.readouterr().err.strip().endswith(f"continues from {run}/checkpoints/step_000002")
    monkeypatch.setattr(trainer_module, "policy_pass", real)
    assert main(args + ["--resume", "true"]) == 0
    records = _records(run)
    assert [r["step"] for r in records] == [1, 2, 3, 4]

    board = EventAccumulator(str(run / "tb"))
    board.Reload()
    assert [(e.step, e.value) for e in board.Scalars("reward/mean")] == \
        [(r["step"], pytest.approx(r["reward/mean"])) for r in records]

    first, resumed = (_wandb_run(p) for p in sorted(run.glob("wandb/offline-run-*/run-*.wandb")))
    run_id = (run / "wandb_id").read_text().strip()
    assert first["id"] == resumed["id"] == run_id and first["name"] == resumed["name"] == "run"
    assert (first["exit_code"], resumed["exit_code"]) == (1, 0)
    assert first["steps"] == [1, 2, 3] and resumed["steps"] == [3, 4]
    assert {**first["history"], **resumed["history"]} == pytest.approx({r["step"]: r["reward/mean"] for r in records})

    assert main(args) == 0  # a fresh run into the directory (the old one set aside) is a wandb run of its own
    assert (run / "wandb_id").read_text().strip() != run_id


def test_wandb_without_a_login_is_one_line_saying_how_to_log_in_or_log_offline(tmp_path, monkeypatch):
    from rookworld_rlvr.config import load_config
    from rookworld_rlvr.grpo.sinks import writer

    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: no key
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    cfg = load_config(None, {"output_dir": str(tmp_path / "run"), "wandb": True, "tensorboard": False})
    with pytest.raises(ValueError) as e:
        writer(cfg)
    assert str(e.value) == ("wandb: No API key configured. Use `wandb login` to log in. Or WANDB_MODE=offline logs "
                            "on this machine (`wandb sync` sends it later), or set wandb: false")


def test_each_trial_of_a_sweep_is_a_wandb_run_of_its_own(tmp_path, tiny_model_dir, small_data, monkeypatch):
    """A sweep's trials run in one process, where wandb handed the first trial's run (never ended) to every later
    one: the whole sweep's steps went into one run. Now a run each, grouped as the sweep."""
    from test_sweep import QUIET, tiny_base, write_space
    from test_trainer import varied_reward

    from rookworld_rlvr.sweep.trials import run_sweep

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    space = write_space(tmp_path / "space.yaml", sampler="grid", base=tiny_base(tiny_model_dir, small_data, wandb=True),
                        params={"lr": {"choices": [1e-4, 1e-3]}})
    out = tmp_path / "out"
    assert run_sweep(space, trials=2, out=out, seed=3, reward_fn=varied_reward, log=QUIET)["complete"] == 2
    for trial in ("trial_0", "trial_1"):
        (logged,) = (_wandb_run(p) for p in (out / trial).glob("wandb/offline-run-*/run-*.wandb"))
        assert logged["id"] == (out / trial / "wandb_id").read_text().strip() and logged["name"] == trial
        assert logged["group"] == "out"  # the sweep's folder: its trials side by side in wandb
        assert logged["steps"] == [1] and logged["exit_code"] == 0
    assert (out / "trial_0" / "wandb_id").read_text() != (out / "trial_1" / "wandb_id").read_text()


@pytest.mark.slow(seconds=12)
def test_a_wandb_server_out_of_reach_is_one_line(tmp_path, monkeypatch):
    """A machine without network (a GPU node, say) and wandb asked for online: wandb's traceback; now one line
    with wandb's reason and the way to log offline."""
    from rookworld_rlvr.config import load_config
    from rookworld_rlvr.grpo.sinks import writer

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing answers there
    monkeypatch.setenv("WANDB_API_KEY", "a" * 40)
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "1")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    cfg = load_config(None, {"output_dir": str(tmp_path / "run"), "wandb": True, "tensorboard": False})
    with pytest.raises(ValueError) as e:
        writer(cfg)
    said = str(e.value)
    assert said.startswith("wandb: ") and "127.0.0.1:9" in said and "\n" not in said, said
    assert said.endswith(". Or WANDB_MODE=offline logs on this machine (`wandb sync` sends it later), or set wandb: "
                         "false"), said
    assert not (tmp_path / "run" / "wandb_id").exists()  # no run started, so none for a resume to go on in


def test_an_sft_run_without_a_wandb_login_says_so_in_its_own_words_and_leaves_nothing_to_set_aside(
        tmp_path, small_data, monkeypatch, capsys):
    """`rookworld sft --wandb` on a machine without a wandb login: one line with wandb's reason and the ways out in
    sft's own words (it has no `wandb: false` to set). It left OUT.wandb holding the id of a run that never started,
    which the next fresh run then set aside as "the previous run's"."""
    from rookworld_rlvr.cli import main

    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: no key
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    out = tmp_path / "m"
    args = ["sft", "--data", str(small_data / "train.jsonl"), "--eval-data", "", "--out", str(out), "--steps", "1",
            "--batch-size", "4", "--device", "cpu", "--threads", "1", "--quiet", "--wandb"]
    assert main(args) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: wandb: No API key configured. Use `wandb login` to log in. Or WANDB_MODE=offline logs on this machine "
        "(`wandb sync` sends it later), or leave out --wandb")
    assert not (tmp_path / "m.wandb").exists()
    import wandb

    wandb.teardown()  # wandb keeps the process's settings: offline from here on
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert main(args) == 0, capsys.readouterr().err[-2000:]
    assert "moved the previous run" not in capsys.readouterr().out


def test_a_sink_that_cannot_start_ends_those_already_started(tmp_path, monkeypatch):
    """TensorBoard's folder blocked by a file: the run stops, and the wandb run it had begun ends (marked failed)
    rather than staying open for the rest of the process (a sweep's next trial)."""
    from rookworld_rlvr.config import load_config
    from rookworld_rlvr.grpo.sinks import writer

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    run = tmp_path / "run"
    run.mkdir()
    (run / "tb").write_text("a file where TensorBoard's folder goes")
    cfg = load_config(None, {"output_dir": str(run), "wandb": True, "tensorboard": True})
    with pytest.raises(OSError, match="tb"):
        writer(cfg)
    (logged,) = (_wandb_run(p) for p in run.glob("wandb/offline-run-*/run-*.wandb"))
    assert logged["exit_code"] == 1 and logged["steps"] == []


@pytest.mark.slow(seconds=12)
def test_an_sft_run_logs_each_step_once_to_tensorboard_and_to_one_wandb_run_over_a_resume(tmp_path, small_data,
                                                                                         monkeypatch, capsys):
    """`rookworld sft --tensorboard --wandb`: each step's log record as TensorBoard events in OUT.tb and into a
    wandb run (OUT.wandb). Killed in step 4 (its checkpoint at step 2), the resume redoes step 3, which TensorBoard
    shows once, as the log does, and goes on in the same wandb run; a fresh run sets both aside with the rest of
    the older run."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import rookworld_rlvr.sft as sft
    from rookworld_rlvr.cli import main
    from rookworld_rlvr.data.io import read_log

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    out = tmp_path / "m"
    args = ["sft", "--data", str(small_data / "train.jsonl"), "--eval-data", str(small_data / "eval.jsonl"),
            "--eval-every", "2", "--eval-samples", "2", "--out", str(out), "--steps", "4", "--batch-size", "4",
            "--save-every", "2", "--device", "cpu", "--threads", "1", "--quiet", "--wandb", "--tensorboard"]
    real = sft._accumulate
    monkeypatch.setattr(sft, "_accumulate", _failing_at(4, real))  # once a step: killed in step 4
    assert main(args) == 1
    monkeypatch.setattr(sft, "_accumulate", real)
    assert main(args + ["--resume"]) == 0
    log = read_log(tmp_path / "m.sft_log.jsonl")
    board = EventAccumulator(str(tmp_path / "m.tb"))
    board.Reload()
    assert [(e.step, e.value) for e in board.Scalars("loss")] == [(r["step"], pytest.approx(r["loss"])) for r in log]
    assert [e.step for e in board.Scalars("eval_loss_A")] == [2, 4]  # the held-out figures where it evaluated
    first, resumed = (_wandb_run(p) for p in sorted(tmp_path.glob("m.wandb/wandb/offline-run-*/run-*.wandb")))
    assert first["id"] == resumed["id"] == (tmp_path / "m.wandb" / "id").read_text().strip() and first["name"] == "m"
    assert (first["exit_code"], resumed["exit_code"]) == (1, 0)
    assert first["steps"] == [1, 2, 3] and resumed["steps"] == [3, 4]

    fresh = [*args[:-2]]
    fresh[fresh.index("--steps") + 1] = "1"
    assert main(fresh) == 0  # a fresh run without them: the older events go aside with the older log
    assert not (tmp_path / "m.tb").exists() and len(list(tmp_path.glob("m.tb-*"))) == 1
    assert not (tmp_path / "m.wandb").exists() and len(list(tmp_path.glob("m.wandb-*"))) == 1
    assert "Traceback" not in capsys.readouterr().err


def test_the_steps_a_rollback_redoes_reach_wandb(tmp_path, monkeypatch):
    """A guard's rollback from step 3 to step 1 logs steps 2 and 3 again. wandb dropped them ("steps must be
    monotonically increasing"): from the rollback to the step it left, the run's figures were the abandoned ones.
    Now every record reaches the run, plotted against its own step."""
    from rookworld_rlvr.config import load_config
    from rookworld_rlvr.grpo.sinks import writer

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    run = tmp_path / "run"
    sinks = writer(load_config(None, {"output_dir": str(run), "wandb": True, "tensorboard": False}))
    for step, reward in ((1, 0.2), (2, 0.3), (3, -0.5), (2, 0.25), (3, 0.35), (4, 0.4)):
        sinks({"step": step, "reward/mean": reward})
    sinks.close()
    (logged,) = (_wandb_run(p) for p in run.glob("wandb/offline-run-*/run-*.wandb"))
    assert logged["steps"] == [1, 2, 3, 2, 3, 4]
    assert logged["history"] == {1: 0.2, 2: 0.25, 3: 0.35, 4: 0.4}


def test_a_trial_whose_wandb_cannot_start_fails_with_its_reason_and_its_engines_closed(
        tmp_path, tiny_model_dir, small_data, monkeypatch):
    """A sweep's trial whose wandb run cannot start (no login) fails with wandb's reason, and the Stockfish processes
    its run had started are closed with it (before, the trial's frames being collected closed them)."""
    from test_sweep import QUIET, tiny_base, trials_of, write_space
    from test_trainer import varied_reward

    from rookworld_rlvr.sweep.trials import run_sweep

    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: no key
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    space = write_space(tmp_path / "space.yaml", sampler="grid", base=tiny_base(tiny_model_dir, small_data, wandb=True),
                        params={"lr": {"choices": [1e-4]}})
    out = tmp_path / "out"
    assert run_sweep(space, trials=1, out=out, seed=3, reward_fn=varied_reward, log=QUIET)["complete"] == 0
    (trial,) = trials_of(out, "space")
    assert trial.user_attrs["failure"].startswith("ValueError: wandb: No API key configured.")
    engines = [p for p in Path("/proc").glob("[0-9]*") if _parent(p) == os.getpid() and "stockfish" in _name(p)]
    assert engines == []


def _parent(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _name(proc: Path) -> str:
    try:
        return (proc / "comm").read_text()
    except OSError:
        return ""
