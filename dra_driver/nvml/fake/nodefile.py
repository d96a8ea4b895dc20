"""Node description files (YAML) and the built-in presets -> NodeSpec, validated strictly.

The format is documented in docs/fake-nvml.md; the presets in presets/*.yaml use the same format,
so every preset doubles as a worked example. Errors name the field: `gpus[2].model: unknown model
'H900'; known: ...`.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

import yaml

from dra_driver.nvml.fake.fields import (
    SpecError,
    as_choice,
    as_int,
    as_list,
    as_mapping,
    as_str,
    check_keys,
    join,
    parse_cpu_list,
    type_name,
)
from dra_driver.nvml.fake.mig import ci_profiles_for, create_compute_instance, create_gpu_instance
from dra_driver.nvml.fake.models import CATALOG, GpuModel, MigSpec, find_model, known_model_keys
from dra_driver.nvml.fake.node import GpuSlot, NodeSpec
from dra_driver.nvml.fake.state import GiState, GpuState
from dra_driver.nvml.types import (
    Architecture,
    FabricInfo,
    FabricState,
    GpuInstanceProfile,
    NvLink,
    NvLinkRemoteType,
    NvmlError,
    NvmlReturn,
    Placement,
    SystemInfo,
)

# Fixed namespace so that generated GPU UUIDs are stable across runs and machines.
FAKE_UUID_NAMESPACE = uuid.UUID("6f1c0e8a-3d5b-5c2e-9a47-1b2d3c4e5f60")
MAX_GPUS = 128  # beyond any real chassis, so tests and benchmarks can offer many distinct devices
DEFAULT_DRIVER = "580.105.08"
DEFAULT_CUDA = 13000
ZERO_UUID = "00000000-0000-0000-0000-000000000000"

_TOP_KEYS = (
    "name",
    "driver_version",
    "cuda_driver_version",
    "nvml_version",
    "numa_nodes",
    "pcie",
    "nvlink",
    "fabric",
    "gpus",
)
_GROUP_KEYS = ("model", "count", "numa", "bus_ids", "minors", "uuids", "mig", "instances")
_MODEL_KEYS = (
    "base",
    "name",
    "architecture",
    "compute_capability",
    "memory_mib",
    "pci_device_id",
    "multiprocessors",
    "nvlink_links",
    "brand",
    "mig",
)
_PROFILE_KEYS = (
    "id",
    "index",
    "name",
    "slices",
    "instances",
    "multiprocessors",
    "copy_engines",
    "decoders",
    "encoders",
    "jpeg_engines",
    "ofa_engines",
    "memory_mib",
    "placements",
)
_BUS_ID = re.compile(r"^(?:([0-9a-fA-F]{4}|[0-9a-fA-F]{8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_GPU_UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_ARCHES = {a.name.lower(): a for a in Architecture if a is not Architecture.UNKNOWN}


# --- entry points --------------------------------------------------------------------------------


def preset_names() -> tuple[str, ...]:
    folder = resources.files("dra_driver.nvml.fake").joinpath("presets")
    return tuple(sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")))


def load_preset(name: str, *, seed: str | None = None) -> NodeSpec:
    names = preset_names()
    if name not in names:
        raise ValueError(f"unknown fake NVML preset {name!r}; valid presets: {', '.join(names)}")
    text = resources.files("dra_driver.nvml.fake").joinpath("presets", f"{name}.yaml").read_text()
    return parse_node_text(text, source=f"preset {name}", seed=seed)


def load_node_file(path: Path | str, *, seed: str | None = None) -> NodeSpec:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"cannot read fake node file {path}: {exc.strerror}") from None
    return parse_node_text(text, source=str(path), seed=seed)


def parse_node_text(text: str, *, source: str = "node file", seed: str | None = None) -> NodeSpec:
    try:
        doc: object = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{source}: not valid YAML: {exc}") from None
    try:
        return parse_node(doc, seed=seed)
    except SpecError as exc:
        raise SpecError(exc.path, f"{exc.problem} (in {source})") from None


# --- the node ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Group:
    """One `gpus[i]` entry, after validation, before slots get indices."""

    path: str
    model: GpuModel
    count: int
    numa: tuple[int, ...] | None
    bus_ids: tuple[str, ...] | None
    minors: tuple[int, ...] | None
    uuids: tuple[str, ...] | None
    mig_enabled: bool
    instances: Sequence[object]


def parse_node(doc: object, *, seed: str | None = None) -> NodeSpec:
    """Validate a decoded node document and resolve it into a NodeSpec."""
    top = as_mapping(doc, "")
    check_keys(top, "", _TOP_KEYS, required=("gpus",))
    name = as_str(top.get("name", "fake-node"), "name")
    system = _system(top)
    numa_nodes = _numa_nodes(top.get("numa_nodes"))
    groups = [
        _group(item, join("gpus", i), numa_nodes) for i, item in enumerate(as_list(top["gpus"], "gpus", min_len=1))
    ]
    total = sum(g.count for g in groups)
    if total > MAX_GPUS:
        raise SpecError("gpus", f"{total} GPUs in total; at most {MAX_GPUS} are supported")
    slots = _slots(groups, numa_nodes, seed if seed is not None else name)
    slots = _apply_pcie(top.get("pcie"), slots)
    slots = _apply_nvlink(top.get("nvlink", "none"), slots)
    slots = _apply_fabric(top.get("fabric", "auto"), slots)
    slots = _apply_instances(groups, slots)
    return NodeSpec(name=name, system=system, numa_nodes=numa_nodes, gpus=tuple(slots))


def _system(top: Mapping[str, object]) -> SystemInfo:
    driver = as_str(top.get("driver_version", DEFAULT_DRIVER), "driver_version")
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?", driver):
        raise SpecError("driver_version", f"expected a version like {DEFAULT_DRIVER!r}, got {driver!r}")
    cuda = as_int(top.get("cuda_driver_version", DEFAULT_CUDA), "cuda_driver_version", minimum=1000)
    nvml = as_str(top.get("nvml_version", f"{cuda // 1000}.{driver}"), "nvml_version")
    return SystemInfo(driver_version=driver, cuda_driver_version=cuda, nvml_version=nvml)


def _numa_nodes(value: object) -> tuple[tuple[int, tuple[int, ...]], ...]:
    if value is None:
        return ((0, ()),)  # one node, CPUs unknown
    if not isinstance(value, Mapping) or not value:
        raise SpecError("numa_nodes", f"expected a non-empty mapping of node id -> CPU list, got {type_name(value)}")
    nodes: list[tuple[int, tuple[int, ...]]] = []
    seen: dict[int, int] = {}
    for key, cpus_text in value.items():
        path = join("numa_nodes", str(key))
        if isinstance(key, str) and key.isdigit():
            key = int(key)
        node = as_int(key, path, minimum=0, maximum=63)
        cpus = parse_cpu_list(cpus_text, path)
        for cpu in cpus:
            if cpu in seen:
                raise SpecError(path, f"CPU {cpu} is already in NUMA node {seen[cpu]}")
            seen[cpu] = node
        nodes.append((node, cpus))
    return tuple(sorted(nodes))


def _int_list(value: object, path: str, count: int, *, maximum: int | None = None) -> tuple[int, ...]:
    items = as_list(value, path)
    if len(items) != count:
        raise SpecError(path, f"has {len(items)} entries but count is {count}; give one per GPU")
    return tuple(as_int(v, join(path, i), minimum=0, maximum=maximum) for i, v in enumerate(items))


def _group(item: object, path: str, numa_nodes: tuple[tuple[int, tuple[int, ...]], ...]) -> _Group:
    m = as_mapping(item, path)
    check_keys(m, path, _GROUP_KEYS, required=("model",))
    model = _model(m["model"], join(path, "model"))
    count = as_int(m.get("count", 1), join(path, "count"), minimum=1, maximum=MAX_GPUS)
    numa: tuple[int, ...] | None = None
    if "numa" in m:
        raw = m["numa"]
        numa = (
            (as_int(raw, join(path, "numa"), minimum=0),) * count
            if not isinstance(raw, list)
            else _int_list(raw, join(path, "numa"), count)
        )
        known = [n for n, _ in numa_nodes]
        for i, n in enumerate(numa):
            if n not in known:
                where = join(path, "numa") if not isinstance(raw, list) else join(join(path, "numa"), i)
                raise SpecError(where, f"NUMA node {n} is not declared in numa_nodes (declared: {known})")
    bus_ids = None
    if "bus_ids" in m:
        items = as_list(m["bus_ids"], join(path, "bus_ids"))
        if len(items) != count:
            raise SpecError(join(path, "bus_ids"), f"has {len(items)} entries but count is {count}; give one per GPU")
        bus_ids = tuple(normalise_bus_id(v, join(join(path, "bus_ids"), i)) for i, v in enumerate(items))
    minors = _int_list(m["minors"], join(path, "minors"), count, maximum=255) if "minors" in m else None
    uuids = None
    if "uuids" in m:
        items = as_list(m["uuids"], join(path, "uuids"))
        if len(items) != count:
            raise SpecError(join(path, "uuids"), f"has {len(items)} entries but count is {count}; give one per GPU")
        uuids = tuple(_gpu_uuid(v, join(join(path, "uuids"), i)) for i, v in enumerate(items))
    mig_enabled = _mig_mode(m.get("mig", "disabled"), join(path, "mig"))
    if mig_enabled and not model.mig_capable:
        raise SpecError(join(path, "mig"), f"{model.name} is not MIG-capable; use mig: disabled")
    instances = as_list(m.get("instances", []), join(path, "instances"))
    if instances and not mig_enabled:
        raise SpecError(join(path, "instances"), "pre-created MIG instances need mig: enabled")
    return _Group(path, model, count, numa, bus_ids, minors, uuids, mig_enabled, instances)


def _mig_mode(value: object, path: str) -> bool:
    if isinstance(value, bool):
        return value
    return as_choice(value, path, ("enabled", "disabled")) == "enabled"


def _default_bus_id(index: int) -> str:
    """Spread like a real chassis (13 buses apart) up to 16 GPUs; wider test nodes use further PCI domains."""
    domain, slot = divmod(index, 16)
    return f"{domain:04x}:{0x18 + 0x0D * slot:02x}:00.0"


def normalise_bus_id(value: object, path: str) -> str:
    """Accept "0000:1b:00.0", "00000000:1B:00.0" (NVML) or "1b:00.0"; return "0000:1b:00.0"."""
    text = as_str(value, path)
    match = _BUS_ID.match(text)
    if match is None:
        raise SpecError(path, f'bad PCI bus id {text!r}; write it like "0000:1b:00.0"')
    domain, bus, device, function = match.groups()
    domain_value = int(domain or "0", 16)
    if domain_value > 0xFFFF:
        raise SpecError(path, f"PCI domain of {text!r} is larger than ffff")
    return f"{domain_value:04x}:{bus.lower()}:{device.lower()}.{function}"


def _gpu_uuid(value: object, path: str) -> str:
    text = as_str(value, path)
    if not _GPU_UUID.match(text):
        raise SpecError(path, f'bad GPU uuid {text!r}; write it like "GPU-{uuid.UUID(int=0)}" (lower-case hex)')
    return text


def _slots(groups: list[_Group], numa_nodes: tuple[tuple[int, tuple[int, ...]], ...], seed: str) -> list[GpuSlot]:
    total = sum(g.count for g in groups)
    node_ids = [n for n, _ in numa_nodes]
    slots: list[GpuSlot] = []
    where: dict[str, str] = {}  # bus id / uuid / minor -> field path, for duplicate errors
    for group in groups:
        for k in range(group.count):
            index = len(slots)
            # Spread GPUs evenly over NUMA nodes in index order unless the file says otherwise.
            numa = group.numa[k] if group.numa is not None else node_ids[index * len(node_ids) // total]
            bus_id = group.bus_ids[k] if group.bus_ids is not None else _default_bus_id(index)
            gpu_uuid = (
                group.uuids[k]
                if group.uuids is not None
                else "GPU-" + str(uuid.uuid5(FAKE_UUID_NAMESPACE, f"{seed}/gpu/{index}"))
            )
            minor = group.minors[k] if group.minors is not None else index
            for kind, value, field in (
                ("bus id", bus_id, "bus_ids"),
                ("uuid", gpu_uuid, "uuids"),
                ("minor", str(minor), "minors"),
            ):
                key = f"{kind}={value}"
                if key in where:
                    raise SpecError(join(join(group.path, field), k), f"{kind} {value} is already used by {where[key]}")
                where[key] = f"GPU {index} ({group.path})"
            slots.append(
                GpuSlot(
                    index=index,
                    minor=minor,
                    uuid=gpu_uuid,
                    bus_id=bus_id,
                    serial=f"{int(gpu_uuid[4:].replace('-', '')[:12], 16) % 10**13:013d}",
                    numa_node=numa,
                    pcie_root="",
                    pcie_switch=0,
                    model=group.model,
                    mig_enabled=group.mig_enabled,
                )
            )
    return slots


def _apply_pcie(value: object, slots: list[GpuSlot]) -> list[GpuSlot]:
    """Group GPUs under PCIe switches and root complexes, in index order."""
    m = as_mapping(value if value is not None else {}, "pcie")
    check_keys(m, "pcie", ("gpus_per_switch", "switches_per_root"))
    per_switch = as_int(m.get("gpus_per_switch", 2), "pcie.gpus_per_switch", minimum=1)
    per_root = as_int(m.get("switches_per_root", 1), "pcie.switches_per_root", minimum=1)
    out: list[GpuSlot] = []
    root_of: dict[int, GpuSlot] = {}  # root number -> first GPU under it
    for slot in slots:
        switch = slot.index // per_switch
        root = switch // per_root
        first = root_of.setdefault(root, slot)
        if first.numa_node != slot.numa_node:
            raise SpecError(
                "pcie",
                f"GPUs {first.index} and {slot.index} share a PCIe root complex but sit on NUMA nodes "
                f"{first.numa_node} and {slot.numa_node}; lower pcie.gpus_per_switch / pcie.switches_per_root "
                "or change the GPUs' numa",
            )
        domain, bus = first.bus_id.split(":")[:2]
        out.append(replace(slot, pcie_switch=switch, pcie_root=f"pci{domain}:{bus}"))
    return out


def _apply_nvlink(value: object, slots: list[GpuSlot]) -> list[GpuSlot]:
    if isinstance(value, str):
        if value == "direct":
            raise SpecError("nvlink", "direct NVLinks need pairs: write nvlink: {kind: direct, pairs: [[0, 1]]}")
        value = {"kind": as_choice(value, "nvlink", ("none", "nvswitch", "direct"))}
    m = as_mapping(value, "nvlink")
    check_keys(m, "nvlink", ("kind", "switches", "links_per_gpu", "pairs"), required=("kind",))
    kind = as_choice(m["kind"], "nvlink.kind", ("none", "nvswitch", "direct"))
    extra = {
        "none": ("switches", "links_per_gpu", "pairs"),
        "nvswitch": ("pairs",),
        "direct": ("switches", "links_per_gpu"),
    }
    for key in extra[kind]:
        if key in m:
            raise SpecError(join("nvlink", key), f"does not apply to kind {kind}")
    if kind == "none":
        return slots
    if kind == "nvswitch":
        return _nvswitch(m, slots)
    return _direct(m, slots)


def _nvswitch(m: Mapping[str, object], slots: list[GpuSlot]) -> list[GpuSlot]:
    switches = as_int(m.get("switches", 4), "nvlink.switches", minimum=1, maximum=12)
    # NVSwitches take the lowest free buses from 0x04 up, so they never collide with a GPU.
    gpu_buses = {s.bus_id for s in slots}
    free = (f"0000:{bus:02x}:00.0" for bus in range(0x04, 0x100))
    switch_ids = tuple(b for b in free if b not in gpu_buses)[:switches]
    override = m.get("links_per_gpu")
    wired: dict[int, int] = {}
    for slot in slots:
        links = (
            slot.model.nvlink_links
            if override is None
            else as_int(override, "nvlink.links_per_gpu", minimum=1, maximum=36)
        )
        if links:
            wired[slot.index] = links
    out = []
    for slot in slots:
        links = wired.get(slot.index, 0)
        nvlinks = tuple(
            NvLink(link=i, remote_type=NvLinkRemoteType.SWITCH, remote_pci_bus_id=switch_ids[i % switches])
            for i in range(links)
        )
        peers = frozenset(i for i in wired if i != slot.index) if links else frozenset()
        out.append(replace(slot, nvlinks=nvlinks, nvlink_peers=peers))
    return out


def _direct(m: Mapping[str, object], slots: list[GpuSlot]) -> list[GpuSlot]:
    pairs = as_list(m.get("pairs"), "nvlink.pairs", min_len=1) if "pairs" in m else []
    if not pairs:
        raise SpecError("nvlink.pairs", "required for kind direct, e.g. pairs: [[0, 1], [2, 3]]")
    links: dict[int, list[NvLink]] = {s.index: [] for s in slots}
    peers: dict[int, set[int]] = {s.index: set() for s in slots}
    for p, raw in enumerate(pairs):
        path = join("nvlink.pairs", p)
        items = as_list(raw, path)
        if len(items) not in (2, 3):
            raise SpecError(path, "write [gpu_a, gpu_b] or [gpu_a, gpu_b, links]")
        a = as_int(items[0], join(path, 0), minimum=0, maximum=len(slots) - 1)
        b = as_int(items[1], join(path, 1), minimum=0, maximum=len(slots) - 1)
        if a == b:
            raise SpecError(path, "a GPU cannot be linked to itself")
        if b in peers[a]:
            raise SpecError(path, f"GPUs {a} and {b} are already paired")
        default = min(slots[a].model.nvlink_links, slots[b].model.nvlink_links)
        count = as_int(items[2], join(path, 2), minimum=1) if len(items) == 3 else default
        if count == 0:
            raise SpecError(
                path,
                f"{slots[a].model.name if not slots[a].model.nvlink_links else slots[b].model.name} has no NVLinks",
            )
        for me, other in ((a, b), (b, a)):
            budget = slots[me].model.nvlink_links
            if len(links[me]) + count > budget:
                raise SpecError(
                    path, f"GPU {me} ({slots[me].model.name}) has only {budget} NVLinks; give explicit link counts"
                )
            for _ in range(count):
                links[me].append(
                    NvLink(link=len(links[me]), remote_type=NvLinkRemoteType.GPU, remote_pci_bus_id=slots[other].bus_id)
                )
            peers[me].add(other)
    return [replace(s, nvlinks=tuple(links[s.index]), nvlink_peers=frozenset(peers[s.index])) for s in slots]


def _apply_fabric(value: object, slots: list[GpuSlot]) -> list[GpuSlot]:
    if value == "auto":
        # HGX/DGX Hopper+ boards behind NVSwitches report a completed fabric with no cluster (§1.5).
        completed = FabricInfo(FabricState.COMPLETED, NvmlReturn.SUCCESS, 0, ZERO_UUID)
        return [
            replace(s, fabric=completed)
            if s.model.architecture >= Architecture.HOPPER
            and any(n.remote_type is NvLinkRemoteType.SWITCH for n in s.nvlinks)
            else s
            for s in slots
        ]
    if value == "none" or value is None:
        return slots
    m = as_mapping(value, "fabric")
    check_keys(m, "fabric", ("state", "status", "clique_id", "cluster_uuid"), required=("state",))
    state = as_choice(m["state"], "fabric.state", [s.name.lower() for s in FabricState])
    status = as_choice(m.get("status", "success"), "fabric.status", [r.name.lower() for r in NvmlReturn])
    clique = as_int(m.get("clique_id", 0), "fabric.clique_id", minimum=0, maximum=0xFFFFFFFF)
    cluster_text = as_str(m.get("cluster_uuid", ZERO_UUID), "fabric.cluster_uuid")
    try:
        cluster = str(uuid.UUID(cluster_text))
    except ValueError:
        raise SpecError("fabric.cluster_uuid", f"not a UUID: {cluster_text!r}") from None
    info = FabricInfo(FabricState[state.upper()], NvmlReturn[status.upper()], clique, cluster)
    return [replace(s, fabric=info) for s in slots]


def _apply_instances(groups: list[_Group], slots: list[GpuSlot]) -> list[GpuSlot]:
    """Create each group's `instances` on every GPU of the group with the real MIG rules."""
    out = list(slots)
    first = 0
    for group in groups:
        for k in range(group.count):
            slot = out[first + k]
            gpu = GpuState(uuid=slot.uuid, mig_current=True, mig_pending=True)
            for i, item in enumerate(group.instances):
                gpu = _create_instance(slot.model, gpu, item, join(join(group.path, "instances"), i))
            out[first + k] = replace(slot, instances=gpu.gis)
        first += group.count
    return out


