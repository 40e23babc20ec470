"""Multi-process GRPO (torch.distributed, gloo on CPU): two real processes, the real trainer.

Each scenario spawns 2 ranks once (torch.multiprocessing, 127.0.0.1, one thread each); the
ranks save what the tests check into the scenario directory, and the tests compare it with
one process on the same global batch.
"""

import contextlib
import io
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from test_trainer import _Result, make, varied_reward

from conftest import built_once
from ranks import WORLD, free_port, spawn_waits
from rookworld_rlvr.cli import main
from rookworld_rlvr.grpo import checkpoint as ckpt
from rookworld_rlvr.grpo import distributed as dist

# small but complete: 2 P: and 2 A: prompts x 4 completions per step, so each rank gets one group per task
SMALL = dict(batch_positions=4, mix_env_ratio=0.5, group_size=4, max_new_tokens=16, steps=2)
# the one-update equality is checked for these settings (the default loss, and the ones whose
# normalisers span the whole batch: dapo's token count, dr_grpo's budget, batch scaling, EMA norm;
# and the anchor loss, whose token mean spans every rank's ground-truth answers)
VARIANTS = [dict(), dict(loss_type="dapo", updates_per_batch=2),
            dict(loss_type="dr_grpo", scale_rewards="batch"), dict(scale_rewards="none", reward_norm=True),
            dict(anchor_coef=1.0, anchor_batch=4)]


def _make(run: Path, model_dir: Path, data_dir: Path, **over):
    return make(run, model_dir, data_dir, None, varied_reward, **{**SMALL, **over})


def _plain_sgd(tr):
    """For comparing one update across summation orders: AdamW's first step is lr * g / (|g| + eps),
    about ±lr for any gradient well above eps, so the rounding dust of gradients that cancel to ~0
    (advantages are centred) becomes ±lr steps that differ between any two summation orders. With
    SGD the weights move by lr * (clipped) gradient, so equal weights mean equal gradients."""
    tr.opt = torch.optim.SGD([p for p in tr.policy.parameters() if p.requires_grad], lr=tr.cfg.lr)
    return tr


def _flat_on_p(prompts, completions, truths, weights):
    """Every P: group is flat (so dynamic sampling always has work), A: groups vary."""
    scores = varied_reward(prompts, completions, truths, weights)
    return [r if p.startswith("A") else _Result(0.0) for p, r in zip(prompts, scores)]


def _weights(tr) -> dict:
    return {k: v.detach().clone() for k, v in tr.policy.state_dict().items()}


# -- what each rank runs ---------------------------------------------------------------------------
def _train_and_resume(model_dir: Path, data_dir: Path, out: Path) -> dict:
    errors = []
    for bad in (dict(batch_positions=3), dict(batch_positions=2)):  # 3 prompts; 1 P: + 1 A: over 2 ranks
        try:
            _make(out / "bad", model_dir, data_dir, **bad)
        except ValueError as e:
            errors.append(str(e))
    evals = []
    straight = _make(out / "straight", model_dir, data_dir)
    shared = _shared_evaluation(straight, data_dir)

    def eval_fn(model, tokenizer) -> dict:  # every rank evaluates; rank 0's result must be every rank's
        evals.append(dist.rank())
        return {"policy": {"n": 1, "mean_reward": 0.5 + dist.rank()}}

    straight.eval_fn = eval_fn
    before = _weights(straight)
    straight.train()
    part = _make(out / "resumed", model_dir, data_dir)
    part.cfg.steps = 1  # stop after 1 of 2; the first step's LR does not depend on the total
    part.train()
    resumed = _make(out / "resumed", model_dir, data_dir, resume=True)
    start = resumed.step
    resumed.train()
    resampler = make(out / "resample", model_dir, data_dir, None, _flat_on_p, **{**SMALL, "dynamic_sampling": 2})
    resampler.collect(0, {})
    return {"before": before, "straight": _weights(straight), "resumed": _weights(resumed), "start": start,
            "end": resumed.step, "errors": errors, "evals": evals, "sampler": resampler.prompts.state,
            "eval_rewards": [e["policy"]["mean_reward"] for e in straight.history_eval], **shared,
            **_eval_command(model_dir, data_dir, out),
            "devices": [str(dist.local_device(torch.device(d))) for d in ("cuda", "cuda:0", "cpu")],
            **_nan_on_rank_1(model_dir, data_dir, out), **_guarded(model_dir, data_dir, out),
            **_interrupted(model_dir, data_dir, out)}


