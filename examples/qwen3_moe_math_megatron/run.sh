#!/usr/bin/env bash
# Usage: MODEL=/path/to/hf/model ./run.sh [more vime train flags, e.g. --dry-run]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec vime train --config "$here/config.yaml" --model "${MODEL:?set MODEL to an HF model folder}" "$@"