def _create_instance(model: GpuModel, gpu: GpuState, item: object, path: str) -> GpuState:
    m = as_mapping(item, path)
    check_keys(m, path, ("profile", "start", "compute_instances"), required=("profile",))
    spec = model.mig
    assert spec is not None  # _group checked that MIG is enabled, which needs a MIG-capable model
    profile = _find_profile(spec, m["profile"], join(path, "profile"))
    if "start" in m:
        start = as_int(m["start"], join(path, "start"), minimum=0)
        candidates = [Placement(start, profile.placements[0].size)]
    else:
        candidates = list(profile.placements)
    gi: GiState | None = None
    error: NvmlError | None = None
    for placement in candidates:
        try:
            gpu, gi = create_gpu_instance(model, gpu, profile.id, placement)
            break
        except NvmlError as exc:
            error = exc
    if gi is None:
        detail = error.detail if error is not None else "no placement"
        raise SpecError(path, f"cannot create {profile.name}: {detail}")
    ci_sizes = m.get("compute_instances", [profile.slice_count])
    offered = {p.slice_count: p.id for p in ci_profiles_for(profile)}
    for j, raw in enumerate(as_list(ci_sizes, join(path, "compute_instances"))):
        cpath = join(join(path, "compute_instances"), j)
        size = as_int(raw, cpath, minimum=1)
        if size not in offered:
            raise SpecError(cpath, f"{profile.name} offers compute instances of {sorted(offered)} slice(s), not {size}")
        try:
            gpu, _ = create_compute_instance(model, gpu, gi.id, offered[size])
        except NvmlError as exc:
            raise SpecError(cpath, f"cannot create a {size}-slice compute instance: {exc.detail}") from None
    return gpu


