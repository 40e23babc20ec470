#!/usr/bin/env bash
# The report test renders report.html in headless Chromium. Make sure a Chromium exists: installs
# Debian's `chromium` (and fonts-liberation, its recommended fonts, for the page's text, in case
# recommends are off) with apt when we are root; otherwise says how and carries on (that one test
# then skips, naming the same command; CI, which sets ROOKWORLD_TEST_STRICT=1, fails on the skip).
set -euo pipefail
for c in chromium chromium-browser; do
  if command -v "$c" >/dev/null; then exit 0; fi
done
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
  echo "Chromium not found: installing it with apt-get (Debian packages chromium, fonts-liberation)" >&2
  export DEBIAN_FRONTEND=noninteractive
  if apt-get update -qq && apt-get install -y -qq chromium fonts-liberation >/dev/null && command -v chromium >/dev/null; then
    exit 0
  fi
  echo "warning: apt-get could not install chromium" >&2
fi
cat >&2 <<'MSG'
note: Chromium is not installed, so the test that renders report.html in a browser will be skipped.
Install it (Debian/Ubuntu: sudo apt-get install chromium; macOS: brew install --cask chromium).
MSG
exit 0