def _interrupted(model_dir: Path, data_dir: Path, out: Path) -> dict:
    """Rank 1 alone gets SIGTERM during step 1 (torchrun passes its own on to every rank; one rank alone is the
    harder case): where each rank stopped, then the weights of the run resumed from there."""
    from rookworld_rlvr.interrupt import Interrupted, StopOnSignal

    def reward(prompts, completions, truths, weights):
        if dist.rank() == 1 and tr.step == 0:
            os.kill(os.getpid(), signal.SIGTERM)
        return varied_reward(prompts, completions, truths, weights)

    tr = make(out / "interrupted", model_dir, data_dir, None, reward, **SMALL)
    caught = None
    try:
        with StopOnSignal(verbose=False) as tr.stop:
            tr.train()
    except Interrupted as e:
        caught = (e.step, e.signum, ckpt.latest_checkpoint(tr.run_dir) == ckpt.checkpoint_dir(tr.run_dir, e.step))
    resumed = _make(out / "interrupted", model_dir, data_dir, resume=True)
    resumed.train()
    return {"interrupted": caught, "interrupted_resumed": _weights(resumed)}


def evaluate_held_out(tr, data_dir: Path, spread=None) -> dict:
    """The real held-out evaluation of `tr`'s start weights (greedy, 4 rows a batch: 5 batches per task),
    the A: rows once more as histories; without the timings, which differ from run to run."""
    from rookworld_rlvr.data.io import read_samples
    from rookworld_rlvr.evaluate import EvalConfig, evaluate
    from rookworld_rlvr.tasks.rewards import RewardScorer

    samples = read_samples(data_dir / "eval.jsonl")
    res = evaluate(tr.sampler(), tr.tokenizer, samples, config=EvalConfig(batch_size=4, max_new_tokens=24),
                   scorer=RewardScorer(), histories=[s for s in samples if s.task == "A"], spread=spread)
    res["meta"].pop("seconds")
    return res


def _shared_evaluation(tr, data_dir: Path) -> dict:
    """The held-out evaluation shared out among the ranks, with the batches this rank generated and the
    rows it scored counted."""
    import rookworld_rlvr.model.completions as completions
    from rookworld_rlvr.tasks.rewards import RewardScorer

    batches, rows = [], []
    real_generate, real_score = completions.generate, RewardScorer.score_batch

    def generate(model, tokenizer, prompts, **kw):
        batches.append(len(prompts))
        return real_generate(model, tokenizer, prompts, **kw)

    def score_batch(self, prompts, *a, **kw):
        rows.append(len(prompts))
        return real_score(self, prompts, *a, **kw)

    completions.generate, RewardScorer.score_batch = generate, score_batch
    try:
        res = evaluate_held_out(tr, data_dir, spread=dist.spread)
    finally:
        completions.generate, RewardScorer.score_batch = real_generate, real_score
    return {"shared_eval": res, "eval_batches": batches, "eval_rows": rows}


def eval_command(model_dir: Path, data_dir: Path, json_out: Path) -> list[str]:
    return ["eval", "--model", str(model_dir), "--data", str(data_dir / "eval.jsonl"), "--histories",
            str(data_dir / "eval.jsonl"), "--batch-size", "4", "--max-new-tokens", "24", "--quiet", "--json",
            str(json_out)]


