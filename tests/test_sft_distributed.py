"""`rookworld sft` on several processes (torch.distributed, gloo on CPU): two real ranks, the real loop.

The ranks are spawned once (torch.multiprocessing, 127.0.0.1, one thread each) and run every scenario;
what they saw is compared with one process training the same run in the test process."""

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from conftest import SMALL_TINY_PRESET, built_once
from ranks import WORLD, free_port
from rookworld_rlvr.grpo import distributed as dist
from rookworld_rlvr.model import load_policy
from rookworld_rlvr.sft import SFTConfig, train


# a fresh model's `tiny` preset at a small shape, here (conftest: small_tiny_preset) and in the ranks
pytestmark = pytest.mark.usefixtures("small_tiny_preset")


def _config(data: Path, out: Path, **over) -> SFTConfig:
    """6 rows a step (3 A:, 3 P:), the model's own answers to 2 prompts, a held-out evaluation with
    Stockfish at steps 2 and 4, a checkpoint at step 2."""
    return SFTConfig(**{**dict(data=str(data / "train.jsonl"), eval_data=str(data / "eval.jsonl"), out=str(out),
                               steps=4, batch_size=6, own_repeats=2, eval_every=2, eval_samples=4, save_every=2,
                               lr=3e-3, warmup_steps=1, device="cpu", threads=1, tokenizer="board"), **over})


def _log(out: Path) -> list[dict]:
    return [json.loads(x) for x in out.with_name(out.name + ".sft_log.jsonl").read_text().splitlines()]


def _weights(out: Path) -> dict:
    model, _ = load_policy(str(out), device="cpu", verbose=False)
    return {k: v.clone() for k, v in model.state_dict().items()}


def plain_sgd(params, lr, *_, **__):
    """For comparing weights across summation orders: AdamW's first step is about +-lr for any gradient
    well above eps, so gradients that round differently near 0 move weights by +-lr apart. With SGD
    the weights move by lr * gradient, so equal weights mean equal gradients."""
    return torch.optim.SGD(params, lr=lr)


def _rank_main(rank: int, port: int, data: str, out: str) -> None:
    import rookworld_rlvr.grpo.control as control
    import rookworld_rlvr.sft as sft
    from rookworld_rlvr.model import load

    load.PRESETS["tiny"] = SMALL_TINY_PRESET  # as the test process's small_tiny_preset (this process ends after)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(WORLD), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    torch.set_num_threads(1)
    assert dist.init_from_env("cpu", 10.0)
    data_dir, root, seen = Path(data), Path(out), {}
    real, rows, stop = sft._accumulate, [], root / "stop"
    real_own, real_adamw, answered = sft.own_repeat_rows, control.adamw, []

    def own(model, tokenizer, prompts, **k):  # the prompts this rank answers itself
        answered.append(len(prompts))
        return real_own(model, tokenizer, prompts, **k)

    def counted(model, step_rows, *a, **k):  # the rows this rank trains on at each step
        rows.append(len(step_rows))
        if rank == 0 and len(rows) == seen.get("split_start", -9) + 2:  # step 2 of the split run
            stop.touch()
        return real(model, step_rows, *a, **k)

    sft._accumulate, sft.own_repeat_rows = counted, own
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            control.adamw = plain_sgd
            train(_config(data_dir, root / "two"), progress=False)
            control.adamw = real_adamw
            # with a rows cache: rank 0 fills it while rank 1 waits, then rank 1 reads it
            cache = dict(dropout=0.1, rows_cache=str(root / "rows.cache"))
            train(_config(data_dir, root / "drop", **cache), progress=False)
            seen["split_start"] = len(rows)
            # rank 1 watches a file that never appears: it stops because rank 0 does
            train(_config(data_dir, root / "split", **cache, stop_when=str(stop if rank == 0 else root / "never")),
                  progress=False)
            seen["split_steps"] = len(rows) - seen["split_start"]
            train(_config(data_dir, root / "split", **cache), resume=True, progress=False)
            for bad in (dict(batch_size=1), dict(encode_only=True, rows_cache=str(root / "cache"))):
                try:
                    train(_config(data_dir, root / "bad", **bad), progress=False)
                except ValueError as e:
                    seen.setdefault("errors", []).append(str(e))
    finally:
        sft._accumulate, sft.own_repeat_rows, control.adamw = real, real_own, real_adamw
        dist.destroy()
    seen.update(rows=rows, answered=answered, printed=printed.getvalue())
    (root / f"rank{rank}.json").write_text(json.dumps(seen))


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, worker_id, small_data):
    out = built_once(tmp_path_factory, worker_id, "sft_ranks",
                     lambda out: mp.spawn(_rank_main, args=(free_port(), str(small_data), str(out)), nprocs=WORLD))
    return out, [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.slow(seconds=12)  # its module fixture `two_ranks` takes about 10 s
def test_sft_on_two_ranks_trains_what_one_process_trains_each_rank_on_half_the_rows(two_ranks, small_data,
                                                                                    tmp_path, one_thread, monkeypatch):
    """Each rank trains on 3 of the 6 rows and answers 1 of the 2 prompts itself; the summed gradients make the
    update of one process on the whole batch: the same losses, held-out figures and weights (under SGD, see
    plain_sgd), up to float summation order. Rank 0 alone prints and writes."""
    import rookworld_rlvr.grpo.control as control

    out, (r0, r1) = two_ranks
    monkeypatch.setattr(control, "adamw", plain_sgd)
    train(_config(small_data, tmp_path / "one"), progress=False)
    one, two = _log(tmp_path / "one"), _log(out / "two")
    assert [r["step"] for r in two] == [1, 2, 3, 4]
    # 3 data rows each, and the own answers that repeated (the rows of the runs after it follow in the lists)
    for n0, n1, record in zip(r0["rows"][:4], r1["rows"][:4], two, strict=True):
        assert n0 >= 3 and n1 >= 3 and n0 + n1 == 6 + record["own_repeats"]
    assert r0["answered"][:4] == r1["answered"][:4] == [1, 1, 1, 1]
    for a, b in zip(one, two, strict=True):
        assert a.keys() == b.keys()
        for k in ("A_rows", "own_repeats", "policy/invalid", "environment/exact"):
            assert a.get(k) == b.get(k), k
        for k in ("loss", "unlikelihood", "grad_norm", "eval_loss_A", "eval_loss_P"):
            if k in a:
                assert b[k] == pytest.approx(a[k], rel=1e-5, abs=1e-7), k
    w1, w2 = _weights(tmp_path / "one"), _weights(out / "two")
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) < 1e-5
    assert r1["printed"] == "" and "sft: saved" in r0["printed"] and "x 2 processes" in r0["printed"]
    assert r0["printed"].count("rows kept in") == 1 and r0["printed"].count("from the rows cache") == 2


