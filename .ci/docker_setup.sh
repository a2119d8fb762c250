#!/usr/bin/env bash
# Make the docker sandbox usable: start a Docker engine if none answers, and build the local
# base image (Debian bookworm + python3, from debootstrap; no image registry is reachable here).
# Idempotent: a running engine and an existing image are kept; the debootstrap tarball is cached.
#
# Environment: VIME_CACHE (default ~/.cache/vime), VIME_SANDBOX_IMAGE (default
# vime-sandbox:bookworm), VIME_SANDBOX_PACKAGES (default python3), VIME_DEBIAN_MIRROR (default:
# the mirror apt uses on this machine).
set -euo pipefail

IMAGE="${VIME_SANDBOX_IMAGE:-vime-sandbox:bookworm}"
SUITE=bookworm
# python3 (not python3-minimal): model-written code and unit tests need the full stdlib (json,
# collections, typing, ...), which python3-minimal leaves out.
PACKAGES="${VIME_SANDBOX_PACKAGES:-python3}"
CACHE="${VIME_CACHE:-$HOME/.cache/vime}/docker"
LOG="$CACHE/dockerd.log"
# The distribution's client matches its engine; a newer one earlier on PATH may not.
DOCKER=docker
[ -x /usr/bin/docker ] && DOCKER=/usr/bin/docker

mkdir -p "$CACHE"
log() { echo "[docker_setup $(date +%T)] $*"; }
die() { echo "[docker_setup] error: $*" >&2; exit 1; }

engine_up() { "$DOCKER" info >/dev/null 2>&1; }

start_engine() {
  command -v dockerd >/dev/null \
    || die "dockerd not found; install it with: apt-get install -y docker.io"
  log "no Docker engine answers; starting dockerd (log: $LOG)"
  # A dockerd that died leaves its pid file behind, and a new one refuses to start over it.
  local pidfile=/var/run/docker.pid
  if [ -f "$pidfile" ] && ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    log "removing stale $pidfile"
    rm -f "$pidfile"
  fi
  # No bridge and no iptables: sandboxes run with --network none, and this machine may not
  # allow iptables changes. setsid keeps the engine alive after this script and its CI step end.
  setsid nohup dockerd --bridge=none --iptables=false --ip6tables=false >"$LOG" 2>&1 </dev/null &
  local pid=$! waited=0
  until engine_up; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 30 "$LOG" >&2 || true
      die "dockerd exited during start-up (log above, full log in $LOG)"
    fi
    if [ "$waited" -ge 120 ]; then
      tail -n 30 "$LOG" >&2 || true
      die "dockerd did not answer within 60 s (log above, full log in $LOG)"
    fi
    sleep 0.5
    waited=$((waited + 1))
  done
  log "engine up after $((waited / 2)) s"
}

# The Debian mirror apt uses here: only the package registries are reachable.
apt_mirror() {
  local uri
  uri=$(
    {
      grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}'
      grep -hsE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
        | sed -E 's/^deb (\[[^]]*\] )?//' | awk '{print $1}'
    } | grep -E '/debian/?$' | head -n 1
  )
  echo "${uri:-http://deb.debian.org/debian}"
}

build_rootfs_tarball() {
  local tarball=$1 mirror root
  command -v debootstrap >/dev/null \
    || die "debootstrap not found; install it with: apt-get install -y debootstrap"
  mirror="${VIME_DEBIAN_MIRROR:-$(apt_mirror)}"
  root=$(mktemp -d "$CACHE/rootfs.XXXXXX")
  # Remove a half-built root on any exit; the tarball is only moved into place when complete.
  trap "rm -rf '$root' '$tarball.tmp'" EXIT
  log "debootstrap $SUITE (minbase + ${PACKAGES// /,}) from $mirror"
  if ! debootstrap --variant=minbase --include="${PACKAGES// /,}" "$SUITE" "$root" "$mirror" \
    >"$CACHE/debootstrap.log" 2>&1; then
    tail -n 30 "$CACHE/debootstrap.log" >&2 || true
    die "debootstrap failed (log above, full log in $CACHE/debootstrap.log)"
  fi
  # Package caches are of no use inside a sandbox; /work is the sandbox's work dir mount point.
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  mkdir -p "$root/work"
  tar --numeric-owner -C "$root" -cf "$tarball.tmp" .
  mv "$tarball.tmp" "$tarball"
  rm -rf "$root"
  trap - EXIT
  log "cached root filesystem: $tarball ($(du -h "$tarball" | cut -f1))"
}

build_image() {
  local tarball="$CACHE/$SUITE-minbase-${PACKAGES// /_}.tar"
  [ -s "$tarball" ] || build_rootfs_tarball "$tarball"
  log "importing $tarball as $IMAGE"
  "$DOCKER" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'WORKDIR /work' \
    --change 'CMD ["sleep", "infinity"]' \
    "$tarball" "$IMAGE" >/dev/null
}

engine_up || start_engine
if "$DOCKER" image inspect "$IMAGE" >/dev/null 2>&1; then
  log "image $IMAGE already present"
else
  build_image
fi
"$DOCKER" run --rm --network none "$IMAGE" python3 -c 'import json, sys; print("python", sys.version.split()[0])' \
  || die "the image $IMAGE does not run python3; remove it (docker rmi $IMAGE) and rerun"
log "ready: $IMAGE"
