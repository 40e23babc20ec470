"""Fault drills: NaN steps, a Stockfish process killed mid-run, the trainer killed while writing a
checkpoint, and malformed data lines. Real components throughout (tiny GPT-2, real Stockfish, real
files); monkeypatch only injects the faults."""

import gzip
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import chess
import pytest
import torch

from conftest import as_options, built_once
from rookworld_rlvr.config import load_config
from rookworld_rlvr.data.io import DataError, read_samples
from rookworld_rlvr.engine import EngineConfig, StockfishPool, find_stockfish
from rookworld_rlvr.grpo import checkpoint as ckpt
from rookworld_rlvr.grpo.trainer import Trainer, TrainingStopped
from rookworld_rlvr.tasks import policy as pol_task
from rookworld_rlvr.tasks.rewards import RewardScorer

SRC = Path(__file__).resolve().parents[1] / "src"


class _Result:
    def __init__(self, total):
        self.total, self.components, self.valid_format = total, {"chars": total}, True


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """The drills train with threads=1 (a shared 2-core machine); later tests get torch's setting back."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def varied_reward(prompts, completions, truths, weights):
    """A dense toy reward (share of digits) so a random model gets a learning signal."""
    return [_Result(sum(c.isdigit() for c in text) / max(len(text), 1)) for text in completions]


def _fields(tiny_model_dir, small_data, run_dir, **over):
    fields = dict(model=str(tiny_model_dir), data=str(small_data / "train.jsonl"), eval_data="",
                  output_dir=str(run_dir), steps=3, batch_positions=2, group_size=4, max_new_tokens=24,
                  lr=1e-3, warmup_steps=0, save_every=1, tensorboard=False, progress=False, report=False, seed=1,
                  engine_cache=None, device="cpu", threads=1)
    fields.update(over)
    return fields


def make(tmp_path, tiny_model_dir, small_data, reward_fn=varied_reward, log=lambda *_: None, **over):
    cfg = load_config(None, _fields(tiny_model_dir, small_data, tmp_path / "run", **over))
    return Trainer(cfg, reward_fn, read_samples(cfg.data), None, log=log)


def _snapshot(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _inject_nan(monkeypatch, tr, poison):
    """NaN in the policy's log-probs (the gradient pass only) whenever poison(step) says so."""
    import rookworld_rlvr.grpo.passes as passes_mod

    real = passes_mod.token_logprobs

    def faulty(model, *a, **k):
        out = real(model, *a, **k)
        if model is tr.forward_model and torch.is_grad_enabled() and poison(tr.step):
            out["logprobs"] = out["logprobs"] * float("nan")
        return out

    monkeypatch.setattr(passes_mod, "token_logprobs", faulty)


# -- 1. NaN ------------------------------------------------------------------------------------------------


def test_nan_at_random_steps_skips_them_and_the_run_finishes(tmp_path, tiny_model_dir, small_data, monkeypatch):
    steps = 6
    bad = set(random.Random(20240601).sample(range(steps), 2))
    tr = make(tmp_path, tiny_model_dir, small_data, steps=steps, nan_max_consecutive=3, save_every=100)
    _inject_nan(monkeypatch, tr, lambda step: step in bad)
    weights = [_snapshot(tr.policy)]  # weights[k]: after k steps
    summary = tr.train(writer=lambda rec: weights.append(_snapshot(tr.policy)))

    assert tr.step == steps and summary["steps"] == steps
    assert (tmp_path / "run" / "final" / "model.safetensors").exists()
    records = _records(tmp_path / "run")
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    for step in range(steps):
        rec = records[step]
        if step in bad:
            assert rec.get("nonfinite") == 1.0, (step, rec)
            assert _same(weights[step], weights[step + 1]), f"skipped step {step} moved the weights"
        else:
            assert "nonfinite" not in rec and torch.isfinite(torch.tensor(rec["loss"])), (step, rec)
            assert not _same(weights[step], weights[step + 1]), f"healthy step {step} did not update"
    assert all(torch.isfinite(p).all() for p in tr.policy.parameters())
    assert tr.nan_guard.total_skips == 2 and tr.nan_guard.rollbacks == 0 and tr.lr_scale == 1.0


