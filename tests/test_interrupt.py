"""Ctrl-C, SIGTERM (a scheduler, a timeout, torchrun passing its own on) and SIGHUP (a closed terminal) end a run
at the next step boundary with a checkpoint there, so --resume continues from that step and ends where the
uninterrupted run ends; a second Ctrl-C or SIGTERM stops at once. Real signals, sent to this process."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import as_options
from rookworld_rlvr.config import load_config
from rookworld_rlvr.data.io import read_samples
from rookworld_rlvr.grpo import checkpoint as ckpt
from rookworld_rlvr.grpo.trainer import Trainer
from rookworld_rlvr.interrupt import Interrupted, StopOnSignal, chunk_size, forked_pool, pool_size
from rookworld_rlvr.sft import SFTConfig, train as sft_train
from test_faults import _fields, _records, varied_reward


# a fresh model's `tiny` preset at a small shape here (conftest: small_tiny_preset)
pytestmark = pytest.mark.usefixtures("small_tiny_preset")


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handler (KeyboardInterrupt), whatever the test runner set (xdist's workers ignore it)."""
    found = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, found)


def test_the_first_signal_asks_the_second_stops_at_once_and_the_handlers_come_back(python_sigint):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ignored where the job started (nohup, `&`): it stays ignored
    with StopOnSignal(verbose=False) as stop:
        stop.arm()
        signal.raise_signal(signal.SIGINT)
    assert stop.asked is None and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    signal.signal(signal.SIGINT, signal.default_int_handler)
    before = {s: signal.getsignal(s) for s in StopOnSignal.SIGNALS}
    with pytest.raises(KeyboardInterrupt), StopOnSignal(verbose=False) as stop:
        # not armed yet (reading data, before the first step): no handler of its own, so the workers a data read
        # forks take SIGTERM's default action even in their first instant (a Python handler loses it there)
        assert {s: signal.getsignal(s) for s in StopOnSignal.SIGNALS} == before
        signal.raise_signal(signal.SIGINT)
    assert stop.asked is None and {s: signal.getsignal(s) for s in StopOnSignal.SIGNALS} == before
    with StopOnSignal(verbose=False) as stop:
        stop.arm()  # the job's first step
        pid = os.fork()
        if pid == 0:  # a forked worker inherits the handler, not the job: SIGTERM ends it as before
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.asked == signal.SIGTERM  # asked, nothing raised: the job decides where to stop
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)  # the second: the handler found on entry (Python's: KeyboardInterrupt)
    assert {s: signal.getsignal(s) for s in StopOnSignal.SIGNALS} == before
    assert Interrupted(signal.SIGINT, 7).exit_code == 130 and "stopped at step 7 on SIGINT" in str(Interrupted(2, 7))


def _sigterm_action(_) -> str:
    return str(signal.getsignal(signal.SIGTERM))


def test_pool_workers_start_with_sigterms_default_action_whatever_handler_the_parent_has():
    """A worker forked under a Python SIGTERM handler (the sweep's; an armed StopOnSignal) loses a SIGTERM that
    comes in its first instant, and Pool.terminate() at the end of a `with` block sends one to workers that may
    have just been forked: one that lost it waited forever for its pool's lock. Their action is the default."""
    def handler(signum, frame):
        pass

    found = signal.signal(signal.SIGTERM, handler)
    try:
        with forked_pool(2) as pool:
            seen = pool.map(_sigterm_action, range(4))
        assert signal.getsignal(signal.SIGTERM) is handler  # the parent's own, back
    finally:
        signal.signal(signal.SIGTERM, found)
    assert seen == [str(signal.SIG_DFL)] * 4


def test_a_pools_default_size_is_the_cores_this_process_may_use_not_the_machines():
    """A GPU machine's data preparation runs pinned to some of its cores (taskset, beside SFT): its pools take
    those cores, not the machine's count; at most the cap. Run in a child, pinned to one core."""
    code = ("import os; from rookworld_rlvr.interrupt import pool_size; "
            "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); print(pool_size(), pool_size(cap=1))")
    pinned = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert pinned == ["1", "1"]
    cores = len(os.sched_getaffinity(0))
    assert pool_size() == min(16, cores) and pool_size(cap=1) == 1


