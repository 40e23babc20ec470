#!/usr/bin/env bash
# Run here, before a GPU machine's command: what its image lacks, ready to travel (`carry: [".whl"]`).
#   .whl/   the python-chess wheel (pure Python, built here from its source release); the image has torch,
#           transformers, tokenizers, safetensors, pyyaml, tqdm and pytest
#   .gpu/stockfish.xz   with --stockfish only: a Stockfish binary, xz-compressed (about 21 MiB; with the 42 MiB tree
#           it comes close to the 64 MiB a call may carry: the last line says how much travels). scripts/gpu_check.sh
#           needs none (its tests and measurements use no engine); scripts/gpu_rl.sh does (GRPO's rewards).
# scripts/gpu_check.sh installs the wheel and unpacks Stockfish when they are there. Both folders are git-ignored.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
py=${PYTHON:-python3}
"$py" -m pip wheel -q --no-deps -w .whl "chess==$(grep -E '^chess==' constraints.txt | cut -d= -f3)"
if [ "${1:-}" = "--stockfish" ]; then
  sf=$(command -v stockfish || true)
  sf=${STOCKFISH_PATH:-${sf:-/usr/games/stockfish}}
  [ -x "$sf" ] || { echo "gpu_pack.sh: no Stockfish at $sf (make setup installs it)" >&2; exit 1; }
  mkdir -p .gpu
  xz -9 -T2 -c "$sf" > .gpu/stockfish.xz
fi
du -sh .whl .gpu 2>/dev/null || true
# what a call carries: the working tree (tracked files, and untracked ones git does not ignore) plus .whl and .gpu
bytes=$({ git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null
          find .whl .gpu -type f -exec stat -c %s {} + 2>/dev/null; } | awk '{s += $1} END {print s + 0}')
echo "gpu_pack.sh: $(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 2^20}') MiB travel (the tree, .whl, .gpu) of 64"
[ "$bytes" -le $((64 * 2**20)) ] || { echo "gpu_pack.sh: more than 64 MiB would not travel" >&2; exit 1; }
