"""`dra-driver inventory`: print what this node has, without any cluster."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import yaml

from dra_driver.cliutil import apply_env_defaults
from dra_driver.inventory.discover import discover
from dra_driver.inventory.render import inventory_document
from dra_driver.nvml.types import NvmlError, NvmlUnavailableError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nvml",
        default="real",
        help="NVML backend: real | fake:<preset>[,state=PATH] | fake:<node.yaml> (presets: dgx-h100, dgx-a100, "
        "hgx-h200, a30x4, l4x2)",
    )
    parser.add_argument("--driver-root", default=None, help="host NVIDIA driver root as seen here (real NVML)")
    parser.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml", help="output format")
    apply_env_defaults(parser)


def run(args: argparse.Namespace) -> int:
    from dra_driver.nvml.factory import open_backend

    try:
        backend = open_backend(args.nvml, driver_root=args.driver_root)
    except ValueError as exc:
        print(f"dra-driver inventory: --nvml {args.nvml!r}: {exc}", file=sys.stderr)
        return 2
    try:
        backend.init()
    except NvmlUnavailableError as exc:
        print(f"dra-driver inventory: {exc}", file=sys.stderr)
        return 1
    try:
        document = inventory_document(discover(backend))
    except NvmlError as exc:
        print(f"dra-driver inventory: NVML failed while reading the node: {exc}", file=sys.stderr)
        return 1
    finally:
        backend.shutdown()
    sys.stdout.write(dump(document, args.output))
    return 0


def dump(document: Any, output: str) -> str:
    if output == "json":
        return json.dumps(document, indent=2, sort_keys=False) + "\n"
    return str(yaml.safe_dump(document, sort_keys=False, default_flow_style=False))
