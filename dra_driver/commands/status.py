"""`dra-driver status [-o wide|json|yaml] [--node N]`: the fleet's GPUs as the API sees them.

Per node: each GPU's product, health and taints (the ResourceSlices' device taints), MIG devices in use, sharing
mode, and which claims and pods hold each device. Read-only, from the API alone (resourceslices, resourceclaims,
pods; `list`), so it works from any machine with a kubeconfig; the formatting is `statusview` (pure).
"""

from __future__ import annotations

import argparse
import sys

from dra_driver import defaults
from dra_driver.commands.flags import FlagParser, apply_env_defaults
from dra_driver.commands.statusview import OUTPUTS, build_status, render
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest, connect
from dra_driver.k8s.kubeconfig import KubeconfigError

SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
ALL_CLAIMS_PATH = "/apis/resource.k8s.io/v1/resourceclaims"
ALL_PODS_PATH = "/api/v1/pods"
PAGE = 500


def add_arguments(parser: FlagParser) -> None:
    parser.add_argument("-o", "--output", choices=OUTPUTS, default="", help="table (default), wide, json or yaml")
    parser.add_argument("--node", action="append", default=[], help="only these nodes (repeatable)")
    parser.add_argument("--driver-name", default=defaults.DRIVER_NAME, help="DRA driver name")
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig (default: in-cluster, then $KUBECONFIG)")
    apply_env_defaults(parser)


def list_all(rest: KubeRest, path: str, query: dict[str, str | int | bool] | None = None) -> list[JsonObject]:
    items: list[JsonObject] = []
    token = ""
    while True:
        page_query: dict[str, str | int | bool] = {**(query or {}), "limit": PAGE}
        if token:
            page_query["continue"] = token
        page = rest.request("GET", path, query=page_query)
        items.extend(i for i in page.get("items") or () if isinstance(i, dict))
        token = str((page.get("metadata") or {}).get("continue") or "")
        if not token:
            return items


def collect(rest: KubeRest, driver: str, nodes: list[str]) -> tuple[list[JsonObject], ...]:
    slices = list_all(rest, SLICES_PATH, {"fieldSelector": f"spec.driver={driver}"})
    claims = list_all(rest, ALL_CLAIMS_PATH)
    pod_query: dict[str, str | int | bool] = {"fieldSelector": f"spec.nodeName={nodes[0]}"} if len(nodes) == 1 else {}
    pods = list_all(rest, ALL_PODS_PATH, pod_query)
    return slices, claims, pods


def status_text(rest: KubeRest, *, driver: str, nodes: list[str], output: str) -> str:
    slices, claims, pods = collect(rest, driver, nodes)
    return render(build_status(slices, claims, pods, driver=driver, nodes=nodes), output, driver=driver)


def run(args: argparse.Namespace) -> int:
    try:
        text = status_text(connect(args.kubeconfig), driver=args.driver_name, nodes=args.node, output=args.output)
    except (ApiError, KubeconfigError) as exc:
        print(f"dra-driver status: {exc}", file=sys.stderr)
        return 1
    print(text)
    return 0