def _find_profile(spec: MigSpec, value: object, path: str) -> GpuInstanceProfile:
    if isinstance(value, int) and not isinstance(value, bool):
        found = spec.profile(value)
    else:
        found = spec.profile_named(as_str(value, path))
    if found is None:
        known = ", ".join(f"{p.name} (id {p.id})" for p in spec.profiles)
        raise SpecError(path, f"unknown MIG profile {value!r}; known: {known}")
    return found


# --- models --------------------------------------------------------------------------------------


def _model(value: object, path: str) -> GpuModel:
    if isinstance(value, str):
        found = find_model(value)
        if found is None:
            raise SpecError(path, f"unknown model {value!r}; known: {', '.join(known_model_keys())}")
        return found
    m = as_mapping(value, path)
    check_keys(m, path, _MODEL_KEYS)
    base: GpuModel | None = None
    if "base" in m:
        base = _model(as_str(m["base"], join(path, "base")), join(path, "base"))
    else:
        for key in ("name", "architecture", "compute_capability", "memory_mib", "pci_device_id", "multiprocessors"):
            if key not in m:
                raise SpecError(
                    join(path, key), "required for an inline model without base (or set base: <known model>)"
                )

    def pick_int(key: str, fallback: int, minimum: int = 0, maximum: int | None = None) -> int:
        return as_int(m[key], join(path, key), minimum=minimum, maximum=maximum) if key in m else fallback

    arch = base.architecture if base is not None else Architecture.UNKNOWN
    if "architecture" in m:
        arch = _ARCHES[as_choice(str(m["architecture"]).lower(), join(path, "architecture"), _ARCHES)]
    cc = base.compute_capability if base is not None else (0, 0)
    if "compute_capability" in m:
        cc_items = as_list(m["compute_capability"], join(path, "compute_capability"))
        if len(cc_items) != 2:
            raise SpecError(join(path, "compute_capability"), "write [major, minor], e.g. [9, 0]")
        cc = (
            as_int(cc_items[0], join(path, "compute_capability[0]")),
            as_int(cc_items[1], join(path, "compute_capability[1]")),
        )
    name = as_str(m["name"], join(path, "name")) if "name" in m else (base.name if base is not None else "")
    brand = as_str(m["brand"], join(path, "brand")) if "brand" in m else (base.brand if base is not None else "Nvidia")
    mig = base.mig if base is not None else None
    if "mig" in m:
        mig = _mig_spec(m["mig"], join(path, "mig"))
    return GpuModel(
        key=f"inline:{name}",
        name=name,
        architecture=arch,
        compute_capability=cc,
        memory_mib=pick_int("memory_mib", base.memory_mib if base else 0, minimum=1),
        pci_device_id=pick_int("pci_device_id", base.pci_device_id if base else 0, maximum=0xFFFFFFFF),
        multiprocessors=pick_int("multiprocessors", base.multiprocessors if base else 0, minimum=1),
        nvlink_links=pick_int("nvlink_links", base.nvlink_links if base else 0, maximum=36),
        brand=brand,
        mig=mig,
    )