@pytest.mark.parametrize("healthy", [0, 2], ids=["nan-from-start", "nan-after-2-good-steps"])
def test_nan_every_update_rolls_back_once_then_stops(tmp_path, tiny_model_dir, small_data, monkeypatch, healthy):
    logs: list[str] = []
    # save_every 100: the only checkpoint is the step-0 one, so after good steps the rollback visibly moves weights
    tr = make(tmp_path, tiny_model_dir, small_data, steps=6, nan_max_consecutive=2, nan_max_rollbacks=1,
              save_every=100, log=logs.append)
    _inject_nan(monkeypatch, tr, lambda step: step >= healthy or tr.nan_guard.rollbacks > 0)
    weights = [_snapshot(tr.policy)]
    with pytest.raises(TrainingStopped, match=r"^non-finite loss") as info:
        tr.train(writer=lambda rec: weights.append(_snapshot(tr.policy)))
    msg = str(info.value)
    assert "1/1 rollbacks" in msg and "LR scale now 0.3" in msg and "4 steps skipped" in msg, msg
    assert tr.nan_guard.rollbacks == 1 and tr.lr_scale == 0.3
    rolled = [line for line in logs if "rolled back to" in line]
    assert len(rolled) == 1, rolled
    assert "rolled back to step_000000" in rolled[0] and "LR x0.3" in rolled[0], rolled
    last = ckpt.latest_checkpoint(tmp_path / "run")
    assert last.name == "step_000000"
    from transformers import AutoModelForCausalLM

    saved = list(AutoModelForCausalLM.from_pretrained(last).parameters())
    assert _same(list(tr.policy.parameters()), saved), "after the rollback the weights are the last checkpoint's"
    # records: the rollback to step 0 drops every record after it (those steps are redone),
    # then one skipped step is logged before the stop
    records = _records(tmp_path / "run")
    flags = [r.get("nonfinite", 0.0) for r in records]
    assert flags == [1.0], (flags, records)
    assert len(weights) == 1 + healthy + 2
    if healthy:
        assert not _same(weights[healthy], saved), "the good steps had moved the weights away from the checkpoint"
        assert _same(weights[healthy], weights[healthy + 1]), "the skipped step did not move them"


# -- 2. Stockfish killed mid-run ---------------------------------------------------------------------------


def _outside_candidate_batch(samples, rng, moves_per_position):
    """P: prompts whose completions name a legal best move that is not among the truth's candidates."""
    prompts, completions, truths = [], [], []
    for s in samples:
        t = s.truth
        board = chess.Board(t.fen)
        outside = sorted(m.uci() for m in board.legal_moves if m.uci() not in t.moves)
        for move in rng.sample(outside, min(moves_per_position, len(outside))):
            evals = " ".join(pol_task.format_eval(e) for e in t.evals)
            prompts.append(pol_task.prompt(t.fen))
            completions.append(f"M: {' '.join(t.moves)} E: {evals} B: {move}")
            truths.append(t)
    return prompts, completions, truths