def _eval_command(model_dir: Path, data_dir: Path, out: Path) -> dict:
    """`rookworld eval` on every rank (the group is up already, as torchrun's would be): what it printed."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = main(eval_command(model_dir, data_dir, out / f"eval_rank{dist.rank()}.json"))
    return {"eval_rc": rc, "eval_printed": printed.getvalue(), "eval_still_joined": dist.active()}


def _guarded(model_dir: Path, data_dir: Path, out: Path) -> dict:
    """A KL bound every update crosses: both ranks recover once, at the same step, to the same state,
    then stop with the same message."""
    from rookworld_rlvr.grpo.trainer import TrainingStopped

    tr = _make(out / "guarded", model_dir, data_dir, steps=4, guard_kl_mean=1e-9, guard_patience=1,
               guard_max_recoveries=1, guard_snapshot_every=1)
    try:
        tr.train()
        stopped = None
    except TrainingStopped as e:
        stopped = str(e)
    return {"guard_stop": stopped, "guard_step": tr.step, "guard_recoveries": tr.guard.recoveries,
            "guard_lr_scale": tr.lr_scale, "guard_weights": _weights(tr)}


def _nan_on_rank_1(model_dir: Path, data_dir: Path, out: Path) -> dict:
    """Only rank 1's policy log-probs turn NaN: both ranks must skip the step, in lockstep."""
    import rookworld_rlvr.grpo.passes as passes_mod

    tr = _make(out / "nan", model_dir, data_dir)
    batch = tr.assemble(tr.collect(0, {}))
    before = _weights(tr)
    real = passes_mod.token_logprobs

    def faulty(model, *a, **k):
        o = real(model, *a, **k)
        if dist.rank() == 1 and torch.is_grad_enabled():
            o["logprobs"] = o["logprobs"] * float("nan")
        return o

    passes_mod.token_logprobs = faulty
    try:
        m = tr.update(batch, 0, {})
    finally:
        passes_mod.token_logprobs = real
    moved = any(not torch.equal(before[k], v) for k, v in _weights(tr).items())
    return {"nan_guard": m["guard"], "nan_loss": m["loss"], "nan_moved": moved}


def _one_update(model_dir: Path, data_dir: Path, out: Path) -> dict:
    """Every rank takes its share of the fixed global batch, as `collect` would, and updates once."""
    groups = torch.load(out / "groups.pt", weights_only=False)
    mine = [g for task in ("P", "A") for g in dist.shard([g for g in groups if g[0].task == task])]
    res = {}
    for i, over in enumerate(VARIANTS):
        tr = _plain_sgd(_make(out / f"v{i}", model_dir, data_dir, **over))
        m = tr.update(tr.assemble(mine), 0, {})
        res[i] = {"weights": _weights(tr), "loss": m["loss"], "grad_norm": m["grad_norm"]}
    return res


SCENARIOS = {"train_and_resume": _train_and_resume, "one_update": _one_update}


