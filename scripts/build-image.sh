#!/usr/bin/env bash
# `make image`: builds localhost/dra-driver:<version> from the Dockerfile with podman (docs/image.md).
#
# No public container registry is needed: when PYTHON_IMAGE is not given, the base image (Debian bookworm
# with its python3 3.11, the same Debian release as python:3.11-slim-bookworm) is made from Debian packages
# with debootstrap and imported into podman once; later runs reuse it (`podman image exists`).
#
# Environment (all optional):
#   IMAGE          the image to build        (default localhost/dra-driver:<version in pyproject.toml>)
#   PYTHON_IMAGE   the base image to build on (default: the debootstrap base below, built when missing)
#   BASE_IMAGE     the debootstrap base's name (default localhost/dra-driver-base:bookworm-python3.11)
#   DEBIAN_MIRROR  the mirror for debootstrap (default: the first URIs of /etc/apt/sources.list.d/*.sources)
#   PIP_INDEX_URL  passed to the build as a build argument when set (a local package index)
#   REBUILD_BASE=1 make the base again even when it exists
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "image: $*"; }
die() { echo "image: error: $*" >&2; exit 1; }

VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n1)
[ -n "$VERSION" ] || die "no version in pyproject.toml"
IMAGE=${IMAGE:-localhost/dra-driver:$VERSION}
BASE_IMAGE=${BASE_IMAGE:-localhost/dra-driver-base:bookworm-python3.11}
WORK=.image  # git-ignored; debootstrap's rootfs lives here only while the base is made
# Rootless or inside a container, podman may refuse the host's huge limits: pin sane ones.
LIMITS=(--ulimit nofile=1024:1024 --ulimit nproc=1024:1024)

need_tool() {  # need_tool <command> <debian package>
  command -v "$1" >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing $2 (apt)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$2" >/dev/null \
      || { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$2" >/dev/null; } \
      || die "could not install $2"
  else
    die "$1 is missing (install the $2 package)"
  fi
}

debian_mirror() {
  if [ -n "${DEBIAN_MIRROR:-}" ]; then echo "$DEBIAN_MIRROR"; return; fi
  local uri
  uri=$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | grep -v -- '-security' | head -n1 || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

build_base() {
  [ "$(id -u)" = 0 ] || die "making the base with debootstrap needs root (or set PYTHON_IMAGE to a python:3.11 image)"
  need_tool debootstrap debootstrap
  local mirror rootfs
  mirror=$(debian_mirror)
  rootfs=$WORK/rootfs
  mkdir -p "$WORK"
  if [ -f "$WORK/rootfs.ok" ] && [ -d "$rootfs" ]; then
    say "reusing the finished debootstrap in $rootfs"
  else
    rm -rf "$rootfs" "$WORK/rootfs.ok"
    say "making the base $BASE_IMAGE: debootstrap bookworm from $mirror (a few minutes; log: $WORK/debootstrap.log)"
    if ! debootstrap --variant=minbase --include=python3,python3-venv,python3-pip \
        bookworm "$rootfs" "$mirror" >"$WORK/debootstrap.log" 2>&1; then
      tail -n 20 "$WORK/debootstrap.log" >&2
      die "debootstrap failed"
    fi
    touch "$WORK/rootfs.ok"
  fi
  # Make it behave like python:3.11-slim for the Dockerfile: `python` on PATH, pip may install into the
  # system site-packages (no PEP 668 marker), no apt lists or caches.
  ln -sf python3 "$rootfs/usr/bin/python"
  rm -f "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
         "$rootfs"/var/log/* "$rootfs"/tmp/*
  say "importing the base into podman"
  tar --numeric-owner -C "$rootfs" -c . \
    | podman import --change 'CMD ["python3"]' --change 'ENV LANG=C.UTF-8' - "$BASE_IMAGE" >/dev/null
  rm -rf "$rootfs" "$WORK/rootfs.ok"
}

need_tool podman podman

build_args=()
if [ -n "${PYTHON_IMAGE:-}" ]; then
  say "base: $PYTHON_IMAGE (from PYTHON_IMAGE)"
  base=$PYTHON_IMAGE
else
  base=$BASE_IMAGE
  if [ "${REBUILD_BASE:-0}" = 1 ] || ! podman image exists "$base"; then
    build_base
  else
    say "base: $base (exists; REBUILD_BASE=1 makes it again)"
  fi
fi
build_args+=(--build-arg "PYTHON_IMAGE=$base")
[ -n "${PIP_INDEX_URL:-}" ] && build_args+=(--build-arg "PIP_INDEX_URL=$PIP_INDEX_URL")

# The builder stage downloads the dependencies with pip: host network, and the host's CA bundle (a
# TLS-inspecting proxy signs with a CA only the host trusts; Debian's pip reads /etc/ssl/certs).
mounts=()
[ -d /etc/ssl/certs ] && mounts+=(-v /etc/ssl/certs:/etc/ssl/certs:ro)
say "building $IMAGE"
start=$(date +%s)
podman build --network=host "${LIMITS[@]}" "${mounts[@]}" "${build_args[@]}" \
  --label "org.opencontainers.image.version=$VERSION" -t "$IMAGE" -f Dockerfile .
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
say "built $IMAGE in $(( $(date +%s) - start ))s: $(( size / 1000000 )) MB ($size bytes; podman image inspect)"
podman run --rm "${LIMITS[@]}" "$IMAGE" --version
