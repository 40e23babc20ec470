#!/usr/bin/env bash
# A base model trained on one GPU in one prepared, offline command (issue: a base that knows chess):
#   scripts/gpu_base.sh OUT_DIR [--smoke] [--minutes M] [--preset wide|small|tiny | --init MODEL_DIR] [--data-only]
#                       [--end-by T] [--more-games RECORD]... [--more-data FILE]... [--make-picks]
# 1. the training data: the shipped data/train.jsonl.xz plus, from python-chess alone, its A: rows copied with
#    shorter histories (a fifth of them) and every transition of 4,000 random openings from the start position
#    (the game starts the shipped data lacks), on the training side of the held-out split, seeded; from each
#    --more-games record (data/more_games.jsonl.xz, _2 and _3: 3,600, 3,000 and 1,400 games' Stockfish
#    answers), replayed here on every core with no Stockfish, its training-side P: positions and its share of
#    200,000 A: transitions (shared evenly between the records) that neither the shipped set (in --smoke, its
#    slice), nor a held-out file, nor an earlier record holds (scripts/gpu_more_data.sh); and each --more-data
#    sample file as it is. Where a record has picks (data/more_games.picks.xz beside data/more_games.jsonl.xz, made
#    for the same shipped set, held-out files, earlier records and A: share), its replay keeps the samples they name
#    as it plays (`rookworld data replay --picks`): the same samples, checked, without the merges (a minute or more
#    of one core per record). --make-picks replays and merges every record and writes its picks beside it;
# 2. `rookworld sft` on cuda: a fresh `wide` model (6 x 512, 19M parameters; --preset picks another), bf16
#    autocast, batch 512, no greedy answers of its own in a step (--own-repeats 0), its lr schedule fitted to M
#    minutes of training (default 8), checkpointed every 500 steps (rerun with the same OUT_DIR and RESUME=1 to
#    continue). With records or more data, SFT does not wait for them: it starts on the shipped data and its game
#    starts (ready in seconds) on 4 cores while the other cores replay (with picks: no merge), read and encode the
#    rest (`sft --encode-only`, into WORK/rows.safetensors; log WORK/prepare.log; pinned apart by taskset on
#    PIN_MIN_CORES cores or more, default 8, with half the cores each below 8); once that is ready SFT stops
#    checkpointed (`--stop-when`) and resumes on all of it with the same schedule. If the rest cannot be prepared,
#    the base trained on the shipped data alone still comes back, with a warning (WORK/train.summary says what it
#    trained on);
# --init MODEL_DIR: SFT continues a base an earlier call sent back (unpacked: below) at its own size and tokenizer,
#    instead of a fresh model, with a fresh optimizer and the same schedule fitted to M minutes: a base can so gain
#    a GPU machine's minutes at a time. Its data order is drawn with the seed of the calls that trained it before
#    (sft_history.jsonl: 0 for a fresh model, 1 after one call...), so no call walks the one before it;
# 3. OUT_DIR gets what a GPU machine can send back (at most 8 files of 16 MiB): the weights as bf16 safetensors
#    shards and meta.tar (config, tokenizer, shard index, the SFT log and profile, sft_history.jsonl: each call
#    that trained it, with its steps, samples and minutes; scripts/sft_history.py). Put them together with
#    `mkdir base && tar xf OUT_DIR/meta.tar -C base && cp OUT_DIR/*.safetensors base/`, then judge it on a CPU
#    with Stockfish: `rookworld eval --model base ...` (no Stockfish is needed on the GPU machine for this part).
# --end-by T (seconds since 1970; scripts/gpu_rl.sh passes its deadline): SFT gets at most the minutes left at its
# start, less its reading and encoding (75 s and 40 us a row, on a GPU machine's cores), the handover (45 s) and the
# export, so the base is in OUT by T (0.5 minutes at least; it says so when it cuts M).
# --data-only: step 1 alone (WORK/train.jsonl.gz; scripts/gpu_rl.sh --base trains GRPO on it).
# --smoke: the same on the CPU at tiny sizes, in seconds (tests/test_gpu_rl.py runs it, through scripts/gpu_rl.sh);
# there the rest of the data is ready before SFT's first step (its 3 steps would outrun it), so the handover comes
# at step 0. WORK/train.used names the data the base trained on last (gpu_rl.sh's GRPO draws from it).
set -euo pipefail
cd "$(dirname "$0")/.."
t_start=$(date +%s)
prep=""
# on the way out, nothing started here runs on: the replays, and the preparation beside SFT (a process group)
cleanup() {
  if [ -n "$prep" ]; then kill -- -"$prep" 2> /dev/null || true; fi
  local left
  left=$(jobs -p)
  if [ -n "$left" ]; then kill $left 2> /dev/null || true; fi
}
trap cleanup EXIT
out=${1:?usage: scripts/gpu_base.sh OUT_DIR [--smoke] [--minutes M] [--preset P | --init MODEL_DIR] [--data-only] [--end-by T] [--more-games RECORD]... [--more-data FILE]... [--make-picks]}
shift
smoke=0
data_only=0
make_picks=0
end_by=""
minutes=8
preset=wide
preset_given=0
init=""
more=()
games=()
while [ $# -gt 0 ]; do
  case $1 in
    --smoke) smoke=1 ;;
    --data-only) data_only=1 ;;
    --make-picks) make_picks=1 ;;
    --end-by) end_by=${2:?--end-by needs a time}; shift
              [[ $end_by =~ ^[0-9]+$ ]] || { echo "gpu_base.sh: --end-by needs seconds since 1970, got '$end_by'" >&2; exit 2; } ;;
    --minutes) minutes=${2:?--minutes needs a number}; shift ;;
    --preset) preset=${2:?--preset needs a name}; preset_given=1; shift ;;
    --init) init=${2:?--init needs a model folder}; shift
            [ -f "$init/config.json" ] || {
              echo "gpu_base.sh: --init $init: no model there (no config.json)" >&2; exit 2; } ;;
    --more-games) games+=("${2:?--more-games needs a game record}"); shift ;;
    --more-data) more+=("${2:?--more-data needs a file}"); shift ;;
    *) echo "gpu_base.sh: unknown option $1 (--smoke, --minutes M, --preset P, --init MODEL_DIR, --data-only," \
            "--end-by T, --more-games RECORD, --more-data FILE, --make-picks)" >&2; exit 2 ;;
  esac
  shift
