"""scripts/gpu_check.sh, the one prepared command for a GPU machine, runs end to end here in its
--smoke mode: the CUDA tests on the CPU, then every measurement at tiny sizes, TRL's GRPOTrainer beside
ours included, into the folder given."""

import json
import os
import subprocess
import sys

from conftest import REPO


def test_the_gpu_check_runs_end_to_end_in_smoke_mode(tmp_path):
    out = tmp_path / "out"
    threads = {k: os.environ[k] for k in ("OMP_NUM_THREADS",) if k in os.environ}  # the suite's share of the cores
    done = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), str(out), "--smoke"], capture_output=True,
                          text=True, timeout=600, env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable,
                                                       "HOME": str(tmp_path), **threads})
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert "8 passed" in (out / "gpu_tests.log").read_text()
    result = json.loads((out / "gpu_check.json").read_text())
    assert result["smoke"] and result["machine"]["device"] == "cpu"
    assert {(r["dtype"], r["decode_graph"], r["prompts"], r["group"]) for r in result["generation"]} == {
        (dtype, graph, 2, 2) for dtype in ("float32", "bf16") for graph in (False, True)}
    assert all(r["tokens_per_s"] > 0 for r in result["generation"])
    assert [r["config"] for r in result["grpo"]] == ["autocast none", "autocast bf16", "autocast bf16, decode_graph"]
    assert all(r["s_per_step"] > 0 and r["peak_memory_gib"] > 0 and "generate" in r["phase_share"]
               for r in result["grpo"])
    assert result["sft"][0]["preset"] == "tiny" and result["sft"][0]["s_per_step"] > 0
    # TRL's GRPOTrainer beside ours on the same work, with the shared reward run without Stockfish (as on the GPU)
    trl = json.loads((out / "grpo_vs_trl.json").read_text())
    assert trl["machine"]["engine"] == "none" and trl["machine"]["device"] == "cpu"
    (pair,) = result["trl"]["results"]
    assert pair["prompts"] == pair["generations"] == 2 and pair["ours_s_per_step"] > 0 and pair["trl_s_per_step"] > 0
    table = (out / "gpu_check.md").read_text()
    assert "| GRPO step (124M preset) |" in table and "(smoke: tiny sizes)" in table
    assert f"| float32 | small | 0 | 2 x 2 x 8 | {pair['ours_s_per_step']:.3f} | {pair['trl_s_per_step']:.3f} |" in table
    bad = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), str(out), "--fast"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "unknown option --fast" in bad.stderr
