"""scripts/fault_drill.py: GRPO and SFT runs killed with SIGKILL and resumed end bit for bit equal to
the uninterrupted runs, and the drill itself notices a difference or a broken checkpoint."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def drill_module():
    spec = importlib.util.spec_from_file_location("fault_drill", REPO / "scripts" / "fault_drill.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.drill
@pytest.mark.slow(seconds=120)
def test_runs_killed_at_random_points_and_resumed_equal_the_uninterrupted_runs(tmp_path, stockfish_path):
    out = tmp_path / "drill"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "STOCKFISH_PATH": stockfish_path}
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "fault_drill.py"), "--smoke", "--kills", "2",
                           "--out", str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = {r["task"]: r for r in json.loads((out / "drill.json").read_text())}
    assert set(results) == {"grpo", "sft"}
    assert results["grpo"]["straight_rollbacks"] >= 1  # the GRPO run's guard fires, so kills land around a rollback
    # the seeded draw aims the GRPO run's second kill at one of its later saves: that attempt resumes from a checkpoint
    # an earlier save wrote whole, not from nothing
    second = results["grpo"]["kills"][1]
    assert second["aimed_at"].startswith("save ") and int(second["aimed_at"].split()[1]) > 1
    assert second["latest_checkpoint_step"] is not None
    for r in results.values():
        assert len(r["kills"]) == 2 and not any(k["problems"] for k in r["kills"])
        assert r["copies"] and all(c["equal"] for c in r["copies"])
    assert "bit for bit equal" in proc.stdout


@pytest.mark.drill
@pytest.mark.slow(seconds=150)
def test_a_rank_stopped_or_killed_under_torchrun_ends_the_run_leaves_nothing_running_and_it_resumes_bit_for_bit(
        tmp_path, stockfish_path):
    """Nothing hangs: rank 1 stopped (SIGSTOP, a hang: rank 0 gives up at its next wait after the run's
    step_timeout_minutes, 15 s here), torchrun itself killed (its ranks end by themselves), then rank 0
    killed; each time the run ends by itself, no process of the run is left, every checkpoint loads, and
    `torchrun ... --resume` ends as the run that was never stopped."""
    out = tmp_path / "drill"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "STOCKFISH_PATH": stockfish_path}
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "fault_drill.py"), "--smoke", "--kills", "3",
                           "--tasks", "ddp", "--out", str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (r,) = json.loads((out / "drill.json").read_text())
    assert r["task"] == "ddp" and [(k["rank"], k["signal"]) for k in r["kills"]] == \
        [(1, "SIGSTOP"), ("torchrun", "SIGKILL"), (0, "SIGKILL")]
    drill = drill_module()
    for k in r["kills"]:
        assert not k["problems"] and not k["hung"] and k["left_running"] == 0
        assert k["teardown_s"] < drill.TEARDOWN_S
    assert r["kills"][0]["teardown_s"] >= drill.STEP_TIMEOUT_MINUTES * 60  # the wait's timeout ended it
    assert r["copies"] and all(c["equal"] for c in r["copies"])
    assert "rank 1 stopped (a hang), torchrun ended the run in" in proc.stdout and "bit for bit equal" in proc.stdout
    assert "torchrun killed, its ranks ended in" in proc.stdout


def test_the_drill_sees_one_flipped_bit_and_a_checkpoint_that_does_not_load(tmp_path, tiny_model_dir):
    import shutil

    drill = drill_module()
    straight = drill.tensor_bytes(tiny_model_dir / "model.safetensors")
    flipped = dict(straight)
    name = sorted(flipped)[0]
    flipped[name] = bytes([flipped[name][0] ^ 1]) + flipped[name][1:]
    assert drill.differences({"final": straight}, {"final": dict(straight)}) == []
    assert drill.differences({"final": straight}, {"final": flipped}) == [f"final: tensor {name} differs"]
    assert drill.differences({"log": [{"loss": 1.0}]}, {"log": [{"loss": 1.0000001}]}) == ["log differs"]
    assert drill.untimed({"seconds": 3, "meta": {"seconds": {"generate": 1}}, "time/step": 2, "loss": 1}) == \
        {"meta": {}, "loss": 1}

    run = tmp_path / "run"
    step = run / "checkpoints" / "step_000002"
    shutil.copytree(tiny_model_dir, step)
    from rookworld_rlvr.statefile import save_state

    save_state(step, "trainer_state", {"step": 2})
    assert drill.check_checkpoints("grpo", run) == ([], 2, False)
    (step / "model.safetensors").write_bytes(b"torn")
    problems, latest, _ = drill.check_checkpoints("grpo", run)
    assert latest == 2 and len(problems) == 1 and "step_000002" in problems[0]
    assert drill.left_behind(run) == []  # a finished copy: what a killed save of final/ left is named
    (run / ".final.tmp-x1").mkdir()
    assert drill.left_behind(run) == ["left behind by killed saves: .final.tmp-x1"]


FAKE_TORCHRUN = """
import os, subprocess, sys, time
ranks = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "rookworld_rlvr"],
                          env={**os.environ, "RANK": str(r)}) for r in (0, 1)]
