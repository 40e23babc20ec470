#!/usr/bin/env bash
# Make sure a Stockfish binary exists. Installs it with apt when we are root; otherwise explains how.
set -euo pipefail
if [ -n "${STOCKFISH_PATH:-}" ]; then
  if [ -x "$STOCKFISH_PATH" ]; then exit 0; fi
  echo "error: STOCKFISH_PATH=$STOCKFISH_PATH is not an executable file" >&2; exit 1
fi
for c in "$(command -v stockfish || true)" /usr/games/stockfish /usr/local/bin/stockfish /usr/bin/stockfish; do
  if [ -n "$c" ] && [ -x "$c" ]; then exit 0; fi
done
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
  echo "Stockfish not found: installing it with apt-get (Debian package 'stockfish')" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq stockfish >/dev/null
  [ -x /usr/games/stockfish ] && exit 0
fi
cat >&2 <<'MSG'
error: Stockfish is not installed and could not be installed automatically.
Install it (Debian/Ubuntu: sudo apt-get install stockfish; macOS: brew install stockfish)
or download it from https://stockfishchess.org and point STOCKFISH_PATH at the binary:
    export STOCKFISH_PATH=/path/to/stockfish
MSG
exit 1
