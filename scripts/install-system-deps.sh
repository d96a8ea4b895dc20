#!/usr/bin/env bash
# Installs optional system tools used by the sandbox's container runtime:
#   podman        a real CDI consumer (reads /etc/cdi and /var/run/cdi)
#   runc          podman's default runtime crun refuses hosts with "hybrid" cgroups; runc works there
#   gcc, libc6-dev  build the static probe program that is the whole container rootfs, and the real node's pause
#                   image (docs/upstream.md "Real node")
#   busybox-static  the real node's workload image localhost/dra-sandbox/busybox:latest
#   containernetworking-plugins  the real node's CNI plugins (bridge, host-local, loopback in /usr/lib/cni)
# Idempotent; succeeds quietly when the tools are already there or cannot be installed
# (tests and the demo then fall back to "CDI checked, not executed" and say so).
set -u
missing=()
command -v podman >/dev/null 2>&1 || missing+=(podman)
command -v runc >/dev/null 2>&1 || missing+=(runc)
command -v gcc >/dev/null 2>&1 || missing+=(gcc)
# gcc -static needs the static C library (libc.a), which comes with libc6-dev.
if ! gcc -print-file-name=libc.a 2>/dev/null | grep -q '/'; then missing+=(libc6-dev); fi
[ -x /bin/busybox ] || [ -x /usr/bin/busybox ] || missing+=(busybox-static)
[ -x /usr/lib/cni/bridge ] || [ -x /opt/cni/bin/bridge ] || missing+=(containernetworking-plugins)
if [ "${#missing[@]}" -eq 0 ]; then exit 0; fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: missing ${missing[*]} (needs root + apt); container checks fall back to CDI parsing"
  exit 0
fi
echo "system-deps: installing ${missing[*]} (apt)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null 2>&1 || true
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
  || echo "system-deps: installing ${missing[*]} failed; container checks fall back to CDI parsing"
exit 0
