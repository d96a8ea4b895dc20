"""What `dra-driver status` shows, computed from API objects and formatted. Pure: values in, values out.

Per node (the driver's pool), per physical GPU: product, health and taints (from the ResourceSlices' device
taints), the sharing mode (exclusive, shares, MIG in use), the MIG devices that are allocated, and which claims
and pods hold each device (the claims' allocation results and `status.reservedFor`); and per claim what the
plugin reported in its `status.devices` (KEP-4817): the device, its UUID, MIG profile and Ready condition. A node
whose plugin says (in the Node annotation `gpu.dra.dev/nvidia-driver`) that its NVIDIA driver is not ready or is
reloading shows as "driver not ready: <reason>" / "driver reloading: <reason>", with or without slices. A GPU the
device plugin holds (`--device-plugin`: left out of the slices, named in their annotation `gpu.dra.dev/device-plugin`,
deviceplugin/published.py) shows with SHARING device-plugin and HELD BY "device-plugin: <namespace>/<pod>".
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from dra_driver.deviceplugin.published import HeldGpu, holder_text
from dra_driver.nvidiadriver.state import DriverState
from dra_driver.resourceapi import InvalidObjectError, ResourceClaim, parse_resource_claim

JsonObject = dict[str, Any]
GPU, GPU_SHARE, MIG, VGPU = "gpu", "gpu-share", "mig", "vgpu"
DEVICE_PLUGIN = "device-plugin"  # the sharing of a GPU the device plugin holds (not in the slices)
FM_PARTITION = "fm-partition"  # a Fabric Manager partition: several GPUs, so the node's, not one GPU's
OUTPUTS = ("", "wide", "json", "yaml")


@dataclass(frozen=True)
class HoldingClaim:
    """A claim that holds a device, as `status` shows it."""

    claim: str  # namespace/name
    pods: tuple[str, ...]  # "namespace/name (Phase)"
    share: str = ""  # the share id of a consumable-capacity allocation
    sharing: str = ""  # the claim's sharing strategy from its opaque config (TimeSlicing, MPS), if any


@dataclass(frozen=True)
class DeviceStatus:
    name: str
    type: str  # gpu | gpu-share | mig | vgpu | fm-partition
    profile: str = ""  # a MIG device's profile, a vGPU slot's type, a partition's size ("2 GPUs")
    uuid: str = ""
    health: str = "Healthy"
    taints: tuple[str, ...] = ()
    holders: tuple[HoldingClaim, ...] = ()


@dataclass(frozen=True)
class GpuStatus:
    name: str
    product: str
    uuid: str
    memory: str
    health: str
    sharing: str  # exclusive | shares | mig | vgpu | device-plugin
    taints: tuple[str, ...]
    holders: tuple[HoldingClaim, ...]  # of the whole GPU and its share device
    mig_devices: int  # MIG devices published for this GPU (every possible placement with dynamic MIG)
    mig_allocated: int  # of which allocated
    mig: tuple[DeviceStatus, ...]  # the MIG devices allocated or tainted (other than the whole GPU is)
    shares: tuple[DeviceStatus, ...] = ()
    vgpus: tuple[DeviceStatus, ...] = ()  # the vGPU slots allocated (docs/vgpu.md)
    # Held by the device plugin (nvidia.com/gpu): its pods ("namespace/name"; empty while the kubelet has not
    # listed them yet); None: not the device plugin's.
    device_plugin: tuple[str, ...] | None = None
    partition: str = ""  # the allocated Fabric Manager partition this GPU is a member of (its device name)


@dataclass(frozen=True)
class ClaimDevice:
    """One entry of this driver in a claim's `status.devices`, as the kubelet plugin wrote it."""

    claim: str  # namespace/name
    device: str
    share: str = ""
    uuid: str = ""
    profile: str = ""  # MIG profile
    ready: str = ""  # the Ready condition's status (True | False | Unknown), "" when it has none
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class NodeStatus:
    name: str
    gpus: tuple[GpuStatus, ...] = field(default_factory=tuple)
    claim_devices: tuple[ClaimDevice, ...] = ()
    driver: str = ""  # the NVIDIA driver as the plugin reports it: "ready", "driver not ready: …"; "" unknown
    # The Fabric Manager partitions allocated (docs/passthrough.md): a partition spans GPUs, so it is the node's.
    partitions: tuple[DeviceStatus, ...] = ()


