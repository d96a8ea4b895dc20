"""`dra-driver inventory`: print what this node has, without any cluster."""

from __future__ import annotations

import argparse
import json
import socket
import sys
from typing import Any, Final

import yaml

from dra_driver import defaults
from dra_driver.commands.flags import Flag, FlagParser, add_flags
from dra_driver.commands.sharing_flags import SHARING_FLAGS, sharing_from_args
from dra_driver.inventory.catalog import MIG_MODE_HELP, MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.inventory.model import NodeInventory
from dra_driver.inventory.passthrough import (
    NO_PASSTHROUGH,
    PASSTHROUGH_HELP,
    PassthroughError,
    PassthroughSettings,
    passthrough_settings,
)
from dra_driver.inventory.render import inventory_document
from dra_driver.inventory.sharing import EXCLUSIVE, SharingSettings, SharingSettingsError, unknown_gpus_message
from dra_driver.inventory.vgpu import NO_VGPU, VGPU_HELP, VgpuSettings, vgpu_settings
from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.types import NvmlError, NvmlUnavailableError

FLAGS: Final = (
    Flag("--nvml", default="real",
         help="NVML backend: real | fake:<preset>[,state=PATH] | fake:<node.yaml> (presets: dgx-h100, dgx-a100, "
              "hgx-h200, a30x4, l4x2, gb200-nvl72)"),
    Flag("--driver-root", help="host NVIDIA driver root as seen here (real NVML)"),
    Flag("--output", choices=("yaml", "json"), default="yaml", short="-o", help="output format"),
    Flag("--slices", switch=True, help="print the ResourceSlices this node would publish instead"),
    Flag("--node-name", default=socket.gethostname(), help="node (and pool) name, with --slices"),
    Flag("--driver-name", default=defaults.DRIVER_NAME, help="DRA driver name, with --slices"),
    Flag("--mig-mode", choices=[p.value for p in MigOffering], default=MigOffering.DYNAMIC.value, help=MIG_MODE_HELP),
    *SHARING_FLAGS,
    Flag("--passthrough", default="none", help=PASSTHROUGH_HELP + "; with --slices"),
    Flag("--vgpu", default="none", help=VGPU_HELP + "; with --slices"),
    Flag("--kube-version", default="1.35", help="target API server version; decides the slice layout (1.34 or 1.35+)"),
)


def add_arguments(parser: FlagParser) -> None:
    add_flags(parser, FLAGS)


def run(args: argparse.Namespace) -> int:
    from dra_driver.commands.nvml_flags import nvml_from_args

    try:
        sharing = sharing_from_args(args)
        passthrough = passthrough_settings(args.passthrough)
        vgpu = vgpu_settings(args.vgpu)
    except (SharingSettingsError, PassthroughError) as exc:
        print(f"dra-driver inventory: {exc}", file=sys.stderr)
        return 2
    backend = nvml_from_args(args, "dra-driver inventory")
    if backend is None:
        return 2
    try:
        backend.init()
    except NvmlUnavailableError as exc:
        print(f"dra-driver inventory: {exc}", file=sys.stderr)
        return 1
    try:
        inventory = discover(backend)
        if inventory.clique.problem:
            # Shown, not fatal: the document below carries it too (`clique.problem`).
            print(f"dra-driver inventory: warning: {inventory.clique.problem}", file=sys.stderr)
        unknown = sharing.unknown_gpus(inventory)
        if unknown:
            print(f"dra-driver inventory: {unknown_gpus_message(unknown, inventory)}", file=sys.stderr)
            return 2
        if args.slices:
            document = slices_document(inventory, args, sharing, passthrough, vgpu)
        else:
            shared = catalog(inventory, MigOffering(args.mig_mode), sharing) if sharing.enabled else None
            document = inventory_document(inventory, shared)
            mps = mps_by_uuid(backend)
            for gpu in document["gpus"]:
                gpu.update(gpu_settings(backend, gpu["info"]["uuid"]))
                gpu["mps"] = mps.get(gpu["info"]["uuid"])
                for mig in gpu.get("migDevices") or ():
                    mig["mps"] = mps.get(mig.get("uuid", ""))
    except NvmlError as exc:
        print(f"dra-driver inventory: NVML failed while reading the node: {exc}", file=sys.stderr)
        return 1
    finally:
        backend.shutdown()
    sys.stdout.write(dump(document, args.output))
    return 0


