"""check-batch, overfit and --dry-run: the tools that catch silent failures early."""

import json
import sys
from pathlib import Path

import pytest
import torch

from conftest import UNREACHABLE_HUB, in_hub_cache
from rookworld_rlvr.cli import main
from rookworld_rlvr.grpo.sanity import check_batch, overfit, product_bits
from rookworld_rlvr.model import tf32_unless_chosen
from test_trainer import make, varied_reward


@pytest.fixture(scope="module")
def scorer():
    from rookworld_rlvr.engine import EngineConfig, StockfishPool
    from rookworld_rlvr.tasks.rewards import RewardScorer

    with StockfishPool(EngineConfig(depth=6, workers=1)) as pool:
        yield RewardScorer(engine=pool)


def test_check_batch_fails_loudly_when_every_reward_is_equal(tmp_path, tiny_model_dir, small_data, scorer):
    tr = make(tmp_path, tiny_model_dir, small_data, scorer)  # random weights: every completion is malformed
    lines = []
    assert check_batch(tr, max_truncation=1.0, out=lines.append) == 1
    text = "\n".join(lines)
    assert "every reward in the batch is equal" in text
    assert "KL 0.00e+00" in text


def test_check_batch_passes_with_a_learning_signal(tmp_path, tiny_model_dir, small_data, scorer):
    tr = make(tmp_path, tiny_model_dir, small_data, scorer, varied_reward)
    lines = []
    assert check_batch(tr, max_truncation=1.0, out=lines.append) == 0, "\n".join(lines)
    assert any(line.startswith("one step: loss") for line in lines)


@pytest.mark.parametrize("command", ["check-batch", "overfit"])
def test_settings_check_batch_and_overfit_never_read_are_named_when_given(tmp_path, tiny_model_dir, small_data,
                                                                          capsys, command):
    """They run in a scratch directory, evaluate nothing and call the trainer's steps directly: an --output-dir, an
    evaluation or a guard setting given to them was taken without a word and did nothing."""
    out = tmp_path / "run"
    argv = [command, "--model", str(tiny_model_dir), "--data", str(small_data / "train.jsonl"), "--device", "cpu",
            "--batch-positions", "2", "--group-size", "2", "--max-new-tokens", "8", "--engine-cache", "",
            "--output-dir", str(out), "--eval-data", str(small_data / "eval.jsonl"), "--guard-kl-mean", "1",
            "--steps", "3"] + (["--overfit-steps", "1"] if command == "overfit" else [])
    assert main(argv) in (0, 1)  # pass or fail, the check ran
    err = capsys.readouterr().err
    assert f"warning: setting without effect: --output-dir: {command} runs in a scratch directory and writes " \
        "nothing" in err
    assert f"--eval-data: {command} evaluates nothing held out" in err
    assert f"--guard-kl-mean: {command} runs no training loop" in err
    assert "--steps:" not in err and "--batch-positions:" not in err  # the lr schedule and the batch: read
    assert not out.exists()


@pytest.mark.parametrize("autocast", ["none", "bf16"])
def test_check_batch_recomputes_with_each_tasks_temperature_and_the_runs_precision(tmp_path, tiny_model_dir,
                                                                                    small_data, scorer, autocast):
    """With per-task sampling temperatures (as configs/default.yaml has: P: at 0.8) check-batch used
    to recompute at the global temperature, in float32, and failed a healthy run (max |ratio-1| 3.8
    on the shipped model). It now recomputes through the trainer's own passes; under bf16 its bound
    is derived from bf16 rounding and the logits' size. A sampler that really samples at another
    temperature than the trainer scores still fails."""
    import rookworld_rlvr.grpo.rollout as rollout

    over = dict(task_sampling={"P": {"temperature": 0.6}, "A": {"temperature": 1.3}}, mix_env_ratio=0.5,
                autocast=autocast, kl_coef=0.04, **({"backward_dtype": "auto"} if autocast == "bf16" else {}))
    tr = make(tmp_path / "ok", tiny_model_dir, small_data, scorer, varied_reward, **over)
    lines = []
    assert check_batch(tr, max_truncation=1.0, out=lines.append) == 0, "\n".join(lines)
    assert any("bf16 rounding" in line for line in lines) == (autocast == "bf16")

    real = rollout.generate
    rollout_generate = lambda *a, **k: real(*a, **{**k, "temperature": 3.0})  # noqa: E731 - the fault
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rollout, "generate", rollout_generate)
        tr = make(tmp_path / "bad", tiny_model_dir, small_data, scorer, varied_reward, **over)
        lines = []
        assert check_batch(tr, max_truncation=1.0, out=lines.append) == 1
    assert any("sampler and trainer disagree on log-probs" in line for line in lines), "\n".join(lines)