def driver_text(annotation: str) -> str:
    """The Node annotation's value (DriverStatus.annotation(): "ready" | "not-ready: <reason>" | "reloading: …") as
    status shows it."""
    state, _, reason = annotation.partition(": ")
    if state == DriverState.NOT_READY.value:
        return f"driver not ready: {reason}" if reason else "driver not ready"
    if state == DriverState.RELOADING.value:
        return f"driver reloading: {reason}" if reason else "driver reloading"
    return annotation


def _attr(device: Mapping[str, Any], name: str) -> str:
    value = (device.get("attributes") or {}).get(name) or {}
    for kind in ("string", "int", "version", "bool"):
        if kind in value:
            return str(value[kind])
    return ""


def _taint_text(taint: Mapping[str, Any]) -> str:
    return f"{taint.get('key')}={taint.get('value', '')}:{taint.get('effect', '')}"


def _health(taints: Sequence[Mapping[str, Any]]) -> str:
    return "Unhealthy" if any(t.get("effect") not in (None, "None") for t in taints) else "Healthy"


def _strategies(claim: ResourceClaim, driver: str) -> dict[str, str]:
    """Request name ("" = every request) -> the sharing strategy of the claim's opaque config for this driver."""
    out: dict[str, str] = {}
    for config in claim.allocation_configs(driver):
        params = config.opaque.parameters if config.opaque is not None else None
        sharing = params.get("sharing") if isinstance(params, dict) else None
        strategy = sharing.get("strategy") if isinstance(sharing, dict) else None
        if strategy:
            for request in config.requests or ("",):
                out[request] = str(strategy)
    return out


def readable_claims(claims: Iterable[JsonObject]) -> tuple[list[ResourceClaim], list[str]]:
    """The claims parsed, and the messages of those the strict parser refused (shown, not silently dropped)."""
    parsed, problems = [], []
    for obj in claims:
        try:
            parsed.append(parse_resource_claim(obj))
        except InvalidObjectError as err:
            problems.append(str(err))
    return parsed, problems


def holders_by_device(
    claims: Iterable[ResourceClaim], pods: Iterable[JsonObject], driver: str
) -> dict[tuple[str, str], list[HoldingClaim]]:
    """(pool, device) -> the claims allocated it, with the pods that reserve each claim."""
    phases = {
        f"{p['metadata'].get('namespace', '')}/{p['metadata']['name']}": str((p.get("status") or {}).get("phase") or "")
        for p in pods
    }
    out: dict[tuple[str, str], list[HoldingClaim]] = {}
    for claim in sorted(claims, key=lambda c: (c.namespace, c.name)):
        pod_keys = [f"{claim.namespace}/{r.name}" for r in claim.reserved_for if r.resource == "pods"]
        pod_names = tuple(key + (f" ({phases[key]})" if phases.get(key) else "") for key in pod_keys)
        strategies = _strategies(claim, driver)
        for result in claim.results:
            if result.driver != driver:
                continue
            sharing = strategies.get(result.request, strategies.get("", ""))
            holder = HoldingClaim(claim.key, pod_names, result.share_id or "", sharing)
            out.setdefault((result.pool, result.device), []).append(holder)
    return out


