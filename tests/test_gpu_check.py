"""scripts/gpu_check.sh, the one prepared command for a GPU machine, runs end to end here in its
--smoke mode: the CUDA tests on the CPU, then every measurement at tiny sizes, TRL's GRPOTrainer beside
ours included, into the folder given."""

import json
import os
import re
import subprocess
import sys
from xml.etree import ElementTree

import pytest

from conftest import REPO


@pytest.mark.drill
@pytest.mark.slow(seconds=120)
def test_the_gpu_check_runs_end_to_end_in_smoke_mode(tmp_path):
    out = tmp_path / "out"
    threads = {k: os.environ[k] for k in ("OMP_NUM_THREADS",) if k in os.environ}  # the suite's share of the cores
    done = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), str(out), "--smoke"], capture_output=True,
                          text=True, timeout=600, env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable,
                                                       "HOME": str(tmp_path), **threads})
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    tests = (out / "gpu_tests.log").read_text()  # every CUDA test ran here and passed: none failed or was skipped
    # pytest adds "(h:mm:ss)" to a run of a minute or more (a slow CPU's smoke run takes that long)
    assert re.fullmatch(r"\.{9,}\s+\[100%\]\n\d+ passed in [\d.]+s( \(\d+:\d\d:\d\d\))?\n", tests), tests
    # what they measured comes back in the JUnit file: the differing shares and the log-prob gaps beside their bounds
    figures = {e.get("name"): e.get("value") for e in ElementTree.parse(out / "gpu_tests.xml").iter("property")}
    assert figures["greedy_differ_from_cpu"] == "0 of 8" and "decode_graph_bf16_sampled_differ" in figures
    assert figures["step0_logp_sampler_diff_none_ieee"].endswith("(bound 0.0001)")
    assert figures["check_batch_ratio"].startswith("before the update: KL")
    result = json.loads((out / "gpu_check.json").read_text())
    assert result["smoke"] and result["machine"]["device"] == "cpu"
    assert result["complete"] and result["not_measured"] == []
    assert {(r["dtype"], r["decode_graph"], r["prompts"], r["group"]) for r in result["generation"]} == {
        (dtype, graph, 2, 2) for dtype in ("float32", "bf16") for graph in (False, True)}
    assert all(r["tokens_per_s"] > 0 for r in result["generation"])
    assert [r["config"] for r in result["grpo"]] == ["autocast none", "autocast bf16", "autocast bf16, decode_graph",
                                                     "autocast bf16, decode_graph, attention as torch chooses "
                                                     "(cuDNN's too)", "autocast bf16, decode_graph, scoring chunks x4"]
    assert all(r["s_per_step"] > 0 and r["peak_memory_gib"] > 0 and "generate" in r["phase_share"]
               for r in result["grpo"])
    assert [(r["preset"], r["own_repeats"]) for r in result["sft"]] == [("tiny", 0), ("tiny", 2)]
    assert all(r["s_per_step"] > 0 and r["host_batch_ms"] > 0 for r in result["sft"])
    # each shape's last step profiled after the timed ones (on a GPU its busy share, which a CPU has not)
    for r, own in zip(result["sft"], (0, 2), strict=True):
        assert r["profile"].startswith(f"# rookworld sft of sft-tiny-4-{own}, batch 4, ") and \
            ": step 4 on cpu, " in r["profile"], r["profile"]
    assert all(r["device_busy_share"] is None for r in result["sft"])
    # TRL's GRPOTrainer beside ours on the same work, with the shared reward run without Stockfish (as on the GPU)
    trl = json.loads((out / "grpo_vs_trl.json").read_text())
    assert trl["machine"]["engine"] == "none" and trl["machine"]["device"] == "cpu"
    (pair,) = result["trl"]["results"]
    assert pair["prompts"] == pair["generations"] == 2 and pair["ours_s_per_step"] > 0 and pair["trl_s_per_step"] > 0
    # equal work at beta 0: no reference pass in ours either (TRL has none); host memory kept as `rookworld train` does
    assert pair["beta"] == 0 and pair["ours_reference_pass"] is False
    assert pair["ours_completion_len"] > 0 and pair["trl_completion_len"] > 0  # equal work is checkable
    assert trl["machine"]["allocator"].startswith("host memory: freed blocks are kept for reuse")
    table = (out / "gpu_check.md").read_text()
    assert "| GRPO step (124M preset) |" in table and "(smoke: tiny sizes)" in table
    assert "| the host's batch, ms | device busy |" in table and " | - |\n" in table.split("| SFT preset")[1]
    # ours as configs/rookworld-124m.yaml runs it on a GPU: the shape-stable decode step (eager on a CPU)
    assert pair["ours_decode_graph"] and "our decoding: shape-stable" in (out / "grpo_vs_trl.txt").read_text()
    assert (f"| float32, decode_graph | small | 0 | 2 x 2 x 8 | {pair['ours_s_per_step']:.3f} | "
            f"{pair['trl_s_per_step']:.3f} |") in table
    # where the preset's GRPO step spends its time: the profiler's tables, with the trainer's phases as ranges
    profile = (out / "grpo_profile.txt").read_text()
    assert profile.startswith("# GRPO steps 3-4 of configs/rookworld-124m.yaml (bf16, decode_graph) on cpu")
    assert all(f"phase/{p}" in profile for p in ("generate", "reference", "policy", "optimizer")) and "aten::" in profile
    bad = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), str(out), "--fast"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "unknown option --fast" in bad.stderr
    for deadline in ("220", "8m"):
        bad = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), str(out), "--smoke"], capture_output=True,
                             text=True, timeout=60, env={**os.environ, "DEADLINE_S": deadline})
        assert bad.returncode == 2 and f"DEADLINE_S must be a whole number of seconds above 220, got '{deadline}'" \
            in bad.stderr


