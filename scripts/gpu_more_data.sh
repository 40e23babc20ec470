#!/usr/bin/env bash
# More training samples for the GPU base, from a generation's games (scripts/gpu_base.sh --more-games runs it):
#   scripts/gpu_more_data.sh SOURCE OUT_DIR [--a-rows N] [--plain] [--workers N] [--known FILE]...
# SOURCE is a game record (`rookworld data record`, such as data/more_games.jsonl.xz), replayed first into
# OUT_DIR/replay with no Stockfish on N workers (default: every core); or a `rookworld data generate` output folder,
# finished or not (its train.jsonl.gz, else its shards, which hold both sides of the FEN-hash split). Each file
# keeps the training side of the split and leaves out every position of a held-out file (compared without the move
# clocks; for A:, before and after the move), each sample once, its truth alone:
#   OUT_DIR/more_p.jsonl.xz  the P: positions that the known training set does not hold (about 33 bytes each);
#   OUT_DIR/more_a.jsonl.xz  at most N (--a-rows, default 0: no file) of the A: transitions that the known set does
#                            not hold (about 38 bytes each): game starts and other histories of real games.
# The known training set is every --known FILE (default: the shipped data/train.jsonl.xz, what gpu_base.sh trains
# on; gpu_base.sh adds the samples taken from the records before this one, so no two records give the same).
# --plain writes .jsonl instead (no compression: where the files are read once, on the machine that made them).
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: scripts/gpu_more_data.sh SOURCE OUT_DIR [--a-rows N] [--plain] [--workers N] [--known FILE]..."
src=${1:?$usage}
out=${2:?$usage}
shift 2
a_rows=0
ext=.jsonl.xz
workers=$(nproc)
known=()
while [ $# -gt 0 ]; do
  case $1 in
    --a-rows) a_rows=${2:?--a-rows needs a number}; shift ;;
    --plain) ext=.jsonl ;;
    --workers) workers=${2:?--workers needs a number}; shift ;;
    --known) known+=("${2:?--known needs a sample file}"); shift ;;
    *) echo "gpu_more_data.sh: unknown option $1 ($usage)" >&2; exit 2 ;;
  esac
  shift
done
py=${PYTHON:-python3}
[ ${#known[@]} -gt 0 ] || known=(data/train.jsonl.xz)
for f in "${known[@]}"; do [ -f "$f" ] || { echo "gpu_more_data.sh: --known $f: no such file" >&2; exit 2; }; done
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
. scripts/held_out.sh
# the two merges at once: each reads the same files, much of it in one process (its workers' rows unpickled there);
# what each says is printed when both are done, the P: merge's first
"$py" -m rookworld_rlvr data merge "${sources[@]}" --out "$out/more_p$ext" --tasks P --side train --truth-only \
  --seed more --exclude "${known[@]}" "${held[@]}" > "$out/.merge_p.out" &
p_merge=$!
a_status=0
if [ "$a_rows" -gt 0 ]; then
  "$py" -m rookworld_rlvr data merge "${sources[@]}" --out "$out/more_a$ext" --tasks A --side train --truth-only \
    --seed more --exclude "${held[@]}" --new-only "${known[@]}" --max "$a_rows" > "$out/.merge_a.out" || a_status=$?
fi
p_status=0
wait "$p_merge" || p_status=$?
cat "$out/.merge_p.out" "$out/.merge_a.out" 2> /dev/null || true
rm -f "$out/.merge_p.out" "$out/.merge_a.out"
[ "$p_status" = 0 ] || { echo "gpu_more_data.sh: the P: merge failed" >&2; exit 1; }
[ "$a_status" = 0 ] || { echo "gpu_more_data.sh: the A: merge failed" >&2; exit 1; }