def claim_devices(claims: Iterable[ResourceClaim], driver: str) -> dict[str, list[ClaimDevice]]:
    """Pool -> this driver's `status.devices` entries of every claim, by claim and device."""
    out: dict[str, list[ClaimDevice]] = {}
    for claim in sorted(claims, key=lambda c: (c.namespace, c.name)):
        for entry in claim.devices:
            if entry.driver != driver:
                continue
            data: Mapping[str, Any] = entry.data if isinstance(entry.data, Mapping) else {}
            ready = next((c for c in entry.conditions if c.type == "Ready"), None)
            out.setdefault(entry.pool, []).append(ClaimDevice(
                claim=claim.key, device=entry.device, share=entry.share_id or "",
                uuid=str(data.get("uuid") or ""), profile=str(data.get("migProfile") or ""),
                ready=ready.status if ready else "", reason=ready.reason if ready else "",
                message=ready.message if ready else "",
            ))  # fmt: skip
    return out


class FleetDevices:
    """The driver's devices of each pool's newest generation, by node and GPU, taken one slice at a time (`add`):
    status adds each slice as its page arrives, so the ~100k devices of a fleet are sorted while the API server
    still encodes the next page, not after the last one. `nodes`: only these (all when empty)."""

    def __init__(self, driver: str, nodes: Sequence[str] = ()) -> None:
        self._driver = driver
        self._nodes = frozenset(nodes)
        # (pool name, generation) -> node -> (its GPUs' (type, device) by GPU uuid, its Fabric Manager
        # partitions); a pool's slices of another generation are kept apart until `by_node` picks the newest.
        self._generations: dict[tuple[str, int], dict[str, tuple[dict[str, list[tuple[str, JsonObject]]],
                                                                  list[JsonObject]]]] = {}
        self._newest: dict[str, int] = {}
        self._kinds: dict[int, tuple[str, str]] = {}  # id of a device's attributes -> (its type, its GPU's uuid)
        self._slices: list[JsonObject] = []  # held: `_kinds` keys on ids of objects they hold

    def add(self, s: JsonObject) -> None:
        spec = s.get("spec") or {}
        if spec.get("driver") != self._driver:
            return
        pool = spec.get("pool") or {}
        name = pool.get("name", "")
        generation = int(pool.get("generation") or 0)
        self._newest[name] = max(self._newest.get(name, 0), generation)
        node = spec.get("nodeName") or pool["name"]
        if self._nodes and node not in self._nodes:
            return
        self._slices.append(s)
        gpus, partitions = self._generations.setdefault((name, generation), {}).setdefault(node, ({}, []))
        kinds = self._kinds
        for device in spec.get("devices") or []:
            # The protobuf view (commands/statusproto.py) shares one attributes object between devices that show
            # the same (a GPU's MIG devices of a profile): their type and GPU are read once. The slices are held,
            # so an id is not reused meanwhile.
            attributes = id(device.get("attributes"))
            classified = kinds.get(attributes)
            if classified is None:
                classified = kinds[attributes] = (_attr(device, "type"),
                                                  _attr(device, "parentUUID") or _attr(device, "uuid"))
            kind, gpu = classified
            if kind == FM_PARTITION:
                partitions.append(device)
                continue
            found = gpus.get(gpu)
            if found is None:
                gpus[gpu] = [(kind, device)]
            else:
                found.append((kind, device))

    def by_node(self, device_plugin: Mapping[str, Sequence[HeldGpu]]) -> tuple[
            dict[str, dict[str, list[tuple[str, JsonObject]]]], dict[str, list[JsonObject]], dict[str, str]]:
        """(node -> GPU uuid -> (type, device) of its devices, node -> its partitions, node -> its pool) over each
        pool's newest generation; a node shows when it has a device, or when the device plugin holds GPUs of its
        pool (`device_plugin`: pool -> those GPUs), even all of them."""
        by_node: dict[str, dict[str, list[tuple[str, JsonObject]]]] = {}
        partitions: dict[str, list[JsonObject]] = {}
        pools: dict[str, str] = {}
        for (pool, generation), on_nodes in self._generations.items():
            if generation != self._newest[pool]:
                continue
            for node, (gpus, node_partitions) in on_nodes.items():
                pools[node] = pool
                if gpus or node_partitions or device_plugin.get(pool):
                    merged = by_node.setdefault(node, {})
                    for gpu, typed in gpus.items():
                        merged.setdefault(gpu, []).extend(typed)
                if node_partitions:
                    partitions.setdefault(node, []).extend(node_partitions)
        return by_node, partitions, pools


