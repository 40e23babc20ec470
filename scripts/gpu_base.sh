#!/usr/bin/env bash
# A base model trained on one GPU in one prepared, offline command (issue: a base that knows chess):
#   scripts/gpu_base.sh OUT_DIR [--smoke] [--minutes M] [--preset wide|small|tiny] [--data-only] [--end-by T]
#                       [--more-games RECORD]... [--more-data FILE]...
# 1. the training data: the shipped data/train.jsonl.xz plus, from python-chess alone, its A: rows copied with
#    shorter histories (a fifth of them) and every transition of 4,000 random openings from the start position
#    (the game starts the shipped data lacks), on the training side of the held-out split, seeded; from each
#    --more-games record (data/more_games.jsonl.xz, _2 and _3: 3,600, 3,000 and 1,400 games' Stockfish
#    answers), replayed here on every core with no Stockfish, its training-side P: positions and its share of
#    200,000 A: transitions (shared evenly between the records) that neither the shipped set (in --smoke, its
#    slice), nor a held-out file, nor an earlier record holds (scripts/gpu_more_data.sh); and each --more-data
#    sample file as it is;
# 2. `rookworld sft` on cuda: a fresh `wide` model (6 x 512, 19M parameters; --preset picks another), bf16
#    autocast, batch 256, its lr schedule fitted to M minutes of training (default 8), checkpointed every 500
#    steps (rerun with the same OUT_DIR and RESUME=1 to continue);
# 3. OUT_DIR gets what a GPU machine can send back (at most 8 files of 16 MiB): the weights as bf16 safetensors
#    shards and meta.tar (config, tokenizer, shard index, the SFT log). Put them together with
#    `mkdir base && tar xf OUT_DIR/meta.tar -C base && cp OUT_DIR/*.safetensors base/`, then judge it on a CPU
#    with Stockfish: `rookworld eval --model base ...` (no Stockfish is needed on the GPU machine for this part).
# --end-by T (seconds since 1970; scripts/gpu_rl.sh passes its deadline): SFT gets at most the minutes left at its
# start, less its reading and encoding (75 s and 40 us a row, on a GPU machine's cores) and the export, so the base
# is in OUT by T (0.5 minutes at least; it says so when it cuts M).
# --data-only: step 1 alone (WORK/train.jsonl.gz; scripts/gpu_rl.sh --base trains GRPO on it).
# --smoke: the same on the CPU at tiny sizes, in seconds (tests/test_gpu_rl.py runs it, through scripts/gpu_rl.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu_base.sh OUT_DIR [--smoke] [--minutes M] [--preset P] [--data-only] [--end-by T] [--more-games RECORD]... [--more-data FILE]...}
shift
smoke=0
data_only=0
end_by=""
minutes=8
preset=wide
more=()
games=()
while [ $# -gt 0 ]; do
  case $1 in
    --smoke) smoke=1 ;;
    --data-only) data_only=1 ;;
    --end-by) end_by=${2:?--end-by needs a time}; shift
              [[ $end_by =~ ^[0-9]+$ ]] || { echo "gpu_base.sh: --end-by needs seconds since 1970, got '$end_by'" >&2; exit 2; } ;;
    --minutes) minutes=${2:?--minutes needs a number}; shift ;;
    --preset) preset=${2:?--preset needs a name}; shift ;;
    --more-games) games+=("${2:?--more-games needs a game record}"); shift ;;
    --more-data) more+=("${2:?--more-data needs a file}"); shift ;;
    *) echo "gpu_base.sh: unknown option $1 (--smoke, --minutes M, --preset P, --data-only, --end-by T, --more-games RECORD," \
            "--more-data FILE)" >&2; exit 2 ;;
  esac
  shift
done
py=${PYTHON:-python3}
mkdir -p "$out"
work=${WORK:-/tmp/gpu-base}
mkdir -p "$work"
. scripts/gpu_wheels.sh
use_carried_wheels "$py" $smoke
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

if [ $smoke = 1 ]; then
  source_data="$work/slice.jsonl"
  "$py" - "$source_data" <<'EOF'
import lzma, sys
rows = []
with lzma.open("data/train.jsonl.xz", "rt") as fh:
    for line in fh:
        rows.append(line)
        if len(rows) == 300:
            break
open(sys.argv[1], "w").writelines(rows)
EOF
  openings=20
  sft=(--preset tiny --device cpu --batch-size 4 --steps 3 --save-every 2 --eval-every 3 --eval-samples 0 --own-repeats 0)
else
  source_data=data/train.jsonl.xz
  openings=4000
  sft=(--preset "$preset" --device cuda --autocast auto --batch-size 256 --steps 100000
       --save-every 500 --eval-every 500 --eval-samples 0)
fi