done
py=${PYTHON:-python3}
if [ -n "$init" ]; then
  [ $preset_given = 0 ] || {
    echo "gpu_base.sh: --preset sizes a fresh model; --init $init continues at its own size" >&2; exit 2; }
  [ $data_only = 0 ] || {
    echo "gpu_base.sh: --data-only trains nothing, so --init $init has nothing to continue" >&2; exit 2; }
fi
[[ ${PIN_MIN_CORES:-8} =~ ^[0-9]+$ ]] || {
  echo "gpu_base.sh: PIN_MIN_CORES needs a number of cores, got '$PIN_MIN_CORES'" >&2; exit 2; }
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
  preset=tiny
  sft=(--device cpu --batch-size 4 --steps 3 --save-every 2 --eval-every 3 --eval-samples 0 --own-repeats 0
       --profile-steps 1 --profile-after 1)
else
  source_data=data/train.jsonl.xz
  openings=4000
  # --own-repeats 0: no greedy answers of the model's own in each step (30 sequential decoding steps, where the
  # training step is one forward and backward; on the CPU they did not stop the repeats: models/README.md)
  # --batch-size 512: a step of 256 rows took 0.06-0.08 s on an H200 and the same step 0.127 s in gpu_check.sh, not
  # what the GPU's arithmetic alone would give: a step's time there is mostly its own (launches, the host), not its
  # rows', so more rows a step are more samples a minute; at about 90k tokens a step a larger batch still costs
  # little per sample. --profile-steps: torch.profiler's tables of 5 steps after each invocation's first 20
  # (WORK/base.profile.txt, in meta.tar): where the step's time goes, measured
  sft=(--device cuda --autocast auto --batch-size 512 --steps 100000 --own-repeats 0
       --save-every 500 --eval-every 500 --eval-samples 0 --profile-steps 5)