def _rank_main(rank: int, port: int, scenario: str, model_dir: str, data_dir: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(WORLD), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    torch.set_num_threads(1)
    assert dist.init_from_env("cpu", 10.0) and dist.world() == WORLD
    try:
        res = SCENARIOS[scenario](Path(model_dir), Path(data_dir), Path(out))
        torch.save(res, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy()


def _spawn(scenario: str, model_dir: Path, data_dir: Path, out: Path) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    mp.spawn(_rank_main, args=(free_port(), scenario, str(model_dir), str(data_dir), str(out)), nprocs=WORLD)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def test_a_hung_rank_fails_the_step_after_its_timeout_while_rank_0_may_work_alone_for_longer(tmp_path):
    """step_timeout_minutes 0.01 (0.6 s): rank 1 waits out rank 0's 1.8 s of lone work at a broadcast and
    at a barrier (those waits allow 15 minutes); when rank 1 hangs, rank 0's barrier and its step's collective
    each end with an error after about 0.6 s instead of waiting for it."""
    T = 0.6
    r0, r1 = spawn_waits(0.01, "lone", tmp_path)
    assert r0["broadcast"] == r1["broadcast"] == "from rank 0" and r0["barrier"] == r1["barrier"] == "passed"
    assert r1["broadcast_s"] > 2 * T and r1["barrier_s"] > 2 * T  # rank 1 waited well past the step timeout
    assert r0["gather"] == r1["gather"] == [0.0, 1.0]
    for name, where in (("barrier_hung", "a barrier"), ("gather_hung", "a step's collective")):
        assert r0[name].startswith(f"error: RankTimeout: rank 0 stopped waiting for the other ranks at {where}: one "
                                   "of them hangs or died. A step's collectives (evaluations, the first meeting) wait "
                                   "step_timeout_minutes (0.01)"), r0[name]
        assert T * 0.9 < r0[name + "_s"] < T + 3, (name, r0[name + "_s"])


def test_a_rank_0_hung_in_its_lone_work_fails_the_others_after_lone_work(tmp_path):
    """Rank 0 hangs while it works alone (a save, say): rank 1 waits for it LONE_WORK (15 minutes; 3 s here), well
    past the step timeout, then gives up with an error that says where and how long, and the run ends."""
    r0, r1 = spawn_waits(0.01, "lone_hang", tmp_path)
    assert r1["barrier_hung"].startswith("error: RankTimeout: rank 1 stopped waiting for the other ranks at a "
                                         "barrier: one of them hangs or died."), r1["barrier_hung"]
    assert "the others wait 0.05 minutes for rank 0's saves" in r1["barrier_hung"]
    assert 2.7 < r1["barrier_hung_s"] < 6, r1["barrier_hung_s"]


def test_an_evaluation_shared_out_among_ranks_keeps_item_order_and_a_rank_hung_in_it_fails_after_the_step_timeout(
        tmp_path):
    """`spread` gives item i to rank i % 2 and every rank every result in item order. When rank 0 hangs in its
    share (say, in a batch of the held-out evaluation), rank 1 gives up after the step timeout, 0.6 s, as at a
    step's collectives: before evaluations were shared out, rank 0 evaluated alone and the others waited an hour."""
    T = 0.6
    r0, r1 = spawn_waits(0.01, "spread", tmp_path)
    assert r0["spread"] == r1["spread"] == [[0, 0], [1, 1], [2, 0], [3, 1], [4, 0]]  # (item, the rank that did it)
    assert r1["spread_hung"].startswith("error: RankTimeout: rank 1 stopped waiting for the other ranks at a step's "
                                        "collective: one of them hangs or died."), r1["spread_hung"]
    assert T * 0.9 < r1["spread_hung_s"] < T + 3, r1["spread_hung_s"]


WORKER = """
import os, sys, time
from pathlib import Path
from rookworld_rlvr.grpo import distributed as dist

pid_file, late = Path(sys.argv[1]), sys.argv[2] == "late"
if not late:
    dist.init_from_env("cpu", 1.0)  # one process: no group, but torchrun is watched
pid_file.write_text(str(os.getpid()))
if late:  # torchrun is killed while this rank still imports: it learns only now
    while not Path(str(pid_file) + ".go").exists():
        time.sleep(0.01)
    dist.init_from_env("cpu", 1.0)
time.sleep(120)
"""


def _running(pid: int) -> bool:
    """Whether `pid` runs (a zombie that its new parent has not reaped yet has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


FIRST_MEETING = """import time
from rookworld_rlvr.grpo import distributed as dist
t0 = time.time()
try:
    dist.init_from_env("cpu", 0.05)
finally:
    print(time.time() - t0)
"""


def test_a_rank_that_never_arrives_fails_the_first_meeting_after_the_step_timeout():
    """The ranks' first meeting waits the step timeout, not an hour: rank 0 of 2, alone (rank 1 hangs before it
    joins, say in its imports), gives up after 3 s with an error that says where it waited."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
           "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", FIRST_MEETING], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "rank 0 stopped waiting for the other ranks at their first meeting" in proc.stderr
    assert 3 <= float(proc.stdout.split()[-1]) < 30


