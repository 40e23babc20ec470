"""The table of `scripts/gpu_check.sh`'s results: OUT/gpu_check.md from OUT/gpu_check.json, and TRL's run
(benchmarks/grpo_vs_trl.py, which gpu_check.sh runs after benchmarks/gpu_check.py) put into both.

    python benchmarks/gpu_check_table.py --out OUT --add-trl OUT/grpo_vs_trl.json OUT/grpo_vs_trl.txt

Imports neither torch nor the package: on the GPU machine it runs within the call's deadline, in a second.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"# GPU check: {m.get('gpu', m.get('cpu'))}", "",
             f"torch {m['torch']}, CUDA {m.get('cuda', '-')}, driver {m.get('driver', '-')}, device {m['device']}"
             + (f", float32 products in {m['float32_matmul']}" if "float32_matmul" in m else "")
             + (" (smoke: tiny sizes)" if result["smoke"] else ""), ""]
    if not result.get("complete", True):
        lines += ["**Incomplete**: below are the measurements that finished before the call ended.", ""]
    if result.get("not_measured"):
        lines += [f"- not measured: {what}" for what in result["not_measured"]] + [""]
    lines += ["| generation | decode_graph | prompts x group x tokens | tokens/s |", "|---|---|---|---|"]
    lines += [f"| {r['dtype']} | {'on' if r['decode_graph'] else 'off'} | {r['prompts']} x {r['group']} x "
              f"{r['new_tokens']} | {r['tokens_per_s'] if 'error' not in r else 'failed: ' + r['error']} |"
              for r in result["generation"]]
    lines += ["", "| GRPO step (124M preset) | batch | s/step | peak GiB | phase shares |", "|---|---|---|---|---|"]
    for r in result["grpo"]:
        if "error" in r:
            lines.append(f"| {r['config']} | - | failed: {r['error']} | - | - |")
        else:
            shares = ", ".join(f"{k} {v:.0%}" for k, v in r["phase_share"].items() if v >= 0.01)
            lines.append(f"| {r['config']} | {r['batch']} | {r['s_per_step']} | {r['peak_memory_gib']} | {shares} |")
    lines += ["", "| SFT preset | batch | own answers a step | s/step | samples/s | the host's batch, ms "
              "| device busy |", "|---|---|---|---|---|---|---|"]

    def busy(r: dict) -> str:  # the share of a profiled step the GPU ran kernels (none on a CPU, or in older results)
        return "-" if r.get("device_busy_share") is None else f"{r['device_busy_share']:.0%}"

    lines += [f"| {r['preset']} | {r['batch_size']} | {r.get('own_repeats', '-')} | "
              + (f"failed: {r['error']} | - | - | - |" if "error" in r else
                 f"{r['s_per_step']} | {r['samples_per_s']} | {r.get('host_batch_ms', '-')} | {busy(r)} |")
              for r in result["sft"]]
    trl = result["trl"]
    if isinstance(trl, dict):
        lines += ["", f"| TRL {trl['trl']} GRPOTrainer beside ours | model | β | prompts x group x tokens | ours s/step "
                  "| TRL s/step | TRL / ours per step | per token | tokens ours / TRL |", "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {'bf16' if r['bf16'] else 'float32'}{', decode_graph' if r.get('ours_decode_graph') else ''} "
                  f"| {r['config']} | {r['beta']:g} | {r['prompts']} x "
                  f"{r['generations']} x {r['max_tokens']} | {r['ours_s_per_step']:.3f} | {r['trl_s_per_step']:.3f} "
                  f"| {r['ratio_trl_over_ours']:.2f}x | "
                  + (f"{r['ratio_per_token']:.2f}x |" if r.get("ratio_per_token") else "- |")
                  + (f" {r['ours_completion_len']:.0f} / {r['trl_completion_len']:.0f} |"
                     if r.get("ours_completion_len") and r.get("trl_completion_len") else " - |")
                  for r in trl["results"]]
    else:
        lines += ["", f"TRL GRPOTrainer: {trl}"]
    return "\n".join(lines + [""])


def add_trl(out: Path, trl_json: Path, trl_log: Path) -> None:
    """Put benchmarks/grpo_vs_trl.py's result (run after this script by gpu_check.sh) into OUT's JSON and
    table; where it wrote none, the last lines of its log say why."""
    result = json.loads((out / "gpu_check.json").read_text())
    if trl_json.is_file():
        trl = json.loads(trl_json.read_text())
        result["trl"] = {"trl": trl["machine"]["trl"], "command": trl["machine"]["command"], "results": [
            {k: r.get(k) for k in ("config", "beta", "bf16", "prompts", "generations", "max_tokens", "ours_s_per_step",
                                   "trl_s_per_step", "ratio_trl_over_ours", "ratio_per_token", "paired_ratios",
                                   "ours_completion_len", "trl_completion_len", "ours_reference_pass",
                                   "ours_decode_graph")}
            for r in trl["results"]]}
    else:
        tail = trl_log.read_text().strip().splitlines()[-3:] if trl_log.is_file() else ["no log"]
        result["trl"] = "not measured: " + " / ".join(tail)[-400:]
    (out / "gpu_check.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "gpu_check.md").write_text(markdown(result))
    print(markdown(result))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="the folder holding gpu_check.json")
    ap.add_argument("--add-trl", nargs=2, required=True, type=Path, metavar=("JSON", "LOG"),
                    help="benchmarks/grpo_vs_trl.py's JSON (or, if it wrote none, its log, whose last lines say why)")
    args = ap.parse_args()
    add_trl(args.out, *args.add_trl)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