@pytest.mark.parametrize("n,workers,size", [(100, 2, 13), (96, 2, 12), (7, 16, 1), (0, 4, 1)])
def test_work_shared_among_a_pool_comes_in_about_four_chunks_a_worker_and_never_in_empty_ones(n, workers, size):
    assert chunk_size(n, workers) == size
    assert -(-n // size) <= workers * 4  # ceil(n / size) chunks: every item in one

def test_a_signal_mid_step_stops_grpo_after_that_step_saved_and_resume_ends_as_the_straight_run(
        tmp_path, tiny_model_dir, small_data):
    """SIGTERM while step 3 scores its rewards: the step finishes, a checkpoint of step 3 is written (the
    periodic ones come every 4), the run raises Interrupted; --resume runs steps 4-6 and ends with the straight
    run's weights and log records."""
    def trainer(path, reward=varied_reward, resume=False):
        cfg = load_config(None, _fields(tiny_model_dir, small_data, path / "run", steps=6, save_every=4,
                                        resume=resume))
        return Trainer(cfg, reward, read_samples(cfg.data), None, log=lambda *_: None)

    straight = trainer(tmp_path / "a")
    straight.train()

    def reward(prompts, completions, truths, weights):
        if stopped.step == 2:  # step 3's rewards
            os.kill(os.getpid(), signal.SIGTERM)
        return varied_reward(prompts, completions, truths, weights)

    stopped = trainer(tmp_path / "b", reward)
    with pytest.raises(Interrupted) as e, StopOnSignal(verbose=False) as stopped.stop:
        stopped.train()
    assert e.value.step == 3 and e.value.signum == signal.SIGTERM and e.value.exit_code == 143
    assert ckpt.latest_checkpoint(tmp_path / "b" / "run") == ckpt.checkpoint_dir(tmp_path / "b" / "run", 3)
    assert [r["step"] for r in _records(tmp_path / "b" / "run")] == [1, 2, 3]
    resumed = trainer(tmp_path / "b", resume=True)
    with StopOnSignal(verbose=False) as resumed.stop:
        resumed.train()
    strip = lambda rs: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rs]  # noqa: E731
    assert strip(_records(tmp_path / "b" / "run")) == strip(_records(tmp_path / "a" / "run"))
    assert all(torch.equal(p, q)
               for p, q in zip(resumed.policy.parameters(), straight.policy.parameters(), strict=True))


