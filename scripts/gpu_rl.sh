#!/usr/bin/env bash
# A base trained on one GPU and GRPO on top of it, judged, in one prepared, offline command (issue: RL that makes
# a model play better, on the GPU):
#   scripts/gpu_rl.sh OUT_DIR [--smoke] [--sft-minutes M] [--grpo-minutes N] [--preset small|wide|tiny | --sft-init B]
#                     [--deadline-minutes D] [--base MODEL_DIR | --continue] [--control] [--more-games RECORD]...
#                     [--more-data FILE]... [--game-positions N]
# 1. the base: scripts/gpu_base.sh (the shipped data plus game starts; `rookworld sft` of a fresh `small` model,
#    8 x 384, 14M parameters, for M minutes, default 4; --more-games (a game record: data/more_games.jsonl.xz,
#    _2 and _3) and --more-data (a sample file) add training samples, as in gpu_base.sh);
# 2. GRPO from it: configs/gpu-grpo.yaml (64 prompts x 8 a step, Stockfish on the machine's cores) for N minutes
#    (default 2.5) on the base's own training data (its anchor holds the game starts too), held-out evaluation at
#    its start and end;
# 3. two 200-game matches from the held-out openings: the trained model against its base, and the base against
#    the shipped models/rookworld-board (where the tree has it); and one greedy self-play game from the start for
#    each of the two models;
#    the four at once, each its own process, its output lines marked [its name] (a failed one stops none of the
#    others: the call ends with exit 1, naming it);
# 4. OUT_DIR gets what a GPU machine can send back (at most 8 files of 16 MiB, 64 MiB in all): base/ and trained/
#    (bf16 safetensors shards and meta.tar each: config, tokenizer, logs, the GRPO run's summary), record.tar (the
#    matches, the self-play games, the minutes per stage, the base's data preparation log: sft/prepare.log) and
#    results.md (the verdict: base, trained and a random mover with 95% intervals; the matches; the minutes),
#    filled after every stage, so a call stopped by its timeout still sends back the stages it finished.
# --base MODEL_DIR: GRPO from that base (one trained by an earlier call and shipped) instead of step 1's SFT: step 1
# makes only the training data (gpu_base.sh --data-only; without --more-games, seconds), and OUT gets no base/.
# A base in one call and GRPO in the next fit a GPU machine's minutes where both in one call would not.
# --game-positions N: GRPO where the base's matches are decided, configs/gpu-game-positions.yaml instead of
# configs/gpu-grpo.yaml: the base plays one greedy game from each of N training-side openings (data/train_openings.txt;
# scripts/game_positions.py), the last 4 positions of each game are labelled by Stockfish on the machine's cores,
# and GRPO's P: prompts (puzzles aside) are those positions, with a KL ten times the other recipe's and no anchor (on
# 2 CPU cores the recipe that won matches against its base: docs/grpo-experiments.md). A stage of its own
# (`positions`) before GRPO. Not with --control: with no anchor the base is its own control.
# --sft-init B: step 1's SFT continues B, a base an earlier call sent back (unpacked), instead of a fresh model
# (gpu_base.sh --init): M more minutes for it. The base that comes back is B trained on; its meta.tar's
# sft_history.jsonl and results.md count every call that trained it.
# --continue: this call continues the one before it in WORK (the base it trained, on this machine's disk): it stops
# at once (exit 2) where WORK holds no finished base, as on a machine started afresh, instead of spending its minutes
# on a new base. GRPO from a base that came back instead: --base.
# --control: the same GRPO run with `--reward-signal false` (every advantage 0: the anchor and the KL alone train),
# the control a GRPO gain is judged against: what the anchor's true answers teach without any reward. Its own
# WORK (default runs/gpu-rl-control); results.md says so.
# --deadline-minutes D: the call should end D minutes after it starts (a GPU machine's time is counted). RESERVE
# seconds (150 on the GPU) are kept for GRPO's final evaluation, the matches and the export: the base's SFT is cut
# to be done RESERVE seconds before D (gpu_base.sh --end-by), GRPO gets what is left before D less RESERVE and is
# skipped with fewer than 0.5 minutes, and a stage that would start after D is skipped. Skipped stages are named in
# results.md and run on a rerun.
# Each stage is kept in WORK (default runs/gpu-rl, git-ignored, so it stays on a warm GPU machine between calls):
# rerun the same command to continue where a timeout stopped it; every call fills OUT afresh. Needs Stockfish: carried by
# `scripts/gpu_pack.sh --stockfish` (.gpu/stockfish.xz), or STOCKFISH_PATH, or one on PATH.
# --smoke: the same on the CPU at tiny sizes, in about a minute (tests/test_gpu_rl.py runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
t_start=$(date +%s)
usage="scripts/gpu_rl.sh OUT_DIR [--smoke] [--sft-minutes M] [--grpo-minutes N] [--preset P | --sft-init B] [--deadline-minutes D] [--base MODEL_DIR | --continue] [--control] [--more-games RECORD]... [--more-data FILE]... [--game-positions N]"
out=${1:?usage: $usage}
shift
smoke=0
sft_minutes=4
grpo_minutes=2.5
preset=small
preset_given=0
sft_init=""
game_positions=0
more=()
deadline=""
given=""
control=0
continued=0
while [ $# -gt 0 ]; do
  case $1 in
    --smoke) smoke=1 ;;
    --sft-minutes) sft_minutes=${2:?--sft-minutes needs a number}; shift ;;
    --grpo-minutes) grpo_minutes=${2:?--grpo-minutes needs a number}; shift ;;
    --preset) preset=${2:?--preset needs a name}; preset_given=1; shift ;;
    --sft-init) sft_init=${2:?--sft-init needs a model folder}; shift
                [ -f "$sft_init/config.json" ] || {
                  echo "gpu_rl.sh: --sft-init $sft_init: no model there (no config.json)" >&2; exit 2; } ;;
    --deadline-minutes)
      [[ ${2:-} =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "gpu_rl.sh: --deadline-minutes needs a number of minutes, got '${2:-}'" >&2; exit 2; }
      deadline=$(awk -v s="$t_start" -v m="$2" 'BEGIN { printf "%d", s + m * 60 }'); shift ;;
    --base) given=${2:?--base needs a model folder}; shift
            [ -f "$given/config.json" ] || { echo "gpu_rl.sh: --base $given: no model there (no config.json)" >&2; exit 2; } ;;
    --control) control=1 ;;
    --game-positions)
      [[ ${2:-} =~ ^[0-9]+$ ]] || {
        echo "gpu_rl.sh: --game-positions needs a number of openings, got '${2:-}'" >&2; exit 2; }
      game_positions=$2; shift ;;
    --continue) continued=1 ;;
    --more-games) more+=(--more-games "${2:?--more-games needs a game record}"); shift ;;
    --more-data) more+=(--more-data "${2:?--more-data needs a file}"); shift ;;
    *) echo "gpu_rl.sh: unknown option $1 (usage: $usage)" >&2; exit 2 ;;
  esac
  shift
