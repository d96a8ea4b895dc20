#!/usr/bin/env bash
# Installs optional system tools used by the sandbox (podman: a real CDI consumer).
# Idempotent; succeeds quietly when the tool is already there or cannot be installed.
set -u
if command -v podman >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: podman not installed (needs root + apt); container checks fall back to CDI parsing"
  exit 0
fi
echo "system-deps: installing podman (apt)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null 2>&1 || true
apt-get install -y -qq --no-install-recommends podman >/dev/null 2>&1 \
  || echo "system-deps: podman install failed; container checks fall back to CDI parsing"
exit 0