def _wait_gone(pid: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while os.path.exists(f"/proc/{pid}"):  # a zombie keeps its /proc entry
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_killed_stockfish_loses_no_reward(small_data, stockfish_path):
    p_samples = [s for s in read_samples(small_data / "train.jsonl") if s.task == "P"]
    rng = random.Random(5)
    rng.shuffle(p_samples)
    batches = [_outside_candidate_batch(p_samples[0:4], rng, 1),    # before any kill
               _outside_candidate_batch(p_samples[4:8], rng, 1),    # after a kill between two calls
               _outside_candidate_batch(p_samples[8:16], rng, 2)]   # with a kill during the call
    for prompts, completions, truths in batches:
        assert all(pol_task.parse_completion(c).best not in t.moves for c, t in zip(completions, truths, strict=True))

    cfg = EngineConfig(path=stockfish_path, depth=6, workers=2, timeout=20.0)
    with StockfishPool(cfg) as pool:
        scorer = RewardScorer(engine=pool)
        got = [scorer.score_batch(*batches[0])]
        calls = pool.stats["engine_calls"]
        assert calls >= len(batches[0][0]), "the scorer must have asked the engine"

        killed = pool.pids
        assert killed
        for pid in killed:  # between two scoring calls: the engines are idle
            os.kill(pid, signal.SIGKILL)
        got.append(scorer.score_batch(*batches[1]))
        assert pool.stats["restarts"] >= 1
        assert pool.stats["engine_calls"] >= calls + len(batches[1][0])

        restarts, calls = pool.stats["restarts"], pool.stats["engine_calls"]
        hit: list[int] = []

        def killer():  # during a scoring call: as soon as it has run two searches
            deadline = time.monotonic() + 30
            while pool.stats["engine_calls"] < calls + 2 and time.monotonic() < deadline:
                time.sleep(0.0005)
            for pid in pool.pids:
                os.kill(pid, signal.SIGKILL)
                hit.append(pid)

        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        got.append(scorer.score_batch(*batches[2]))
        thread.join(30)
        assert hit, "the killer thread never fired"
        assert pool.stats["restarts"] > restarts, "the kill landed after the call ended"
        assert pool.stats["engine_calls"] >= calls + len(batches[2][0])
        assert all(_wait_gone(pid) for pid in killed + hit), "killed engines must be reaped"
        assert set(pool.pids).isdisjoint(killed + hit)

    with StockfishPool(EngineConfig(path=stockfish_path, depth=6, workers=1)) as fresh:
        expected = [RewardScorer(engine=fresh).score_batch(*b) for b in batches]
        assert fresh.stats["restarts"] == 0
    for g, e in zip(got, expected, strict=True):
        assert len(g) == len(e)
        for a, b in zip(g, e, strict=True):
            assert (a.total, a.components, a.valid_format, a.correct) == (b.total, b.components, b.valid_format, b.correct)
            assert a.components["best_legal"] == 1.0 and a.components["quality"] < 1.0


# -- 3. the trainer killed while writing a checkpoint ------------------------------------------------------

_SCRIPT = """
import io, json, os, sys, time
sys.path.insert(0, {tests!r})
from test_faults import make, varied_reward
from pathlib import Path
import rookworld_rlvr.grpo.checkpoint as ck

real_save_state = ck.save_state

def slow_save_state(directory, name, state):
    '''The checkpoint module's state writer, slowed down: the tensors file is rewritten half first.'''
    real_save_state(directory, name, state)
    f = Path(directory) / f"{{name}}.safetensors"
    data = f.read_bytes()
    with open(f, "wb") as fh:
        fh.write(data[: len(data) // 2])
        fh.flush()
        os.fsync(fh.fileno())
        print(f"SAVING step {{state['step']}}", flush=True)  # half the state file is on disk now
        time.sleep(2)
        fh.write(data[len(data) // 2:])

ck.save_state = slow_save_state
over = json.loads(sys.argv[1])
tr = make(Path(over.pop("tmp")), Path(over.pop("model")), Path(over.pop("data")),
          log=lambda *a: print(*a, file=sys.stderr), **over)
tr.train()
print("FINISHED", flush=True)
"""


FILE_SIZE_LIMIT = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so that the kernel fails the write (EFBIG) instead of the process
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
from rookworld_rlvr.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow(seconds=24)
def test_a_checkpoint_the_disk_refuses_is_one_error_line_and_resume_goes_on_from_the_one_before(
        tmp_path, tiny_model_dir, small_data, stockfish_path):
    """A write the machine refuses, as on a full disk (here the kernel's limit on a file's size, from the real
    write): `rookworld train` ends with one line naming the checkpoint it could not write and the next naming the
    one `--resume` continues from, which is whole; nothing half-written is left; --resume then ends the run. Saved
    directories read as under the umask (not private, as temporary directories and safetensors' files are)."""
    run = tmp_path / "run"
    fields = _fields(tiny_model_dir, small_data, run, steps=3, save_every=2)
    args = ["train"] + as_options(fields)
    weights = (tiny_model_dir / "model.safetensors").stat().st_size
    # the weights fit; Adam's two moments (a file twice their size, from step 1 on) do not: step 0's checkpoint is
    # written, step 2's is refused
    script = tmp_path / "limited.py"
    script.write_text(FILE_SIZE_LIMIT.format(limit=weights * 3 // 2))
    env = {**os.environ, "PYTHONPATH": str(SRC), "STOCKFISH_PATH": stockfish_path}
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    err = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr and err[-2].startswith(
        f"error: cannot write {run}/checkpoints/step_000002: ") and "File too large" in err[-2], err[-3:]
    assert err[-2].endswith("; nothing was written under that name")
    assert err[-1] == f"once there is room, the same command with --resume continues from {run}/checkpoints/step_000000"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000000"]  # no half-written copy
    assert ckpt.load_state(ckpt.latest_checkpoint(run))["step"] == 0
    umask = os.umask(0)
    os.umask(umask)
    saved = run / "checkpoints" / "step_000000"
    assert saved.stat().st_mode & 0o777 == 0o777 & ~umask
    assert all(p.stat().st_mode & 0o777 == 0o666 & ~umask for p in saved.iterdir())
    asked = subprocess.run([sys.executable, str(script), *args, "--resume", "true", "--traceback"], capture_output=True,
                           text=True, env=env, timeout=300)  # --traceback: the traceback, as for any other error
    assert asked.returncode == 1 and "Traceback" in asked.stderr and "SaveError: cannot write" in asked.stderr

    again = subprocess.run([sys.executable, "-m", "rookworld_rlvr", *args, "--resume", "true"], capture_output=True,
                           text=True, env=env, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from {saved} at step 0" in again.stdout
    assert [r["step"] for r in _records(run)] == [1, 2, 3] and (run / "final" / "model.safetensors").exists()


def test_a_device_out_of_memory_is_one_line_naming_what_needs_less_and_resume_goes_on(
        tmp_path, tiny_model_dir, small_data, stockfish_path, monkeypatch, capsys):
    """A device out of memory mid-run (torch's OutOfMemoryError, injected in step 3's policy pass as CUDA raises it)
    ended `rookworld train` in a traceback; now one line: torch's figures, the settings that bound the memory, and
    the checkpoint `--resume` continues from. Resumed with a smaller minibatch_size, the run ends."""
    from rookworld_rlvr.cli import main
    from rookworld_rlvr.grpo import trainer as trainer_module

    monkeypatch.setenv("STOCKFISH_PATH", stockfish_path)
    run = tmp_path / "run"
    args = ["train"] + as_options(_fields(tiny_model_dir, small_data, run, steps=4, save_every=2))
    real, steps = trainer_module.policy_pass, []

    def short_of_memory(*a, **k):
        steps.append(1)
        if len(steps) == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
                                         "of 79.11 GiB of which 1.06 GiB is free. Process 7 has 78.04 GiB memory in "
                                         "use. Of the allocated memory 77.50 GiB is allocated by PyTorch")
        return real(*a, **k)

    monkeypatch.setattr(trainer_module, "policy_pass", short_of_memory)
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "no --config" in err.splitlines()[0]  # the note on a run without a preset
    *_, line = err.strip().splitlines()
    assert line == ("error: out of memory (CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
                    "of 79.11 GiB of which 1.06 GiB is free): a smaller minibatch_size needs less (completions a "
                    "forward and backward take at once: now 0, all 8), as does eval_batch_size (a held-out "
                    "evaluation's prompts at once: now 64); the same command with --resume "
                    f"continues from {run}/checkpoints/step_000002"), line
    monkeypatch.setattr(trainer_module, "policy_pass", real)
    assert main(args + ["--resume", "true", "--minibatch-size", "4"]) == 0
    assert [r["step"] for r in _records(run)] == [1, 2, 3, 4] and (run / "final" / "model.safetensors").exists()


@pytest.mark.slow(seconds=10)
def test_trainer_killed_while_saving_resumes_from_last_complete_checkpoint(tmp_path, tiny_model_dir, small_data):
    from transformers import AutoModelForCausalLM

    script = tmp_path / "train_slow_save.py"
    script.write_text(_SCRIPT.format(tests=str(Path(__file__).parent)))
    over = {"tmp": str(tmp_path), "model": str(tiny_model_dir), "data": str(small_data), "steps": 3, "keep_last": 3}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(SRC), "TOKENIZERS_PARALLELISM": "false"}
    stderr = open(tmp_path / "child.stderr", "w")
    proc = subprocess.Popen([sys.executable, str(script), json.dumps(over)], stdout=subprocess.PIPE, stderr=stderr,
                            text=True, env=env)
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line.strip())
            if line.strip() == "SAVING step 2":
                os.kill(proc.pid, signal.SIGKILL)
                break
    finally:
        watchdog.cancel()
        rc = proc.wait(30)
        stderr.close()
    assert seen[-1:] == ["SAVING step 2"], (seen, (tmp_path / "child.stderr").read_text()[-2000:])
    assert "FINISHED" not in seen and rc == -signal.SIGKILL

    run = tmp_path / "run"
    found = ckpt.list_checkpoints(run)
    assert [s for s, _ in found] == [0, 1]
    for step, path in found:
        assert all((path / name).exists() for name in ckpt.STATE_FILES)
        assert ckpt.load_state(path)["step"] == step
        AutoModelForCausalLM.from_pretrained(path)
    assert not (run / "checkpoints" / "step_000002").exists()
    partial = list((run / "checkpoints").glob(".step_000002.tmp-*"))
    assert len(partial) == 1, "the kill must have hit the save of step 2"
    half = partial[0] / ckpt.STATE_FILES[0]
    assert half.exists() and half.stat().st_size < (found[-1][1] / ckpt.STATE_FILES[0]).stat().st_size
    assert ckpt.latest_checkpoint(run) == found[-1][1]
    killed_records = _records(run)
    assert [r["step"] for r in killed_records] == [1, 2]

    logs: list[str] = []
    resumed = make(tmp_path, tiny_model_dir, small_data, steps=3, keep_last=3, resume=True, log=logs.append)
    assert resumed.step == 1 and any("resumed from" in x and "step_000001" in x for x in logs)
    summary = resumed.train()
    assert summary["steps"] == 3 and resumed.step == 3
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [1, 2, 3]
    assert not list((run / "checkpoints").glob(".step_*.tmp-*")), "the half-written save is cleaned up"
    assert (run / "final" / "model.safetensors").exists()
    for _, path in ckpt.list_checkpoints(run):
        AutoModelForCausalLM.from_pretrained(path)
    # the resumed run redoes step 2 exactly as the killed run did it (the RNG states come from step_000001)
    redone = [r for r in _records(run) if r["step"] == 2][-1]
    assert [r["step"] for r in _records(run)][-2:] == [2, 3]
    assert redone["reward/mean"] == killed_records[1]["reward/mean"]
    assert redone["completion_len/mean"] == killed_records[1]["completion_len/mean"]
    assert abs(redone["loss"] - killed_records[1]["loss"]) < 1e-5


# -- 3b. a checkpoint someone handed you -------------------------------------------------------------------


def _bait(marker: Path, binary: bool = True) -> bytes:
    """A pickle that runs `touch marker` when unpickled (os.system): what a malicious state file carries."""
    body = b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."
    return (b"\x80\x04" + body) if binary else body


def test_the_bait_is_live(tmp_path):
    """The crafted files below really execute code when unpickled, so their tests have teeth."""
    import pickle

    marker = tmp_path / "pwned"
    for binary in (True, False):
        pickle.loads(_bait(marker, binary))
        assert marker.exists()
        marker.unlink()


def test_a_crafted_checkpoint_cannot_run_code_and_a_bad_state_file_is_named(tmp_path, tiny_model_dir, small_data):
    """Resume reads the trainer state as safetensors + JSON: a pickle planted where the old state
    file lived is never opened, and a pickle (or garbage, or nothing) in place of the state is an
    error naming the file. Nothing is executed either way."""
    make(tmp_path, tiny_model_dir, small_data, steps=1).train()
    run = tmp_path / "run"
    latest = ckpt.latest_checkpoint(run)
    assert latest.name == "step_000001" and sorted(ckpt.STATE_FILES) == sorted(
        p.name for p in latest.iterdir() if p.name.startswith("trainer_state"))
    marker = tmp_path / "pwned"
    (latest / ckpt.LEGACY_STATE_FILE).write_bytes(_bait(marker))  # where older versions kept their pickle
    resumed = make(tmp_path, tiny_model_dir, small_data, steps=2, resume=True)
    assert resumed.step == 1 and not marker.exists()

    good = {name: (latest / name).read_bytes() for name in ckpt.STATE_FILES}
    tensors, tree = (latest / name for name in ckpt.STATE_FILES)
    cases = [
        (tensors, _bait(marker), "not a complete safetensors state"),  # a pickle as the state
        (tree, _bait(marker, binary=False), "not a state file"),  # a text pickle as the JSON
        (tree, good[tree.name][: len(good[tree.name]) // 2], "not a state file"),  # cut short
        (tree, b'{"step": 1, "optimizer": {"__tensor__": "nowhere"}}',
         "field 'optimizer' names a tensor 'nowhere' that the tensors file does not hold"),
        (tree, b'[1, 2]', "not a trainer state"),
        (tree, None, "missing"),
    ]
    for path, content, why in cases:
        if content is None:
            path.unlink()
        else:
            path.write_bytes(content)
        with pytest.raises(ValueError, match=why) as info:
            make(tmp_path, tiny_model_dir, small_data, steps=2, resume=True)
        assert str(path) in str(info.value), info.value
        assert not marker.exists()
        path.write_bytes(good[path.name])

    for name in ckpt.STATE_FILES:  # only the old pickle is left: refused by name, not skipped silently
        (latest / name).unlink()
    with pytest.raises(ValueError, match="missing.*pickled trainer state.*never loaded") as info:
        make(tmp_path, tiny_model_dir, small_data, steps=2, resume=True)
    assert str(latest / ckpt.LEGACY_STATE_FILE) in str(info.value) and not marker.exists()


# -- 4. malformed data lines -------------------------------------------------------------------------------


def _bad_file(small_data, path: Path) -> tuple[Path, list[int], int]:
    """The training file with malformed lines spliced in; returns (path, bad line numbers, good count)."""
    good = [line.encode() for line in (small_data / "train.jsonl").read_text().splitlines()]
    row = json.loads(good[0])
    broken = {
        3: b'{"task": "P", "truth": {"fen": ',                                    # truncated JSON
        7: json.dumps({**row, "task": "X"}).encode(),                             # unknown task
        12: json.dumps({**row, "truth": {k: v for k, v in row["truth"].items() if k != "moves"}}).encode(),  # no moves
        20: json.dumps({**row, "prompt": "P: 8/8/8/8/8/8/8/8 w - - 0 1 "}).encode(),  # prompt disagrees with truth
        25: b'{"task": "A", "truth": \xff\xfe\x00 garbage}',                       # bytes that are not UTF-8
    }
    lines, src = [], iter(good)
    for lineno in range(1, len(good) + len(broken) + 1):
        lines.append(broken[lineno] if lineno in broken else next(src))
    data = b"\n".join(lines) + b"\n"
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path, sorted(broken), len(good)


@pytest.mark.parametrize("name", ["bad.jsonl", "bad.jsonl.gz"])
def test_malformed_lines_fail_dry_run_and_build_with_file_line(tmp_path, tiny_model_dir, small_data, capsys, name):
    from rookworld_rlvr.cli import main
    from rookworld_rlvr.data.io import ReadReport
    from rookworld_rlvr.grpo.cli import build

    bad, bad_lines, n_good = _bad_file(small_data, tmp_path / name)
    report = ReadReport()
    assert len(read_samples(bad, skip_invalid=True, report=report)) == n_good
    assert report.invalid == len(bad_lines)
    assert [e.split(": ")[0] for e in report.errors] == [f"{bad}:{n}" for n in bad_lines], report.errors
    assert report.errors[-1] == f"{bad}:25: not valid UTF-8 text"
    common = ["--model", str(tiny_model_dir), "--eval-data", "", "--output-dir", str(tmp_path / "run"),
              "--engine-cache", "null"]

    assert main(["train", "--dry-run", "--data", str(bad), *common]) == 1
    out = capsys.readouterr()
    text = out.out + out.err
    assert f"{bad}:{bad_lines[0]}:" in text and f"{len(bad_lines)} malformed lines" in text, text
    assert "dry run: ok" not in text

    assert main(["train", "--dry-run", "--data", str(bad), "--skip-invalid", *common]) == 0
    text = capsys.readouterr().out
    assert f"malformed={len(bad_lines)}" in text and "dry run: ok" in text, text

    assert main(["train", "--data", str(bad), *common]) == 1  # a real run stops before loading anything
    err = capsys.readouterr().err
    assert f"error: {bad}:{bad_lines[0]}:" in err, err

    fields = _fields(tiny_model_dir, small_data, tmp_path / "run", data=str(bad))
    with pytest.raises(DataError, match=f"^{re.escape(str(bad))}:{bad_lines[0]}: "):
        build(load_config(None, fields))

    logs: list[str] = []
    trainer, pool = build(load_config(None, {**fields, "skip_invalid": True}), log=logs.append)
    try:
        assert any(x.startswith("host memory: freed blocks are kept") for x in logs), logs  # CPU: see hostmem
        skipped = [x for x in logs if "skipped" in x]
        assert len(skipped) == 1 and f"skipped {len(bad_lines)} invalid lines" in skipped[0], logs
        assert f"{bad}:{bad_lines[0]}:" in skipped[0]
        assert sum(len(v) for v in trainer.prompts.pools.values()) == n_good
    finally:
        pool.close()


def test_malformed_lines_of_the_anchors_data_stop_build_with_file_line(tmp_path, tiny_model_dir, small_data):
    from rookworld_rlvr.grpo.cli import build

    bad, bad_lines, n_good = _bad_file(small_data, tmp_path / "anchor.jsonl")
    fields = _fields(tiny_model_dir, small_data, tmp_path / "run", anchor_data=str(bad), anchor_coef=1.0,
                     anchor_tasks="PA", anchor_batch=4)
    with pytest.raises(DataError, match=f"^{re.escape(str(bad))}:{bad_lines[0]}: "):
        build(load_config(None, fields))
    logs: list[str] = []
    trainer, pool = build(load_config(None, {**fields, "skip_invalid": True}), log=logs.append)
    pool.close()
    skipped = [x for x in logs if "skipped" in x]
    assert len(skipped) == 1 and skipped[0].startswith(f"anchor_data: skipped {len(bad_lines)} invalid lines of {bad}")
    assert sum(len(v) for v in trainer.anchor.sampler.pools.values()) == n_good


# -- 5. collapse: a fault that does not make a NaN -----------------------------------------------------------
# The shipped 4.85M chess model, real data rows, the real chess reward and Stockfish. Each fault is
# transient (it stops once the guard has recovered), and the recovery factor is 1, so a recovered run
# must end exactly as the run that never saw the fault: same records, same weights, bit for bit.

SHIPPED = Path(__file__).resolve().parents[1] / "models" / "rookworld-board"
FAULT_STEP = 4  # the 5th step: 4 healthy records first, more than the guard's 3 of history


@pytest.fixture(scope="module")
def chess_reward():
    with StockfishPool(EngineConfig(path=find_stockfish(), depth=6, workers=1)) as pool:
        yield RewardScorer(engine=pool)


def _collapse_run(tmp_path, small_data, scorer, fault=None, **over):
    fields = dict(model=str(SHIPPED), data=str(small_data / "train.jsonl"), eval_data="", output_dir=str(tmp_path / "run"),
                  steps=8, batch_positions=2, group_size=4, mix_env_ratio=0.0, lr=1e-5, warmup_steps=0,
                  task_sampling={"P": {"temperature": 0.8, "max_new_tokens": 80}}, save_every=100, seed=3,
                  tensorboard=False, progress=False, report=False, engine_cache=None, device="cpu", threads=1,
                  backward_dtype="float32", guard_snapshot_every=1, rollback_lr_factor=1.0,
                  # 8 samples a step: a healthy step's reward mean moves by up to ~0.15 and one malformed
                  # answer costs 1/8 of the valid share, so these bounds sit well above that noise and well
                  # below what each fault does (reward -0.3 or lower, valid 0, truncation 1)
                  guard_reward_drop=0.3, guard_valid_drop=0.5, guard_truncation_rise=0.5)
    fields.update(over)
    cfg = load_config(None, fields)
    holder = {}

    def reward(prompts, completions, truths, weights):
        results = scorer.score_batch(prompts, completions, truths, weights)
        tr = holder["tr"]
        if fault == "format" and tr.step >= FAULT_STEP and tr.guard.recoveries == 0:  # pays text that does not parse
            for r in results:
                r.total = 1.0 if r.components.get("format", 0.0) == 0.0 else -1.0
        return results

    tr = Trainer(cfg, reward, read_samples(cfg.data), None, log=lambda *_: None)
    holder["tr"] = tr
    return tr


def _inject(monkeypatch, tr, fault):
    import rookworld_rlvr.grpo.rollout as rollout_mod
    import rookworld_rlvr.grpo.trainer as trainer_mod

    if fault == "lr":  # one update at 3000 x the learning rate
        real_lr = trainer_mod.cosine_lr
        monkeypatch.setattr(trainer_mod, "cosine_lr", lambda step, *a: real_lr(step, *a) * (
            3000.0 if step == FAULT_STEP and tr.guard.recoveries == 0 else 1.0))
    if fault == "temperature":  # the sampler runs at 3 x the temperature for two steps (the trainer does not know)
        real_gen = rollout_mod.generate

        def hot(*a, **k):
            if tr.step in (FAULT_STEP, FAULT_STEP + 1) and tr.guard.recoveries == 0:
                k["temperature"] = [3 * t for t in k["temperature"]]
            return real_gen(*a, **k)

        monkeypatch.setattr(rollout_mod, "generate", hot)


def _comparable(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "guard/"))} for r in _records(run_dir)]


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory, worker_id, small_data, chess_reward):
    """The run without a fault: its records and final weights, built once by whichever worker asks first. Every
    worker that compares a run with it trains on one thread, as it was trained."""
    from safetensors.torch import load_file, save_file

    def build(tmp: Path) -> None:
        tr = _collapse_run(tmp, small_data, chess_reward)
        tr.train()
        assert not (tmp / "run" / "events.jsonl").exists() and tr.guard.recoveries == 0, "the healthy run must not trip"
        save_file({str(i): p for i, p in enumerate(_snapshot(tr.policy))}, tmp / "weights.safetensors")

    torch.set_num_threads(1)
    tmp = built_once(tmp_path_factory, worker_id, "fault_free", build)
    weights = load_file(tmp / "weights.safetensors")
    return _comparable(tmp / "run"), [weights[str(i)] for i in range(len(weights))]


