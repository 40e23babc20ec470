"""Supervised bootstrap: trains, saves a loadable model, resumes from its checkpoint."""

import json

from rookworld_rlvr.cli import main
from rookworld_rlvr.model import load_policy
from rookworld_rlvr.sft import SFTConfig, make_batch, train


def test_completion_only_loss_masks_prompt_and_padding():
    ids, mask, labels = make_batch([([5, 6, 7, 8, 0], 2), ([5, 6, 0], 1)], pad_id=0, loss_on="completion")
    assert labels.tolist() == [[-100, -100, 7, 8, 0], [-100, 6, 0, -100, -100]]
    assert mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]


def test_sft_trains_saves_and_resumes(tmp_path, small_data):
    out = tmp_path / "m"
    cfg = SFTConfig(data=str(small_data / "train.jsonl"), eval_data=str(small_data / "eval.jsonl"), out=str(out),
                    steps=4, batch_size=8, eval_every=2, eval_samples=2, save_every=2, lr=3e-3, warmup_steps=1,
                    device="cpu", threads=1)
    train(cfg, progress=False)
    log = [json.loads(x) for x in (tmp_path / "m.sft_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4]
    assert log[-1]["loss"] < log[0]["loss"]
    assert "policy/invalid" in log[1] and "eval_loss_A" in log[1]
    model, tok = load_policy(str(out), device="cpu", verbose=False)
    assert model.config.n_positions == 320
    cfg.steps = 6
    train(cfg, resume=True, progress=False)
    log = [json.loads(x) for x in (tmp_path / "m.sft_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log][-2:] == [5, 6]


def test_cli_help_lists_every_subcommand(capsys):
    try:
        main(["--help"])
    except SystemExit as e:
        assert e.code == 0
    text = capsys.readouterr().out
    for sub in ("data", "eval", "sft", "train", "check-batch", "overfit", "report"):
        assert sub in text


def test_readme_documents_every_config_field():
    from pathlib import Path

    from rookworld_rlvr.config import help_table

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert help_table() in readme, "README config table is stale: run python scripts/sync_readme.py"
    lines = readme.splitlines()
    assert lines[0] == "# rookworld-rlvr" and "make train" in lines[3] and "make test" in lines[4]