@pytest.mark.slow(seconds=12)  # its module fixture `two_ranks` takes about 10 s
def test_sft_stopped_on_two_ranks_and_resumed_equals_the_straight_run_bit_for_bit(two_ranks):
    """The stop decision is rank 0's (only it saw the file appear), so both ranks stop after step 2; the
    checkpoint keeps each rank's dropout stream, and the resumed run ends on the straight run's weights."""
    out, (r0, r1) = two_ranks
    assert r0["split_steps"] == r1["split_steps"] == 2
    straight, split = _weights(out / "drop"), _weights(out / "split")
    assert all(torch.equal(straight[k], split[k]) for k in straight)
    assert [r["loss"] for r in _log(out / "split")] == [r["loss"] for r in _log(out / "drop")]
    assert not torch.equal(_weights(out / "two")["transformer.h.0.mlp.c_fc.weight"],
                           straight["transformer.h.0.mlp.c_fc.weight"])  # dropout did act


@pytest.mark.slow(seconds=12)  # its module fixture `two_ranks` takes about 10 s
def test_sft_on_two_ranks_refuses_what_it_cannot_split(two_ranks):
    out, (r0, r1) = two_ranks
    assert r0["errors"] == r1["errors"] == [
        "sft.batch_size (1) must be at least the number of processes (2)",
        "sft.encode_only fills a rows cache in one process: run it without torchrun"]


@pytest.mark.slow(seconds=12)  # two ranks under torchrun, each loading torch and transformers
def test_rookworld_sft_under_torchrun_writes_one_run(tmp_path, small_data):
    """The command itself under a real torchrun: the ranks join (the command sets the group up), train one
    run, and rank 0 alone writes the model, the checkpoint and the log."""
    out = tmp_path / "m"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
         "rookworld_rlvr", "sft", "--data", str(small_data / "train.jsonl"), "--eval-data", "", "--out", str(out),
         "--steps", "2", "--batch-size", "4", "--own-repeats", "0", "--device", "cpu", "--threads", "1",
         "--quiet"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("sft: saved") == 1 and "x 2 processes" in proc.stdout
    assert [r["step"] for r in _log(out)] == [1, 2]
    assert (tmp_path / "m.checkpoint" / "sft_state.json").exists()
    state = json.loads((tmp_path / "m.checkpoint" / "sft_state.json").read_text())
    assert len(state["torch_rng_ranks"]) == 2


@pytest.mark.slow(seconds=12)  # two ranks' start and a step timeout's wait
def test_sft_step_timeout_minutes_bounds_the_wait_for_the_other_ranks(tmp_path, small_data):
    """`--step-timeout-minutes` reaches the ranks' waits: rank 0 of 2, alone, stops waiting for rank 1 after
    3 s and says where and for how long; a timeout that is not a positive number of minutes is refused."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "LOCAL_RANK": "0",
           "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "rookworld_rlvr", "sft", "--data", str(small_data / "train.jsonl"),
                           "--eval-data", "", "--out", str(tmp_path / "m"), "--device", "cpu",
                           "--step-timeout-minutes", "0.05"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr  # one line, as for any error a user can act on
    assert proc.stderr.splitlines()[-1].startswith(
        "error: rank 0 stopped waiting for the other ranks at their first meeting: one of them hangs or died. A "
        "step's collectives (evaluations, the first meeting) wait step_timeout_minutes (0.05)"), proc.stderr[-2000:]
    assert not (tmp_path / "m").exists()
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="sft.step_timeout_minutes must be a positive number of minutes"):
            SFTConfig(data=str(small_data / "train.jsonl"), step_timeout_minutes=bad).validate()