# first bad record: the reward and the sampler act on the samples of step FAULT_STEP (record FAULT_STEP + 1);
# the spiked update of step FAULT_STEP shows in the samples of the next step. The expected signals are those
# this fault moves on the shipped base: its sampled P: answers repeat a move, so their well-formed share is
# already 0 and cannot fall (the valid/P signal is tested on records in test_options and test_control).
@pytest.mark.parametrize("fault,first,expected", [
    ("format", FAULT_STEP + 1, {"reward/P"}),
    ("temperature", FAULT_STEP + 1, {"reward/P"}),
    ("lr", FAULT_STEP + 2, {"kl_mean", "kl_seq_max", "truncation_rate", "reward/P"}),
])
@pytest.mark.slow
def test_a_collapse_is_caught_within_a_few_steps_and_undone(tmp_path, small_data, chess_reward, fault_free, monkeypatch,
                                                            fault, first, expected):
    tr = _collapse_run(tmp_path, small_data, chess_reward, fault)
    _inject(monkeypatch, tr, fault)
    summary = tr.train()
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert len(events) == 1, events
    ev = events[0]
    # two out-of-bounds records in a row act (guard_patience 2); the state before the first one's samples is good
    assert ev["action"] == "recover" and (ev["first_step"], ev["step"], ev["to_step"]) == (first, first + 1, first - 2), ev
    assert {ev["signal"], *ev["also"]} == expected, ev  # every signal this fault moves saw it
    assert summary["guard"] == {"recoveries": 1, "nan_rollbacks": 0, "events": 1}
    records, weights = fault_free
    assert _comparable(tmp_path / "run") == records  # the recovered run is the run without the fault ...
    assert _same(_snapshot(tr.policy), weights)  # ... to the last bit


