"""scripts/gpu_base.sh --smoke: the prepared GPU base recipe runs end to end on a CPU at tiny sizes, and what it
leaves in OUT is what a GPU machine can send back and loads as a model again."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def test_the_gpu_base_recipe_runs_and_its_outputs_come_back_and_load(tmp_path):
    from rookworld_rlvr.data.io import read_samples
    from rookworld_rlvr.model import load_policy

    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "PYTHON": sys.executable, "WORK": str(work)}
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_base.sh"), str(out), "--smoke"], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert "meta.tar" in files and any(f.endswith(".safetensors") for f in files) and len(files) <= 8
    assert all((out / f).stat().st_size <= 16 * 2**20 for f in files)
    # the training data has game starts: A: rows with a one-move history from the start position
    rows = [s for s in read_samples(work / "train.jsonl.gz") if s.task == "A"]
    assert any(s.truth.fen.startswith("rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w") for s in rows)
    base = tmp_path / "base"
    base.mkdir()
    with tarfile.open(out / "meta.tar") as tar:
        tar.extractall(base, filter="data")
    for f in out.glob("*.safetensors"):
        (base / f.name).write_bytes(f.read_bytes())
    log = [json.loads(x) for x in (base / "sft_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3]
    model, tok = load_policy(str(base), device="cpu", verbose=False)
    trained, _ = load_policy(str(work / "base"), device="cpu", verbose=False)
    for (name, a), b in zip(model.state_dict().items(), trained.state_dict().values()):  # bf16 copies
        torch.testing.assert_close(a, b.to(torch.bfloat16).float(), rtol=0, atol=0, msg=name)


def test_an_export_that_would_not_come_back_is_named(tmp_path):
    spec = importlib.util.spec_from_file_location("export_bf16", REPO / "scripts" / "export_bf16.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "big.safetensors").write_bytes(b"\0" * (17 * 2**20))
    for i in range(8):
        (tmp_path / f"f{i}.json").write_text("{}")
    problems = module.check(sorted(tmp_path.iterdir()))
    assert problems == ["big.safetensors: 17.0 MiB > 16", "9 files > 8"]
