#!/usr/bin/env bash
# Make the virtual environment that `make` installs into: PYTHON -m venv VENV, with pip in it.
# Debian and Ubuntu ship python3 without `venv`'s pip (the python3-venv package): there `python3 -m venv` fails
# and leaves VENV half made, without pip, and every later `make` would fail on it ("No module named pip") even
# once the package is installed. So a VENV without pip is made again, python3-venv is installed with apt-get when
# we are root, and otherwise the error says what to install.
set -euo pipefail
usage="usage: scripts/ensure_venv.sh PYTHON VENV"
py=${1:?$usage}
venv=${2:?$usage}
has_pip() { [ -x "$venv/bin/python" ] && "$venv/bin/python" -m pip --version > /dev/null 2>&1; }
has_pip && exit 0
command -v "$py" > /dev/null || {
  echo "error: $py not found: install Python 3.11 or later, or name yours: make PYTHON=python3.12" >&2; exit 1; }
version=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
"$py" -c 'import sys; sys.exit(sys.version_info[:2] < (3, 11))' || {
  echo "error: $py is Python $version; rookworld-rlvr needs 3.11 or later: make PYTHON=python3.11 (or later)" >&2
  exit 1; }
if [ -e "$venv" ]; then
  [ -f "$venv/pyvenv.cfg" ] || {
    echo "error: $venv is there and is not a virtual environment: move it away" >&2; exit 1; }
  echo "$venv has no pip (a virtual environment left half made): making it again" >&2
  rm -rf "$venv"
fi
if ! "$py" -c 'import ensurepip, venv' 2> /dev/null && [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
  echo "$py cannot make a virtual environment with pip: installing python$version-venv with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && { apt-get install -y -qq "python$version-venv" > /dev/null 2>&1 ||
                          apt-get install -y -qq python3-venv > /dev/null; } || true
fi
if ! "$py" -m venv "$venv" || ! has_pip; then
  rm -rf "$venv"  # never leave it half made: the next `make` starts afresh
  cat >&2 <<MSG
error: $py could not make the virtual environment $venv with pip in it.
On Debian/Ubuntu install the venv package (sudo apt-get install python$version-venv, or python3-venv), then run
make again; elsewhere, a Python 3.11 or later with its venv module (make PYTHON=/path/to/python3).
MSG
  exit 1
fi
