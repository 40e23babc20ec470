# Sourced by scripts/gpu_check.sh, gpu_rl.sh and gpu_base.sh: what travels to a GPU machine, put to use.
# `use_carried_wheels PYTHON SMOKE` installs the wheels
# scripts/gpu_pack.sh put in .whl/ (built for the GPU image's Python) into /tmp/gpu-site and puts that first on
# PYTHONPATH. Nothing in --smoke runs (SMOKE=1: this machine's own packages), nothing when there are no wheels, and
# nothing a second time (gpu_rl.sh runs gpu_base.sh, which inherits the PYTHONPATH).
use_carried_wheels() {
  local py=$1 smoke=$2
  [ "$smoke" = 1 ] && return 0
  ls .whl/*.whl >/dev/null 2>&1 || return 0
  case ":${PYTHONPATH:-}:" in *:/tmp/gpu-site:*) return 0 ;; esac
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-site .whl/*.whl \
    || return 1
  export PYTHONPATH="/tmp/gpu-site${PYTHONPATH:+:$PYTHONPATH}"
}

# `use_carried_stockfish PYTHON DEST`: the Stockfish gpu_pack.sh --stockfish put in .gpu/stockfish.xz, unpacked to
# DEST by Python's lzma (the image need not have xz) and named by STOCKFISH_PATH; nothing when none was carried.
use_carried_stockfish() {
  local py=$1 dest=$2
  [ -f .gpu/stockfish.xz ] || return 0
  "$py" -c 'import lzma, shutil, sys
with lzma.open(sys.argv[1]) as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)' .gpu/stockfish.xz "$dest.tmp" && chmod +x "$dest.tmp" && mv "$dest.tmp" "$dest" \
    || return 1
  export STOCKFISH_PATH="$(cd "$(dirname "$dest")" && pwd)/$(basename "$dest")"
}