def build_status(
    slices: Iterable[JsonObject] | FleetDevices,
    claims: Iterable[ResourceClaim],
    pods: Iterable[JsonObject],
    *,
    driver: str,
    nodes: Sequence[str] = (),
    driver_states: Mapping[str, str] | None = None,
    device_plugin: Mapping[str, Sequence[HeldGpu]] | None = None,
) -> list[NodeStatus]:
    """`slices`: the API's, or their devices already taken in (`FleetDevices` of the same driver and nodes);
    `driver_states`: node name -> its driver annotation (see driver_text); `device_plugin`: pool -> the GPUs the
    device plugin holds there (deviceplugin/published.py `held_in_slices`)."""
    driver_states = driver_states or {}
    device_plugin = device_plugin or {}
    claims = list(claims)
    held = holders_by_device(claims, pods, driver)
    reported = claim_devices(claims, driver)
    if isinstance(slices, FleetDevices):
        fleet = slices
    else:
        fleet = FleetDevices(driver, nodes)
        for s in slices:
            fleet.add(s)
    by_node, partitions, pools = fleet.by_node(device_plugin)
    held_in_pool: dict[str, set[str]] = {}  # pool -> the names of its devices some claim holds
    for pool_name, device_name in held:
        held_in_pool.setdefault(pool_name, set()).add(device_name)
    out = []
    for node in sorted(by_node.keys() | {n for n, a in driver_states.items() if _not_ready(a)}):
        if nodes and node not in nodes:
            continue
        if node not in by_node:  # no slices (a node that never published: its driver was never ready)
            out.append(NodeStatus(node, driver=driver_text(driver_states[node])))
            continue
        pool = pools[node]
        gpus = []
        held_here = held_in_pool.get(pool, set())
        for uuid, typed in by_node[node].items():
            # One pass over the GPU's devices (a fleet's ~100k): a MIG device neither allocated nor tainted is only
            # counted (most of them: every placement of dynamic MIG is published), the others made a DeviceStatus.
            whole: JsonObject | None = None
            share_devices, vgpu_devices, marked_migs = [], [], []
            mig_count = 0
            for kind, d in typed:
                if kind == MIG:
                    mig_count += 1
                    if d.get("taints") or d["name"] in held_here:
                        marked_migs.append(d)
                elif kind == GPU:
                    whole = d if whole is None else whole
                elif kind == GPU_SHARE:
                    share_devices.append(d)
                elif kind == VGPU:
                    vgpu_devices.append(d)
            first = whole or typed[0][1]  # a GPU in MIG mode offers only its MIG devices

            def status_of(d: JsonObject, pool: str = pool) -> DeviceStatus:
                taints = d.get("taints") or []
                return DeviceStatus(
                    name=d["name"],
                    type=_attr(d, "type"),
                    profile=_attr(d, "profile") or _attr(d, "vgpuType"),
                    uuid=_attr(d, "uuid"),
                    health=_health(taints),
                    taints=tuple(_taint_text(t) for t in taints),
                    holders=tuple(held.get((pool, d["name"]), ())),
                )

            gpu_status = status_of(whole) if whole is not None else DeviceStatus(f"gpu-{_attr(first, 'minor')}", GPU)
            shares = tuple(map(status_of, share_devices))
            migs = list(map(status_of, marked_migs))
            allocated = [m for m in migs if m.holders]
            vgpus = tuple(v for v in map(status_of, vgpu_devices) if v.holders)
            sharing = ("mig" if allocated or whole is None else "vgpu" if vgpus else "shares" if shares
                       else "exclusive")  # fmt: skip
            memory = str((((whole or {}).get("capacity") or {}).get("memory") or {}).get("value") or "")
            gpus.append(
                GpuStatus(
                    name=gpu_status.name,
                    product=_attr(first, "productName"),
                    uuid=uuid,
                    memory=memory,
                    health=gpu_status.health,
                    sharing=sharing,
                    taints=gpu_status.taints,
                    holders=gpu_status.holders + tuple(h for s in shares for h in s.holders),
                    mig_devices=mig_count,
                    mig_allocated=len(allocated),
                    # MIG devices tainted like their GPU (a whole-GPU event) would only repeat the GPU's line
                    mig=tuple(m for m in migs if m.holders or (m.taints and m.taints != gpu_status.taints)),
                    shares=shares,
                    vgpus=vgpus,
                )
            )
        gpus = _with_device_plugin(gpus, device_plugin.get(pool, ()))
        gpus.sort(key=lambda g: (len(g.name), g.name))
        state = driver_states.get(node)
        held_partitions = tuple(
            DeviceStatus(
                name=d["name"],
                type=FM_PARTITION,
                profile=f"{_attr(d, 'gpuCount')} GPUs",
                health=_health(d.get("taints") or []),
                taints=tuple(_taint_text(t) for t in d.get("taints") or []),
                holders=tuple(held.get((pool, d["name"]), ())),
            )
            for d in partitions.get(node, [])
        )
        member_of = {m: p.name for p, d in zip(held_partitions, partitions.get(node, []), strict=True) if p.holders
                     for m in partition_members(d)}  # fmt: skip
        gpus = [replace(g, partition=member_of[g.name]) if g.name in member_of else g for g in gpus]
        out.append(NodeStatus(node, tuple(gpus), tuple(reported.get(pool, ())), driver_text(state) if state else "",
                              partitions=tuple(p for p in held_partitions if p.holders)))  # fmt: skip
    return out