PARTING = """import sys, time
from rookworld_rlvr.grpo import distributed as dist
dist.init_from_env("cpu", 0.1)
if sys.argv[1] == "late":
    time.sleep(9)  # rank 0's last lone work (a report, say), longer than the step timeout
t0 = time.time()
dist.finish()
print(f"finished in {time.time() - t0:.2f} s", flush=True)
if sys.argv[1] == "hang":
    time.sleep(120)  # a rank that hangs after the run: in NCCL's teardown, say
"""


@pytest.mark.slow(seconds=15)  # two ranks' start and a step timeout's wait
@pytest.mark.parametrize("roles", [("ends", "hang"), ("hang", "ends"), ("late", "ends")],
                         ids=["rank-1-hangs", "rank-0-hangs", "rank-0-works-late"])
def test_a_rank_that_hangs_after_the_run_is_ended_by_the_watch_of_its_machine(roles):
    """torchrun waits for every rank to exit, so one that hangs once the run is done and saved would hold it (and
    its GPUs) for good. After the ranks' last meeting, the first rank of each machine starts a watch over them,
    itself included, in a process of its own: the ranks still running the step timeout later (6 s here) are
    SIGKILLed, with a message; the others part at once, after waiting for rank 0's last lone work longer than a
    step if need be. 6 s, not less: a loaded 2-core machine took over 3 s to let a rank exit after its last meeting."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2",
           "OMP_NUM_THREADS": "1"}
    t0 = time.time()
    procs = [subprocess.Popen([sys.executable, "-c", PARTING, role], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)})
             for r, role in enumerate(roles)]
    try:
        outs = [p.communicate(timeout=120) for p in procs]  # rank 0's pipes stay open until its watch ends
    finally:
        for p in procs:
            p.kill()
    seconds = time.time() - t0
    err0 = outs[0][1]
    took = [float(out.split()[-2]) for out, _ in outs]  # each rank's finish()
    if "hang" in roles:
        hung = roles.index("hang")
        assert [p.returncode for p in procs] == [-signal.SIGKILL if r == hung else 0 for r in range(2)], err0
        assert (f"rank {hung} (pid {procs[hung].pid}) had not ended 0.1 minutes (step_timeout_minutes) after the "
                "run was done and saved: killing it") in err0
        assert seconds < 60 and max(took) < 3  # not the hung rank's 120 s; nobody waits in finish()
    else:  # rank 1 waited 9 s for rank 0, past its step timeout, and both parted
        assert [p.returncode for p in procs] == [0, 0] and took[1] > 8 and "killing" not in err0, err0


@pytest.mark.parametrize("when", ["running", "late"])
def test_a_rank_ends_itself_when_torchrun_is_killed(tmp_path, when):
    """torchrun starts its ranks in sessions of their own: killed itself (SIGKILL, as the OOM killer or a
    scheduler does), it stops none of them, and they would train on, unwatched, beside a resumed run. A rank
    notices that its parent is gone within a second and ends, saying why; "late": torchrun died before the
    rank reached `init_from_env` (its imports take seconds), which still knows torchrun's pid."""
    script, pid_file, log = tmp_path / "worker.py", tmp_path / "pid", tmp_path / "torchrun.log"
    script.write_text(WORKER)
    with open(log, "w") as fh:
        agent = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
                                  str(script), str(pid_file), when], stdout=fh, stderr=subprocess.STDOUT,
                                 start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    worker = None
    try:
        for _ in range(600):
            if pid_file.exists() and pid_file.read_text():
                worker = int(pid_file.read_text())
                break
            assert agent.poll() is None, log.read_text()[-2000:]
            time.sleep(0.1)
        assert worker is not None, "the worker never started: " + log.read_text()[-2000:]
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait()
        Path(f"{pid_file}.go").touch()
        t0 = time.time()
        while _running(worker) and time.time() - t0 < 10:
            time.sleep(0.05)
        assert not _running(worker), "the rank ran on after torchrun was killed"
        assert time.time() - t0 < 5
        assert f"rank 0: torchrun (pid {agent.pid}) is gone: this rank stops too" in log.read_text()
    finally:
        if worker is not None and _running(worker):
            os.kill(worker, signal.SIGKILL)
        if agent.poll() is None:
            agent.kill()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, worker_id, tiny_model_dir, small_data):
    """Built once per run by whichever worker asks first, from its own copies of the model and data (out/model,
    out/data), which a test that compares a one-process run with the ranks' uses too: paths are in the results."""
    def build(out: Path) -> None:
        shutil.copytree(tiny_model_dir, out / "model")
        shutil.copytree(small_data, out / "data")
        mp.spawn(_rank_main, args=(free_port(), "train_and_resume", str(out / "model"), str(out / "data"), str(out)),
                 nprocs=WORLD)

    out = built_once(tmp_path_factory, worker_id, "ddp_ranks", build)
    return out, [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def _assert_close(a: dict, b: dict, rtol: float = 1e-6, atol: float = 1e-7) -> None:
    """Weights after one plain-SGD step w - lr * g from gradients summed in another order: the step
    rounds w once more (rtol 1e-6: 8 float32 steps of |w|), and lr * (g's rounding) is lr 1e-3 x
    eps * sqrt(n) * max|g| with |g| <= grad_clip 1 and n ~ 1,200 tokens: 4e-9, well inside atol 1e-7
    (measured at most 4e-11 beyond rtol, AVX-512 and simulated SSE4.2)."""
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=rtol, atol=atol, msg=lambda m, k=k: f"{k}: {m}")


