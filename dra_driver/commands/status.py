"""`dra-driver status [-o wide|json|yaml] [--node N]`: the fleet's GPUs as the API sees them.

Per node: each GPU's product, health and taints (the ResourceSlices' device taints), MIG devices in use, sharing
mode, and which claims and pods hold each device, or the device plugin and its pod (the slices' annotation
`gpu.dra.dev/device-plugin`); a node whose NVIDIA driver is not ready (the plugin's Node
annotation `gpu.dra.dev/nvidia-driver`) says so. Read-only, from the API alone (resourceslices, resourceclaims,
pods, nodes; `list`, `get` for `--node`), so it works from any machine with a kubeconfig; the formatting is
`statusview` (pure). `--pool-status` adds kube-controller-manager's own count of the pools (KEP-5677, `poolstatus`):
the one option that writes (a ResourcePoolStatusRequest, deleted again), and only where the server serves the kind.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from collections.abc import Sequence
from typing import Any, Final

import msgspec

from dra_driver import defaults
from dra_driver.allocation.taints import apply_taint_rules
from dra_driver.commands.flags import Flag, FlagParser, add_flags
from dra_driver.commands.listing import field_value, list_all, pool_name
from dra_driver.commands.poolstatus import DEFAULT_TIMEOUT_S, PoolStatusQuery, PoolStatusUnavailable, pool_status
from dra_driver.commands.poolstatusview import PoolReport, only_nodes, pool_data, render_pool_table
from dra_driver.commands.statusview import (
    OUTPUTS,
    FleetDevices,
    NodeStatus,
    as_data,
    build_status,
    readable_claims,
    render,
)
from dra_driver.deviceplugin.published import held_in_slices
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest, connect
from dra_driver.k8s.kubeconfig import KubeconfigError
from dra_driver.k8s.liststream import PageStream, stream_pages
from dra_driver.k8s.sliceproto import NotProtobuf
from dra_driver.nvidiadriver.state import NODE_ANNOTATION

SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
ALL_CLAIMS_PATH = "/apis/resource.k8s.io/v1/resourceclaims"
ALL_PODS_PATH = "/api/v1/pods"
NODES_PATH = "/api/v1/nodes"
# Slices per page of the fleet's LIST: half liststream's default, so that the last full page, which status decodes
# after kube-apiserver has sent its last byte, costs half as much (1,000 nodes: 1.75-1.93 s with 500, 1.76-1.79 s
# with 250; docs/benchmarks.md "Fleet on kube-apiserver 1.37"). The server's CPU for the LIST is the same.
FLEET_PAGE: Final = 250


FLAGS: Final = (
    Flag("--output", short="-o", choices=OUTPUTS, default="", help="table (default), wide, json or yaml"),
    Flag("--node", repeatable=True, help="only these nodes (repeatable)"),
    Flag("--driver-name", default=defaults.DRIVER_NAME, help="DRA driver name"),
    Flag("--kubeconfig", help="kubeconfig (default: in-cluster, then $KUBECONFIG)"),
    Flag("--pool-status", switch=True,
         help="also show kube-controller-manager's count of the driver's pools (KEP-5677 ResourcePoolStatusRequest: "
              "alpha, gate DRAResourcePoolStatus and resource.k8s.io/v1alpha3; creates one request and deletes it, so "
              "it needs create, get, watch and delete on resourcepoolstatusrequests); where the server does not serve "
              "it, nothing is sent and stderr says so"),
    Flag("--pool-status-timeout", type=float, default=DEFAULT_TIMEOUT_S,
         help="seconds to wait for kube-controller-manager's answer (--pool-status)"),
    Flag("--no-protobuf", switch=True,
         help="ask for the slices' LIST in JSON only, not kube-apiserver's protobuf first (a server without protobuf "
              "answers JSON either way)"),
)


def add_arguments(parser: FlagParser) -> None:
    add_flags(parser, FLAGS)


_Unset = msgspec.UnsetType
UNSET = msgspec.UNSET


class _Attributes(msgspec.Struct, frozen=True):
    uuid: dict[str, Any] | _Unset = UNSET
    parentUUID: dict[str, Any] | _Unset = UNSET
    type: dict[str, Any] | _Unset = UNSET
    profile: dict[str, Any] | _Unset = UNSET
    productName: dict[str, Any] | _Unset = UNSET
    minor: dict[str, Any] | _Unset = UNSET


class _Capacity(msgspec.Struct, frozen=True):
    memory: dict[str, Any] | _Unset = UNSET


class _Device(msgspec.Struct, frozen=True):
    name: Any = UNSET
    attributes: _Attributes | _Unset | None = UNSET
    taints: list[Any] | _Unset | None = UNSET
    capacity: _Capacity | _Unset | None = UNSET


class _Spec(msgspec.Struct, frozen=True):
    driver: Any = UNSET
    nodeName: Any = UNSET
    pool: dict[str, Any] | _Unset | None = UNSET
    devices: list[_Device] | _Unset | None = UNSET


class _Slice(msgspec.Struct, frozen=True):
    """The parts of a ResourceSlice status shows (statusview.build_status) and selects by (taint rules, pools to
    complete): a typed decode skips the rest unbuilt, most of a fleet's bytes (counters, capacities, the MIG
    devices' other attributes); absent fields stay absent (UNSET)."""

    metadata: dict[str, Any] | _Unset = UNSET
    spec: _Spec | _Unset | None = UNSET


