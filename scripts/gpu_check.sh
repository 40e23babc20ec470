#!/usr/bin/env bash
# The one prepared command for a GPU machine (offline; about 8 minutes on one H100):
#   scripts/gpu_check.sh OUT_DIR            the CUDA tests (tests/gpu), then benchmarks/gpu_check.py on cuda
#   scripts/gpu_check.sh OUT_DIR --smoke    the same on the CPU at tiny sizes (a CPU test runs this)
# OUT_DIR gets gpu_tests.log, gpu_tests.xml (JUnit, with what the tests measured as properties), gpu_check.json and
# gpu_check.md (TRL's GRPOTrainer beside ours included), grpo_vs_trl.txt/.json (that run's own output, or why it
# did not run) and grpo_profile.txt (torch.profiler's tables of the 124M preset's GRPO steps).
# DEADLINE_S=N: the call ends within about N seconds (give the device call's timeout a little more): the benchmarks
# start no measurement in the last TRL_S (220) seconds, which TRL's run and the profile keep; what did not run is
# named in the results. Every result file is written again after each measurement, so a call its timeout ends
# still sends back what it finished.
# Uses the python on PATH (PYTHON=... to choose): a CUDA build of torch with this package's dependencies;
# what the GPU image lacks (python-chess; TRL and datasets) comes from scripts/gpu_pack.sh --trl's .whl/ when present.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu_check.sh OUT_DIR [--smoke]}
mode=${2:-}
if [ -n "$mode" ] && [ "$mode" != "--smoke" ]; then
  echo "gpu_check.sh: unknown option $mode (only --smoke)" >&2
  exit 2
fi
start=$(date +%s)
TRL_S=220  # TRL's run (at most 150 s) and the profile (60 s)
deadline=()
if [ -n "${DEADLINE_S:-}" ]; then
  if ! [[ "$DEADLINE_S" =~ ^[0-9]+$ ]] || [ "$DEADLINE_S" -le "$TRL_S" ]; then
    echo "gpu_check.sh: DEADLINE_S must be a whole number of seconds above $TRL_S, got '$DEADLINE_S'" >&2
    exit 2
  fi
  deadline=(--deadline $((start + DEADLINE_S - TRL_S)))
fi
py=${PYTHON:-python3}
device=cuda
[ "$mode" = "--smoke" ] && device=cpu
mkdir -p "$out"
. scripts/gpu_wheels.sh
use_carried_wheels "$py" $([ "$mode" = "--smoke" ] && echo 1 || echo 0) || exit 1
use_carried_stockfish "$py" /tmp/gpu-stockfish || exit 1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
# each CUDA test within 120 s (the suite's 300 s would let one hang take the benchmarks' minutes)
ROOKWORLD_TEST_DEVICE=$device "$py" -m pytest -q -m gpu tests/gpu -p no:cacheprovider --timeout 120 \
  --junitxml "$out/gpu_tests.xml" 2>&1 | tee "$out/gpu_tests.log"
tests=${PIPESTATUS[0]}
"$py" benchmarks/gpu_check.py --device "$device" --out "$out" $mode "${deadline[@]}"
bench=$?
# TRL's GRPOTrainer beside ours on the same device and work (124M, bf16; --smoke: the shipped small model, 2 x 2
# completions of 8 tokens, float32), when TRL and its dependencies import (scripts/gpu_pack.sh --trl carries them);
# at most 150 s (less where DEADLINE_S leaves less). Its result joins gpu_check.json and gpu_check.md; where it did not run, the reason does. The shared
# reward runs without Stockfish (--engine none: a move outside a sample's top 5 is valued at the lowest of them):
# Stockfish (21 MiB) and TRL's wheels do not fit in one 64 MiB carry with the tree, and both trainers score alike.
rm -f "$out/grpo_vs_trl.json"
trl_s=150
if [ -n "${DEADLINE_S:-}" ]; then
  left=$(( start + DEADLINE_S - $(date +%s) - 10 ))  # 10 s for what follows TRL's run
  [ "$left" -lt "$trl_s" ] && trl_s=$left
fi
if [ "$trl_s" -lt 30 ]; then
  echo "grpo_vs_trl: not run: ${trl_s} s were left before DEADLINE_S" > "$out/grpo_vs_trl.txt"
elif "$py" -c "import trl, datasets, accelerate" 2> "$out/grpo_vs_trl.txt"; then
  if [ "$mode" = "--smoke" ]; then
    trl_args=(--config small --device cpu --beta 0 --steps 1 --warmup 0 --threads 1 --prompts 2 --generations 2 --max-tokens 8 --engine none --decode-graph)
  else
    trl_args=(--config 124m --device cuda --bf16 --beta 0 --steps-124m 5 --warmup-124m 1 --engine none --decode-graph)
  fi
  timeout "$trl_s" "$py" benchmarks/grpo_vs_trl.py "${trl_args[@]}" --json "$out/grpo_vs_trl.json" > "$out/grpo_vs_trl.txt" 2>&1 \
    || echo "grpo_vs_trl: exit $?" >> "$out/grpo_vs_trl.txt"
else
  echo "grpo_vs_trl: TRL, datasets or accelerate does not import here (scripts/gpu_pack.sh --trl carries them); not run" >> "$out/grpo_vs_trl.txt"
fi
# (also when a measurement failed: gpu_check.py then exits 1, its rows naming the errors, and its JSON stands)
[ -f "$out/gpu_check.json" ] && "$py" benchmarks/gpu_check_table.py --out "$out" --add-trl "$out/grpo_vs_trl.json" "$out/grpo_vs_trl.txt" > /dev/null
# where a minute is left: where the preset's GRPO step spends its time (torch.profiler), into OUT/grpo_profile.txt
prof_s=90
if [ -n "${DEADLINE_S:-}" ]; then
  prof_s=$(( start + DEADLINE_S - $(date +%s) - 5 ))
fi
if [ "$prof_s" -ge 60 ]; then
  timeout "$prof_s" "$py" benchmarks/gpu_check.py --device "$device" --out "$out" --profile $mode > /dev/null 2>&1 \
    || echo "profile: exit $? (OUT/grpo_profile.txt missing or partial)"
else
  echo "profile: not run: ${prof_s} s were left before DEADLINE_S" > "$out/grpo_profile.txt"
fi
echo "gpu_check: tests exit $tests, benchmarks exit $bench; results in $out"
[ "$tests" = 0 ] && [ "$bench" = 0 ]
