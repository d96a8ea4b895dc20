"""`dra-driver explain`: why a ResourceClaim can (or cannot) be allocated, node by node.

Reads the claim, DeviceClasses, ResourceSlices, Nodes and allocated claims from the cluster and runs the same pure
allocator the sandbox scheduler uses, printing its explanation. Read-only: nothing is written.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Sequence

from dra_driver.commands.flags import FlagParser, apply_env_defaults
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest, connect
from dra_driver.k8s.kubeconfig import KubeconfigError

RESOURCE = "/apis/resource.k8s.io/v1"


def add_arguments(parser: FlagParser) -> None:
    parser.add_argument("claim", help="the ResourceClaim, as NAME or NAMESPACE/NAME")
    parser.add_argument("-n", "--namespace", default="default", help="namespace when CLAIM has none")
    parser.add_argument("--node", action="append", default=[], help="only these nodes (repeatable)")
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig (default: in-cluster, then $KUBECONFIG)")
    apply_env_defaults(parser)


def explain_claim(
    claim: JsonObject,
    *,
    nodes: Sequence[JsonObject],
    classes: Sequence[JsonObject],
    slices: Sequence[JsonObject],
    claims: Sequence[JsonObject],
    namespace_labels: dict[str, str],
) -> tuple[list[str], str]:
    """(nodes the claim fits on, the text to print). Pure."""
    from dra_driver.allocation import SliceIndex, allocate, explain_text
    from dra_driver.cel.environment import DraCelEnvironment

    cel = DraCelEnvironment()
    index = SliceIndex(slices)  # each slice parsed once, and only for the nodes asked about
    allocated = [c for c in claims if (c.get("status") or {}).get("allocation")]
    fits, sections = [], []
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        outcome = allocate(
            claim,
            node=node,
            classes=classes,
            slices=index,
            allocated_claims=allocated,
            namespace_labels=namespace_labels,
            cel=cel,
        )
        if outcome.ok:
            fits.append(node["metadata"]["name"])
        sections.append(explain_text(outcome))
    header = _current_state(claim)
    summary = f"fits on: {', '.join(fits)}" if fits else "fits on no node"
    return fits, "\n\n".join([header, summary, *sections])


def _current_state(claim: JsonObject) -> str:
    meta = claim["metadata"]
    status = claim.get("status") or {}
    name = f"{meta.get('namespace')}/{meta.get('name')}"
    allocation = status.get("allocation")
    if not allocation:
        return f"claim {name}: not allocated"
    devices = ", ".join(
        f"{r['driver']}/{r['pool']}/{r['device']}" for r in (allocation.get("devices") or {}).get("results") or []
    )
    users = ", ".join(r.get("name", "?") for r in status.get("reservedFor") or []) or "nobody"
    return f"claim {name}: allocated to {devices}; reserved for {users} (below: what a new allocation would find)"


def run(args: argparse.Namespace) -> int:
    namespace, _, name = args.claim.rpartition("/")
    namespace = namespace or args.namespace
    try:
        rest = connect(args.kubeconfig)
    except KubeconfigError as exc:
        print(f"dra-driver explain: {exc}", file=sys.stderr)
        return 1
    try:
        claim = rest.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}")
        if claim is None:
            print(f"dra-driver explain: ResourceClaim {namespace}/{name} not found", file=sys.stderr)
            return 1
        nodes = _items(rest, "/api/v1/nodes")
        if args.node:
            nodes = [n for n in nodes if n["metadata"]["name"] in args.node]
        ns = rest.get(f"/api/v1/namespaces/{namespace}") or {}
        classes = _items(rest, f"{RESOURCE}/deviceclasses")
        slices = _items(rest, f"{RESOURCE}/resourceslices")
        claims = _items(rest, f"{RESOURCE}/resourceclaims")
        # One short pass that allocates many small, long-lived objects over a large heap (the cluster's slices):
        # the cyclic collector would rescan that heap again and again for nothing (2-3x the pass at 1000 nodes).
        collecting = gc.isenabled()
        gc.disable()
        try:
            fits, text = explain_claim(
                claim,
                nodes=nodes,
                classes=classes,
                slices=slices,
                claims=claims,
                namespace_labels=(ns.get("metadata") or {}).get("labels") or {},
            )
        finally:
            if collecting:
                gc.enable()
    except ApiError as exc:
        print(f"dra-driver explain: API request failed: {exc}", file=sys.stderr)
        return 1
    print(text)
    return 0 if fits else 2


def _items(rest: KubeRest, path: str) -> list[JsonObject]:
    return list(rest.request("GET", path).get("items") or [])
