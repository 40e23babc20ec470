#!/usr/bin/env bash
# More training samples for the GPU base, made here with Stockfish and carried there (scripts/gpu_pack.sh --more-data):
#   scripts/gpu_more_data.sh GEN OUT_DIR [A_ROWS]
# GEN is a `rookworld data generate` output folder, finished or not (its train.jsonl.gz, else its shards, which hold
# both sides of the FEN-hash split). Each file keeps the training side of the split and leaves out every position of
# a held-out file (compared without the move clocks; for A:, before and after the move), each sample once, its truth
# alone, in xz:
#   OUT_DIR/more_p.jsonl.xz  GEN's P: positions that the shipped training set does not hold (about 33 bytes each);
#   OUT_DIR/more_a.jsonl.xz  at most A_ROWS (default 0: no file) of GEN's A: transitions that the shipped set does not
#                            hold (about 38 bytes each): game starts and other histories of real games.
set -euo pipefail
cd "$(dirname "$0")/.."
gen=${1:?usage: scripts/gpu_more_data.sh GEN OUT_DIR [A_ROWS]}
out=${2:?usage: scripts/gpu_more_data.sh GEN OUT_DIR [A_ROWS]}
a_rows=${3:-0}
py=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
if [ -f "$gen/train.jsonl.gz" ]; then
  sources=("$gen/train.jsonl.gz")
else
  shopt -s nullglob
  sources=("$gen"/.shards/shard_*.jsonl)
fi
[ ${#sources[@]} -gt 0 ] || { echo "gpu_more_data.sh: $gen holds no data generate output" >&2; exit 1; }
mkdir -p "$out"
echo "gpu_more_data.sh: ${#sources[@]} file(s) of $gen"
held=(data/eval.jsonl.gz data/strength.jsonl.gz data/puzzles_eval.jsonl.gz data/eval_histories.jsonl.gz
      data/mate_in_one.tsv data/openings.txt)
"$py" -m rookworld_rlvr data merge "${sources[@]}" --out "$out/more_p.jsonl.xz" --tasks P --side train --truth-only \
  --seed more --exclude data/train.jsonl.xz "${held[@]}"
if [ "$a_rows" -gt 0 ]; then
  "$py" -m rookworld_rlvr data merge "${sources[@]}" --out "$out/more_a.jsonl.xz" --tasks A --side train --truth-only \
    --seed more --exclude "${held[@]}" --new-only data/train.jsonl.xz --max "$a_rows"
fi
