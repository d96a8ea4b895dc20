"""`dra-driver explain`: why a ResourceClaim can (or cannot) be allocated, node by node.

Reads the claim, DeviceClasses, ResourceSlices, Nodes and allocated claims from the cluster and runs the same pure
allocator the sandbox scheduler uses, printing its explanation. Read-only: nothing is written. Where a claim does not
fit on a node whose GPUs the device plugin holds (`--device-plugin`: left out of the slices, named in their
annotation, deviceplugin/published.py), the node's section names them and their pods.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import msgspec

from dra_driver.commands.flags import Flag, FlagParser, add_flags
from dra_driver.commands.listing import field_value, list_all, pool_name
from dra_driver.deviceplugin.published import ANNOTATION, HeldGpu, held_in_slices, held_text
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest, connect
from dra_driver.k8s.kubeconfig import KubeconfigError
from dra_driver.k8s.liststream import Item, PageStream, stream_encoded, stream_pages
from dra_driver.k8s.sliceproto import NotProtobuf, resource_slice

if TYPE_CHECKING:
    from dra_driver.allocation.prune import ClaimReach, PoolSieve, Pruned
    from dra_driver.cel.environment import DraCelEnvironment

RESOURCE = "/apis/resource.k8s.io/v1"
_ANY: msgspec.json.Decoder[Any] = msgspec.json.Decoder()




def parse_feature_gates(text: str) -> dict[str, bool]:
    """`A=true,B=false` -> {"A": True, "B": False}; argparse shows the ValueError as the flag's error."""
    gates: dict[str, bool] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name or value.lower() not in ("true", "false"):
            raise argparse.ArgumentTypeError(f"{item!r}: write NAME=true or NAME=false, e.g. DRADerivedAttributes=true")
        gates[name] = value.lower() == "true"
    return gates


FLAGS: Final = (
    Flag("claim", help="the ResourceClaim, as NAME or NAMESPACE/NAME"),
    Flag("--namespace", short="-n", default="default", help="namespace when CLAIM has none"),
    Flag("--node", repeatable=True, help="only these nodes (repeatable)"),
    Flag("--kubeconfig", help="kubeconfig (default: in-cluster, then $KUBECONFIG)"),
    Flag("--all-devices", switch=True,
         help="parse and account for every device, also those of pools no request's selectors can match "
              "(by default such pools are left out before parsing: the verdicts are the same)"),
    # Pages by default: kube-apiserver 1.37 spends about twice the CPU on a watch-list of a fleet's slices as on
    # the paged LIST of the same (5.2-5.6 s against 2.1-3.0 s at 1,000 nodes; docs/benchmarks.md "Fleet on
    # kube-apiserver 1.37"), and on a busy control plane that CPU is most of explain's wall time.
    Flag("--watch-list", switch=True,
         help="read the slices as one KEP-3157 watch-list (sendInitialEvents; the paged LIST where the API server "
              "refuses it) instead of the paged LIST: one request, but more of the API server's CPU"),
    Flag("--no-watch-list", negates="--watch-list", help="read the slices as a paged LIST (the default)"),
    # Protobuf by default: kube-apiserver encodes a fleet's slices in protobuf for half the CPU of JSON (1.1-1.3 s
    # against 2.3-2.6 s at 1,000 nodes; docs/benchmarks.md "Fleet on kube-apiserver 1.37").
    Flag("--no-protobuf", switch=True,
         help="ask for the slices' paged LIST in JSON only, not kube-apiserver's protobuf first (a server without "
              "protobuf answers JSON either way; --watch-list and --all-devices read JSON)"),
    Flag("--feature-gates", type=parse_feature_gates,
         help="kube-scheduler's gates the allocation follows, as NAME=true|false,...: e.g. "
              "DRADerivedAttributes=false to see what a scheduler without KEP-6080 says (default: the release's "
              "defaults, DRADerivedAttributes on for a claim that carries derived attributes and "
              "DRADeviceCompatibilityGroups on where slices carry compatibility groups: the API server drops those "
              "fields unless its gate is on)"),
)


def add_arguments(parser: FlagParser) -> None:
    add_flags(parser, FLAGS)