fi
# the model SFT starts from: a fresh one of the preset's size, or --init's (whose tokenizer encodes the rows too)
if [ -n "$init" ]; then
  earlier=$("$py" scripts/sft_history.py count "$init")
  echo "gpu_base: SFT continues $init, trained before in" \
       "$("$py" scripts/sft_history.py describe "$init") (seed $earlier)"
  model=(--init "$init" --seed "$earlier")
  init_arg=(--init "$init")
else
  model=(--preset "$preset")
  init_arg=()
fi

for f in "${games[@]}" "${more[@]}"; do [ -f "$f" ] || { echo "gpu_base.sh: $f: no such file" >&2; exit 2; }; done
rows() {  # a sample file's lines, whatever its compression (python's gzip and lzma: no xz binary needed)
  "$py" -c 'import gzip, lzma, shutil, sys
opener = {".gz": gzip.open, ".xz": lzma.open}.get(sys.argv[1][-3:], open)
with opener(sys.argv[1], "rb") as fh:
    shutil.copyfileobj(fh, sys.stdout.buffer)' "$1"
}
# the quick part (seconds): the shipped data and its game starts, train0.jsonl.gz; seeded, the same rows on every
# machine, rebuilt when its inputs change
if [ ! -f "$work/train0.jsonl.gz" ] || [ "$(cat "$work/train0.inputs" 2>/dev/null)" != "$source_data $openings" ]; then
  "$py" -m rookworld_rlvr data histories "$source_data" --out "$work/histories.jsonl.gz" --cut-share 0.2 \
    --openings $openings --side train --seed 0
  { rows "$source_data"; rows "$work/histories.jsonl.gz"; } | gzip -1 > "$work/train0.jsonl.gz.tmp"
  mv "$work/train0.jsonl.gz.tmp" "$work/train0.jsonl.gz"
  echo "$source_data $openings" > "$work/train0.inputs"
fi