def _check(out, *extra) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--smoke",
                             "--out", str(out), *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_gpu_check_its_timeout_kills_still_leaves_what_it_measured(tmp_path):
    """The device call's timeout kills what runs: the results written after each measurement come back."""
    proc = _check(tmp_path)
    try:
        for line in proc.stdout:
            if line.startswith("generation "):  # the first measurement is done
                break
        proc.kill()
    finally:
        proc.wait(timeout=60)
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert not result["complete"] and result["generation"] and result["generation"][0]["tokens_per_s"] > 0
    assert "**Incomplete**" in (tmp_path / "gpu_check.md").read_text()


def test_a_gpu_check_past_its_deadline_starts_no_measurement_and_names_each(tmp_path):
    """gpu_check.sh's DEADLINE_S keeps TRL's run its time: past the deadline the benchmarks measure nothing
    more and say what they left out."""
    import time

    proc = _check(tmp_path, "--deadline", str(time.time() - 1))
    assert proc.wait(timeout=120) == 0, proc.stdout.read()
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["complete"] and result["generation"] == result["grpo"] == result["sft"] == []
    assert len(result["not_measured"]) == 4 + 5 + 2  # generation: 2 dtypes x decode_graph off/on; GRPO; SFT
    assert "sft tiny batch 4 own_repeats 2: the deadline had passed" in result["not_measured"]
    assert "- not measured: grpo autocast bf16, decode_graph: the deadline had passed" in \
        (tmp_path / "gpu_check.md").read_text()


