"""The kubelet plugin's `--device-plugin` flags: nvidia.com/gpu through the kubelet's device-plugin API beside DRA
(docs/device-plugin.md "Turning it on"; chart value `devicePlugin.enabled`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Final

from dra_driver.commands.flags import Flag
from dra_driver.deviceplugin.settings import (
    DEVICE_PLUGIN_DIR,
    POD_RESOURCES_SOCKET,
    RESOURCE_NAME,
    DevicePluginSettings,
)

DEVICE_PLUGIN_FLAGS: Final = (
    Flag("--device-plugin", choices=("on", "off"), default="off",
         help="also serve whole GPUs as an extended resource through the kubelet's device-plugin API v1beta1, for "
              "pods that ask for nvidia.com/gpu; a GPU is offered to one API at a time (docs/device-plugin.md)"),
    Flag("--device-plugin-dir", default=str(DEVICE_PLUGIN_DIR),
         help="the kubelet's device-plugins dir (its kubelet.sock, and the plugin's socket)"),
    Flag("--device-plugin-resource", default=RESOURCE_NAME, help="the extended resource served"),
    Flag("--pod-resources-socket", default=str(POD_RESOURCES_SOCKET),
         help="the kubelet's PodResources socket: which GPUs pods still hold"),
)


def device_plugin_from_args(args: argparse.Namespace) -> DevicePluginSettings | None:
    if args.device_plugin != "on":
        return None
    return DevicePluginSettings(directory=Path(args.device_plugin_dir),
                                pod_resources_socket=Path(args.pod_resources_socket),
                                resource_name=args.device_plugin_resource)  # fmt: skip