def partition_members(device: Mapping[str, Any]) -> tuple[str, ...]:
    """A partition's member GPUs by device name. A slice names them only in the partition's consumption of the
    fabric counter set: one counter per member, named as the member's whole-GPU device (`gpu-<minor>`,
    slices/fabricpartitions.py). Anything else in the consumption is ignored (the object is untrusted)."""
    # Imported here: the slices' module brings the inventory's (≈ 35 ms), which status needs only for a partition.
    from dra_driver.slices.fabricpartitions import FABRIC_COUNTER_SET

    consumed = device.get("consumesCounters")
    names: set[str] = set()
    for consumption in consumed if isinstance(consumed, list) else []:
        if isinstance(consumption, dict) and consumption.get("counterSet") == FABRIC_COUNTER_SET:
            counters = consumption.get("counters")
            names |= {n for n in counters if isinstance(n, str)} if isinstance(counters, dict) else set()
    return tuple(sorted(names, key=lambda n: (len(n), n)))


def _with_device_plugin(gpus: list[GpuStatus], held: Sequence[HeldGpu]) -> list[GpuStatus]:
    """The GPUs of the slices and those the device plugin holds, which the slices leave out (a GPU in both, which
    the plugin never publishes, keeps its slice's facts and gets the device plugin's pods)."""
    by_uuid = {g.uuid: i for i, g in enumerate(gpus)}
    out = list(gpus)
    for h in held:
        if h.uuid in by_uuid:
            out[by_uuid[h.uuid]] = replace(out[by_uuid[h.uuid]], device_plugin=h.pods)
            continue
        out.append(GpuStatus(name=h.device, product=h.product, uuid=h.uuid, memory="", health="-",
                             sharing=DEVICE_PLUGIN, taints=(), holders=(), mig_devices=0, mig_allocated=0, mig=(),
                             device_plugin=h.pods))  # fmt: skip
    return out


def _not_ready(annotation: str) -> bool:
    return annotation.partition(": ")[0] in (DriverState.NOT_READY.value, DriverState.RELOADING.value)


def _holders_text(holders: Sequence[HoldingClaim]) -> str:
    if not holders:
        return "-"
    parts = []
    for h in holders:
        extra = [x for x in (f"share {h.share}" if h.share else "", h.sharing) if x]
        text = h.claim + (f" [{', '.join(extra)}]" if extra else "")
        if h.pods:
            text += " <- " + " ".join(h.pods)
        parts.append(text)
    return "; ".join(parts)