ranks[1].wait()
if sys.argv[1] == "hang":
    time.sleep(60)
"""


@pytest.mark.parametrize("mode,sig", [("hang", "SIGKILL"), ("orphan", "SIGKILL"), ("hang", "SIGSTOP")])
def test_the_drill_names_a_torchrun_that_hangs_or_leaves_a_rank_running(tmp_path, monkeypatch, mode, sig):
    """A stand-in for torchrun that, once rank 1 is killed, never stops (hang) or ends leaving rank 0
    running (orphan), or that waits for ever for a stopped rank 1: `launch` reports it, and kills every
    process the run started, the stopped one included."""
    drill = drill_module()
    monkeypatch.setattr(drill, "TEARDOWN_S", 2.0)
    monkeypatch.setattr(drill, "ENGINE_GRACE_S", 0.5)  # the stand-in starts no engine
    log = tmp_path / "run.log"
    finished, _, found, _ = drill.launch([sys.executable, "-c", FAKE_TORCHRUN, mode], log, 0.0, rank=1, sig=sig)
    assert not finished and found["rank"] == 1 and found["signal"] == sig
    assert found["hung"] == (mode == "hang") and found["left_running"] == (1 if sig == "SIGKILL" else 2)
    assert (found["teardown_s"] >= 2.0) == (mode == "hang")
    assert drill.marked(str(log)) == []


def test_the_drill_names_ranks_that_run_on_after_torchrun_is_killed(tmp_path, monkeypatch):
    """The stand-in's ranks do not watch their torchrun: killed, it leaves them running, which the drill
    reports as a hang, and it kills them."""
    drill = drill_module()
    monkeypatch.setattr(drill, "TEARDOWN_S", 2.0)
    monkeypatch.setattr(drill, "ENGINE_GRACE_S", 0.5)  # the stand-in starts no engine
    log = tmp_path / "run.log"
    finished, _, found, _ = drill.launch([sys.executable, "-c", FAKE_TORCHRUN, "orphan"], log, 0.0, rank=drill.AGENT)
    assert not finished and found["rank"] == "torchrun" and found["hung"] and found["left_running"] == 2
    assert found["teardown_s"] >= 2.0
    assert drill.marked(str(log)) == []


SAVER = """
import sys, tempfile, time
from pathlib import Path
for n in range(3):  # three saves, each in a hidden directory of a name of its own, as atomic.py makes them
    time.sleep(0.3)
    tempfile.mkdtemp(prefix=".step_%d.tmp-" % n, dir=sys.argv[1])
    time.sleep(0.5)  # the save takes a while: a kill at its start lands before the mark below
    (Path(sys.argv[1]) / "saved").write_text(str(n + 1))
"""


def test_a_kill_aimed_at_a_save_waits_for_the_one_drawn_and_the_saves_are_counted(tmp_path):
    """The uninterrupted run's saves are counted (the draw's range); a kill aimed at the second lands as it starts."""
    drill = drill_module()
    run, saver = tmp_path / "run", [sys.executable, "-c", SAVER, str(tmp_path / "run")]
    run.mkdir()
    assert drill.launch(saver, tmp_path / "a.log", None, drill.folders(run))[::3] == (True, 3)
    # the first run's three directories are still there: what a run finds at its start is not its save
    finished, _, _, seen = drill.launch(saver, tmp_path / "b.log", 30.0, drill.folders(run), at_save=2)
    assert not finished and seen == 2 and (run / "saved").read_text() == "1"  # killed before it wrote its mark


def test_the_ddp_task_runs_at_the_grpo_tasks_lr_only_when_asked_to_roll_back(tmp_path):
    """`--ddp-rollbacks`: the torchrun run at lr 1e-3, where its guard rolls it back (by hand: about 25 minutes);
    by default at `make train`'s lr. Both under torchrun with the drill's step timeout."""
    drill = drill_module()
    plain, rolling = (drill.ddp_command(tmp_path, tmp_path / "d.jsonl", True, "m", rollbacks=r) for r in (False, True))
    assert "--lr" not in plain and rolling[rolling.index("--lr") + 1] == "1e-3"
    for cmd in (plain, rolling):
        assert cmd[1:3] == ["-m", "torch.distributed.run"]
        assert cmd[cmd.index("--step-timeout-minutes") + 1] == str(drill.STEP_TIMEOUT_MINUTES)


@pytest.mark.parametrize("argv,message", [(["--kills", "0"], "--kills must be at least 1"),
                                          (["--tasks", "ppo"], "--tasks: grpo, sft, ddp and/or sft-ddp")])
def test_the_drill_refuses_what_it_cannot_do(argv, message, capsys):
    with pytest.raises(SystemExit):
        drill_module().main(argv)
    assert message in capsys.readouterr().err