@pytest.mark.parametrize("fault", ["signal", "crash"])
def test_a_signal_or_crash_during_an_evaluation_loses_no_step_and_resume_evaluates_first(
        tmp_path, tiny_model_dir, small_data, fault):
    """Evaluations at steps 2, 4 and 5 (eval_every 2, the end), periodic checkpoints never (save_every 100).
    SIGTERM during step 4's evaluation stops the run there at once, not when the evaluation ends; a crash
    there ends it. Either way the checkpoint of step 4 is on disk, saying its evaluation is owed; --resume
    evaluates step 4 first and ends with the straight run's weights, log records and evaluations."""
    def eval_fn(model, tokenizer):  # a score of the weights: an evaluation of other weights would differ
        if signal_at == tr.step:
            if fault == "signal":
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(60)  # an evaluation minutes long: the signal must not wait for its end
                raise AssertionError("the signal waited for the evaluation")
            raise RuntimeError("the evaluation crashed")
        score = float(sum(p.detach().double().sum() for p in model.parameters()))
        return {"policy": {"n": 1, "mean_reward": score}, "environment": {"n": 0}}

    def trainer(path, resume=False):
        cfg = load_config(None, _fields(tiny_model_dir, small_data, path / "run", steps=5, save_every=100,
                                        eval_every=2, eval_data="x", resume=resume))
        return Trainer(cfg, varied_reward, read_samples(cfg.data), eval_fn, log=lambda *_: None)

    def evals(path):
        return [{k: v for k, v in json.loads(x).items() if k != "seconds"}
                for x in (path / "run" / "eval.jsonl").read_text().splitlines()]

    signal_at = None
    tr = straight = trainer(tmp_path / "a")
    straight.train()
    assert [e["step"] for e in evals(tmp_path / "a")] == [0, 2, 4, 5]
    assert ckpt.load_state(ckpt.checkpoint_dir(tmp_path / "a" / "run", 2))["eval_owed"] is False  # saved after it

    signal_at, tr = 4, trainer(tmp_path / "b")
    t0 = time.time()
    with pytest.raises(Interrupted if fault == "signal" else RuntimeError) as e, \
            StopOnSignal(verbose=False) as tr.stop:
        tr.train()
    assert time.time() - t0 < 50  # 5 tiny steps and 3 evaluations; the stopped one would have slept 60 s
    if fault == "signal":
        assert e.value.step == 4 and e.value.exit_code == 143
    run = tmp_path / "b" / "run"
    assert ckpt.latest_checkpoint(run) == ckpt.checkpoint_dir(run, 4)
    assert ckpt.load_state(ckpt.checkpoint_dir(run, 4))["eval_owed"] is True
    assert [e["step"] for e in evals(tmp_path / "b")] == [0, 2]
    signal_at, tr = None, trainer(tmp_path / "b", resume=True)
    with StopOnSignal(verbose=False) as tr.stop:
        tr.train()
    strip = lambda rs: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rs]  # noqa: E731
    assert strip(_records(run)) == strip(_records(tmp_path / "a" / "run"))
    assert evals(tmp_path / "b") == evals(tmp_path / "a")
    assert all(torch.equal(p, q) for p, q in zip(tr.policy.parameters(), straight.policy.parameters(), strict=True))


@pytest.mark.parametrize("stop_at", [2, 0], ids=["signal-at-step-2", "kill-in-base-evaluation"])
def test_an_evaluation_stopped_part_way_keeps_its_completed_batches_and_the_resume_ends_as_the_straight_run(
        tmp_path, tiny_model_dir, small_data, stockfish_path, monkeypatch, stop_at):
    """The real held-out evaluation (4 prompts a batch), stopped as its fourth batch starts: at step 2 by SIGTERM,
    or the base evaluation (before any checkpoint, when no handler is armed yet) by a kill, simulated by an
    exception. The three batches it completed are on disk (model.journal); --resume (from step 2's checkpoint, or
    starting over without one) completes only the others and ends with the straight run's evaluations, log records
    and weights; the journal goes once the evaluation returns."""
    import rookworld_rlvr.model.completions as completions
    from rookworld_rlvr.evaluate import EvalConfig, evaluate
    from rookworld_rlvr.model.journal import NAME
    from rookworld_rlvr.tasks.rewards import RewardScorer

    samples = read_samples(small_data / "eval.jsonl")

    def eval_fn(model, tokenizer, journal=None):
        return evaluate(model, tokenizer, samples, config=EvalConfig(batch_size=4, max_new_tokens=24),
                        scorer=RewardScorer(), journal=journal)

    real, batches = completions.generate, []

    def generate(*args, **kwargs):  # the fault, as the evaluation's fourth batch starts
        batches.append(tr.step)
        if fault and tr.step == stop_at and batches.count(stop_at) == 4:
            if stop_at == 0:
                raise RuntimeError("killed")
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(completions, "generate", generate)

    def trainer(path, resume=False):
        cfg = load_config(None, _fields(tiny_model_dir, small_data, path / "run", steps=3, save_every=100,
                                        eval_every=2, eval_data="x", resume=resume))
        return Trainer(cfg, varied_reward, read_samples(cfg.data), eval_fn, log=lambda *_: None)

    def evals(path):
        out = [json.loads(x) for x in (path / "run" / "eval.jsonl").read_text().splitlines()]
        for e in out:
            e.pop("seconds"), e["meta"].pop("seconds")
        return out

    fault, tr = False, trainer(tmp_path / "a")
    tr.train()
    straight, whole = tr, batches.count(stop_at)
    assert whole == 10 and [e["step"] for e in evals(tmp_path / "a")] == [0, 2, 3]  # 20 P: + 20 A:, 4 a batch

    batches.clear()
    fault, tr = True, trainer(tmp_path / "b")
    with pytest.raises(Interrupted if stop_at else RuntimeError), StopOnSignal(verbose=False) as tr.stop:
        tr.train()
    run = tmp_path / "b" / "run"
    lines = (run / NAME).read_text().splitlines()
    header = json.loads(lines[0])
    assert header["step"] == stop_at and len(lines) == 1 + 3
    assert set(header) == {"step", "weights", "dtype", "device", "arithmetic", "torch"}
    batches.clear()
    fault, tr = False, trainer(tmp_path / "b", resume=True)
    with StopOnSignal(verbose=False) as tr.stop:
        tr.train()
    assert batches.count(stop_at) == whole - 3 and not (run / NAME).exists()
    strip = lambda rs: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rs]  # noqa: E731
    assert evals(tmp_path / "b") == evals(tmp_path / "a")
    assert strip(_records(run)) == strip(_records(tmp_path / "a" / "run"))
    assert all(torch.equal(p, q) for p, q in zip(tr.policy.parameters(), straight.policy.parameters(), strict=True))