def claim_gates(
    claim: JsonObject, given: dict[str, bool] | None, slices: Sequence[JsonObject] = ()
) -> dict[str, bool]:
    """The gates `explain` allocates with: a claim that carries KEP-6080 derived attributes was kept by an API server
    with DRADerivedAttributes on, and slices that carry KEP-5963 compatibility groups by one with
    DRADeviceCompatibilityGroups on, so the scheduler beside it is taken to have them too, unless `given` says
    otherwise."""
    grouped = any(
        consumption.get("compatibilityGroups")
        for raw in slices
        for device in (raw.get("spec") or {}).get("devices") or []
        for consumption in device.get("consumesCounters") or []
    )
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    derived = any(
        (r.get("exactly") or {}).get("derivedAttributes")
        or any(s.get("derivedAttributes") for s in r.get("firstAvailable") or [] if isinstance(s, dict))
        for r in requests
        if isinstance(r, dict)
    )
    return {"DRADerivedAttributes": derived, "DRADeviceCompatibilityGroups": grouped, **(given or {})}


def explain_claim(
    claim: JsonObject,
    *,
    nodes: Sequence[JsonObject],
    classes: Sequence[JsonObject],
    slices: Sequence[JsonObject],
    claims: Sequence[JsonObject],
    namespace_labels: dict[str, str],
    prune: bool = True,
    pruned_before: Pruned | None = None,
    cel: DraCelEnvironment | None = None,
    feature_gates: dict[str, bool] | None = None,
    device_plugin: Mapping[str, Sequence[HeldGpu]] | None = None,
) -> tuple[list[str], str]:
    """(nodes the claim fits on, the text to print). Pure. `device_plugin`: node -> the GPUs the device plugin holds
    there, named in the section of each node the claim does not fit on.

    `prune`: leave out, before parsing them, the pools no request's selectors can match (`allocation.prune`):
    the verdicts are those of the full pass, the per-node accounting of rejected devices leaves those pools out
    and the header says how much was left out. `pruned_before`: what the caller's own PoolSieve left out (slices
    sieved as they were listed)."""
    from dra_driver.allocation import SliceIndex, allocate, explain_text
    from dra_driver.allocation.prune import PoolSieve, Pruned, claim_reach
    from dra_driver.cel.environment import DraCelEnvironment

    cel = cel if cel is not None else DraCelEnvironment()
    pruned = pruned_before or Pruned()
    if prune:
        sieve = PoolSieve(claim_reach(claim, classes, cel=cel))
        for raw in slices:
            sieve.add(raw)
        kept, left = sieve.result()
        slices, pruned = kept, pruned + left
    index = SliceIndex(slices)  # each slice parsed once, and only for the nodes asked about
    allocated = [c for c in claims if (c.get("status") or {}).get("allocation")]
    fits, sections = [], []
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        short = pruned.short_nodes.get(node["metadata"]["name"])
        outside = _outside_dra((device_plugin or {}).get(node["metadata"]["name"], ()))
        if short is not None:
            sections.append(f"claim {_claim_name(claim)} cannot be allocated on node {node['metadata']['name']}: "
                            f"{short}{outside}")
            continue
        outcome = allocate(
            claim,
            node=node,
            classes=classes,
            slices=index,
            allocated_claims=allocated,
            namespace_labels=namespace_labels,
            cel=cel,
            feature_gates=feature_gates,
        )
        if outcome.ok:
            fits.append(node["metadata"]["name"])
        sections.append(explain_text(outcome) + ("" if outcome.ok else outside))
    header = _current_state(claim)
    summary = f"fits on: {', '.join(fits)}" if fits else "fits on no node"
    if pruned.pools:
        summary += (
            f"\nnot looked at: {pruned.devices} devices in {pruned.slices} slices of {pruned.pools} pools, where no "
            "device can satisfy any request's selectors (left out of the per-node counts below; --all-devices "
            "accounts for them)"
        )
    if pruned.short_nodes:
        summary += (
            f"\nnot parsed: {pruned.short_devices} devices in {pruned.short_slices} slices of {pruned.short_pools} "
            f"pools on {len(pruned.short_nodes)} nodes where a request's selectors accept fewer devices than it asks "
            "for (counted before parsing; each such node's section says which; --all-devices accounts for every "
            "device)"
        )
    return fits, "\n\n".join([header, summary, *sections])


def _outside_dra(held: Sequence[HeldGpu]) -> str:
    """The lines that name the GPUs a node's slices leave out because the device plugin holds them."""
    if not held:
        return ""
    lines = [f"  {held_text(g)}" for g in held]
    return ("\nleft out of the ResourceSlices (allocated as nvidia.com/gpu through the kubelet's device plugin; each "
            "returns to DRA when its pod ends):\n" + "\n".join(lines))  # fmt: skip


def _claim_name(claim: JsonObject) -> str:
    meta = claim["metadata"]
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _current_state(claim: JsonObject) -> str:
    status = claim.get("status") or {}
    name = _claim_name(claim)
    allocation = status.get("allocation")
    if not allocation:
        return f"claim {name}: not allocated"
    devices = ", ".join(
        f"{r['driver']}/{r['pool']}/{r['device']}" for r in (allocation.get("devices") or {}).get("results") or []
    )
    users = ", ".join(_consumer(r) for r in status.get("reservedFor") or []) or "nobody"
    return f"claim {name}: allocated to {devices}; reserved for {users} (below: what a new allocation would find)"


