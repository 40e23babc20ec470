#!/usr/bin/env bash
# The one prepared command for a GPU machine (offline; about 8 minutes on one H100):
#   scripts/gpu_check.sh OUT_DIR            the CUDA tests (tests/gpu), then benchmarks/gpu_check.py on cuda
#   scripts/gpu_check.sh OUT_DIR --smoke    the same on the CPU at tiny sizes (a CPU test runs this)
# OUT_DIR gets gpu_tests.log, gpu_tests.xml (JUnit), gpu_check.json and gpu_check.md, and (not with --smoke)
# grpo_vs_trl.txt/.json: TRL's GRPOTrainer beside ours on the GPU, or why it did not run.
# Uses the python on PATH (PYTHON=... to choose): a CUDA build of torch with this package's dependencies;
# what the GPU image lacks (python-chess, Stockfish) comes from scripts/gpu_pack.sh's .whl/ and .gpu/ when present.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu_check.sh OUT_DIR [--smoke]}
mode=${2:-}
if [ -n "$mode" ] && [ "$mode" != "--smoke" ]; then
  echo "gpu_check.sh: unknown option $mode (only --smoke)" >&2
  exit 2
fi
py=${PYTHON:-python3}
device=cuda
[ "$mode" = "--smoke" ] && device=cpu
mkdir -p "$out"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then  # carried wheels (scripts/gpu_pack.sh)
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/gpu-site${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ -f .gpu/stockfish.xz ]; then  # carried Stockfish (scripts/gpu_pack.sh --stockfish)
  xz -dc .gpu/stockfish.xz > /tmp/gpu-stockfish && chmod +x /tmp/gpu-stockfish && export STOCKFISH_PATH=/tmp/gpu-stockfish
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
ROOKWORLD_TEST_DEVICE=$device "$py" -m pytest -q -m gpu tests/gpu -p no:cacheprovider \
  --junitxml "$out/gpu_tests.xml" 2>&1 | tee "$out/gpu_tests.log"
tests=${PIPESTATUS[0]}
"$py" benchmarks/gpu_check.py --device "$device" --out "$out" $mode
bench=$?
# TRL's GRPOTrainer beside ours on the same GPU and work (124M, bf16), when TRL and its dependencies import
# (carried as wheels, or in the image); at most 150 s. Not in --smoke (tests/test_gpu_check.py keeps it short).
if [ "$mode" != "--smoke" ]; then
  if "$py" -c "import trl, datasets, accelerate" 2> "$out/grpo_vs_trl.txt"; then
    timeout 150 "$py" benchmarks/grpo_vs_trl.py --config 124m --device cuda --bf16 --beta 0 --steps-124m 3 \
      --warmup-124m 1 --json "$out/grpo_vs_trl.json" > "$out/grpo_vs_trl.txt" 2>&1 || echo "grpo_vs_trl: exit $?" >> "$out/grpo_vs_trl.txt"
  else
    echo "grpo_vs_trl: TRL, datasets or accelerate does not import here (see above); not run" >> "$out/grpo_vs_trl.txt"
  fi
fi
echo "gpu_check: tests exit $tests, benchmarks exit $bench; results in $out"
[ "$tests" = 0 ] && [ "$bench" = 0 ]