def test_a_measurement_that_fails_is_named_and_the_others_still_run(tmp_path, monkeypatch):
    """One GPU call, one chance: a configuration that raises there (a CUDA graph that will not capture, memory
    that runs out) becomes a row naming its error, and every other measurement still runs; the exit status says
    one failed. Faults injected: decode_graph generation and the SFT run with its own answers raise."""
    import importlib.util

    import torch

    import rookworld_rlvr.sft as sft

    spec = importlib.util.spec_from_file_location("gpu_check_faults", REPO / "benchmarks" / "gpu_check.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    real_generate, real_train = bench.generate, sft.train

    def generate(*args, decode_graph=False, **kw):
        if decode_graph:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        return real_generate(*args, decode_graph=decode_graph, **kw)

    def train(cfg, **kw):
        if cfg.own_repeats:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_train(cfg, **kw)

    monkeypatch.setattr(bench, "generate", generate)
    monkeypatch.setattr(sft, "train", train)
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--device", "cpu", "--smoke", "--out", str(tmp_path)])
    assert bench.main() == 1
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["complete"] and result["not_measured"] == []
    gen = {(r["dtype"], r["decode_graph"]): r for r in result["generation"]}
    assert len(gen) == 4 and all(gen[d, False]["tokens_per_s"] > 0 for d in ("float32", "bf16"))
    assert all(gen[d, True]["error"].startswith("RuntimeError: CUDA error: operation not permitted")
               and "tokens_per_s" not in gen[d, True] for d in ("float32", "bf16"))
    assert len(result["grpo"]) == 5 and all(r["s_per_step"] > 0 for r in result["grpo"])
    from rookworld_rlvr.model import logprobs  # the row with larger scoring chunks gave the default back
    from rookworld_rlvr.model.generate import attention_backends  # and torch's attention row our choice

    assert logprobs.SCORE_CHUNK_ELEMENTS == 2**25
    assert attention_backends.__module__ == "rookworld_rlvr.model.generate"
    measured, oom = result["sft"]
    assert measured["s_per_step"] > 0 and oom["own_repeats"] == 2 and oom["error"].startswith("OutOfMemoryError")
    table = (tmp_path / "gpu_check.md").read_text()
    assert "| bf16 | on | 2 x 2 x 8 | failed: RuntimeError: CUDA error" in table
    assert "| tiny | 4 | 2 | failed: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB | - | - |" in table
    # on a GPU the table's head names it and the precision its float32 rows ran in (TF32 unless chosen otherwise)
    gpu = {"torch": "2.11.0+cu130", "device": "cuda", "gpu": "NVIDIA H200", "cuda": "13.0", "driver": "580.95",
           "float32_matmul": "tf32"}
    head = bench.markdown({**result, "machine": gpu, "smoke": False}).splitlines()[:3]
    assert head == ["# GPU check: NVIDIA H200", "",
                    "torch 2.11.0+cu130, CUDA 13.0, driver 580.95, device cuda, float32 products in tf32"]


def test_the_trl_comparisons_random_model_runs_every_completion_to_the_limit_in_both_samplers(tmp_path):
    """Equal work in benchmarks/grpo_vs_trl.py: its random model's EOS is undrawable, so our sampler and
    transformers' generate (TRL's) both write --max-tokens tokens in every row. The same architecture
    freshly initialised, without `never_stops`, stops some rows early in both."""
    import importlib.util

    import torch
    from transformers import GPT2LMHeadModel

    from rookworld_rlvr.model import load_policy
    from rookworld_rlvr.model.generate import generate

    spec = importlib.util.spec_from_file_location("grpo_vs_trl", REPO / "benchmarks" / "grpo_vs_trl.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    model, tok = load_policy(str(bench.random_model("tiny", tmp_path / "m", seed=0)), device="cpu", verbose=False)
    prompts = ["P: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1 ", "A: 8/8/8/8/8/8/8/K6k w - - 0 1+"]
    limit = 48

    def lengths(m) -> tuple[list[int], list[int]]:
        ours = generate(m, tok, prompts, max_new_tokens=limit, temperature=1.0, num_return_sequences=8,
                        generator=torch.Generator().manual_seed(0))
        enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        torch.manual_seed(0)
        out = m.generate(**enc, do_sample=True, top_k=0, max_new_tokens=limit, num_return_sequences=8,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)[:, enc.input_ids.shape[1]:]
        hf = [limit if not (row == tok.eos_token_id).any() else int((row == tok.eos_token_id).nonzero()[0]) for row in out]
        return ours.completion_mask.sum(1).tolist(), hf

    ours, hf = lengths(model)
    assert ours == hf == [limit] * 16
    plain = GPT2LMHeadModel(model.config)  # the same architecture, freshly initialised: its EOS is drawable
    ours, hf = lengths(plain.eval())
    assert min(ours) < limit and min(hf) < limit
    with pytest.raises(ValueError, match="freshly initialised"):
        bench.never_stops(model, tok.eos_token_id)  # its layer norm is no longer at its initial values


def test_a_trl_run_that_wrote_no_result_is_named_in_the_table_by_its_logs_last_lines(tmp_path):
    """gpu_check.sh's last step on the GPU machine: TRL's result (or, where its run wrote none, why) joins
    gpu_check.json and gpu_check.md, in a process that imports neither torch nor transformers (seconds of the
    call's deadline otherwise)."""
    result = {"machine": {"torch": "2.11.0+cu130", "device": "cuda", "gpu": "NVIDIA H100 80GB HBM3"}, "smoke": False,
              "generation": [], "grpo": [], "sft": [], "not_measured": [], "complete": True,
              "trl": "not measured yet: scripts/gpu_check.sh runs benchmarks/grpo_vs_trl.py next"}
    (tmp_path / "gpu_check.json").write_text(json.dumps(result))
    log = tmp_path / "grpo_vs_trl.txt"
    log.write_text("loading TRL\nTraceback (most recent call last):\nModuleNotFoundError: No module named 'trl'\n")
    code = ("import runpy, sys\nsys.argv = sys.argv[1:]\n"
            "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
            "except SystemExit as e:\n    assert e.code == 0, e.code\n"
            "print(sorted(m for m in ('torch', 'transformers', 'rookworld_rlvr') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code, str(REPO / "benchmarks" / "gpu_check_table.py"), "--out",
                           str(tmp_path), "--add-trl", str(tmp_path / "grpo_vs_trl.json"), str(log)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"
    trl = json.loads((tmp_path / "gpu_check.json").read_text())["trl"]
    assert trl == ("not measured: loading TRL / Traceback (most recent call last): / ModuleNotFoundError: "
                   "No module named 'trl'")
    table = (tmp_path / "gpu_check.md").read_text()
    assert table.startswith("# GPU check: NVIDIA H100 80GB HBM3\n") and f"TRL GRPOTrainer: {trl}" in table