def _consumer(reference: JsonObject) -> str:
    """A pod by its name; any other consumer as `<resource>/<name>`, e.g. `podgroups/trainers` for a claim a KEP-5729
    PodGroup's pods share."""
    name = str(reference.get("name", "?"))
    resource = reference.get("resource") or "pods"
    return name if resource == "pods" else f"{resource}/{name}"


def run(args: argparse.Namespace) -> int:
    namespace, _, name = args.claim.rpartition("/")
    namespace = namespace or args.namespace
    try:
        rest = connect(args.kubeconfig, component="explain")
    except KubeconfigError as exc:
        print(f"dra-driver explain: {exc}", file=sys.stderr)
        return 1
    # One short command that decodes and then parses many small, long-lived objects (the cluster's slices): the
    # cyclic collector would rescan that ever larger heap again and again for nothing (at 1000 nodes it doubles
    # the decoding of the LIST and the pass alike). The process ends right after.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _explain(rest, args, namespace, name)
    finally:
        if collecting:
            gc.enable()


def _explain(rest: KubeRest, args: argparse.Namespace, namespace: str, name: str) -> int:
    # The slices' paged LIST is started first (its pages are fetched in the background, liststream.PageStream): at
    # fleet scale it is most of the wait, the API server encoding page after page, while the allocator is imported
    # (0.3 s) and the claim, classes, Nodes and the rest are read meanwhile. Protobuf is asked for before the claim
    # is read: where its reach turns out not to prune (below), the LIST starts over in JSON.
    pages = None if args.node or args.watch_list else stream_pages(
        rest, f"{RESOURCE}/resourceslices", protobuf=not args.no_protobuf and not args.all_devices)
    try:
        return _explain_with(rest, args, namespace, name, pages)
    finally:
        if pages is not None:
            pages.close()


def _explain_with(rest: KubeRest, args: argparse.Namespace, namespace: str, name: str,
                  pages: PageStream | None) -> int:
    from dra_driver.allocation.prune import PoolSieve, claim_reach
    from dra_driver.allocation.taints import apply_taint_rules
    from dra_driver.cel.environment import DraCelEnvironment
    from dra_driver.k8s.taintrules import list_taint_rules

    try:
        claim = rest.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}")
        if claim is None:
            print(f"dra-driver explain: ResourceClaim {namespace}/{name} not found", file=sys.stderr)
            return 1
        classes = _items(rest, f"{RESOURCE}/deviceclasses")
        cel = DraCelEnvironment()
        # Slices are sieved as they arrive: the pools no request can use are dropped before their devices are
        # decoded past their attributes, and never parsed.
        reach = None if args.all_devices else claim_reach(claim, classes, cel=cel)
        sieve = PoolSieve(reach)
        # The slices that say the device plugin holds GPUs, kept whole whatever the sieve does with their pool: a
        # node short of GPUs because of them is the case to explain.
        annotated: list[JsonObject] = []

        def restart() -> None:  # the LIST starts again from its first object
            sieve.clear()
            annotated.clear()

        if pages is not None:
            pages.set_on_restart(restart)
            if reach is None and not args.no_protobuf and not args.all_devices:
                # Every pool is kept: converting every protobuf message whole would cost more than the JSON decode.
                pages.close()
                pages = stream_pages(rest, f"{RESOURCE}/resourceslices", protobuf=False, on_restart=restart)
        if args.node:
            found = [rest.get(f"/api/v1/nodes/{n}") for n in dict.fromkeys(args.node)]
            nodes = [n for n in found if n is not None]
        else:
            nodes = _items(rest, "/api/v1/nodes")
        ns = rest.get(f"/api/v1/namespaces/{namespace}") or {}
        try:
            if args.node:
                for raw in fetch_slices(rest, [n["metadata"]["name"] for n in nodes]):
                    sieve.add(raw)
                    annotated.append(raw)
            elif pages is None:
                encoded, _ = stream_encoded(rest, f"{RESOURCE}/resourceslices", watch_list=True, on_restart=restart)
                marker = ANNOTATION.encode()
                for item in encoded:
                    sieve.add_encoded(item)
                    if marker in item:  # decoded only then: most slices of a fleet carry no such annotation
                        annotated.append(_ANY.decode(item))
            else:
                try:
                    _sieve_pages(pages, sieve, reach, annotated)
                finally:
                    pages.close()  # a JSON restart above is not the caller's to close
            kept, pruned = sieve.result()
        except NotProtobuf as exc:
            print(f"dra-driver explain: the API server sent a ResourceSlice that does not decode: {exc}",
                  file=sys.stderr)
            return 1
        except ValueError as exc:  # msgspec's DecodeError too
            print(f"dra-driver explain: the API server sent a ResourceSlice that is not JSON: {exc}", file=sys.stderr)
            return 1
        # The taints of DeviceTaintRules count as the slice's own, as kube-scheduler sees them (KEP-5055).
        slices = apply_taint_rules(kept, list_taint_rules(rest))
        # The kept slices tell the pools' newest generation too (a pool's older slices may carry an old say). Of a
        # pool the sieve left out, only its annotated slices are known: while it replaces an annotated generation by
        # one without (a pass of its publisher), explain may still name what the older one said.
        held = held_in_slices([*annotated, *kept], None)
        for problem in held.problems:
            print(f"dra-driver explain: skipping what the device plugin says it holds: {problem}", file=sys.stderr)
        claims = _items(rest, f"{RESOURCE}/resourceclaims")
        fits, text = explain_claim(
            claim,
            nodes=nodes,
            classes=classes,
            slices=slices,
            claims=claims,
            namespace_labels=(ns.get("metadata") or {}).get("labels") or {},
            prune=False,
            pruned_before=pruned,
            cel=cel,
            feature_gates=claim_gates(claim, args.feature_gates, slices),
            device_plugin=held.by_node(),
        )
    except ApiError as exc:
        print(f"dra-driver explain: API request failed: {exc}", file=sys.stderr)
        return 1
    print(text)
    return 0 if fits else 2