done
py=${PYTHON:-python3}
mode=$([ $control = 1 ] && echo control || echo grpo)
work=${WORK:-runs/gpu-rl$([ $control = 1 ] && echo -control || true)}
openings=$(grep -cv '^#' data/train_openings.txt)  # where the game positions' games start: asked for past them, the
[ "$game_positions" -le "$openings" ] || {  # stage would stop after the base, with GRPO's minutes still unspent
  echo "gpu_rl.sh: --game-positions $game_positions: data/train_openings.txt holds $openings openings" >&2; exit 2; }
if [ $control = 1 ] && [ "$game_positions" -gt 0 ]; then
  echo "gpu_rl.sh: --control trains the anchor and the KL alone, and --game-positions' recipe has no anchor: nothing" \
       "but its rewards moves the weights, so the base is its control (run it without --control)" >&2
  exit 2
fi
if [ -n "$sft_init" ]; then  # a base to train on: not with one given as it is, nor with the base in WORK
  why=""
  if [ -n "$given" ]; then why="--sft-init trains a base on from $sft_init; --base takes $given as it is: one of them"
  elif [ $continued = 1 ]; then why="--continue goes on with the base in WORK: --sft-init belongs to the base's call"
  elif [ $preset_given = 1 ]; then why="--preset sizes a fresh model; --sft-init $sft_init continues at its own size"
  fi
  [ -z "$why" ] || { echo "gpu_rl.sh: $why" >&2; exit 2; }
fi
if [ $continued = 1 ]; then  # the base in WORK, or why not (before anything is made or run)
  why=""
  if [ -n "$given" ]; then why="--continue and --base: a call continues the base in WORK or starts from a given one"
  elif [ -f "$work/base.done" ]; then :
  elif [ -f "$work/sft/base.checkpoint/config.json" ]; then  # what the base's command resumes
    why="--continue: the base's SFT in $work did not finish: rerun the base's command to finish it"
  else why="--continue: $work holds no finished base (a machine started afresh?): run GRPO from the base that came \
back with --base MODEL_DIR"
  fi
  [ -z "$why" ] || { echo "gpu_rl.sh: $why" >&2; exit 2; }