def gpu_settings(backend: NvmlBackend, gpu_uuid: str) -> dict[str, str | None]:
    """The per-GPU settings sharing changes: `computeMode` (Default | ExclusiveProcess | …) and `timeSlice`
    (Default | Short | Medium | Long); null where the GPU cannot report it (e.g. NOT_SUPPORTED)."""
    out: dict[str, str | None] = {}
    try:
        out["computeMode"] = "".join(p.capitalize() for p in backend.compute_mode(gpu_uuid).name.split("_"))
    except NvmlError:
        out["computeMode"] = None
    try:
        out["timeSlice"] = backend.time_slice(gpu_uuid).label
    except NvmlError:
        out["timeSlice"] = None
    return out


def mps_by_uuid(backend: NvmlBackend) -> dict[str, dict[str, Any]]:
    """Device UUID -> the MPS control daemon serving it: its pipe directory, the limits every client gets
    (`activeThreadPercentage`, `pinnedMemoryLimit` in bytes; null: none) and, on shared GPUs, each share's own.
    Only the fake backend keeps a node-wide record of its daemons; on real GPUs `kubectl` and the plugin's
    checkpoint tell which claims use MPS (docs/sharing.md)."""
    from dra_driver.nvml.fake.backend import FakeNvml

    if not isinstance(backend, FakeNvml):
        return {}
    out: dict[str, dict[str, Any]] = {}
    for daemon in backend.mps_control().daemons():
        limits = dict(daemon.pinned_memory_limits)
        for uuid in daemon.visible_uuids:
            out[uuid] = {
                "daemon": daemon.id,
                "pipeDirectory": daemon.pipe_directory,
                "activeThreadPercentage": daemon.active_thread_percentage,
                "pinnedMemoryLimit": limits.get(uuid),
                "multiUser": daemon.multi_user,
                "shares": [
                    {
                        "shareID": share.share_id,
                        "claim": share.claim,
                        "activeThreadPercentage": share.active_thread_percentage,
                        "pinnedMemoryLimit": share.pinned_memory_limit,
                    }
                    for share in daemon.shares
                ],
            }
    return out


def slices_document(
    inventory: NodeInventory,
    args: argparse.Namespace,
    sharing: SharingSettings = EXCLUSIVE,
    passthrough: PassthroughSettings = NO_PASSTHROUGH,
    vgpu: VgpuSettings = NO_VGPU,
) -> dict[str, Any]:
    from dra_driver.slices.builder import SliceSettings, build_slices

    major, minor = (int(p) for p in args.kube_version.split(".")[:2])
    settings = SliceSettings(
        driver_name=args.driver_name, node_name=args.node_name, kube_version=(major, minor), sharing=sharing,
        passthrough=passthrough, vgpu=vgpu,
    )
    devices = catalog(inventory, MigOffering(args.mig_mode), sharing, passthrough, vgpu)
    items = build_slices(inventory.system, devices, settings, generation=1)
    return {"apiVersion": "v1", "kind": "List", "items": items}


def dump(document: Any, output: str) -> str:
    if output == "json":
        return json.dumps(document, indent=2, sort_keys=False) + "\n"
    if document.get("kind") == "List":
        # One YAML document per object: what `kubectl apply -f` expects from a file of manifests.
        return str(yaml.safe_dump_all(document["items"], sort_keys=False, default_flow_style=False))
    return str(yaml.safe_dump(document, sort_keys=False, default_flow_style=False))