def test_check_batchs_bound_on_a_gpu_comes_from_the_bits_its_float32_products_keep(float32_matmul):
    """On CUDA, float32 products run in TF32 unless the process chose IEEE float32 (`resolve_device`): there
    check-batch derives its bound from TF32's 11 bits as from bf16's 8, where IEEE float32's 1e-4 would fail a
    healthy run. The flags are the same on a CPU build; a CPU's float32 is IEEE."""
    from types import SimpleNamespace

    def bits(amp, device):
        return product_bits(SimpleNamespace(amp=amp, device=torch.device(device)))

    assert bits(None, "cpu") is None and bits(torch.bfloat16, "cpu") == 8
    assert bits(None, "cuda") is None  # torch's own default: IEEE
    assert tf32_unless_chosen() and bits(None, "cuda") == 11 and bits(torch.bfloat16, "cuda") == 8
    assert bits(None, "cpu") is None
    float32_matmul.allow_tf32 = False  # the process chose IEEE float32
    assert bits(None, "cuda") is None
    float32_matmul.fp32_precision = "none"
    torch.backends.fp32_precision = "tf32"  # process-wide, which the products inherit
    assert bits(None, "cuda") == 11


def test_overfit_one_batch_rises_on_a_learnable_reward(tmp_path, tiny_model_dir, small_data, scorer):
    tr = make(tmp_path, tiny_model_dir, small_data, scorer, varied_reward, lr=3e-3, kl_coef=0.0, steps=12,
              batch_positions=2, group_size=8, max_new_tokens=16, temperature=1.0)
    lines = []
    code = overfit(tr, steps=12, window=4, eval_every=2, out=lines.append)
    text = "\n".join(lines)
    assert code == 0, text
    assert "PASS: 4-step moving average of greedy reward rises" in text