_SLICE = msgspec.json.Decoder(_Slice)
_ANY: msgspec.json.Decoder[Any] = msgspec.json.Decoder()


def status_slice(encoded: bytes) -> JsonObject:
    """A ResourceSlice's JSON as status reads it: only the fields it shows (_Slice), or the whole object when
    it has a field of another shape (then each reader of it checks what it takes)."""
    try:
        shown = msgspec.to_builtins(_SLICE.decode(encoded))
    except msgspec.ValidationError:
        shown = _ANY.decode(encoded)
    if not isinstance(shown, dict):
        raise ApiError(0, f"list {SLICES_PATH}: an item that is not an object: {encoded[:80]!r}")
    return shown


def list_slices(rest: KubeRest, query: dict[str, str | int | bool], *, protobuf: bool = True,
                pages: PageStream | None = None, taking: SliceTaker | None = None) -> list[JsonObject]:
    """A LIST of ResourceSlices in pages, each decoded as `status_slice`: at 1000 nodes the whole objects are
    128 MB of JSON and ten times that in memory, of which status shows a small part. Asked for as kube-apiserver's
    protobuf first (half its CPU of JSON for a fleet's slices; a server without it answers JSON), each message
    read as the same view (commands/statusproto.py). `pages`: that LIST, started by the caller (`slices_stream`);
    `taking`: each slice handed on as it is decoded, and what is listed is what it makes of them."""
    from dra_driver.commands.statusproto import StatusSlices

    items: list[JsonObject] = []

    def restart() -> None:
        items.clear()
        if taking is not None:
            taking.clear()

    views = StatusSlices()
    if pages is None:
        pages = stream_pages(rest, SLICES_PATH, query=query, protobuf=protobuf, on_restart=restart)
    else:
        pages.set_on_restart(restart)
    for item in pages:
        try:
            view = views.slice(item.data) if item.protobuf else status_slice(item.data)
        except NotProtobuf as exc:
            raise ApiError(0, f"list {SLICES_PATH}: an item that does not decode: {exc}") from exc
        items.append(view if taking is None else taking.add(view))
    return items


class SliceTaker:
    """Takes the fleet's slices as their pages arrive: each with the DeviceTaintRules' taints (KEP-5055), its
    devices sorted by node and GPU at once (`FleetDevices`), while the API server still encodes the next page."""

    def __init__(self, driver: str, rules: Sequence[JsonObject]) -> None:
        self._driver = driver
        self._rules = rules
        self.fleet = FleetDevices(driver)

    def add(self, listed: JsonObject) -> JsonObject:
        tainted = apply_taint_rules([listed], self._rules)[0] if self._rules else listed
        self.fleet.add(tainted)
        return tainted

    def clear(self) -> None:
        """The LIST starts again from its first page: nothing taken so far counts."""
        self.fleet = FleetDevices(self._driver)