def test_a_journal_drops_a_line_cut_by_a_kill_and_serves_only_its_own_weights_and_step(tmp_path, tiny_model_dir):
    from rookworld_rlvr.model import journal
    from rookworld_rlvr.model.load import load_policy

    model, _ = load_policy(str(tiny_model_dir), device="cpu")
    header = journal.identity(model, step=4)
    assert header == journal.identity(load_policy(str(tiny_model_dir), device="cpu")[0], step=4)  # loaded again
    changed, _ = load_policy(str(tiny_model_dir), device="cpu")
    with torch.no_grad():  # one weight one step away in float32
        w = next(changed.parameters()).view(-1)
        w[0] = torch.nextafter(w[0], w[0] + 1)
    threads = torch.get_num_threads()
    try:  # another thread count sums products in another order: its answers are not these
        torch.set_num_threads(threads + 1)
        other_threads = journal.identity(model, step=4)  # (before the bf16 copy below: it converts in place)
    finally:
        torch.set_num_threads(threads)
    assert other_threads["arithmetic"].endswith(f", {threads + 1} threads")
    assert {**other_threads, "arithmetic": header["arithmetic"]} == header  # only the arithmetic differs
    others = [journal.identity(changed, step=4), journal.identity(model, step=5),
              journal.identity(model.to(torch.bfloat16), step=4), {**header, "torch": "2.0.0"}, other_threads]
    assert all(o != header for o in others) and others[2]["dtype"] == "bfloat16"
    assert header["torch"] == torch.__version__ and header["device"] == "cpu"
    assert header["arithmetic"] == f"{torch.backends.cpu.get_cpu_capability()}, {threads} threads"

    path = tmp_path / journal.NAME
    first = journal.start(path, header, {})
    first.add(["a", "b"], 8, ["x", "y"], ["eos", "length"])
    first.add(["c"], 8, ["z"], ["eos"])
    path.write_text(path.read_text()[:-10])  # killed while writing the last line
    kept = {journal.batch_key(["a", "b"], 8): (["x", "y"], ["eos", "length"])}
    assert journal.read(path, header) == kept and all(journal.read(path, o) == {} for o in others)
    again = journal.start(path, header, journal.read(path, header))  # the resumed evaluation: the cut line is gone
    again.add(["c"], 8, ["z"], ["eos"])
    assert journal.read(path, header) == {**kept, journal.batch_key(["c"], 8): (["z"], ["eos"])}
    assert again.get(["c"], 7) is None and again.get(["a", "b"], 8) == (["x", "y"], ["eos", "length"])


