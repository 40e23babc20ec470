"""The analysis scripts the docs quote (scripts/fit_gap.py, seen_positions.py, guard_margins.py and
std_floor_effect.py with its step0_batches.py), run whole on the tiny model and data: each prints what it says
it measures."""

import json
import re
import runpy
import sys

import pytest
import torch
from conftest import REPO

from rookworld_rlvr.config import load_config
from rookworld_rlvr.data.io import read_samples
from rookworld_rlvr.grpo.trainer import Trainer
from rookworld_rlvr.model import load_policy
from rookworld_rlvr.sft_rows import encode, make_batch
from rookworld_rlvr.tasks.rewards import RewardResult


def run_script(name: str, argv: list, monkeypatch, capsys) -> str:
    """scripts/NAME run as `python scripts/NAME ARGV...` would run it, in this process; its stdout."""
    monkeypatch.setattr(sys, "argv", [name, *map(str, argv)])
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    runpy.run_path(str(REPO / "scripts" / name), run_name="__main__")
    return capsys.readouterr().out


def test_fit_gap_prints_each_task_s_answer_loss_on_both_sets_and_the_rows_it_used(tiny_model_dir, small_data,
                                                                                  monkeypatch, capsys):
    """The held-out loss is the mean NLL of every answer token (computed here from the logits by hand), the gap
    is held out less train, and the rows counted are the rows there were (20 held-out rows of each task, not the
    30 asked for)."""
    out = run_script("fit_gap.py", ["--model", tiny_model_dir, "--train", small_data / "train.jsonl",
                                    "--eval", small_data / "eval.jsonl", "--rows", 30], monkeypatch, capsys)
    found = re.findall(r"^(P|A): train ([\d.]+), held out ([\d.]+) nats a token \(gap ([+-][\d.]+); "
                       r"(\d+) training and (\d+) held-out rows\)$", out, re.M)
    assert [f[0] for f in found] == ["P", "A"], out
    model, tok = load_policy(str(tiny_model_dir), device="cpu", verbose=False)
    for task, train, held, gap, n_train, n_held in found:
        assert (int(n_train), int(n_held)) == (30, 20)
        assert float(gap) == pytest.approx(float(held) - float(train), abs=2e-4)
        rows = encode(tok, [s for s in read_samples(small_data / "eval.jsonl") if s.task == task], "compact",
                      "best-first")
        ids, mask, labels = make_batch(rows, tok.pad_token_id, "completion")
        with torch.no_grad():
            logp = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float().log_softmax(-1)
        target = labels[:, 1:]
        answer = target != -100
        nll = -logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)[answer].mean()
        assert float(held) == pytest.approx(float(nll), abs=1e-4), task


def test_seen_positions_writes_a_few_positions_with_the_a_rows_and_the_positions_apart(small_data, tmp_path,
                                                                                       monkeypatch, capsys):
    out_file = tmp_path / "p8.jsonl"
    out = run_script("seen_positions.py", ["--data", small_data / "train.jsonl", "--out", out_file, "--positions", 8,
                                           "--pool", 40, "--env-rows", 5], monkeypatch, capsys)
    assert out.strip() == f"{out_file}: 8 P: positions and 5 A: rows"
    rows = read_samples(out_file)
    positions = read_samples(tmp_path / "p8.positions.jsonl")
    assert [s.task for s in rows] == ["P"] * 8 + ["A"] * 5
    assert [s.truth.fen for s in positions] == [s.truth.fen for s in rows[:8]]
    train = read_samples(small_data / "train.jsonl")
    first_p = [s.truth.fen for s in train if s.task == "P"][:40]
    assert {s.truth.fen for s in positions} <= set(first_p)  # drawn from the pool: the first 40 P: rows
    assert [s.truth for s in rows[8:]] == [s.truth for s in train if s.task == "A"][:5]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_model_dir, small_data):
    """A 6-step GRPO run of the tiny model with a reward that varies within each group."""
    out = tmp_path_factory.mktemp("guard") / "run"
    cfg = load_config(None, dict(model=str(tiny_model_dir), data=str(small_data / "train.jsonl"), eval_data="",
                                 output_dir=str(out), steps=6, batch_positions=2, group_size=4, max_new_tokens=16,
                                 lr=1e-3, warmup_steps=0, save_every=100, tensorboard=False, progress=False,
                                 report=False, seed=1, engine_cache=None, device="cpu"))

    def reward(prompts, completions, truths, weights):
        return [RewardResult(total=len(c) % 5 / 5, components={}, valid_format=True, task=p[0])
                for p, c in zip(prompts, completions)]

    Trainer(cfg, reward, read_samples(cfg.data), None, log=lambda *_: None).train()
    return out


