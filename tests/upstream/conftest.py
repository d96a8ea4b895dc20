"""What the upstream suites share: the pinned release's binaries (or a SKIP the suite's banner repeats) and the
driver's kubelet plugin started as the chart's DaemonSet would start it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dra_sandbox.upstream.build import DEFAULT_MINOR, RELEASES, ReleaseBinaries, UpstreamUnavailable, find_release
from dra_sandbox.upstream.controlplane import ControlPlane
from dra_sandbox.upstream.install import plugin_kubeconfig
from dra_sandbox.upstream.node import unavailable_reason
from tests.conftest import UPSTREAM_SKIP_PREFIX

MINOR = os.environ.get("DRA_UPSTREAM_K8S", DEFAULT_MINOR)
DRIVER = "gpu.dra.dev"


def release_binaries(*, real_node: bool = False) -> ReleaseBinaries:
    """The binaries of release MINOR from the cache `make upstream` fills; SKIPs with UPSTREAM_SKIP_PREFIX where they
    are not built or cannot be (no Go), and with `real_node` also where this machine cannot run a real node."""
    if MINOR not in RELEASES:
        pytest.fail(f"DRA_UPSTREAM_K8S={MINOR}: pinned releases are {', '.join(RELEASES)}")
    try:
        found = find_release(MINOR)
    except UpstreamUnavailable as exc:
        pytest.skip(f"{UPSTREAM_SKIP_PREFIX} {exc}")
    if found is None:
        from dra_sandbox.upstream.build import _go  # the same check the build makes

        try:
            _go()
        except UpstreamUnavailable as exc:
            pytest.skip(f"{UPSTREAM_SKIP_PREFIX} {exc}")
        pytest.skip(f"{UPSTREAM_SKIP_PREFIX} Kubernetes {MINOR} is not built here: run `make upstream K8S={MINOR}` "
                    "(make test does)")
    if real_node:
        reason = unavailable_reason()
        if reason is not None:
            pytest.skip(f"{UPSTREAM_SKIP_PREFIX} no real node here: {reason}")
    return found


def start_plugin(plane: ControlPlane, node: str, work: Path, nvml_profile: str,
                 flags: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`dra-driver kubelet-plugin` with its defaults for `node` on fake GPUs of `nvml_profile` (e.g. "l4x2"), its
    state and log (plugin.log) under `work`, and `flags` as DRA_DRIVER_* settings (e.g.
    {"DRA_DRIVER_MIG_MODE": "none"}); the caller stops it."""
    kubeconfig = plugin_kubeconfig(plane, node, work / "plugin.kubeconfig")
    (work / "nvml").mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRA_DRIVER_")}
    env.update({
        "DRA_DRIVER_NODE_NAME": node, "DRA_DRIVER_DRIVER_NAME": DRIVER, "DRA_DRIVER_KUBECONFIG": str(kubeconfig),
        "DRA_DRIVER_PLUGIN_DIR": str(work / "plugins" / DRIVER), "DRA_DRIVER_REGISTRY_DIR": str(work / "registry"),
        "DRA_DRIVER_CDI_ROOT": str(work / "cdi"),
        "DRA_DRIVER_NVML": f"fake:{nvml_profile},state={work / 'nvml' / 'state.json'},seed={node}",
        "DRA_DRIVER_HEALTHZ_PORT": "-1", "DRA_DRIVER_METRICS_PORT": "-1",
        "DRA_DRIVER_BOOT_ID_PATH": str(work / "boot_id"), "DRA_DRIVER_LOG_FORMAT": "text",
        **(flags or {}),
    })
    log = open(work / "plugin.log", "wb")  # noqa: SIM115 (the child keeps it)
    return subprocess.Popen([sys.executable, "-m", "dra_driver.cli", "kubelet-plugin"], env=env, stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