def _mig_spec(value: object, path: str) -> MigSpec | None:
    if value == "none":
        return None
    m = as_mapping(value, path)
    if "from" in m:
        check_keys(m, path, ("from",))
        source = as_str(m["from"], join(path, "from"))
        model = find_model(source)
        mig_models = [c.key for c in CATALOG if c.mig is not None]
        if model is None or model.mig is None:
            raise SpecError(join(path, "from"), f"unknown MIG-capable model {source!r}; known: {', '.join(mig_models)}")
        return model.mig
    check_keys(
        m,
        path,
        ("memory_slices", "compute_slices", "profiles"),
        required=("memory_slices", "compute_slices", "profiles"),
    )
    memory_slices = as_int(m["memory_slices"], join(path, "memory_slices"), minimum=1, maximum=8)
    if memory_slices & (memory_slices - 1):
        raise SpecError(join(path, "memory_slices"), f"must be a power of two (1, 2, 4 or 8), got {memory_slices}")
    compute_slices = as_int(m["compute_slices"], join(path, "compute_slices"), minimum=1, maximum=8)
    profiles = [
        _profile(item, join(join(path, "profiles"), i), memory_slices, compute_slices)
        for i, item in enumerate(as_list(m["profiles"], join(path, "profiles"), min_len=1))
    ]
    for attr in ("id", "index", "name"):
        seen: set[object] = set()
        for i, p in enumerate(profiles):
            if getattr(p, attr) in seen:
                raise SpecError(
                    join(join(join(path, "profiles"), i), attr), f"duplicate profile {attr} {getattr(p, attr)!r}"
                )
            seen.add(getattr(p, attr))
    return MigSpec(memory_slices, compute_slices, tuple(sorted(profiles, key=lambda p: p.index)))