# -- tests -------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_two_ranks_train_in_lockstep_and_only_rank_0_writes(two_ranks):
    out, (r0, r1) = two_ranks
    assert any(not torch.equal(r0["before"][k], r0["straight"][k]) for k in r0["before"]), "training moved nothing"
    for k in r0["straight"]:
        assert torch.equal(r0["straight"][k], r1["straight"][k]), f"ranks disagree on {k}"
    run = out / "straight" / "run"
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]  # one record per step: rank 1 wrote none
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["reward/mean"]) for r in records)
    assert [json.loads(x)["step"] for x in (run / "eval.jsonl").read_text().splitlines()] == [0, 2]
    assert r0["evals"] == [0, 0] and r1["evals"] == [1, 1], "every rank evaluates (before and after)"
    assert r0["eval_rewards"] == r1["eval_rewards"] == [0.5, 0.5], "every rank keeps rank 0's result"
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [0, 1, 2]  # keep_last 2 + the best (step 0)
    final = ckpt.load_state(ckpt.latest_checkpoint(run))
    assert len(final["generators"]) == WORLD  # each rank's sampling stream, for resume
    assert (run / "final" / "model.safetensors").exists() and (run / "config.yaml").exists()
    assert not list(out.glob("straight/run-*")), "nothing was moved aside"


@pytest.mark.slow  # its module fixture `two_ranks` takes 10 s: run with the other slow tests, once
def test_a_held_out_evaluation_shared_out_among_ranks_equals_one_process_and_each_rank_does_half(
        two_ranks, tmp_path):
    """Each rank generates every other batch and scores every other row; both end with the evaluation one
    process makes of the same weights, to the last digit: each prompt is completed in the same batch."""
    out, (r0, r1) = two_ranks
    alone = evaluate_held_out(_make(tmp_path / "alone", out / "model", out / "data"), out / "data")
    assert r0["shared_eval"] == r1["shared_eval"] == alone
    assert alone["policy"]["n"] == alone["environment"]["n"] == alone["histories"]["n"] == 20
    # 20 P: + 20 A: rows, 4 a batch: 5 batches per task, 3 + 2 of each on the ranks; the histories, the same A:
    # prompts, are answered from the memory both ranks keep (no batch), and scored again, shared out
    assert (len(r0["eval_batches"]), len(r1["eval_batches"])) == (6, 4)
    assert sum(r0["eval_batches"]) + sum(r1["eval_batches"]) == 40 and alone["meta"]["reused_answers"] == 20
    assert (sum(r0["eval_rows"]), sum(r1["eval_rows"])) == (20 + 10, 20 + 10)  # the 40 rows, then 20 histories


