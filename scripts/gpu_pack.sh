#!/usr/bin/env bash
# Run here, before a GPU machine's command: what its image lacks, ready to travel (`carry: [".whl"]`).
#   .whl/   the python-chess wheel (pure Python, built here from its source release); the image has torch,
#           transformers, tokenizers, safetensors, pyyaml, tqdm and pytest
#   .gpu/stockfish.xz   with --stockfish only: a Stockfish binary, xz-compressed (about 22 MB; with the 45 MB tree it
#           comes close to the 64 MiB a call may carry). scripts/gpu_check.sh needs none: its tests and measurements
#           use no engine.
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
