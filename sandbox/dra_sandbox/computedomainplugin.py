"""A node's compute-domain kubelet plugin in the sandbox: `dra-driver compute-domain-kubelet-plugin` in its own
process beside the node's GPU plugin (as the chart's DaemonSet runs both containers), on the same fake NVML node
(state file and seed), registering in the same kubelet registry dir under its own driver name.

On by default for nodes whose fake NVML is a `gb200-nvl72` one (NodeSpec.compute_domains None), or where a node
spec asks for it. Its state (plugin dir: sockets, checkpoint, the daemons' `domains/<uid>/` dirs and the fake
`proc` tree) is under `<node>/plugins/compute-domain.gpu.dra.dev`; its log is `<node>/compute-domain-plugin.log`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from dra_driver.computedomain.names import DRIVER_NAME
from dra_driver.kubeletplugin.server import SocketPaths
from dra_sandbox.children import kill, terminate
from dra_sandbox.polling import socket_accepts, wait_for

COMPUTE_DOMAIN_PRESETS = ("gb200-nvl72",)
COMPUTE_DOMAIN_NAMESPACE = "dra-driver"  # the release namespace: daemons, their templates, the cliques


# What this module reads of the cluster's node spec and GPU plugin (cluster.NodeSpec, cluster.PluginProcess),
# as protocols: the cluster imports this module, so this one does not import the cluster (no import circle).
class Node(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def nvml(self) -> str: ...
    @property
    def compute_domains(self) -> bool | None: ...


class GpuPlugin(Protocol):
    @property
    def node(self) -> Node: ...
    @property
    def dir(self) -> Path: ...
    @property
    def plugins_dir(self) -> Path: ...
    @property
    def registry_dir(self) -> Path: ...
    @property
    def boot_id_file(self) -> Path: ...
    @property
    def nvml_spec(self) -> str: ...


def wants_compute_domains(node: Node) -> bool:
    if node.compute_domains is not None:
        return node.compute_domains
    spec = node.nvml.removeprefix("fake:").split(",", 1)[0]
    return spec in COMPUTE_DOMAIN_PRESETS


class CdPluginProcess:
    """One node's `dra-driver compute-domain-kubelet-plugin` process."""

    def __init__(self, gpu_plugin: GpuPlugin, *, kubeconfig: Path, cdi_root: Path,
                 env: Mapping[str, str] | None = None) -> None:
        self.gpu_plugin = gpu_plugin
        self.node = gpu_plugin.node
        self.plugin_dir = gpu_plugin.plugins_dir / DRIVER_NAME
        self.registry_dir = gpu_plugin.registry_dir
        self.log_file = gpu_plugin.dir / "compute-domain-plugin.log"
        self.sockets = SocketPaths.for_instance(self.registry_dir, self.plugin_dir, DRIVER_NAME, None)
        self._kubeconfig = kubeconfig
        self._cdi_root = cdi_root
        self._extra = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DRA_DRIVER_")}
        env.update({
            "DRA_DRIVER_NODE_NAME": self.node.name,
            "DRA_DRIVER_KUBECONFIG": str(self._kubeconfig),
            "DRA_DRIVER_PLUGIN_DIR": str(self.plugin_dir),
            "DRA_DRIVER_REGISTRY_DIR": str(self.registry_dir),
            "DRA_DRIVER_CDI_ROOT": str(self._cdi_root),
            "DRA_DRIVER_NVML": self.gpu_plugin.nvml_spec,
            "DRA_DRIVER_BOOT_ID_PATH": str(self.gpu_plugin.boot_id_file),
            "DRA_DRIVER_LOG_FORMAT": "text",
            "DRA_DRIVER_CLEANUP_INTERVAL": "5",
            "DRA_DRIVER_READINESS_WAIT": "2",
            # Every node's plugin is a process on this one host: fixed ports would collide (the chart sets them).
            "DRA_DRIVER_HEALTHZ_PORT": "-1",
            "DRA_DRIVER_METRICS_PORT": "-1",
            # The release namespace, as the chart passes the pod's: where the sandbox's controller makes the
            # daemons and their claim template (the only namespace whose daemon claims the plugin prepares) and
            # where the daemons keep the ComputeDomainCliques.
            "DRA_DRIVER_DRIVER_NAMESPACE": COMPUTE_DOMAIN_NAMESPACE,
            **self._extra,
            **(extra or {}),
        })
        return env

    def start(self, extra_env: Mapping[str, str] | None = None) -> None:
        self.gpu_plugin.dir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "dra_driver.cli", "compute-domain-kubelet-plugin"]
        with open(self.log_file, "ab") as out:
            self.process = subprocess.Popen(argv, env=self.env(extra_env), stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, process_group=0)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_serving(self, timeout: float = 30.0) -> None:
        def up() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"compute-domain plugin of {self.node.name} exited {self.process.returncode}; "
                                   f"see {self.log_file}")
            return socket_accepts(self.sockets.registration) and socket_accepts(self.sockets.dra)

        wait_for(up, timeout, f"the compute-domain plugin of {self.node.name} to serve")

    def stop(self, timeout: float = 20.0) -> int | None:
        return terminate(self.process, timeout)

    def kill(self) -> None:
        kill(self.process)

    def restart(self, extra_env: Mapping[str, str] | None = None) -> None:
        self.kill()
        self.start(extra_env)
        self.wait_serving()
