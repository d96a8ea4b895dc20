"""The kubelet plugin's Fabric Manager flags: where libnvfm is and where FM listens (docs/passthrough.md "Fabric
Manager partitions"). Asked only with `--fabric-partitions on`."""

from __future__ import annotations

import argparse
from typing import Final

from dra_driver.commands.flags import Flag
from dra_driver.nvml.fabricmanager import DEFAULT_UNIX_SOCKET, FM_CMD_PORT, FabricManagerAddress

FABRIC_MANAGER_FLAGS: Final = (
    Flag("--fabric-manager-library", default="",
         help="libnvfm.so, the Fabric Manager SDK library, as this process sees it; empty: libnvfm.so.1 (then "
              "libnvfm.so) under --driver-root's library dirs, then the dynamic loader's search"),
    Flag("--fabric-manager-socket", default=DEFAULT_UNIX_SOCKET,
         help="Fabric Manager's command UNIX socket as this process sees it (FM_CMD_UNIX_SOCKET_PATH in its config)"),
    Flag("--fabric-manager-address", default="",
         help=f"Fabric Manager's TCP command address <ipv4>[:port] (port {FM_CMD_PORT} when left out), used instead "
              "of the socket when set (FM_CMD_BIND_INTERFACE and FM_CMD_PORT_NUMBER in its config)"),
)  # fmt: skip


def fabric_manager_from_args(args: argparse.Namespace) -> FabricManagerAddress | None:
    """Where to ask Fabric Manager; None with `--fabric-partitions off` (it is not asked). Raises ValueError naming
    the flag."""
    if args.fabric_partitions != "on":
        return None
    return FabricManagerAddress(
        library=args.fabric_manager_library,
        unix_socket=args.fabric_manager_socket,
        tcp=args.fabric_manager_address,
    )