def test_a_signal_pauses_sft_after_that_step_and_resume_ends_as_the_straight_run(tmp_path, small_data, monkeypatch,
                                                                                  capsys, python_sigint):
    import rookworld_rlvr.sft as sft

    def run(name, resume=False, interrupt=None):
        cfg = SFTConfig(data=str(small_data / "train.jsonl"), eval_data=str(small_data / "eval.jsonl"),
                        eval_samples=0, out=str(tmp_path / name), steps=5, batch_size=4, own_repeats=0, lr=1e-3,
                        warmup_steps=1, save_every=100, device="cpu", threads=1)
        sft_train(cfg, resume=resume, progress=False, interrupt=interrupt)
        return [json.loads(x) for x in (tmp_path / f"{name}.sft_log.jsonl").read_text().splitlines()]

    straight = run("straight")
    real, calls = sft._accumulate, []

    def signal_in_step_two(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(sft, "_accumulate", signal_in_step_two)
    with StopOnSignal(verbose=False) as stop:
        paused = run("split", interrupt=stop)
    assert [r["step"] for r in paused] == [1, 2] and "eval_loss_P" in straight[-1]
    assert "eval_loss_P" not in paused[-1]  # a pause on a signal saves at once: no held-out evaluation first
    assert stop.asked == signal.SIGINT and "paused, --resume continues to step 5" in capsys.readouterr().out
    monkeypatch.setattr(sft, "_accumulate", real)
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("minutes", "seconds")} for r in rows]  # noqa: E731
    assert strip(run("split", resume=True)) == strip(straight)


@pytest.mark.slow(seconds=14)
def test_ctrl_c_ends_rookworld_train_with_a_checkpoint_and_exit_130(tmp_path, tiny_model_dir, small_data):
    """The command a user runs: SIGINT once its first step is logged; it says where it stopped and how to go on,
    exits 130 with the checkpoint of its last logged step, and --resume continues from the step after it."""
    run = tmp_path / "run"
    fields = _fields(tiny_model_dir, small_data, run, steps=10_000, save_every=1000)
    args = [sys.executable, "-m", "rookworld_rlvr", "train"] + as_options(fields)
    # as from a terminal: SIGINT not ignored (a test runner's worker may ignore it, and a child inherits that)
    terminal = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    proc = subprocess.Popen(args, **terminal)
    deadline = time.time() + 240
    while not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text().strip():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-2000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    last = _records(run)[-1]["step"]
    assert f"train: stopped at step {last} on SIGINT: checkpoint saved, --resume continues from it" in err
    assert "SIGINT: stopping after this step with a checkpoint" in err
    assert ckpt.latest_checkpoint(run) == ckpt.checkpoint_dir(run, last)
    again = subprocess.Popen(args + ["--resume", "true"], **terminal)
    while len(_records(run)) <= last:
        assert again.poll() is None and time.time() < deadline + 120, again.communicate()[1][-2000:]
        time.sleep(0.2)
    again.send_signal(signal.SIGTERM)
    assert again.wait(timeout=120) == 143
    steps = [r["step"] for r in _records(run)]
    assert steps == list(range(1, len(steps) + 1)), steps  # continued from the step after the checkpoint