fi
mkdir -p "$out" "$work"
rm -rf "$out/base" "$out/trained" "$out/record.tar" "$out/results.md" "$work/skipped.txt"
. scripts/gpu_wheels.sh
use_carried_wheels "$py" $smoke
[ -z "${STOCKFISH_PATH:-}" ] && use_carried_stockfish "$py" "$work/stockfish"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
left() {  # seconds before the deadline (a day without one)
  if [ -n "$deadline" ]; then echo $(( deadline - $(date +%s) )); else echo 86400; fi
}
skip() {  # name, why: not run in this call; results.md names it
  echo "gpu_rl: $1 skipped: $2"
  echo "$1: $2" >> "$work/skipped.txt"
}
together=""  # set while the judging stages are started: each then runs in the background, at once
running=()   # pid:name of each stage started in the background
stage() {  # name, command...: run once, then OUT filled with what is done (in the background while $together)
  local name=$1
  shift
  if [ -f "$work/$name.done" ]; then echo "gpu_rl: $name done before"; return; fi
  if [ "$(left)" -le 0 ]; then skip "$name" "past the deadline"; return; fi
  echo "gpu_rl: $name"
  if [ -z "$together" ]; then run_stage "$name" "$@"; return; fi
  { export OMP_NUM_THREADS=$share; run_stage "$name" "$@" 2>&1 | sed -u "s/^/[$name] /"; } &
  running+=("$!:$name")
}
run_stage() {  # name, command...: its seconds and start time in times.tsv, then OUT filled (one stage at a time)
  local name=$1 t0
  shift
  t0=$(date +%s)
  "$@"
  echo -e "$name\t$(( $(date +%s) - t0 ))\t$t0" >> "$work/times.tsv"
  touch "$work/$name.done"
  {
    flock 9
    publish
    "$py" scripts/gpu_rl_report.py "$work" "$out" > /dev/null || echo "gpu_rl: warning: OUT would not all come back"
  } 9> "$work/publish.lock"
}
publish() {  # OUT's models from the stages done so far (each call's OUT starts empty on a GPU machine)
  [ -f "$work/base.done" ] || return 0
  if [ -z "$given" ]; then
    mkdir -p "$out/base"
    cp "$work"/base-out/* "$out/base/"
  fi
  if [ -f "$work/grpo.done" ]; then
    if [ ! -f "$work/export/.done" ]; then  # the trained model's bf16 shards, once
      rm -rf "$work/export"
      "$py" scripts/export_bf16.py "$work/grpo/final" "$work/export"
      for f in summary.json metrics.jsonl eval.jsonl events.jsonl config.yaml; do
        [ -f "$work/grpo/$f" ] && cp "$work/grpo/$f" "$work/export/"
      done
      touch "$work/export/.done"
    fi
    mkdir -p "$out/trained"
    cp "$work"/export/*.safetensors "$out/trained/"
    tar cf "$out/trained/meta.tar" -C "$work/export" --exclude '*.safetensors' --exclude .done .
  fi
  # record.tar and results.md: scripts/gpu_rl_report.py, run after each publish
}

if [ $smoke = 1 ]; then
  device=cpu
  base_args=(--smoke --minutes "$sft_minutes")
  grpo=(--device cpu --steps 2 --batch-positions 2 --group-size 4 --engine-workers 1
        --eval-limit 4 --strength-data null --history-eval-data null --puzzle-eval-data null --max-new-tokens 40)
  [ "$game_positions" -gt 0 ] || grpo+=(--anchor-batch 4)  # (its recipe has no anchor)
  games=(--games 2 --max-plies 8)
  # the game positions' stage: the model's moves batched, Stockfish's depth and processes
  positions=(--device cpu --batch-size 64)
  label=(--depth 2 --workers 1)
  selfplay_plies=8
  reserve=${RESERVE:-0}
else
  device=cuda
  base_args=(--minutes "$sft_minutes")
  [ -n "$sft_init" ] || base_args+=(--preset "$preset")
  grpo=(--engine-workers "$(( $(nproc) > 4 ? $(nproc) - 4 : 1 ))")
  games=(--games 200 --batch-size 256)  # each ply's moves of a model (about 100 games) in one decode batch
  positions=(--device cuda --batch-size 256)
  label=(--depth 8 --workers "$(( $(nproc) > 4 ? $(nproc) - 4 : 1 ))")
  selfplay_plies=150
  reserve=${RESERVE:-150}
fi

# WORK belongs to one base: the one step 1 trains, or --base's
base=${given:-$work/sft/base}
[ -f "$work/base_model" ] && [ "$(cat "$work/base_model")" != "$base" ] && {
  echo "gpu_rl.sh: $work holds a run from the base $(cat "$work/base_model"), not $base: set WORK to another folder" >&2
  exit 2; }
echo "$base" > "$work/base_model"
# ... and its base to the model its SFT started from (a fresh one, or --sft-init's): a rerun repeats the flag
if [ $continued = 0 ] && [ -z "$given" ]; then
  [ -f "$work/sft_init" ] && [ "$(cat "$work/sft_init")" != "${sft_init:-fresh}" ] && {
    echo "gpu_rl.sh: $work holds a base whose SFT started from $(cat "$work/sft_init"), not ${sft_init:-fresh}:" \
         "set WORK to another folder" >&2
    exit 2; }
  echo "${sft_init:-fresh}" > "$work/sft_init"
fi
# ... and to one kind of run: GRPO, or its control
[ -f "$work/mode" ] && [ "$(cat "$work/mode")" != "$mode" ] && {
  echo "gpu_rl.sh: $work holds a $(cat "$work/mode") run, not a $mode run: set WORK to another folder" >&2
  exit 2; }
echo "$mode" > "$work/mode"
# ... and a GRPO run to its prompts (a rerun or --continue repeats --game-positions)
positions_before=$(cat "$work/game_positions" 2> /dev/null || echo 0)
{ [ -d "$work/grpo" ] || [ -f "$work/positions.done" ]; } && [ "$positions_before" != "$game_positions" ] && {
  echo "gpu_rl.sh: $work holds a GRPO run with --game-positions $positions_before," \
       "not $game_positions: set WORK to another folder" >&2
  exit 2; }
[ $control = 1 ] && grpo+=(--reward-signal false)
[ -n "$sft_init" ] && base_args+=(--init "$sft_init")
[ -n "$given" ] && base_args+=(--data-only)
# with a deadline, the base is done RESERVE seconds before it (SFT cut to fit): the base comes back first
[ -n "$deadline" ] && base_args+=(--end-by $(( deadline - reserve )))
base_stage() {
  # (an assignment is a literal word: one an expansion makes would run as a command)
  PYTHON="$py" WORK="$work/sft" RESUME="${RESUME_SFT:-}" scripts/gpu_base.sh "$work/base-out" "${base_args[@]}" \
    "${more[@]}"
}
[ -f "$work/sft/base.checkpoint/config.json" ] && [ ! -f "$work/base.done" ] && export RESUME_SFT=1
stage base base_stage

positions_stage() {  # --game-positions: GRPO's P: prompts from the ends of the base's own games
  local dir=$work/positions n ended
  echo "$game_positions" > "$work/game_positions"
  rm -rf "$dir"
  mkdir -p "$dir"
  "$py" scripts/game_positions.py --model "$base" --openings-file data/train_openings.txt \
    --openings "$game_positions" --last 4 "${positions[@]}" --out "$dir/fens.txt" | tee "$dir/games.txt"
  "$py" -m rookworld_rlvr data generate --out "$dir/gen" --games 0 --positions "$dir/fens.txt" "${label[@]}" --quiet
  "$py" -m rookworld_rlvr data merge "$dir/gen/train.jsonl.gz" --tasks P --truth-only --out "$dir/grpo.jsonl.gz"
  n=$(gzip -dc "$dir/grpo.jsonl.gz" | wc -l)
  ended=$(sed -E 's/^([0-9]+) games \((.*)\); .*/\1 games from training openings, ended by: \2/' "$dir/games.txt")
  echo "GRPO's P: prompts (puzzles aside; --game-positions $game_positions, configs/gpu-game-positions.yaml): $n" \
       "positions from the ends of the base's own greedy games (the last 4 of each; $ended), labelled by" \
       "Stockfish" > "$dir/summary.txt"
}
grpo_stage() {
  local resume=() recipe=(--config configs/gpu-grpo.yaml --data "$(cat "$work/sft/train.used")")
  [ -d "$work/grpo/checkpoints" ] && resume=(--resume)
  echo "$game_positions" > "$work/game_positions"
  [ "$game_positions" -gt 0 ] && recipe=(--config configs/gpu-game-positions.yaml
                                        --data "$work/positions/grpo.jsonl.gz")
  "$py" -m rookworld_rlvr train "${recipe[@]}" --model "$base" --output-dir "$work/grpo" --max-minutes "$grpo_budget" \
    --engine-cache "$work/engine.sqlite" "${grpo[@]}" "${resume[@]}"
}
budget() {  # GRPO's minutes: --grpo-minutes, or what the deadline leaves after RESERVE seconds for what follows it
  awk -v want="$grpo_minutes" -v left="$(left)" -v r="$reserve" \
    'BEGIN { m = (left - r) / 60; if (m > want) m = want; printf "%.2f", m }'
}
grpo_budget=$(budget)
fits() { awk -v m="$grpo_budget" 'BEGIN { exit !(m >= 0.5) }'; }
waits=$([ "$game_positions" -gt 0 ] && [ ! -f "$work/positions.done" ] && echo 1 || echo 0)  # on its positions
if [ ! -f "$work/grpo.done" ] && [ $waits = 1 ] && fits; then
  stage positions positions_stage  # (a deadline past: skipped, and GRPO with it, below)
  grpo_budget=$(budget)  # what the positions' stage left
  [ -f "$work/positions.done" ] && waits=0
