#!/usr/bin/env bash
# More P: positions for the GPU base, made here with Stockfish and carried there (scripts/gpu_pack.sh --more-data):
#   scripts/gpu_more_data.sh GEN OUT_FILE
# GEN is a `rookworld data generate` output folder, finished or not (its train.jsonl.gz, else its shards, which hold
# both sides of the FEN-hash split). OUT_FILE (.jsonl.xz) gets GEN's P: positions on the training side of the split,
# none of them a position of the shipped training set or of any held-out file (compared without the move clocks),
# each once, their truth alone (about 33 bytes a position). It prints what it wrote and what it left out.
set -euo pipefail
cd "$(dirname "$0")/.."
gen=${1:?usage: scripts/gpu_more_data.sh GEN OUT_FILE}
out=${2:?usage: scripts/gpu_more_data.sh GEN OUT_FILE}
py=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
if [ -f "$gen/train.jsonl.gz" ]; then
  sources=("$gen/train.jsonl.gz")
else
  shopt -s nullglob
  sources=("$gen"/.shards/shard_*.jsonl)
fi
[ ${#sources[@]} -gt 0 ] || { echo "gpu_more_data.sh: $gen holds no data generate output" >&2; exit 1; }
echo "gpu_more_data.sh: ${#sources[@]} file(s) of $gen"
"$py" -m rookworld_rlvr data merge "${sources[@]}" --out "$out" --tasks P --side train --truth-only --seed more \
  --exclude data/train.jsonl.xz data/eval.jsonl.gz data/strength.jsonl.gz data/puzzles_eval.jsonl.gz \
  data/eval_histories.jsonl.gz data/mate_in_one.tsv data/openings.txt