@pytest.mark.parametrize("log", ["terminal", "file"])
def test_a_closed_terminal_ends_rookworld_train_with_a_checkpoint_of_the_step_in_hand(tmp_path, tiny_model_dir,
                                                                                       small_data, log):
    """A run in a terminal that goes away (an SSH connection lost): the terminal hangs up, after which every write
    to it fails, and SIGHUP comes, twice (the terminal's and its shell's). The run ended where it stood, losing the
    steps since its last periodic checkpoint; now it finishes the step in hand, saves it and exits 129. Its stderr
    (the bar, the messages) on the terminal or in a file it was sent to (`2> train.log`): the file keeps them."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    run = tmp_path / "run"
    fields = _fields(tiny_model_dir, small_data, run, steps=10_000, save_every=1000, lr=1e-5)  # no collapse
    args = [sys.executable, "-m", "rookworld_rlvr", "train"] + as_options({**fields, "progress": True})
    terminal, its_end = pty.openpty()
    fcntl.ioctl(its_end, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))  # a terminal's size: a bar's width
    err_log = tmp_path / "train.log"
    stderr = its_end if log == "terminal" else err_log.open("wb")
    proc = subprocess.Popen(args, stdin=its_end, stdout=its_end, stderr=stderr,  # a test runner may ignore SIGHUP
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    os.close(its_end)
    if log == "file":
        stderr.close()  # the run's own copy stays open
    shown, deadline = b"", time.time() + 240

    def bar_shown() -> bool:
        return b"grpo:" in (shown if log == "terminal" else err_log.read_bytes())

    # until a step is logged and the run's progress bar is shown (each step writes to it)
    while not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text().strip() or not bar_shown():
        assert proc.poll() is None and time.time() < deadline, shown[-2000:]
        if select.select([terminal], [], [], 0.2)[0]:
            try:
                shown += os.read(terminal, 1 << 16)
            except OSError:  # EIO: the run has ended (the assertion above then says how)
                time.sleep(1)
    os.close(terminal)  # the terminal goes away
    proc.send_signal(signal.SIGHUP)
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(timeout=120) == 129
    last = _records(run)[-1]["step"]
    # the step in hand saved (before: only step 0's checkpoint, every logged step lost)
    assert last >= 1 and ckpt.latest_checkpoint(run) == ckpt.checkpoint_dir(run, last)
    if log == "file":
        text = err_log.read_text()
        assert "SIGHUP: stopping after this step with a checkpoint (--resume continues from it)\n" in text
        assert f"train: stopped at step {last} on SIGHUP: checkpoint saved, --resume continues from it" in text


WRITE_SYSCALL = {"x86_64": 1, "aarch64": 64}  # write(2)'s number where /proc/PID/syscall shows it


def _writing(pid: int) -> bool:
    """Whether process `pid` waits in a write(2) to its stdout or stderr (/proc/PID/syscall: number, arguments)."""
    fields = Path(f"/proc/{pid}/syscall").read_text().split()
    return fields[0] == str(WRITE_SYSCALL[platform.machine()]) and int(fields[1], 16) in (1, 2)


def test_a_stalled_terminal_that_hangs_up_ends_rookworld_sft_with_a_checkpoint_of_the_step_in_hand(
        tmp_path, tiny_model_dir, small_data):
    """A lost SSH connection stalls before the server gives up on it: nobody reads the terminal, its buffer fills
    and `rookworld sft` waits in its next write (here a step's held-out line: --quiet, no bar), which the hangup
    then fails (EIO) before SIGHUP's handler runs. The run died of that write with nothing saved; now it saves
    the step in hand and exits 129."""
    import contextlib
    import pty
    import select

    out = tmp_path / "m"
    args = [sys.executable, "-m", "rookworld_rlvr", "sft", "--data", str(small_data / "train.jsonl"), "--eval-data",
            str(small_data / "eval.jsonl"), "--out", str(out), "--init", str(tiny_model_dir), "--steps", "10000",
            "--save-every", "1000", "--eval-every", "1", "--eval-samples", "2", "--batch-size", "4", "--device",
            "cpu", "--threads", "1", "--quiet"]
    terminal, its_end = pty.openpty()
    name = os.ttyname(its_end)
    proc = subprocess.Popen(args, stdin=its_end, stdout=its_end, stderr=its_end,  # a test runner may ignore SIGHUP
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    os.close(its_end)
    shown, deadline = b"", time.time() + 240
    while b'"step": 2' not in shown:  # a step past the first, so that the handlers are armed
        assert proc.poll() is None and time.time() < deadline, shown[-2000:]
        if select.select([terminal], [], [], 0.2)[0]:
            shown += os.read(terminal, 1 << 16)
    # the stall: another writer fills what the terminal holds for its reader, and the run waits in its next write
    filler = os.open(name, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(filler, b"." * 1024)
    while not _writing(proc.pid):
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.1)
    os.close(filler)
    os.close(terminal)  # the server gives up: the terminal hangs up, then SIGHUP, twice (the terminal's, its shell's)
    proc.send_signal(signal.SIGHUP)
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(timeout=120) == 129
    logged = [json.loads(x)["step"] for x in (tmp_path / "m.sft_log.jsonl").read_text().splitlines()]
    state = json.loads((tmp_path / "m.checkpoint" / "sft_state.json").read_text())
    assert logged == list(range(1, len(logged) + 1)) and state["step"] == logged[-1] >= 2
