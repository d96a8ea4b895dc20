"""The `--nvml` backend of `kubelet-plugin`, `compute-domain-kubelet-plugin` and `inventory`: one error path."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dra_driver.nvml.backend import NvmlBackend
    from dra_driver.nvml.fabricmanager import FabricManagerAddress


def nvml_from_args(
    args: argparse.Namespace, prog: str, *, fabric_manager: FabricManagerAddress | None = None
) -> NvmlBackend | None:
    """The backend `--nvml` names (not yet initialised), or None after telling stderr what is wrong with it.
    `fabric_manager`: where a real node's Fabric Manager is asked (the kubelet plugin's `--fabric-manager-*`)."""
    from dra_driver.nvml.factory import open_backend

    try:
        return open_backend(args.nvml, driver_root=args.driver_root, fabric_manager=fabric_manager)
    except ValueError as exc:
        print(f"{prog}: --nvml {args.nvml!r}: {exc}", file=sys.stderr)
        return None