@pytest.mark.slow  # its module fixture `two_ranks` takes 10 s: run with the other slow tests, once
def test_rookworld_eval_under_torchrun_shares_the_work_and_rank_0_alone_prints_and_writes_what_one_process_would(
        two_ranks, tmp_path):
    out, (r0, r1) = two_ranks
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(eval_command(out / "model", out / "data", tmp_path / "alone.json")) == 0
    assert r0["eval_rc"] == r1["eval_rc"] == 0 and r0["eval_still_joined"] and r1["eval_still_joined"]
    assert r1["eval_printed"] == "" and not (out / "eval_rank1.json").exists()
    assert "wrote" in r0["eval_printed"]
    shared, alone = (json.loads(p.read_text()) for p in (out / "eval_rank0.json", tmp_path / "alone.json"))
    for res in (shared, alone):
        res["meta"].pop("seconds")
    assert shared == alone and alone["histories"]["n"] == 20


@pytest.mark.slow  # its module fixture `two_ranks` takes 10 s: run with the other slow tests, once
def test_dynamic_sampling_keeps_the_prompt_sampler_identical_on_all_ranks(two_ranks):
    _, (r0, r1) = two_ranks
    # 2 P: prompts, then 2 rounds x the 2 flat P: groups of the global batch (1 per rank): 6 drawn everywhere
    assert r0["sampler"] == r1["sampler"] and r0["sampler"]["P"]["cursor"] == 6


@pytest.mark.slow  # its module fixture `two_ranks` takes 10 s: run with the other slow tests, once
def test_a_non_finite_loss_on_one_rank_skips_the_step_on_every_rank(two_ranks):
    _, ranks = two_ranks
    for r in ranks:
        assert r["nan_guard"] == "skip" and math.isnan(r["nan_loss"]) and not r["nan_moved"]


@pytest.mark.slow  # its module fixture `two_ranks` takes 10 s: run with the other slow tests, once
def test_the_collapse_guard_decides_the_same_on_every_rank(two_ranks):
    out, (r0, r1) = two_ranks
    assert r0["guard_stop"] and r0["guard_stop"] == r1["guard_stop"] and "kl_mean" in r0["guard_stop"]
    for k in ("guard_step", "guard_recoveries", "guard_lr_scale"):
        assert r0[k] == r1[k], k
    assert r0["guard_recoveries"] == 1 and r0["guard_lr_scale"] == 0.3
    assert all(torch.equal(r0["guard_weights"][k], r1["guard_weights"][k]) for k in r0["guard_weights"])
    events = [json.loads(x) for x in (out / "guarded" / "run" / "events.jsonl").read_text().splitlines()]
    assert [e["action"] for e in events] == ["recover", "stop"]  # written once, by rank 0


@pytest.mark.slow  # its module fixture `two_ranks` takes 10 s: run with the other slow tests, once
def test_batch_that_cannot_be_split_over_ranks_is_a_clear_error(two_ranks):
    _, (r0, _) = two_ranks
    assert "must divide by the number of processes (2)" in r0["errors"][0]
    assert "1 P: and 1 A: prompts" in r0["errors"][1]


@pytest.mark.slow  # its module fixture `two_ranks` takes 10 s: run with the other slow tests, once
def test_under_torchrun_a_bare_cuda_means_each_ranks_own_gpu(two_ranks):
    """Device names only (no GPU needed): rank r trains on cuda:r; explicit devices are kept."""
    _, (r0, r1) = two_ranks
    assert r0["devices"] == ["cuda:0", "cuda:0", "cpu"] and r1["devices"] == ["cuda:1", "cuda:0", "cpu"]