def _short(taints: Sequence[str], driver: str) -> str:
    return ",".join(t.removeprefix(f"{driver}/") for t in taints) or "-"


def render_table(nodes: Sequence[NodeStatus], *, driver: str, wide: bool = False) -> str:
    header = ["NODE", "DEVICE", "PRODUCT", "HEALTH", "SHARING", "TAINTS", "HELD BY"]
    if wide:
        header[3:3] = ["UUID", "MEMORY"]
    rows: list[list[str]] = [header]
    for node in nodes:
        first = True
        for gpu in node.gpus:
            sharing = gpu.sharing
            if gpu.sharing == "mig":
                sharing = f"mig {gpu.mig_allocated}/{gpu.mig_devices}"
            holders = _holders_text(gpu.holders)
            if gpu.device_plugin is not None:
                dp = holder_text(HeldGpu(gpu.name, gpu.uuid, pods=gpu.device_plugin))
                holders = dp if holders == "-" else f"{dp}; {holders}"
            if gpu.partition:  # its holders are the partition's, on the partition's own line
                sharing = FM_PARTITION
                holders = f"in {gpu.partition}" if holders == "-" else f"in {gpu.partition}; {holders}"
            row = [node.name if first else "", gpu.name, gpu.product, gpu.health, sharing,
                   _short(gpu.taints, driver), holders]  # fmt: skip
            if wide:
                row[3:3] = [gpu.uuid, gpu.memory]
            rows.append(row)
            first = False
            for mig in (*gpu.mig, *gpu.vgpus):
                sub = ["", f"  {mig.name}", mig.profile, mig.health, "", _short(mig.taints, driver),
                       _holders_text(mig.holders)]  # fmt: skip
                if wide:
                    sub[3:3] = [mig.uuid, ""]
                rows.append(sub)
        for partition in node.partitions:
            sub = [node.name if first else "", partition.name, partition.profile, partition.health, "fm-partition",
                   _short(partition.taints, driver), _holders_text(partition.holders)]  # fmt: skip
            if wide:
                sub[3:3] = ["", ""]
            rows.append(sub)
            first = False
        if not node.gpus:
            empty = "(driver not ready)" if node.driver.startswith("driver ") else "(no GPUs)"
            rows.append([node.name, empty, "", "", "", "", ""] + (["", ""] if wide else []))
    text = _columns(rows)
    drivers = [["NODE", "NVIDIA DRIVER"]] + [[n.name, n.driver] for n in nodes if n.driver.startswith("driver ")]
    if len(drivers) > 1:
        text += "\n\nNVIDIA DRIVER NOT READY (the plugin waits: no registration, slices left as they are)\n"
        text += _columns(drivers)
    reported = [["NODE", "CLAIM", "DEVICE", "UUID", "PROFILE", "READY"]]
    for node in nodes:
        for d in node.claim_devices:
            ready = d.ready or "-"
            if d.ready and d.ready != "True" and (wide or d.reason):
                ready += f" ({d.message if wide and d.message else d.reason})"
            device = d.device + (f" share {d.share}" if d.share else "")
            reported.append([node.name, d.claim, device, d.uuid or "-", d.profile or "-", ready])
    if len(reported) > 1:
        text += "\n\nCLAIM DEVICE STATUS (status.devices)\n" + _columns(reported)
    return text


def _columns(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def as_data(nodes: Sequence[NodeStatus]) -> list[JsonObject]:
    """Plain lists and dicts (YAML's safe dumper has no tuples)."""
    data: list[JsonObject] = json.loads(json.dumps([asdict(n) for n in nodes]))
    return data


def render(nodes: Sequence[NodeStatus], output: str, *, driver: str) -> str:
    if output == "json":
        return json.dumps(as_data(nodes), indent=2)
    if output == "yaml":
        import yaml  # only for -o yaml: one import fewer before the slices' LIST starts

        return str(yaml.safe_dump(as_data(nodes), sort_keys=False)).rstrip()
    return render_table(nodes, driver=driver, wide=output == "wide")
