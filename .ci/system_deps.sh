#!/usr/bin/env bash
# System packages the tests use: bubblewrap (local sandbox), a C compiler (the local sandbox's
# launcher, built by scripts/install.sh), docker.io + debootstrap (docker sandbox and its base
# image), chromium (the eval report check), libtcmalloc-minimal4 (the CPU engines' allocator).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
need=()
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v cc >/dev/null || need+=(gcc)
[ -e /usr/include/stdio.h ] || need+=(libc6-dev)
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v chromium >/dev/null || need+=(chromium)
command -v tmux >/dev/null || need+=(tmux)
# tcmalloc for the vLLM CPU engines (vime.inference.engines preloads it when present)
ldconfig -p | grep -q libtcmalloc_minimal || need+=(libtcmalloc-minimal4)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${need[@]}"
fi
