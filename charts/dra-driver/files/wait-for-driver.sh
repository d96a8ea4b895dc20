#!/bin/sh
# Init container of the dra-driver kubelet plugin (nvml: real): wait until the NVIDIA driver is usable
# under the driver root, and while it is not, say exactly what was checked and how to fix it.
#   ready = libnvidia-ml.so.1 under the driver root (where the plugin loads NVML from)
#           and the /dev/nvidiactl character device (the kernel module is loaded)
# Environment (set by the chart):
#   DRIVER_ROOT            the driver root as this container sees it        (default /driver-root)
#   HOST_DRIVER_ROOT       the same directory on the node (chart value driverRoot) (default /)
#   DEV_ROOT               the node's /dev as this container sees it        (default /dev)
#   WAIT_INTERVAL_SECONDS  seconds between checks                           (default 5)
#   HINT_EVERY_SECONDS     repeat the full hints this often                 (default 60)
#   WAIT_TIMEOUT_SECONDS   give up (exit 1) after this long; 0 waits forever (default 0)
#   CHECK_ONCE             1: check once, print the hints, exit 0/1 (for debugging on a node)
set -u

DRIVER_ROOT="${DRIVER_ROOT:-/driver-root}"
HOST_DRIVER_ROOT="${HOST_DRIVER_ROOT:-/}"
DEV_ROOT="${DEV_ROOT:-/dev}"
INTERVAL="${WAIT_INTERVAL_SECONDS:-5}"
HINT_EVERY="${HINT_EVERY_SECONDS:-60}"
TIMEOUT="${WAIT_TIMEOUT_SECONDS:-0}"
CHECK_ONCE="${CHECK_ONCE:-0}"

for setting in "WAIT_INTERVAL_SECONDS=$INTERVAL" "HINT_EVERY_SECONDS=$HINT_EVERY" "WAIT_TIMEOUT_SECONDS=$TIMEOUT"; do
  case "${setting#*=}" in
    ''|*[!0-9]*) printf 'wait-for-driver: %s is not a whole number of seconds\n' "$setting" >&2; exit 2 ;;
  esac
done
if [ "$INTERVAL" -lt 1 ]; then INTERVAL=1; fi

# Same order as the plugin's loader (dra_driver/nvml/real/loader.py).
LIB_DIRS="usr/lib64 usr/lib/x86_64-linux-gnu usr/lib/aarch64-linux-gnu lib64 lib/x86_64-linux-gnu lib/aarch64-linux-gnu usr/lib lib"

say() { printf 'wait-for-driver: %s\n' "$*"; }

# Prints the library path when found; otherwise returns 1 and leaves a reason in $lib_problem.
find_nvml() {
  lib_problem="not found"
  for dir in $LIB_DIRS; do
    candidate="$DRIVER_ROOT/$dir/libnvidia-ml.so.1"
    if [ -f "$candidate" ]; then
      printf '%s\n' "$candidate"
      return 0
    fi
    if [ -L "$candidate" ]; then
      # A symlink whose target does not resolve inside this container, e.g. an absolute link that only
      # makes sense on the host.
      lib_problem="$candidate is a dangling symlink (-> $(readlink "$candidate"))"
    fi
  done
  return 1
}

find_ctl() {
  for candidate in "$DEV_ROOT/nvidiactl" "$DRIVER_ROOT/dev/nvidiactl"; do
    if [ -c "$candidate" ]; then
      printf '%s\n' "$candidate"
      return 0
    fi
  done
  return 1
}

hints() {
  say "NVIDIA driver not ready on this node after ${waited}s."
  if [ -n "$missing_lib" ]; then
    say "  MISSING libnvidia-ml.so.1 ($lib_problem) under $DRIVER_ROOT (= $HOST_DRIVER_ROOT on the node); looked in:"
    for dir in $LIB_DIRS; do say "      $DRIVER_ROOT/$dir/"; done
  fi
  if [ -n "$missing_ctl" ]; then
    say "  MISSING character device nvidiactl; looked at $DEV_ROOT/nvidiactl (the node's /dev) and $DRIVER_ROOT/dev/nvidiactl"
  fi
  say "How to fix:"
  say "  - The chart value driverRoot is '$HOST_DRIVER_ROOT'. It must be where the driver files are ON THE NODE:"
  say "      driver installed by the NVIDIA GPU Operator:  helm upgrade ... --set driverRoot=/run/nvidia/driver"
  say "        (then wait for the operator's nvidia-driver-daemonset pod on this node to become Ready)"
  say "      driver installed on the host (package manager or .run installer):  --set driverRoot=/"
  say "  - Check on the node: find <driverRoot> -name libnvidia-ml.so.1; <driverRoot>/usr/bin/nvidia-smi must work."
  if [ -n "$missing_ctl" ]; then
    say "  - No /dev/nvidiactl: the nvidia kernel module is not loaded. Load it (modprobe nvidia, or nvidia-smi once as"
    say "    root), or wait for the GPU Operator's driver pod; a node without NVIDIA GPUs should not run this pod:"
    say "    check the chart values affinity/nodeSelector."
  fi
  say "  - Testing without GPUs? Install with --set nvml=fake:dgx-h100 (simulated GPUs; this check is skipped)."
  if [ "$CHECK_ONCE" != "1" ]; then say "Checking again every ${INTERVAL}s."; fi
}

waited=0
last_hint=-1
while :; do
  lib="$(find_nvml)" && missing_lib="" || missing_lib=1
  ctl="$(find_ctl)" && missing_ctl="" || missing_ctl=1
  if [ -z "$missing_lib" ] && [ -z "$missing_ctl" ]; then
    say "NVIDIA driver ready: $lib and $ctl"
    exit 0
  fi
  if [ "$last_hint" -lt 0 ] || [ $((waited - last_hint)) -ge "$HINT_EVERY" ]; then
    # find_nvml ran in a subshell above; run it again here so that lib_problem is set in this shell.
    find_nvml >/dev/null || true
    hints
    last_hint=$waited
  fi
  if [ "$CHECK_ONCE" = "1" ]; then
    exit 1
  fi
  if [ "$TIMEOUT" -gt 0 ] && [ "$waited" -ge "$TIMEOUT" ]; then
    say "giving up after ${waited}s (WAIT_TIMEOUT_SECONDS=$TIMEOUT)"
    exit 1
  fi
  sleep "$INTERVAL"
  waited=$((waited + INTERVAL))
done