@pytest.mark.slow  # its module fixture `two_ranks` takes 10 s: run with the other slow tests, once
def test_resume_under_two_ranks_equals_the_straight_run(two_ranks):
    out, (r0, r1) = two_ranks
    assert (r0["start"], r0["end"]) == (1, 2) and (r1["start"], r1["end"]) == (1, 2)
    for k in r0["straight"]:
        assert torch.equal(r0["resumed"][k], r0["straight"][k]), k
        assert torch.equal(r1["resumed"][k], r0["straight"][k]), k

    def metrics(run):
        return [{k: v for k, v in json.loads(x).items() if not k.startswith("time/")}
                for x in (run / "metrics.jsonl").read_text().splitlines()]

    assert metrics(out / "resumed" / "run") == metrics(out / "straight" / "run")


@pytest.mark.slow  # its module fixture `two_ranks` takes 10 s: run with the other slow tests, once
def test_a_signal_on_one_rank_stops_every_rank_after_that_step_and_the_resumed_run_ends_as_the_straight_one(two_ranks):
    """SIGTERM on rank 1 alone during step 1: both ranks stop after step 1, with its checkpoint (rank 0, which got
    no signal, names torchrun's SIGTERM), and the run resumed from it ends with the straight run's weights."""
    _, (r0, r1) = two_ranks
    assert r0["interrupted"] == r1["interrupted"] == (1, signal.SIGTERM, True)
    for k in r0["straight"]:
        assert torch.equal(r0["interrupted_resumed"][k], r0["straight"][k]), k
        assert torch.equal(r1["interrupted_resumed"][k], r0["straight"][k]), k


@pytest.mark.slow(seconds=11)
def test_one_update_on_two_ranks_equals_one_process_on_the_global_batch(tmp_path, tiny_model_dir, small_data, one_thread):
    collector = _make(tmp_path / "collect", tiny_model_dir, small_data)
    groups = collector.collect(0, {})
    assert sum(max(r.reward for r in g) > min(r.reward for r in g) for g in groups) >= 2, "need a learning signal"
    torch.save(groups, tmp_path / "groups.pt")
    ranks = _spawn("one_update", tiny_model_dir, small_data, tmp_path)
    for i, over in enumerate(VARIANTS):
        single = _plain_sgd(_make(tmp_path / f"single{i}", tiny_model_dir, small_data, **over))
        m = single.update(single.assemble(groups), 0, {})
        for r in ranks:
            # a norm's relative rounding is at most its elements': eps * sqrt(n) = 4e-6 for n ~ 1,200 tokens
            assert r[i]["grad_norm"] == pytest.approx(m["grad_norm"], rel=1e-5), over
            # the loss is ~0 (ratio 1, advantages centred per group), so only the absolute bound applies: the
            # mean of N = 16 row terms rounds by about eps * sqrt(N) * max|partial sum| / N = 6e-8 for partial
            # sums <= 2 (measured <= 2e-8)
            assert r[i]["loss"] == pytest.approx(m["loss"], rel=1e-5, abs=1e-7), over
            _assert_close(r[i]["weights"], _weights(single))


def test_metric_reduction_rules():
    assert dist.reduce_values("step", [3, 3]) == 3 and isinstance(dist.reduce_values("step", [3, 3]), int)
    assert dist.reduce_values("loss", [1.0, 2.0]) == 1.5
    assert dist.reduce_values("kl_max", [1.0, 2.0]) == 2.0 and dist.reduce_values("adv/max", [1.0, 2.0]) == 2.0
    assert dist.reduce_values("kl_min", [1.0, 2.0]) == 1.0
    assert dist.reduce_values("logp_sampler_diff", [1e-6, 1e-5]) == 1e-5
    for key in ("loss", "kl_max", "kl_min"):  # a NaN anywhere is a NaN everywhere, whatever the order
        assert math.isnan(dist.reduce_values(key, [1.0, float("nan")]))
        assert math.isnan(dist.reduce_values(key, [float("nan"), 1.0]))
    assert dist.world() == 1 and dist.reduce_metrics({"a": 1.0}) == {"a": 1.0}  # no-ops in one process
    assert dist.shard([1, 2, 3]) == [1, 2, 3]