def test_dry_run_reports_counts_and_fails_on_bad_input(tmp_path, tiny_model_dir, small_data, capsys, monkeypatch):
    base = ["train", "--dry-run", "--model", str(tiny_model_dir), "--data", str(small_data / "train.jsonl"),
            "--eval-data", str(small_data / "eval.jsonl")]
    assert main(base) == 0
    out, err = capsys.readouterr()
    assert "data: " in out and "P=60 A=60" in out and "dry run: ok" in out
    # without a preset the built-in defaults run, not make train's recipe: the run says so
    assert "no --config: every field at its built-in default" in err and "configs/default.yaml" in err
    preset = tmp_path / "preset.yaml"
    preset.write_text("steps: 2\n")
    assert main(base + ["--config", str(preset)]) == 0
    out, err = capsys.readouterr()
    assert "\n2 steps x" in out and "no --config" not in err
    # a device this machine lacks (MPS: never on Linux) is a warning, as the run may be meant for another machine;
    # the last line says it cannot start here
    assert main(base + ["--device", "mps"]) == 0
    out = capsys.readouterr().out
    assert ("warning: config field 'device': device 'mps' requested but MPS is not available on this machine; the "
            "run stops at once here\n") in out
    assert out.endswith("dry run: ok for a machine that has what the 1 warning(s) above name; here the run stops at "
                        "once\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text((small_data / "train.jsonl").read_text() + "not json\n")
    assert main(base[:4] + ["--data", str(bad), "--eval-data", str(small_data / "eval.jsonl")]) == 1
    assert f"{bad}:121" in capsys.readouterr().out
    assert main(base + ["--group-size", "1"]) == 1
    assert "group_size" in capsys.readouterr().err
    # a device this machine lacks: a warning in a dry run (the run may be prepared here for another machine), and
    # the run itself stops at once, before its data is read (here: a file with a bad line it never reaches)
    assert main(base + ["--device", "cuda:99"]) == 0
    assert "warning: config field 'device': device 'cuda:99' requested but " in capsys.readouterr().out
    run = ["train", "--model", str(tiny_model_dir), "--data", str(bad), "--output-dir", str(tmp_path / "run")]
    assert main(run + ["--ref-device", "cuda:99"]) == 1
    err = capsys.readouterr().err
    assert "error: config field 'ref_device': device 'cuda:99' requested but " in err and str(bad) not in err
    # a logging sink whose package is missing (wandb, taken away here) alike: the run stopped only after loading the
    # models and reading the data (20 s for make train's), leaving a TensorBoard folder behind
    monkeypatch.setitem(sys.modules, "wandb", None)
    assert main(base + ["--wandb", "true"]) == 0
    assert ("warning: config field 'wandb': true needs the wandb package (pip install wandb), or set wandb: false; "
            "the run stops at once here\n") in capsys.readouterr().out
    assert main(run + ["--wandb", "true", "--tensorboard", "true"]) == 1
    assert capsys.readouterr().err.strip().endswith("error: config field 'wandb': true needs the wandb package (pip "
                                                    "install wandb), or set wandb: false")
    assert not (tmp_path / "run").exists()
    # the report's matplotlib alike: the run trained for its minutes and then said the report was not written
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(run + ["--tensorboard", "false"]) == 1
    assert capsys.readouterr().err.strip().endswith("error: config field 'report': true needs the matplotlib package "
                                                    "(pip install matplotlib), or set report: false")
    assert not (tmp_path / "run").exists()


def test_the_shipped_preset_run_from_outside_the_checkout_says_where_it_looked_for_each_file(tmp_path, capsys,
                                                                                             monkeypatch):
    """The presets name the shipped files relative to the checkout; run from elsewhere, each error says where it
    looked (the working directory), and the model, which a Hub id would also read as, says so before the Hub's
    word, so that one run of --dry-run shows the fix."""
    from huggingface_hub import constants

    from conftest import REPO

    monkeypatch.setattr(constants, "ENDPOINT", UNREACHABLE_HUB)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--config", str(REPO / "configs" / "default.yaml"), "--dry-run"]) == 1
    out = capsys.readouterr().out
    assert f"does not hold models/rookworld-board, nor is it a directory in {tmp_path}; the run stops" in out
    for field in ("data", "eval_data", "puzzle_data", "strength_data", "puzzle_eval_data"):
        assert f"error: {field}: data/" in out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) >= 5 and all(line.endswith(f": no such file in {tmp_path}") for line in errors), errors
    # the run itself: every file it would read in one line, each by its field, before anything is read or written
    assert main(["train", "--config", str(REPO / "configs" / "default.yaml")]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: ") and sorted(line[len("error: "):].split("; ")) == \
        sorted(e[len("error: "):] for e in errors), line
    assert not (tmp_path / "runs").exists()
    assert main(["eval", "--model", "models/rookworld-board", "--data", str(REPO / "data" / "eval.jsonl.gz")]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: cannot load the model: model models/rookworld-board could not be loaded: the "
                           "Hugging Face Hub "), line
    assert f"does not hold it, nor is it a directory in {tmp_path} (" in line, line


def test_a_dry_run_says_whether_a_hub_model_will_load_here(tmp_path, tiny_model_dir, small_data, capsys, monkeypatch,
                                                           answering_hub):
    """A Hub id: downloaded where the Hub answers (any answer is an answer); where it is out of reach or offline mode
    is on, from the local cache when it holds the model, else a warning that the run stops at once (a warning: the
    run may be prepared here for a machine with network)."""
    from huggingface_hub import constants

    cache = tmp_path / "cache"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    base = ["train", "--dry-run", "--model", "someone/tiny", "--data", str(small_data / "train.jsonl"), "--eval-data",
            str(small_data / "eval.jsonl")]
    monkeypatch.setattr(constants, "ENDPOINT", answering_hub)
    assert main(base) == 0
    out = capsys.readouterr().out
    assert "model: someone/tiny (Hugging Face Hub id; downloaded at load time)" in out and "warning" not in out
    assert out.endswith("dry run: ok\n")

    monkeypatch.setattr(constants, "ENDPOINT", UNREACHABLE_HUB)
    assert main(base) == 0
    out = capsys.readouterr().out
    assert f"model: someone/tiny (Hugging Face Hub id)\nwarning: the Hugging Face Hub {UNREACHABLE_HUB} is out of " \
           "reach (" in out and f") and the local cache ({cache}) does not hold someone/tiny, nor is it a directory " \
           f"in {Path.cwd()}; the run stops at once here\n" in out
    assert out.endswith("dry run: ok for a machine that has what the 1 warning(s) above name; here the run stops at "
                        "once\n")

    in_hub_cache(tiny_model_dir, cache, "someone/tiny")
    assert main(base) == 0
    out = capsys.readouterr().out
    assert f"model: someone/tiny (Hugging Face Hub id, from the local cache {cache}: the Hugging Face Hub " \
           f"{UNREACHABLE_HUB} is out of reach (" in out and "warning" not in out
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert main(base) == 0
    assert f"model: someone/tiny (Hugging Face Hub id, from the local cache {cache}: offline mode is on " \
           "(HF_HUB_OFFLINE))" in capsys.readouterr().out


def test_dry_run_checks_the_anchors_own_data(tmp_path, tiny_model_dir, small_data, capsys):
    only_p = tmp_path / "p.jsonl"
    only_p.write_text("".join(x + "\n" for x in (small_data / "train.jsonl").read_text().splitlines()
                              if json.loads(x)["task"] == "P"))
    base = ["train", "--dry-run", "--model", str(tiny_model_dir), "--data", str(small_data / "train.jsonl"),
            "--eval-data", str(small_data / "eval.jsonl"), "--anchor-coef", "1", "--anchor-tasks", "PA", "--anchor-batch", "4"]
    assert main(base + ["--anchor-data", str(only_p)]) == 1
    assert f"anchor_data: {only_p} has no A: samples but anchor_tasks is PA" in capsys.readouterr().out
    assert main(base + ["--anchor-data", str(small_data / "eval.jsonl")]) == 0
    assert f"anchor_data: {small_data / 'eval.jsonl'}: P=" in capsys.readouterr().out
    assert main(base[:4] + ["--data", str(only_p)] + base[6:]) == 1  # null: the anchor draws from data
    assert f"data: {only_p} has no A: samples but anchor_tasks is PA" in capsys.readouterr().out
    assert main(base + ["--anchor-data", str(tmp_path / "missing.jsonl")]) == 1
    assert f"anchor_data: {tmp_path / 'missing.jsonl'}: no such file" in capsys.readouterr().out