fi
if [ -f "$work/grpo.done" ]; then
  stage grpo grpo_stage  # done before
elif [ $waits = 1 ] && fits; then
  skip grpo "its game positions are not ready (positions not done)"
elif fits; then
  [ "$grpo_budget" = "$(printf %.2f "$grpo_minutes")" ] || echo "gpu_rl: grpo gets $grpo_budget minutes (the deadline)"
  stage grpo grpo_stage
elif [ "$grpo_budget" = "$(printf %.2f "$grpo_minutes")" ]; then
  skip grpo "--grpo-minutes $grpo_minutes asked, fewer than 0.5"
else
  skip grpo "$grpo_budget minutes left for it before the deadline, fewer than 0.5"
fi
trained() {  # stage name, command...: a stage of the trained model, run once GRPO is done
  if [ -f "$work/grpo.done" ]; then stage "$@"; else skip "$1" "no trained model (GRPO not done)"; fi
}

# the judging stages (two matches, two self-play games) need none of one another's results: they run at
# once, each its own process. A 14M model's games are bound by the launches of its small kernels, not by the GPU's
# arithmetic, so four at once take about as long as the longest alone.
# Each takes a quarter of the cores for torch's threads: with more threads than cores, threads that spin while
# waiting for one another take the cores from the others (on 2 CPU cores, 4 stages at once took 31 s in one
# call and 79 s in the next, each with 2 threads; a match beside a training run took 30 minutes instead of 1.3).
share=$(( $(nproc) / 4 > 1 ? $(nproc) / 4 : 1 ))
if command -v flock > /dev/null; then together=1; else echo "gpu_rl: no flock here: the judging stages run one after another"; fi
trained match_trained "$py" -m rookworld_rlvr match "$work/grpo/final" "$base" "${games[@]}" --device "$device" \
  --json "$work/match_trained_vs_base.json" --pgn "$work/match_trained_vs_base.pgn" --quiet