def slices_stream(rest: KubeRest, driver: str, *, protobuf: bool = True) -> PageStream:
    """The LIST of the driver's every slice (what `collect` reads for no nodes), started: its pages are
    fetched in the background while the caller reads the Nodes, claims and pods (at fleet scale the slices are most
    of the wait, the API server encoding page after page)."""
    return stream_pages(rest, SLICES_PATH, query={"fieldSelector": f"spec.driver={field_value(driver)}"},
                        protobuf=protobuf, page=FLEET_PAGE)


def driver_slices(rest: KubeRest, driver: str, nodes: list[str], *, protobuf: bool = True) -> list[JsonObject]:
    """The driver's slices that show under `nodes` (all of them when empty), in the API's order (by name).

    Real API servers of 1.34-1.37 select ResourceSlices by `metadata.name`, `spec.nodeName` and `spec.driver` only
    (docs/reference/api-requests.md), so for some nodes: the driver's slices naming each node; once, its slices
    naming no node, kept when their pool is one of those or is named like a node (a slice without a node shows
    under its pool's name); then, only when a pool among these looks incomplete (`pools_to_complete`: a pool's
    newest generation decides which of its slices count), the driver's whole list once, filtered to those pools
    here."""
    driver_field = f"spec.driver={field_value(driver)}"
    if not nodes:
        return list_slices(rest, {"fieldSelector": driver_field}, protobuf=protobuf)
    # Imported here: the allocator's pools bring its model and the CEL library (≈ 0.15 s), which the fleet's
    # status never needs.
    from dra_driver.allocation.pools import pools_to_complete

    found: dict[str, JsonObject] = {}

    def add(items: list[JsonObject], pools: set[str] | None = None) -> None:
        for s in items:
            if pools is None or pool_name(s) in pools:
                found[str(s["metadata"]["name"])] = s

    for node in dict.fromkeys(nodes):
        add(list_slices(rest, {"fieldSelector": f"{driver_field},spec.nodeName={field_value(node)}"},
                        protobuf=protobuf))
    pools = {pool_name(s) for s in found.values()} | set(nodes)
    add(list_slices(rest, {"fieldSelector": f"{driver_field},spec.nodeName="}, protobuf=protobuf), pools)
    incomplete = {pool for _, pool in pools_to_complete(list(found.values()))}
    if incomplete:
        add(list_slices(rest, {"fieldSelector": driver_field}, protobuf=protobuf), incomplete)
    return [found[name] for name in sorted(found)]


def collect(rest: KubeRest, driver: str, nodes: list[str], *, protobuf: bool = True,
            pages: PageStream | None = None) -> tuple[list[JsonObject], FleetDevices, list[JsonObject],
                                                      list[JsonObject]]:
    """(slices, their devices by node and GPU, claims, pods). `pages`: the slices' LIST already started
    (`slices_stream`, for no nodes): the other LISTs are read while its pages arrive, and each slice is taken in
    as it arrives."""
    from dra_driver.k8s.taintrules import list_taint_rules

    pod_query: dict[str, str | int | bool] = {"fieldSelector": f"spec.nodeName={nodes[0]}"} if len(nodes) == 1 else {}
    # The slices last: a LIST already started has its pages arriving meanwhile.
    claims = list_all(rest, ALL_CLAIMS_PATH)
    pods = list_all(rest, ALL_PODS_PATH, pod_query)
    # An admin's DeviceTaintRules count as the slices' own taints, as the scheduler sees them (KEP-5055).
    rules = list_taint_rules(rest)
    if not nodes:
        taker = SliceTaker(driver, rules)
        listed = list_slices(rest, {"fieldSelector": f"spec.driver={field_value(driver)}"}, protobuf=protobuf,
                             pages=pages, taking=taker)  # the query of slices_stream, where no stream was started
        return listed, taker.fleet, claims, pods
    listed = apply_taint_rules(driver_slices(rest, driver, nodes, protobuf=protobuf), rules)
    fleet = FleetDevices(driver, nodes)
    for s in listed:
        fleet.add(s)
    return listed, fleet, claims, pods


