#!/usr/bin/env bash
# Render `vime view` of a train run into a PNG (the README's screenshot of the viewer):
#   scripts/viewer_screenshot.sh [RUN_DIR] [OUT_PNG] [EPISODE]
# RUN_DIR defaults to a small synthetic run (tests/view/synth_run.py), OUT_PNG to
# docs/viewer.png; EPISODE (default 0) is the trajectory opened in the browser pane.
set -euo pipefail
cd "$(dirname "$0")/.."
run=${1:-}
out=${2:-docs/viewer.png}
episode=${3:-0}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -z "$run" ]; then
  run="$tmp/run"
  .venv/bin/python tests/view/synth_run.py "$run" >/dev/null
fi
.venv/bin/vime view "$run" --output "$tmp/view.html"
mkdir -p "$(dirname "$out")"
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$tmp/profile" --hide-scrollbars --window-size=1400,1700 \
  --virtual-time-budget=10000 --screenshot="$(realpath -m "$out")" \
  "file://$tmp/view.html#t=$episode" 2>/dev/null
echo "wrote $out"
