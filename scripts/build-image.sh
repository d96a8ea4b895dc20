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
#   IMAGE_WORK_DIR the work dir (default .image)
#   SANDBOX_PYTHON the Python with dra_sandbox installed (default .venv/bin/python: `make venv`)
#
# The OCI runtime: the sandbox's probe (`python -m dra_sandbox.imagebuild podman-args`, the one PodmanRuntime
# uses) says whether podman's default runtime can run a container here; where it cannot (crun on a host with
# cgroups in hybrid mode: "cgroups in hybrid mode not supported"), it answers `--runtime runc`, which every
# podman call below then gets, so the Dockerfile's RUN steps run under runc.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "image: $*"; }
die() { echo "image: error: $*" >&2; exit 1; }

VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n1)
[ -n "$VERSION" ] || die "no version in pyproject.toml"
IMAGE=${IMAGE:-localhost/dra-driver:$VERSION}
BASE_IMAGE=${BASE_IMAGE:-localhost/dra-driver-base:bookworm-python3.11}
WORK=${IMAGE_WORK_DIR:-.image}  # git-ignored; the build lock, and debootstrap's rootfs while the base is made
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
    | "${PODMAN[@]}" import --change 'CMD ["python3"]' --change 'ENV LANG=C.UTF-8' - "$BASE_IMAGE" >/dev/null
  rm -rf "$rootfs" "$WORK/rootfs.ok"
}

need_tool podman podman

# One build at a time in this checkout (make test starts one in the background; the debootstrap dir is shared).
mkdir -p "$WORK"
exec 9>"$WORK/build.lock"
if ! flock -n 9; then say "waiting for another build in this checkout ($WORK/build.lock)"; flock 9; fi

SANDBOX_PYTHON=${SANDBOX_PYTHON:-.venv/bin/python}
[ -x "$SANDBOX_PYTHON" ] || die "$SANDBOX_PYTHON is missing: run \`make venv\` (or set SANDBOX_PYTHON)"
PODMAN=(podman)
probe_status=0
runtime_args=$("$SANDBOX_PYTHON" -m dra_sandbox.imagebuild podman-args 2>"$WORK/probe.err") || probe_status=$?
if [ "$probe_status" = 0 ]; then
  mapfile -t extra <<<"$runtime_args"
  for arg in "${extra[@]}"; do if [ -n "$arg" ]; then PODMAN+=("$arg"); fi; done
  if [ "${#PODMAN[@]}" -gt 1 ]; then
    say "OCI runtime: podman ${PODMAN[*]:1} (the default runtime cannot run containers here)"
  else
    say "OCI runtime: the default of podman"
  fi
elif [ "$probe_status" = 3 ]; then
  say "warning: the probe found no way to run a container here ($(cat "$WORK/probe.err")); trying podman's default runtime"
else
  cat "$WORK/probe.err" >&2
  die "the runtime probe failed (exit $probe_status)"
fi

build_args=()
if [ -n "${PYTHON_IMAGE:-}" ]; then
  say "base: $PYTHON_IMAGE (from PYTHON_IMAGE)"
  base=$PYTHON_IMAGE
else
  base=$BASE_IMAGE
  if [ "${REBUILD_BASE:-0}" = 1 ] || ! "${PODMAN[@]}" image exists "$base"; then
    build_base
  else
    say "base: $base (exists; REBUILD_BASE=1 makes it again)"
  fi
fi
# The base by digest, as the Dockerfile's default is: the build uses exactly the image inspected here, whatever its
# tag points at later. A base given by digest already is passed as it is.
if [[ "$base" != *@sha256:* ]]; then
  if ! "${PODMAN[@]}" image exists "$base"; then
    "${PODMAN[@]}" pull "$base" >/dev/null || die "cannot pull the base $base (set PYTHON_IMAGE to an image podman has)"
  fi
  digest=$("${PODMAN[@]}" image inspect --format '{{.Digest}}' "$base" 2>/dev/null || true)
  [[ "$digest" == sha256:* ]] || die "cannot read the digest of the base $base (podman image inspect)"
  base="${base%%@*}@$digest"
fi
say "base pinned: $base"
build_args+=(--build-arg "PYTHON_IMAGE=$base")
[ -n "${PIP_INDEX_URL:-}" ] && build_args+=(--build-arg "PIP_INDEX_URL=$PIP_INDEX_URL")
# The OCI labels the Dockerfile sets (org.opencontainers.image.*): what was built, from which commit, when, and where
# its source lives (the git remote; a checkout without one names itself as a file URL).
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$revision" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  revision="$revision-dirty"
fi
source_url=$(git config --get remote.origin.url 2>/dev/null || true)
source_url=${source_url:-file://$(pwd)}
build_args+=(--build-arg "VERSION=$VERSION" --build-arg "REVISION=$revision"
             --build-arg "CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ)" --build-arg "SOURCE=$source_url")
previous=$("${PODMAN[@]}" image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)

# The builder stage downloads the dependencies with pip: host network, and the host's CA bundle (a
# TLS-inspecting proxy signs with a CA only the host trusts; Debian's pip reads /etc/ssl/certs).
mounts=()
[ -d /etc/ssl/certs ] && mounts+=(-v /etc/ssl/certs:/etc/ssl/certs:ro)
say "building $IMAGE"
start=$(date +%s)
"${PODMAN[@]}" build --network=host "${LIMITS[@]}" "${mounts[@]}" "${build_args[@]}" -t "$IMAGE" -f Dockerfile .
# No untagged image left behind: the builder stage's (labelled in the Dockerfile; only a cache) and the image this
# tag named before, once nothing uses it.
"${PODMAN[@]}" image prune --force --filter "label=io.dra-driver.build-stage=builder" >/dev/null
current=$("${PODMAN[@]}" image inspect --format '{{.Id}}' "$IMAGE")
if [ -n "$previous" ] && [ "$previous" != "$current" ]; then
  "${PODMAN[@]}" rmi "$previous" >/dev/null 2>&1 || say "kept the previous $IMAGE ($previous): a container still uses it"
fi
size=$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE")
say "built $IMAGE in $(( $(date +%s) - start ))s: $(( size / 1000000 )) MB ($size bytes; podman image inspect)"
"${PODMAN[@]}" run --rm "${LIMITS[@]}" "$IMAGE" --version
