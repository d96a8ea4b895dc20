"""The device-plugin mode's settings (`--device-plugin`, commands/deviceplugin_flags.py): no gRPC here, so the
command line reads them without loading it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dra_driver.errors import DraDriverError

# Upstream's paths (deviceplugin/v1beta1 constants.go DevicePluginPath; the kubelet's pod-resources socket).
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
RESOURCE_NAME = "nvidia.com/gpu"


@dataclass(frozen=True)
class DevicePluginSettings:
    """`--device-plugin` and its paths (docs/device-plugin.md "Turning it on")."""

    directory: Path  # the kubelet's device-plugins dir (/var/lib/kubelet/device-plugins)
    pod_resources_socket: Path  # /var/lib/kubelet/pod-resources/kubelet.sock
    resource_name: str = RESOURCE_NAME
    socket_name: str = "gpu.dra.dev.sock"
    watch_interval: float = 1.0  # how often kubelet.sock and the plugin's socket are checked
    reconcile_interval: float = 5.0  # how often PodResources is asked which GPUs pods still hold
    # An allocation this young is kept although PodResources does not list it yet: the kubelet records it in the
    # pod's devices right after Allocate answers, in the same admission, so seconds are plenty.
    grace: float = 10.0

    def check(self) -> None:
        if "/" in self.socket_name or not self.socket_name.endswith(".sock"):
            raise DraDriverError(f"--device-plugin-socket {self.socket_name!r}: a file name ending in .sock")
        if len(str(self.directory / self.socket_name).encode()) >= 108:
            raise DraDriverError(f"--device-plugin-dir {self.directory}: the socket path passes the unix socket "
                                 "limit of 107 bytes; choose a shorter directory")  # fmt: skip