picks_of() {  # a record's picks file: which of its replayed samples the merges keep (`rookworld data picks`)
  echo "${1%.jsonl.xz}.picks.xz"
}
picks_key() {  # the recipe key a picks file was made for ("unreadable" when it cannot be read)
  "$py" -c 'import json, lzma, sys
try:
    print(json.loads(lzma.open(sys.argv[1], "rt").readline())["key"])
except Exception:
    print("unreadable")' "$1"
}
prepare() {  # the slow part (minutes on a GPU machine's cores): the records' samples, then train.jsonl.gz, all of it
  local told=() known=(--known "$source_data") made="" i rec dir f inputs n dirs=() makes=() replays=() keys=() fast=()
  local a_rows=$([ $smoke = 1 ] && echo 20 || echo 200000)  # A: transitions from the records, in all
  [ ${#games[@]} -gt 0 ] && a_rows=$(( a_rows / ${#games[@]} ))  # shared evenly between them
  # what a record's merges depend on: the cap, the shipped set, the held-out files, this record and those before
  # it; a picks file made for the same key gives the same samples without the merges
  local held recs="" src_sha held_sha pk
  . scripts/held_out.sh
  src_sha=$(sha256sum < "$source_data" | cut -d' ' -f1)
  held_sha=$(cat "${held[@]}" | sha256sum | cut -d' ' -f1)
  for i in "${!games[@]}"; do  # replayed once per record: the folder remembers which (path and size) it holds
    rec=${games[$i]}
    dirs[$i]="$work/more-$((i + 1))-$(basename "$rec" | tr -c 'A-Za-z0-9._\n-' _)"
    made="$rec $(stat -c %s "$rec") $a_rows $source_data${made:+ after $made}"  # and after which records
    makes[$i]=$made
    recs="$recs $(sha256sum < "$rec" | cut -d' ' -f1)"
    keys[$i]=$(echo "a_rows=$a_rows source=$src_sha held=$held_sha records=$recs" | sha256sum | cut -c1-32)
    pk=$(picks_of "$rec")
    replays[$i]=""
    fast[$i]=0
    if [ $make_picks = 1 ] || [ "$(cat "${dirs[$i]}/made" 2>/dev/null)" != "$made" ]; then
      rm -rf "${dirs[$i]}"
      mkdir -p "${dirs[$i]}"
      # every record's replay at once: they need nothing (a record's merges need the records before it)
      if [ $make_picks = 0 ] && [ -f "$pk" ] && [ "$(picks_key "$pk")" = "${keys[$i]}" ]; then
        fast[$i]=1  # its picked samples as it replays, no merges
        "$py" -m rookworld_rlvr data replay "$rec" --picks "$pk" --key "${keys[$i]}" --out "${dirs[$i]}" \
          --workers "$(nproc)" --quiet > /dev/null &
      else
        if [ $make_picks = 0 ] && [ -f "$pk" ] && [ "$(picks_key "$pk")" = unreadable ]; then
          echo "gpu_base: $pk cannot be read: $rec is replayed and merged"
        elif [ $make_picks = 0 ] && [ -f "$pk" ]; then
          echo "gpu_base: $pk was made for other data (another record, shipped set, held-out file or A: cap):" \
               "$rec is replayed and merged"
        fi
        "$py" -m rookworld_rlvr data replay "$rec" --out "${dirs[$i]}/replay" --workers "$(nproc)" --quiet &
      fi
      replays[$i]=$!
    fi
  done
  for i in "${!games[@]}"; do
    rec=${games[$i]}
    dir=${dirs[$i]}
    if [ -n "${replays[$i]}" ]; then
      wait "${replays[$i]}" || { echo "gpu_base: the replay of $rec failed" >&2; return 1; }
      if [ "${fast[$i]}" = 1 ]; then
        echo "gpu_base: $rec replayed with its picks ($(picks_of "$rec")) at +$(( $(date +%s) - t_start )) s"
      else
        PYTHON="$py" scripts/gpu_more_data.sh "$dir/replay" "$dir" --a-rows "$a_rows" --plain "${known[@]}"
        echo "gpu_base: $rec replayed and merged at +$(( $(date +%s) - t_start )) s"
        if [ $make_picks = 1 ]; then
          "$py" -m rookworld_rlvr data picks "$rec" --replay "$dir/replay" --merged "$dir/more_p.jsonl" \
            "$dir/more_a.jsonl" --key "${keys[$i]}" --out "$(picks_of "$rec")" --workers "$(nproc)"
        fi
        rm -rf "$dir/replay"
      fi
      echo "${makes[$i]}" > "$dir/made"
    fi
    known+=(--known "$dir/more_p.jsonl" --known "$dir/more_a.jsonl")  # no sample twice from two records
    more+=("$dir/more_p.jsonl" "$dir/more_a.jsonl")
    told+=("$rec's games ($(wc -l < "$dir/more_p.jsonl") P: and $(wc -l < "$dir/more_a.jsonl") A: rows)")
  done
  for f in "${more[@]}"; do [[ $f == "$work"/more-* ]] || told+=("$f"); done
  inputs="$source_data $openings ${more[*]} $(for f in "${more[@]}"; do stat -c %s "$f"; done)"
  if [ ! -f "$work/train.jsonl.gz" ] || [ "$(cat "$work/train.inputs" 2>/dev/null)" != "$inputs" ]; then
    { gzip -dc "$work/train0.jsonl.gz"; for f in "${more[@]}"; do rows "$f"; done; } | gzip -1 > "$work/train.jsonl.gz.tmp"
    mv "$work/train.jsonl.gz.tmp" "$work/train.jsonl.gz"
    echo "$inputs" > "$work/train.inputs"
  fi
  n=$(gzip -dc "$work/train.jsonl.gz" | wc -l)
  echo "gpu_base: training data $n rows: $source_data, its histories$([ ${#told[@]} -gt 0 ] && printf ', %s' "${told[@]}")." \
    > "$work/train.summary"
  echo "gpu_base: train.jsonl.gz ($n rows) at +$(( $(date +%s) - t_start )) s"
}
if [ $data_only = 1 ]; then
  prepare
  cat "$work/train.summary"
  echo "$work/train.jsonl.gz" > "$work/train.used"
  exit 0
fi

# SFT trains from the start on train0 while the rest is prepared on the other cores (replayed, merged, read and
# encoded into rows.safetensors by `sft --encode-only`); once it is ready, SFT stops checkpointed (--stop-when) and
# resumes on all of it, on the same schedule. Without records or more data, train0 is all of it.
pin_sft=()  # a CPU-affinity prefix for SFT (taskset), while the preparation has the other cores
sft_run() {  # data, rows cache, more sft options...: one invocation of the base's SFT
  local data=$1 cache=$2
  shift 2
  echo "gpu_base: SFT on $data starts at +$(( $(date +%s) - t_start )) s"  # where a GPU machine's minutes go
  "${pin_sft[@]}" "$py" -m rookworld_rlvr sft --data "$data" --rows-cache "$cache" --eval-data data/eval.jsonl.gz \
    --out "$work/base" "${model[@]}" "${sft[@]}" --max-minutes "$minutes" --quiet "$@"
}
encode_rows() {  # data, rows cache: SFT's rows encoded into the cache its runs read (the same encoding flags)
  "$py" -m rookworld_rlvr sft --data "$1" --rows-cache "$2" --encode-only --device cpu --eval-data "" \
    --out "$work/base" "${init_arg[@]}" --quiet
}
encode_all() {
  encode_rows "$work/train.jsonl.gz" "$work/rows.safetensors"
  echo "gpu_base: its rows encoded at +$(( $(date +%s) - t_start )) s"
  cat "$work/train.inputs" > "$work/ready"
}
phased=$([ $(( ${#games[@]} + ${#more[@]} )) -gt 0 ] && echo 1 || echo 0)
resume=(${RESUME:+--resume})
if [ $phased = 1 ] && [ -n "${RESUME:-}" ] && [ -f "$work/base.checkpoint/sft_state.json" ] && [ "$("$py" -c 'import json, sys
print(json.load(open(sys.argv[1]))["config"]["data"])' "$work/base.checkpoint/sft_state.json")" = "$work/train.jsonl.gz" ]; then
  phased=0  # a resume of a run already on all of its data: that data first, then SFT goes on with it
fi
rows0=$(gzip -dc "$work/train0.jsonl.gz" | wc -l)
if [ -n "$end_by" ]; then  # what the deadline leaves SFT's training, once its start, a handover and the export are paid
  fit=$(awk -v t="$end_by" -v now="$(date +%s)" -v rows="$rows0" -v m="$minutes" -v h="$(( phased * 45 ))" \
    'BEGIN { f = (t - now - 75 - rows * 40e-6 - h - 30) / 60; if (f > m) f = m; if (f < 0.5) f = 0.5; printf "%.2f", f }')
  [ "$fit" = "$(printf %.2f "$minutes")" ] || echo "gpu_base: SFT gets $fit minutes, not $minutes (--end-by; 0.5 at least)"
  minutes=$fit
fi
used="$work/train.jsonl.gz"
if [ $phased = 0 ]; then
  prepare
  cat "$work/train.summary"
  sft_run "$work/train.jsonl.gz" "$work/rows.safetensors" "${resume[@]}"
else
  rm -f "$work/ready"
  cpus=($("$py" -c 'import os; print(*sorted(os.sched_getaffinity(0)))'))
  pin_prep=()
  # on PIN_MIN_CORES cores or more (default 8), 4 cores feed the GPU (half of them below 8) and the preparation has
  # the rest, so that neither takes the other's (where taskset works: a sandbox may refuse to set affinities, and
  # then nothing is pinned)
  if [ ${#cpus[@]} -ge "${PIN_MIN_CORES:-8}" ] && [ ${#cpus[@]} -ge 2 ] && taskset -c "${cpus[0]}" true 2> /dev/null
  then
    k=$(( ${#cpus[@]} >= 8 ? 4 : ${#cpus[@]} / 2 ))
    pin_sft=(taskset -c "$(IFS=,; echo "${cpus[*]:0:k}")")
    pin_prep=(taskset -c "$(IFS=,; echo "${cpus[*]:k}")")
    echo "gpu_base: SFT on cores ${pin_sft[2]} and the preparation on ${pin_prep[2]} until the handover"
    # the shipped data's rows encoded first on every core: pinned to 4, SFT would spend 4 times as long on them
    # before its first step (its own pools take the cores it may use)
    encode_rows "$work/train0.jsonl.gz" "$work/rows0.safetensors"
  fi
  echo "gpu_base: SFT starts on the shipped data and its game starts ($rows0 rows) while the rest is prepared" \
       "(log: $work/prepare.log)"
  set -m  # the preparation in a process group of its own, so that it can be stopped whole
  "${pin_prep[@]}" bash -c "$(declare -p py smoke work source_data openings games more t_start make_picks init_arg
    declare -f prepare rows encode_rows encode_all picks_of picks_key); set -euo pipefail
    ! command -v taskset > /dev/null || echo \"gpu_base: preparing on cores \$(taskset -cp \$\$ | sed 's/.*: //')\"
    prepare; encode_all" \
    > "$work/prepare.log" 2>&1 &
  prep=$!
  set +m
  # --smoke: the preparation ends first (its 3 steps would outrun it), so the handover comes before the first step
  [ $smoke = 1 ] && { wait "$prep" || true; }
  sft_run "$work/train0.jsonl.gz" "$work/rows0.safetensors" --stop-when "$work/ready" "${resume[@]}"
  pin_sft=()  # all cores are SFT's from here on
  if [ -f "$work/ready" ]; then
    wait "$prep" || true  # done: it wrote ready last
    prep=""
    first=0
    [ -f "$work/base.sft_log.jsonl" ] && first=$(wc -l < "$work/base.sft_log.jsonl")
    sed -i "s/\.\$/. Its first $first steps trained on the shipped data and its histories alone ($rows0 rows) while the rest was prepared./" \
      "$work/train.summary"
    cat "$work/train.summary"
    sft_run "$work/train.jsonl.gz" "$work/rows.safetensors" --resume
  elif kill -0 "$prep" 2> /dev/null; then
    kill -- -"$prep" 2> /dev/null || true
    prep=""
    used="$work/train0.jsonl.gz"
    echo "gpu_base: SFT ended before the rest of its data was ready: the base trained on the shipped data and its" \
         "game starts alone" | tee "$work/train.summary"
  else
    kill -- -"$prep" 2> /dev/null || true  # a replay that was still running
    prep=""
    used="$work/train0.jsonl.gz"
    echo "gpu_base: warning: preparing the rest of the data failed, so the base trained on the shipped data and its" \
         "game starts alone ($work/prepare.log)." | tee "$work/train.summary" >&2
    tail -n 20 "$work/prepare.log" >&2
  fi
fi
echo "$used" > "$work/train.used"

echo "gpu_base: SFT done at +$(( $(date +%s) - t_start )) s"
rm -rf "$work/export"
"$py" scripts/export_bf16.py "$work/base" "$work/export"
rm -f "$out"/*.safetensors "$out/meta.tar"
cp "$work"/export/*.safetensors "$out"/
cp "$work/base.sft_log.jsonl" "$work/export/sft_log.jsonl"
[ -f "$work/base.profile.txt" ] && cp "$work/base.profile.txt" "$work/export/sft_profile.txt"
"$py" scripts/sft_history.py write "$work/export/sft_history.jsonl" --log "$work/base.sft_log.jsonl" \
  --state "$work/base.checkpoint/sft_state.json" "${init_arg[@]}"
tar cf "$out/meta.tar" -C "$work/export" --exclude '*.safetensors' .
"$py" - "$out" <<'EOF2'
import sys
from pathlib import Path
sys.path.insert(0, "scripts")
from export_bf16 import report
sys.exit(report(sorted(p for p in Path(sys.argv[1]).iterdir() if p.is_file()), "gpu_base", sys.argv[1]))
EOF2