selfplay() {  # name, model: one greedy game from the start against itself, its legal half-moves (the base's goal: 60)
  "$py" -m rookworld_rlvr eval --model "$2" --data data/eval.jsonl.gz --limit 0 --selfplay 1 \
    --selfplay-max-plies "$selfplay_plies" --device "$device" --json "$work/selfplay_$1.json" --quiet
}
stage selfplay_base selfplay base "$base"
trained selfplay_trained selfplay trained "$work/grpo/final"
if [ -f models/rookworld-board/config.json ]; then
  stage match_base "$py" -m rookworld_rlvr match "$base" models/rookworld-board "${games[@]}" --device "$device" \
    --json "$work/match_base_vs_board.json" --pgn "$work/match_base_vs_board.pgn" --quiet
else  # a tree slimmed to travel beside a shipped base (docs/gpu.md): the call that trained the base played it
  skip match_base "models/rookworld-board is not in this tree"
fi
failed=()
for job in "${running[@]}"; do
  wait "${job%%:*}" || failed+=("${job#*:}")
done
together=""

publish  # also when every stage was done before (a rerun into a new, empty OUT)
rc=0
"$py" scripts/gpu_rl_report.py "$work" "$out" || rc=$?  # record.tar, results.md printed; 1: OUT would not come back
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu_rl: failed: ${failed[*]} (their output above, each line marked with its name; rerun to run them again)" >&2
  rc=1
fi
exit $rc
