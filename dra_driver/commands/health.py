"""`dra-driver health clear|taint|reset|show --node N [--device D]`: an admin's override of one device's health.

Writes the Node annotation `<driver>/device-health` that the node's kubelet plugin polls (docs/operations.md,
"Admin overrides"): `clear` removes the device's current taint once (`<device>=healthy@<token>`, a new token each
time), `taint` keeps a `<driver>/admin=unhealthy:NoSchedule` taint on it until `reset` or `clear`, `reset` removes
the device's entry, `show` prints the entries. Runs with the admin's kubeconfig: it needs `get` and `patch` on
nodes; the plugin itself only reads its Node.
"""

from __future__ import annotations

import argparse
import sys
import time

from dra_driver import defaults
from dra_driver.commands.flags import FlagParser, apply_env_defaults
from dra_driver.k8s.client import ApiError, KubeRest, connect
from dra_driver.k8s.kubeconfig import KubeconfigError
from dra_driver.plugin.health.healing import (
    OVERRIDE_HEALTHY,
    OVERRIDE_UNHEALTHY,
    annotation_key,
    format_overrides,
    parse_overrides,
)

ACTIONS = ("clear", "taint", "reset", "show")
CONFLICT_RETRIES = 5


def add_arguments(parser: FlagParser) -> None:
    parser.add_argument("action", choices=ACTIONS, help="clear | taint | reset a device's override, or show them")
    parser.add_argument("--node", required=True, help="the node")
    parser.add_argument("--device", default="", help="the device, as published (e.g. gpu-3, gpu-0-mig-1g10gb-19-0)")
    parser.add_argument("--driver-name", default=defaults.DRIVER_NAME, help="DRA driver name")
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig (default: in-cluster, then $KUBECONFIG)")
    apply_env_defaults(parser)


def updated(current: str, action: str, device: str, token: str) -> str:
    """The annotation after one action. Pure; bad entries already there are dropped."""
    entries, _ = parse_overrides(current)
    entries.pop(device, None)
    if action == "clear":
        entries[device] = f"{OVERRIDE_HEALTHY}@{token}"
    elif action == "taint":
        entries[device] = OVERRIDE_UNHEALTHY
    return format_overrides(entries)


def run(args: argparse.Namespace) -> int:
    if args.action != "show" and not args.device:
        print(f"dra-driver health {args.action}: --device is required", file=sys.stderr)
        return 2
    try:
        rest = connect(args.kubeconfig, component="health")
    except KubeconfigError as exc:
        print(f"dra-driver health: {exc}", file=sys.stderr)
        return 1
    return apply(rest, args.action, args.node, args.device, args.driver_name)


def apply(rest: KubeRest, action: str, node: str, device: str, driver_name: str) -> int:
    key = annotation_key(driver_name)
    for _ in range(CONFLICT_RETRIES):
        try:
            obj = rest.get(f"/api/v1/nodes/{node}")
        except ApiError as exc:
            print(f"dra-driver health: reading node {node} failed: {exc}", file=sys.stderr)
            return 1
        if obj is None:
            print(f"dra-driver health: node {node} not found", file=sys.stderr)
            return 1
        metadata = obj.get("metadata") or {}
        current = str((metadata.get("annotations") or {}).get(key) or "")
        if action == "show":
            print(f"{node} {key}: {current or '(none)'}")
            return 0
        value = updated(current, action, device, str(time.time_ns()))
        patch = {"metadata": {"resourceVersion": metadata.get("resourceVersion"), "annotations": {key: value or None}}}
        try:
            rest.request("PATCH", f"/api/v1/nodes/{node}", body=patch, content_type="application/merge-patch+json")
        except ApiError as exc:
            if exc.status == 409:
                continue  # someone else changed the Node: read it again
            print(f"dra-driver health: updating node {node} failed: {exc}", file=sys.stderr)
            return 1
        print(f"{node} {key}: {value or '(none)'} (the plugin applies it within --health-check-interval)")
        return 0
    print(f"dra-driver health: node {node} kept changing; try again", file=sys.stderr)
    return 1