def _sieve_pages(pages: Iterable[Item], sieve: PoolSieve, reach: ClaimReach | None,
                 annotated: list[JsonObject]) -> None:
    """Every slice of a paged LIST into the sieve, as protobuf where the server sends it (then each slice's light
    view is built from its message, and only kept pools are converted whole: commands/protoviews.py), else as JSON.
    Protobuf is asked for only where a claim's reach prunes (the caller's `pages`): with every pool kept, converting
    every message whole in Python would cost more than the JSON decode."""
    from dra_driver.commands.protoviews import ProtoSieveFeed

    feed = ProtoSieveFeed(sieve, reach) if reach is not None else None
    marker = ANNOTATION.encode()
    for item in pages:
        data = item.data
        if not item.protobuf:
            sieve.add_encoded(data)
        elif feed is not None:
            feed.add(data)
        else:  # a protobuf answer not asked for: judged whole
            sieve.add(resource_slice(data))
        if marker in data:  # decoded only then: most slices of a fleet carry no such annotation
            annotated.append(resource_slice(data) if item.protobuf else _ANY.decode(data))


def _items(rest: KubeRest, path: str, field_selector: str = "") -> list[JsonObject]:
    return list_all(rest, path, {"fieldSelector": field_selector} if field_selector else None)


def fetch_slices(rest: KubeRest, node_names: Sequence[str] | None) -> list[JsonObject]:
    """The ResourceSlices that can matter to `node_names` (every slice when None), in the API's order (by name).

    At fleet scale a LIST of every slice is most of a one-node explain (1000 nodes: 128 MB of JSON), so only
    these are read: the slices naming one of the nodes and those naming none (`spec.nodeName=`: allNodes,
    nodeSelector, perDeviceNodeSelection), each a field-selected LIST; then, whole, every pool that these alone
    do not complete (`allocation.pools_to_complete`: its other slices name other nodes), from a LIST of their
    driver's slices."""
    from dra_driver.allocation import pools_to_complete

    path = f"{RESOURCE}/resourceslices"
    if node_names is None:
        return _items(rest, path)
    found: dict[str, JsonObject] = {}

    def add(items: list[JsonObject]) -> None:
        for item in items:
            found[str((item.get("metadata") or {}).get("name"))] = item

    for name in ("", *dict.fromkeys(node_names)):
        add(_items(rest, path, f"spec.nodeName={field_value(name)}"))
    # Real API servers of 1.34-1.37 select ResourceSlices by spec.nodeName and spec.driver, not by pool
    # (docs/reference/api-requests.md): one LIST per driver with an incomplete pool, filtered to those pools here.
    incomplete: dict[str, set[str]] = {}
    for driver, pool in pools_to_complete(list(found.values())):
        incomplete.setdefault(driver, set()).add(pool)
    for driver, pools in incomplete.items():
        add([s for s in _items(rest, path, f"spec.driver={field_value(driver)}") if pool_name(s) in pools])
    return [found[name] for name in sorted(found)]