@pytest.mark.slow(seconds=18)
def test_a_held_out_drop_rolls_back_to_the_best_evaluation(tmp_path, small_data, chess_reward, fault_free, monkeypatch):
    from rookworld_rlvr.evaluate import EvalConfig, evaluate

    held_out = [s for s in read_samples(small_data / "eval.jsonl") if s.task == "P"][:8]
    tr = _collapse_run(tmp_path, small_data, chess_reward, "lr", eval_every=1, guard_eval_drop=0.2)
    tr.eval_fn = lambda model, tok: evaluate(model, tok, held_out, config=EvalConfig(max_new_tokens=80),
                                             scorer=chess_reward)
    _inject(monkeypatch, tr, "lr")
    tr.train()
    (ev,) = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    # the spiked update is step FAULT_STEP + 1; the evaluation right after it catches it, before any sample does
    assert (ev["signal"], ev["step"], ev["action"]) == ("eval", FAULT_STEP + 1, "recover"), ev
    assert ev["value"] < ev["reference"] - 0.2 and ev["to_step"] <= FAULT_STEP
    # the bound is the least drop or two standard errors of the change paired over the 8 rows, whichever is wider
    assert ev["noise"] > 0 and ev["bound"] == pytest.approx(ev["reference"] - max(0.2, 2 * ev["noise"]))
    assert "paired standard error" in ev["message"]
    evals = [json.loads(x) for x in (tmp_path / "run" / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == list(range(9))  # the bad evaluation is gone with the steps it judged
    records, weights = fault_free
    assert _comparable(tmp_path / "run") == records and _same(_snapshot(tr.policy), weights)


@pytest.mark.slow
def test_repeated_collapse_stops_with_the_signal_value_and_knob(tmp_path, small_data, chess_reward, monkeypatch):
    """A fault that comes back after every recovery: the guard stops after guard_max_recoveries."""
    import rookworld_rlvr.grpo.trainer as trainer_mod

    tr = _collapse_run(tmp_path, small_data, chess_reward, guard_max_recoveries=1, rollback_lr_factor=0.5)
    real_lr = trainer_mod.cosine_lr
    monkeypatch.setattr(trainer_mod, "cosine_lr", lambda step, *a: real_lr(step, *a) * (3000.0 if step == FAULT_STEP else 1))
    with pytest.raises(TrainingStopped, match=r"collapse guard: kl_mean [\d.]+ crossed 0.5 .* after 1/1 recoveries\. "
                                              r".*lower lr.*guard_kl_mean"):
        tr.train()
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert [(e["action"], e["signal"]) for e in events] == [("recover", "kl_mean"), ("stop", "kl_mean")]
    assert events[0]["lr_scale"] == 0.5  # the second try ran at half the learning rate
    assert not (tmp_path / "run" / "final").exists(), "a stopped run does not save its collapsed model as final"


@pytest.mark.parametrize("stop_at", [6, 7], ids=["before-the-rollback", "after-the-rollback"])
def test_a_guarded_run_resumed_mid_collapse_equals_the_straight_run(tmp_path, tiny_model_dir, small_data, stop_at):
    """Exact under resume: the guard's histories, counts and rollback targets come back with the
    checkpoint (in-memory states older than a checkpoint are dropped in the straight run as well).
    Killed after the rollback too, before the next checkpoint: the resume redoes the collapse and its
    rollback, and events.jsonl holds each event once, as the straight run's."""
    class Killed(Exception):
        pass

    def run(path, stop_at=None, resume=False):
        holder = {}

        def reward(prompts, completions, truths, weights):
            tr = holder["tr"]
            if tr.step in (5, 6) and tr.guard.recoveries == 0:  # a transient reward fault
                return [_Result(-1.0) for _ in completions]
            return varied_reward(prompts, completions, truths, weights)

        tr = make(path, tiny_model_dir, small_data, reward_fn=reward, steps=10, save_every=4, guard_snapshot_every=1,
                  resume=resume)
        holder["tr"] = tr

        def writer(rec):
            if rec["step"] == stop_at:
                raise Killed

        try:
            tr.train(writer=writer)
        except Killed:
            pass
        return tr

    straight = run(tmp_path / "a")
    killed = run(tmp_path / "b", stop_at=stop_at)  # at the first bad record, or at step 7 after the rollback to 4
    assert killed.guard.recoveries == (stop_at == 7) and ckpt.latest_checkpoint(tmp_path / "b" / "run").name.endswith("4")
    resumed = run(tmp_path / "b", resume=True)
    assert resumed.guard.recoveries == straight.guard.recoveries == 1
    ea = [json.loads(x) for x in (tmp_path / "a" / "run" / "events.jsonl").read_text().splitlines()]
    eb = [json.loads(x) for x in (tmp_path / "b" / "run" / "events.jsonl").read_text().splitlines()]
    assert ea == eb and ea[0]["to_step"] == 4
    strip = lambda rs: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rs]  # noqa: E731
    assert strip(_records(tmp_path / "b" / "run")) == strip(_records(tmp_path / "a" / "run"))
    assert _same(_snapshot(resumed.policy), _snapshot(straight.policy))
