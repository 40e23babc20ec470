#!/usr/bin/env bash
# A base trained on one GPU and GRPO on top of it, judged, in one prepared, offline command (issue: RL that makes
# a model play better, on the GPU):
#   scripts/gpu_rl.sh OUT_DIR [--smoke] [--sft-minutes M] [--grpo-minutes N] [--preset small|wide|tiny]
#                     [--more-games RECORD]... [--more-data FILE]...
# 1. the base: scripts/gpu_base.sh (the shipped data plus game starts; `rookworld sft` of a fresh `small` model,
#    8 x 384, 14M parameters, for M minutes, default 4; --more-games (a game record: data/more_games.jsonl.xz,
#    data/more_games_2.jsonl.xz) and --more-data (a sample file) add training samples, as in gpu_base.sh);
# 2. GRPO from it: configs/gpu-grpo.yaml (64 prompts x 8 a step, Stockfish on the machine's cores) for N minutes
#    (default 2.5) on the base's own training data (its anchor holds the game starts too), held-out evaluation at
#    its start and end;
# 3. two 200-game matches from the held-out openings: the trained model against its base, and the base against
#    the shipped models/rookworld-board; and one greedy self-play game from the start for each of the two models;
# 4. OUT_DIR gets what a GPU machine can send back (at most 8 files of 16 MiB, 64 MiB in all): base/ and trained/
#    (bf16 safetensors shards and meta.tar each: config, tokenizer, logs, the GRPO run's summary and the matches)
#    and results.md (the verdict: base, trained and a random mover with 95% intervals; the matches; the minutes).
# Each stage is kept in WORK (default runs/gpu-rl, git-ignored, so it stays on a warm GPU machine between calls):
# rerun the same command to continue where a timeout stopped it; every call fills OUT afresh. Needs Stockfish: carried by
# `scripts/gpu_pack.sh --stockfish` (.gpu/stockfish.xz), or STOCKFISH_PATH, or one on PATH.
# --smoke: the same on the CPU at tiny sizes, in about a minute (tests/test_gpu_rl.py runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu_rl.sh OUT_DIR [--smoke] [--sft-minutes M] [--grpo-minutes N] [--preset P] [--more-games RECORD]... [--more-data FILE]...}
shift
smoke=0
sft_minutes=4
grpo_minutes=2.5
preset=small
more=()
while [ $# -gt 0 ]; do
  case $1 in
    --smoke) smoke=1 ;;
    --sft-minutes) sft_minutes=${2:?--sft-minutes needs a number}; shift ;;
    --grpo-minutes) grpo_minutes=${2:?--grpo-minutes needs a number}; shift ;;
    --preset) preset=${2:?--preset needs a name}; shift ;;
    --more-games) more+=(--more-games "${2:?--more-games needs a game record}"); shift ;;
    --more-data) more+=(--more-data "${2:?--more-data needs a file}"); shift ;;
    *) echo "gpu_rl.sh: unknown option $1 (--smoke, --sft-minutes M, --grpo-minutes N, --preset P," \
            "--more-games RECORD, --more-data FILE)" >&2
       exit 2 ;;
  esac
  shift
done
py=${PYTHON:-python3}
work=${WORK:-runs/gpu-rl}
mkdir -p "$out" "$work"
. scripts/gpu_wheels.sh
use_carried_wheels "$py" $smoke
[ -z "${STOCKFISH_PATH:-}" ] && use_carried_stockfish "$py" "$work/stockfish"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
stage() {  # name, command...: run once, its minutes in times.tsv
  local name=$1 t0
  shift
  if [ -f "$work/$name.done" ]; then echo "gpu_rl: $name done before"; return; fi
  t0=$(date +%s)
  echo "gpu_rl: $name"
  "$@"
  echo -e "$name\t$(( $(date +%s) - t0 ))" >> "$work/times.tsv"
  touch "$work/$name.done"
}

if [ $smoke = 1 ]; then
  device=cpu
  base_args=(--smoke)
  grpo=(--device cpu --steps 2 --batch-positions 2 --group-size 4 --anchor-batch 4 --engine-workers 1
        --eval-limit 4 --strength-data null --history-eval-data null --puzzle-eval-data null --max-new-tokens 40)
  games=(--games 2 --max-plies 8)
  selfplay_plies=8
else
  device=cuda
  base_args=(--minutes "$sft_minutes" --preset "$preset")
  grpo=(--engine-workers "$(( $(nproc) > 4 ? $(nproc) - 4 : 1 ))")
  games=(--games 200)
  selfplay_plies=150
fi

base_stage() {
  PYTHON="$py" WORK="$work/sft" ${RESUME_SFT:+RESUME=1} scripts/gpu_base.sh "$work/base-out" "${base_args[@]}" \
    "${more[@]}"
}
[ -f "$work/sft/base.checkpoint/config.json" ] && [ ! -f "$work/base.done" ] && export RESUME_SFT=1
stage base base_stage

grpo_stage() {
  local resume=()
  [ -d "$work/grpo/checkpoints" ] && resume=(--resume)
  "$py" -m rookworld_rlvr train --config configs/gpu-grpo.yaml --model "$work/sft/base" --output-dir "$work/grpo" \
    --data "$work/sft/train.jsonl.gz" --max-minutes "$grpo_minutes" --engine-cache "$work/engine.sqlite" \
    "${grpo[@]}" "${resume[@]}"
}
stage grpo grpo_stage

stage match_trained "$py" -m rookworld_rlvr match "$work/grpo/final" "$work/sft/base" "${games[@]}" --device "$device" \
  --json "$work/match_trained_vs_base.json" --pgn "$work/match_trained_vs_base.pgn" --quiet
selfplay() {  # name, model: one greedy game from the start against itself, its legal half-moves (the base's goal: 60)
  "$py" -m rookworld_rlvr eval --model "$2" --data data/eval.jsonl.gz --limit 0 --selfplay 1 \
    --selfplay-max-plies "$selfplay_plies" --device "$device" --json "$work/selfplay_$1.json" --quiet
}
stage selfplay_base selfplay base "$work/sft/base"
stage selfplay_trained selfplay trained "$work/grpo/final"
stage match_base "$py" -m rookworld_rlvr match "$work/sft/base" models/rookworld-board "${games[@]}" --device "$device" \
  --json "$work/match_base_vs_board.json" --pgn "$work/match_base_vs_board.pgn" --quiet

# into OUT on every call (a GPU machine gives each call an empty one): the base, the trained model with the
# run's record, and the verdict
rm -rf "$work/export" "$out/base" "$out/trained"
mkdir -p "$out/base"
cp "$work"/base-out/* "$out/base/"
"$py" scripts/export_bf16.py "$work/grpo/final" "$work/export"
mkdir -p "$out/trained"
cp "$work"/export/*.safetensors "$out/trained/"
for f in summary.json metrics.jsonl eval.jsonl events.jsonl config.yaml; do
  [ -f "$work/grpo/$f" ] && cp "$work/grpo/$f" "$work/export/"
done
cp "$work"/match_*.json "$work"/match_*.pgn "$work"/selfplay_*.json "$work/times.tsv" "$work/export/"
tar cf "$out/trained/meta.tar" -C "$work/export" --exclude '*.safetensors' .
"$py" scripts/gpu_rl_report.py "$work" "$out"
