#!/usr/bin/env bash
# More training samples for the GPU base, from a generation's games (scripts/gpu_base.sh --more-games runs it):
#   scripts/gpu_more_data.sh SOURCE OUT_DIR [--a-rows N] [--plain] [--workers N]
# SOURCE is a game record (`rookworld data record`, such as data/more_games.jsonl.xz), replayed first into
# OUT_DIR/replay with no Stockfish on N workers (default: every core); or a `rookworld data generate` output folder,
# finished or not (its train.jsonl.gz, else its shards, which hold both sides of the FEN-hash split). Each file
# keeps the training side of the split and leaves out every position of a held-out file (compared without the move
# clocks; for A:, before and after the move), each sample once, its truth alone:
#   OUT_DIR/more_p.jsonl.xz  the P: positions that the shipped training set does not hold (about 33 bytes each);
#   OUT_DIR/more_a.jsonl.xz  at most N (--a-rows, default 0: no file) of the A: transitions that the shipped set does
#                            not hold (about 38 bytes each): game starts and other histories of real games.
# --plain writes .jsonl instead (no compression: where the files are read once, on the machine that made them).
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: scripts/gpu_more_data.sh SOURCE OUT_DIR [--a-rows N] [--plain] [--workers N]"
src=${1:?$usage}
out=${2:?$usage}
shift 2
a_rows=0
ext=.jsonl.xz
workers=$(nproc)
while [ $# -gt 0 ]; do
  case $1 in
    --a-rows) a_rows=${2:?--a-rows needs a number}; shift ;;
    --plain) ext=.jsonl ;;
    --workers) workers=${2:?--workers needs a number}; shift ;;
    *) echo "gpu_more_data.sh: unknown option $1 ($usage)" >&2; exit 2 ;;
  esac
  shift
done
py=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$out"
gen=$src
if [ -f "$src" ]; then
  gen="$out/replay"
  "$py" -m rookworld_rlvr data replay "$src" --out "$gen" --workers "$workers" --quiet
fi
if [ -f "$gen/train.jsonl.gz" ]; then
  sources=("$gen/train.jsonl.gz")
else
  shopt -s nullglob
  sources=("$gen"/.shards/shard_*.jsonl)
fi
[ ${#sources[@]} -gt 0 ] || { echo "gpu_more_data.sh: $src holds no data generate output" >&2; exit 1; }
echo "gpu_more_data.sh: ${#sources[@]} file(s) of $gen"
held=(data/eval.jsonl.gz data/strength.jsonl.gz data/puzzles_eval.jsonl.gz data/eval_histories.jsonl.gz
      data/mate_in_one.tsv data/openings.txt)
"$py" -m rookworld_rlvr data merge "${sources[@]}" --out "$out/more_p$ext" --tasks P --side train --truth-only \
  --seed more --exclude data/train.jsonl.xz "${held[@]}"
if [ "$a_rows" -gt 0 ]; then
  "$py" -m rookworld_rlvr data merge "${sources[@]}" --out "$out/more_a$ext" --tasks A --side train --truth-only \
    --seed more --exclude "${held[@]}" --new-only data/train.jsonl.xz --max "$a_rows"
fi