def test_guard_margins_replays_a_run_through_the_guard_with_the_bounds_given(tiny_run, monkeypatch, capsys):
    """With every other bound out of reach and a patience of one step, the KL row's worst is the run's largest
    kl_mean, and a bound under it makes the guard act at the first step over it, as the trainer's guard would."""
    records = [json.loads(x) for x in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    kl = [r["kl_mean"] for r in records]
    assert max(kl) > 0
    loose = ["--guard-valid-drop", 10, "--guard-reward-drop", 10, "--guard-kl-max", 1e9, "--guard-entropy-factor",
             1e9, "--guard-truncation-rise", 10, "--guard-patience", 1]
    out = run_script("guard_margins.py", [tiny_run, *loose, "--guard-kl-mean", 1e9], monkeypatch, capsys)
    assert out.startswith(f"{tiny_run}: 6 steps, 0 evaluations")
    worst = float(re.search(r"^  kl_mean\s+(\S+)", out, re.M).group(1))
    assert worst == pytest.approx(max(kl), rel=1e-3)
    assert out.rstrip().endswith("would act at: none")
    bound = max(kl) / 2
    out = run_script("guard_margins.py", [tiny_run, *loose, "--guard-kl-mean", bound], monkeypatch, capsys)
    first = next(r["step"] for r in records if r["kl_mean"] > bound)
    assert re.search(rf"would act at: step {first} \(kl_mean ", out), out


def test_std_floor_effect_counts_the_groups_and_how_often_each_floor_binds(tiny_model_dir, small_data, tmp_path,
                                                                             stockfish_path, monkeypatch, capsys):
    """step0_batches samples the groups a run's first steps would (here 3 batches of 2 prompts of the shipped
    base); every group with a learning signal is counted once in each floor's row, and a floor of 0 never binds.
    A model whose every group is flat (a random one: no answer is readable) is told so, not a traceback."""
    monkeypatch.setenv("STOCKFISH_PATH", stockfish_path)

    def config(model) -> str:
        path = tmp_path / f"{model.name}.yaml"
        path.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in dict(
            model=str(model), data=str(small_data / "train.jsonl"), batch_positions=2, group_size=4,
            max_new_tokens=100, engine_cache=None, device="cpu", mix_env_ratio=0.5).items()))
        return path

    args = ["--batches", 3, "--floors", "max:0.05,add:0"]
    out = run_script("std_floor_effect.py", ["--config", config(REPO / "models" / "rookworld-board"), *args],
                     monkeypatch, capsys)
    head = re.search(r": 6 groups of 4, (\d+) with a learning signal \((\d+) flat\)", out)
    assert head, out
    signal = int(head.group(1))
    assert signal + int(head.group(2)) == 6 and signal > 0
    rows = re.findall(r"^\s+(max|add)\s+(\S+)\s+(\d+) of (\d+) ", out, re.M)
    assert [(m, f, int(n)) for m, f, _, n in rows] == [("max", "0.05", signal), ("add", "0", signal)]
    assert rows[1][2] == "0"
    with pytest.raises(SystemExit, match="6 groups of 4, none with a learning signal"):
        run_script("std_floor_effect.py", ["--config", config(tiny_model_dir), *args], monkeypatch, capsys)