def driver_states(rest: KubeRest, nodes: list[str]) -> dict[str, str]:
    """node -> the value of its NVIDIA driver annotation, for the nodes that have one."""
    found = [n for n in (rest.get(f"/api/v1/nodes/{name}") for name in dict.fromkeys(nodes)) if n] if nodes \
        else list_all(rest, NODES_PATH)
    states: dict[str, str] = {}
    for node in found:
        metadata = node.get("metadata") or {}
        value = (metadata.get("annotations") or {}).get(NODE_ANNOTATION)
        if isinstance(value, str):
            states[str(metadata.get("name"))] = value
    return states


def pool_report(rest: KubeRest, *, driver: str, nodes: list[str], timeout_s: float) -> PoolReport | None:
    """`--pool-status`: the control plane's count, or None with the reason on stderr (the rest of status follows)."""
    query = PoolStatusQuery(driver, nodes[0] if len(nodes) == 1 else None, timeout_s)
    try:
        report, warnings = pool_status(rest, query)
    except PoolStatusUnavailable as exc:
        print(f"dra-driver status: no pool status: {exc}", file=sys.stderr)
        return None
    for warning in warnings:
        print(f"dra-driver status: {warning}", file=sys.stderr)
    return only_nodes(report, nodes)


def with_pools(nodes: list[NodeStatus], report: PoolReport, output: str, *, driver: str) -> str:
    """The status with the pool report: a second table, or each node's `poolStatus` in json/yaml."""
    if output not in ("json", "yaml"):
        return render(nodes, output, driver=driver) + "\n\n" + render_pool_table(report)
    data = as_data(nodes)
    by_node = {p.node or p.pool: pool_data(p) for p in report.pools}
    for node in data:
        node["poolStatus"] = by_node.get(str(node.get("name")))
    if output == "json":
        return json.dumps(data, indent=2)
    import yaml  # only for -o yaml: one import fewer before the slices' LIST starts

    return str(yaml.safe_dump(data, sort_keys=False)).rstrip()


def status_text(rest: KubeRest, *, driver: str, nodes: list[str], output: str, pool_status_timeout: float | None = None,
                protobuf: bool = True) -> str:
    """The status; `pool_status_timeout` set: with the pool report (`--pool-status`); `protobuf`: the slices asked
    for as protobuf first."""
    # The whole fleet: the slices' LIST is started first and the Nodes, claims and pods read while its pages
    # arrive (liststream.PageStream).
    pages = None if nodes else slices_stream(rest, driver, protobuf=protobuf)
    try:
        states = driver_states(rest, nodes) if pages is not None else None
        slices, fleet, raw_claims, pods = collect(rest, driver, nodes, protobuf=protobuf, pages=pages)
    finally:
        if pages is not None:
            pages.close()
    claims, problems = readable_claims(raw_claims)
    for problem in problems:  # on stderr, so that -o json/yaml stays parseable
        print(f"dra-driver status: skipping a claim it cannot read: {problem}", file=sys.stderr)
    if states is None:
        states = driver_states(rest, nodes)
    held = held_in_slices(slices, driver)
    for problem in held.problems:
        print(f"dra-driver status: skipping what the device plugin says it holds: {problem}", file=sys.stderr)
    built = build_status(fleet, claims, pods, driver=driver, nodes=nodes, driver_states=states,
                         device_plugin=held.gpus)
    report = None if pool_status_timeout is None else pool_report(rest, driver=driver, nodes=nodes,
                                                                    timeout_s=pool_status_timeout)
    if report is None:
        return render(built, output, driver=driver)
    return with_pools(list(built), report, output, driver=driver)


def run(args: argparse.Namespace) -> int:
    # As explain: one short command that builds many long-lived objects from a fleet's LIST; the cyclic collector
    # would rescan that growing heap again and again for nothing. The process ends right after.
    collecting = gc.isenabled()
    gc.disable()
    try:
        rest = connect(args.kubeconfig, component="status")
        text = status_text(rest, driver=args.driver_name, nodes=args.node, output=args.output,
                           pool_status_timeout=args.pool_status_timeout if args.pool_status else None,
                           protobuf=not args.no_protobuf)
    except (ApiError, KubeconfigError) as exc:
        print(f"dra-driver status: {exc}", file=sys.stderr)
        return 1
    finally:
        if collecting:
            gc.enable()
    print(text)
    return 0
