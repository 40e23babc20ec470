#!/usr/bin/env bash
# The GRPO trainer driven by environment variables, for people used to that style:
#   STEPS=40 LR=1e-5 KL_COEF=0.02 ./train.sh
# Every config field can be set by its upper-case name (KL_ESTIMATOR, LOSS_TYPE, ...).
# Aliases: MODEL, DATA, OUTPUT_DIR, SEED, RESUME and the other names map 1:1 to fields;
# CONFIG picks the YAML preset (default configs/default.yaml). Extra arguments pass through.
set -euo pipefail
cd "$(dirname "$0")"
[ -x .venv/bin/rookworld ] || make setup >&2
CONFIG="${CONFIG:-configs/default.yaml}"
args=(train --config "$CONFIG")
fields=$(.venv/bin/python -c "from rookworld_rlvr.config import FIELDS; print(' '.join(FIELDS))")
for f in $fields; do
  var=$(echo "$f" | tr '[:lower:]' '[:upper:]')
  if [ -n "${!var+x}" ]; then args+=("--$f" "${!var}"); fi
done
echo "+ rookworld ${args[*]} $*" >&2
exec .venv/bin/rookworld "${args[@]}" "$@"