def _profile(item: object, path: str, memory_slices: int, compute_slices: int) -> GpuInstanceProfile:
    m = as_mapping(item, path)
    check_keys(m, path, _PROFILE_KEYS, required=_PROFILE_KEYS)

    def num(key: str, minimum: int = 0) -> int:
        return as_int(m[key], join(path, key), minimum=minimum)

    slices = as_int(m["slices"], join(path, "slices"), minimum=1, maximum=compute_slices)
    placements: list[Placement] = []
    for i, raw in enumerate(as_list(m["placements"], join(path, "placements"), min_len=1)):
        ppath = join(join(path, "placements"), i)
        text = as_str(raw, ppath)
        start_text, sep, size_text = text.partition(":")
        if not sep or not start_text.isdigit() or not size_text.isdigit():
            raise SpecError(ppath, f'write a placement as "start:size" in memory slices, e.g. "4:4"; got {text!r}')
        placement = Placement(int(start_text), int(size_text))
        if (
            placement.size == 0
            or placement.size & (placement.size - 1)
            or placement.start + placement.size > memory_slices
        ):
            raise SpecError(
                ppath, f"placement {text} must have a power-of-two size and fit in {memory_slices} memory slices"
            )
        if placements and placement.size != placements[0].size:
            raise SpecError(ppath, "every placement of a profile has the same size")
        placements.append(placement)
    return GpuInstanceProfile(
        index=num("index"),
        id=num("id"),
        name=as_str(m["name"], join(path, "name")),
        slice_count=slices,
        instance_count=num("instances", 1),
        multiprocessors=num("multiprocessors", 1),
        copy_engines=num("copy_engines"),
        decoders=num("decoders"),
        encoders=num("encoders"),
        jpeg_engines=num("jpeg_engines"),
        ofa_engines=num("ofa_engines"),
        memory_mib=num("memory_mib", 1),
        placements=tuple(placements),
    )