for f in "${games[@]}" "${more[@]}"; do [ -f "$f" ] || { echo "gpu_base.sh: $f: no such file" >&2; exit 2; }; done
told=()
a_rows=$([ $smoke = 1 ] && echo 20 || echo 200000)  # A: transitions from the records, in all
[ ${#games[@]} -gt 0 ] && a_rows=$(( a_rows / ${#games[@]} ))  # shared evenly between them
known=(--known "$source_data")
made=""
for i in "${!games[@]}"; do  # replayed once per record: the folder remembers which (path and size) it holds
  rec=${games[$i]}
  dir="$work/more-$((i + 1))-$(basename "$rec" | tr -c 'A-Za-z0-9._\n-' _)"
  made="$rec $(stat -c %s "$rec") $a_rows $source_data${made:+ after $made}"  # and after which records
  if [ "$(cat "$dir/made" 2>/dev/null)" != "$made" ]; then
    rm -rf "$dir"
    PYTHON="$py" scripts/gpu_more_data.sh "$rec" "$dir" --a-rows "$a_rows" --plain "${known[@]}"
    rm -rf "$dir/replay"
    echo "$made" > "$dir/made"
  fi
  known+=(--known "$dir/more_p.jsonl" --known "$dir/more_a.jsonl")  # no sample twice from two records
  more+=("$dir/more_p.jsonl" "$dir/more_a.jsonl")
  told+=("$rec's games ($(wc -l < "$dir/more_p.jsonl") P: and $(wc -l < "$dir/more_a.jsonl") A: rows)")
done
for f in "${more[@]}"; do [[ $f == "$work"/more-* ]] || told+=("$f"); done
rows() {  # a sample file's lines, whatever its compression (python's gzip and lzma: no xz binary needed)
  "$py" -c 'import gzip, lzma, shutil, sys
opener = {".gz": gzip.open, ".xz": lzma.open}.get(sys.argv[1][-3:], open)
with opener(sys.argv[1], "rb") as fh:
    shutil.copyfileobj(fh, sys.stdout.buffer)' "$1"
}
inputs="$source_data ${more[*]} $(for f in "${more[@]}"; do stat -c %s "$f"; done)"
if [ ! -f "$work/train.jsonl.gz" ] || [ "$(cat "$work/train.inputs" 2>/dev/null)" != "$inputs" ]; then
  # seeded: the same rows on every machine; rebuilt when the inputs change
  "$py" -m rookworld_rlvr data histories "$source_data" --out "$work/histories.jsonl.gz" --cut-share 0.2 \
    --openings $openings --side train --seed 0
  { rows "$source_data"; rows "$work/histories.jsonl.gz"; for f in "${more[@]}"; do rows "$f"; done; } \
    | gzip -1 > "$work/train.jsonl.gz.tmp"
  mv "$work/train.jsonl.gz.tmp" "$work/train.jsonl.gz"
  echo "$inputs" > "$work/train.inputs"
fi
rows=$(gzip -dc "$work/train.jsonl.gz" | wc -l)
echo "gpu_base: training data $rows rows: $source_data, its histories$([ ${#told[@]} -gt 0 ] && printf ', %s' "${told[@]}")." \
  | tee "$work/train.summary"
[ $data_only = 1 ] && exit 0

if [ -n "$end_by" ]; then  # what the deadline leaves SFT's training, once its start and the export are paid
  fit=$(awk -v t="$end_by" -v now="$(date +%s)" -v rows="$rows" -v m="$minutes" \
    'BEGIN { f = (t - now - 75 - rows * 40e-6 - 30) / 60; if (f > m) f = m; if (f < 0.5) f = 0.5; printf "%.2f", f }')
  [ "$fit" = "$(printf %.2f "$minutes")" ] || echo "gpu_base: SFT gets $fit minutes, not $minutes (--end-by; 0.5 at least)"
  minutes=$fit
fi
"$py" -m rookworld_rlvr sft --data "$work/train.jsonl.gz" --eval-data data/eval.jsonl.gz --out "$work/base" \
  "${sft[@]}" --max-minutes "$minutes" ${RESUME:+--resume} --quiet

rm -rf "$work/export"
"$py" scripts/export_bf16.py "$work/base" "$work/export"
rm -f "$out"/*.safetensors "$out/meta.tar"
cp "$work"/export/*.safetensors "$out"/
cp "$work/base.sft_log.jsonl" "$work/export/sft_log.jsonl"
tar cf "$out/meta.tar" -C "$work/export" --exclude '*.safetensors' .
"$py" - "$out" <<'EOF'
import sys
from pathlib import Path
sys.path.insert(0, "scripts")
from export_bf16 import report
sys.exit(report(sorted(p for p in Path(sys.argv[1]).iterdir() if p.is_file()), "gpu_base", sys.argv[1]))
EOF
