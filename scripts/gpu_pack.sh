#!/usr/bin/env bash
# Run here, before a GPU machine's command: what its image lacks, ready to travel (both folders are git-ignored).
#   scripts/gpu_pack.sh --trl         for scripts/gpu_check.sh (carry [".whl"])
#   scripts/gpu_pack.sh --stockfish   for scripts/gpu_rl.sh (carry [".whl", ".gpu"])
# .whl/ is rebuilt on every call and holds the python-chess wheel (pure Python, built here from its source release;
#   the image has torch, transformers, tokenizers, safetensors, pyyaml, tqdm and pytest) and, with --trl, what TRL's
#   GRPOTrainer needs beside it there: TRL, datasets, dill and multiprocess at constraints.txt's versions (about
#   2 MB of pure-Python wheels for the image's Python, GPU_PYTHON, default 3.12; the image has accelerate, pyarrow,
#   pandas and xxhash). scripts/gpu_check.sh runs TRL beside our trainer when these import.
# .gpu/stockfish.xz, with --stockfish: a Stockfish binary, xz-compressed (about 21 MiB). scripts/gpu_rl.sh needs it
#   (GRPO's rewards); gpu_check.sh needs none. The GPU base's further positions travel in the tree, as game records
#   (data/more_games.jsonl.xz, _2 and _3) that gpu_rl.sh --more-games replays there.
# The last line says how much the call's carry adds up to; more than 64 MiB fails here, not there.
set -euo pipefail
cd "$(dirname "$0")/.."
trl=0
stockfish=0
while [ $# -gt 0 ]; do
  case $1 in
    --trl) trl=1 ;;
    --stockfish) stockfish=1 ;;
    *) echo "gpu_pack.sh: unknown option $1 (--trl, --stockfish)" >&2; exit 2 ;;
  esac
  shift
done
py=${PYTHON:-python3}
pin() { grep -E "^$1==" constraints.txt | cut -d= -f3; }
rm -rf .whl
mkdir -p .whl
"$py" -m pip wheel -q --no-deps -w .whl "chess==$(pin chess)"
if [ $trl = 1 ]; then
  gpu_python=${GPU_PYTHON:-3.12}
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$gpu_python" --implementation cp \
    --abi "cp${gpu_python/./}" --platform manylinux2014_x86_64 --platform any -d .whl \
    "trl==$(pin trl)" "datasets==$(pin datasets)" "dill==$(pin dill)" "multiprocess==$(pin multiprocess)"
fi
carry=(.whl)
if [ $stockfish = 1 ]; then
  sf=$(command -v stockfish || true)
  sf=${STOCKFISH_PATH:-${sf:-/usr/games/stockfish}}
  [ -x "$sf" ] || { echo "gpu_pack.sh: no Stockfish at $sf (make setup installs it)" >&2; exit 1; }
  rm -rf .gpu
  mkdir -p .gpu
  xz -9 -T2 -c "$sf" > .gpu/stockfish.tmp && mv .gpu/stockfish.tmp .gpu/stockfish.xz
  carry+=(.gpu)
fi
du -sh "${carry[@]}"
# what the call carries: the working tree (tracked files, and untracked ones git does not ignore) plus the carry
bytes=$({ git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null
          find "${carry[@]}" -type f -exec stat -c %s {} +; } | awk '{s += $1} END {print s + 0}')
echo "gpu_pack.sh: carry [$(printf '"%s", ' "${carry[@]}" | sed 's/, $//')]: $(awk -v b="$bytes" \
  'BEGIN {printf "%.1f", b / 2^20}') MiB travel (the tree and the carry) of 64"
[ "$bytes" -le $((64 * 2**20)) ] || { echo "gpu_pack.sh: more than 64 MiB would not travel" >&2; exit 1; }
