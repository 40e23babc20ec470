#!/usr/bin/env bash
# The GRPO trainer driven by environment variables, for people used to that style:
#   STEPS=40 LR=1e-5 KL_COEF=0.02 ./train.sh
#   ROOKWORLD_DATA=my.jsonl ROOKWORLD_SEED=3 ./train.sh --dry-run
# Every config field can be set as ROOKWORLD_<FIELD> or by its bare upper-case name (KL_COEF,
# LOSS_TYPE, ...); CONFIG (or ROOKWORLD_CONFIG) picks the YAML preset (default configs/default.yaml).
# Extra arguments pass through to `rookworld train` (--dry-run validates everything and stops).
#
# Why the prefix, and why the list printed before every run: any variable named like a field
# becomes a flag, and some field names are ordinary words that shell profiles and other tools
# export for their own use (DATA, MODEL, DEVICE, THREADS, SEED, REPORT, STEPS, OUTPUT_DIR, ...).
# Exported for something else, such a variable would change the run without anyone asking. So:
#  - every value taken from the environment is listed, with the variable it came from;
#  - a bare one-word name (and OUTPUT_DIR, CONFIG) still works, since it is the interface this
#    script's users know, but is listed with a warning: write ROOKWORLD_<FIELD> when it is meant
#    for this run (never warned about), unset it when it is not;
#  - a field set both ways must have the same value in both, or the script stops;
#  - a ROOKWORLD_<NAME> that is no field (a typo: ROOKWORLD_KL_COEFF) stops it, naming the fields it may mean.
# Multi-word names (KL_COEF, BATCH_POSITIONS, ...) are specific to this trainer and never warned about.
set -euo pipefail
cd "$(dirname "$0")"
[ -x .venv/bin/rookworld ] || make setup >&2

value=""
origin=""
take() {  # take NAME: value and origin from ROOKWORLD_NAME or NAME; fails when neither is set
  local prefixed="ROOKWORLD_$1"
  if [ -n "${!prefixed+x}" ]; then
    if [ -n "${!1+x}" ] && [ "${!1}" != "${!prefixed}" ]; then
      echo "train.sh: $1='${!1}' and $prefixed='${!prefixed}' disagree: unset one of them" >&2
      exit 2
    fi
    value=${!prefixed}
    origin=$prefixed
    return 0
  fi
  if [ -n "${!1+x}" ]; then
    value=${!1}
    origin=$1
    return 0
  fi
  return 1
}

listed=()
list() {  # list FIELD VARIABLE: one line of the banner
  local line
  line=$(printf '  %-24s = %s  (from %s)' "$1" "$value" "$origin")
  if [ "$origin" = "$2" ] && { [[ "$2" != *_* ]] || [ "$2" = OUTPUT_DIR ]; }; then
    line+=" warning: $2 is an ordinary name other tools export too; write ROOKWORLD_$2 if it is meant for this run, unset $2 if not"
  fi
  listed+=("$line")
}

CONFIG_FILE=configs/default.yaml
if take CONFIG; then
  CONFIG_FILE=$value
  list config CONFIG
fi
args=(train --config "$CONFIG_FILE")
fields=$(.venv/bin/python -c "from rookworld_rlvr.config import FIELDS; print(' '.join(FIELDS))")
for f in $fields; do
  var=$(echo "$f" | tr '[:lower:]' '[:upper:]')
  if take "$var"; then
    args+=("--$f" "$value")
    list "$f" "$var"
  fi
done
# a ROOKWORLD_ name is meant for this run: one that is no field (ROOKWORLD_KL_COEFF) would change nothing, so it stops
# the run, naming the fields it may mean (ROOKWORLD_TEST_* and ROOKWORLD_DRILL_* are the test suite's and the drill's)
for var in $(compgen -e | grep '^ROOKWORLD_' || true); do
  name=$(echo "${var#ROOKWORLD_}" | tr '[:upper:]' '[:lower:]')
  case " $fields config " in *" $name "*) continue ;; esac
  case $name in test_*|drill_*) continue ;; esac
  echo "train.sh: $var: $(.venv/bin/python -c 'import sys; from rookworld_rlvr.config_checks import unknown_field
print(unknown_field(sys.argv[1]))' "$name")" >&2
  exit 2
done
if [ ${#listed[@]} -eq 0 ]; then
  echo "train.sh: no settings from the environment" >&2
else
  echo "train.sh: ${#listed[@]} setting(s) from the environment (over $CONFIG_FILE):" >&2
  printf '%s\n' "${listed[@]}" >&2
fi
echo "+ rookworld ${args[*]} $*" >&2
exec .venv/bin/rookworld "${args[@]}" "$@"
