"""The real node's KubeletConfiguration (kubelet.config.k8s.io/v1beta1) and command line (docs/upstream.md
"Real node").

What these machines need (cgroup v1 controllers with the unified hierarchy beside them, PID 1 not systemd):
`failCgroupV1: false` (kubelets >= 1.35 refuse cgroup v1 otherwise, KEP-5573; the field exists since 1.31),
`cgroupDriver: cgroupfs` (containerd's runc runs with `SystemdCgroup = false`) and `failSwapOn: false`.

Everything the kubelet would put at a machine-wide default path is moved under the node's own dirs or its own
names, so two sandboxes on one machine do not share it: the root dir (`--root-dir`: pods, plugin registry,
checkpoints), pod logs (`podLogsDir`), the flexvolume dir, the cgroup root (`cgroupRoot`: the pods' cgroups are
`<cgroupRoot>/kubepods/...`, and a kubelet removes pod cgroups it does not know there), and the addresses
(`address`, `healthzBindAddress` on the node's own loopback address). One path stays machine-wide: the kubelet links
each container's log into /var/log/containers (a constant in the kubelet) and removes the link with the container.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KUBELET_PORT = 10250
HEALTHZ_PORT = 10248


@dataclass(frozen=True)
class KubeletSettings:
    node_name: str
    node_ip: str
    root_dir: Path
    config_file: Path
    kubeconfig: Path
    client_ca: Path
    serving_cert: Path
    serving_key: Path
    runtime_endpoint: str  # unix://<containerd socket>
    pod_logs_dir: Path
    volume_plugin_dir: Path
    cgroup_root: str  # "/dra-sandbox-..."
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    verbosity: int = 2


def kubelet_configuration(s: KubeletSettings) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": s.node_ip,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": s.node_ip,
        "healthzPort": HEALTHZ_PORT,
        "tlsCertFile": str(s.serving_cert),
        "tlsPrivateKeyFile": str(s.serving_key),
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(s.client_ca)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": s.runtime_endpoint,
        "imageServiceEndpoint": s.runtime_endpoint,
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": True,
        "cgroupRoot": s.cgroup_root,
        "enforceNodeAllocatable": ["pods"],
        "failSwapOn": False,
        "podLogsDir": str(s.pod_logs_dir),
        "volumePluginDir": str(s.volume_plugin_dir),
        "featureGates": dict(s.feature_gates),
        "clusterDomain": "cluster.local",
        "maxPods": 30,
        # A sandbox's disk and memory are what the machine has left: eviction only when it is nearly out, and no
        # image garbage collection (the node's images were imported here and cannot be pulled back).
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "shutdownGracePeriod": "0s",
        # Pods' status and a registered plugin reach the API sooner than with the defaults (1 m).
        "syncFrequency": "10s",
        "nodeStatusUpdateFrequency": "5s",
        "runtimeRequestTimeout": "2m",
    }


def kubelet_argv(binary: Path, s: KubeletSettings) -> list[str]:
    argv = [
        str(binary),
        f"--config={s.config_file}",
        f"--kubeconfig={s.kubeconfig}",
        f"--root-dir={s.root_dir}",
        f"--hostname-override={s.node_name}",
        f"--node-ip={s.node_ip}",
        f"--v={s.verbosity}",
    ]
    if s.labels:
        argv.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())))
    return argv


def registration_dir(root_dir: Path) -> Path:
    """Where the kubelet's plugin watcher looks for registration sockets (`<root-dir>/plugins_registry`)."""
    return root_dir / "plugins_registry"


def plugins_dir(root_dir: Path, driver: str) -> Path:
    """Where a DRA driver's kubelet plugin serves (`<root-dir>/plugins/<driver>`), as the chart mounts it."""
    return root_dir / "plugins" / driver

