"""Node description files (YAML) and the built-in presets -> NodeSpec, validated strictly.

The format is documented in docs/fake-nvml.md; the presets in presets/*.yaml use the same format,
so every preset doubles as a worked example. The document models below check shapes, types, ranges
and what one part of a file says about another, reporting every mistake at once; resolving a valid
document into GPU slots then applies the hardware rules (unique identities, NVLink budgets, MIG
instances that fit). Errors name the field: `gpus[2].model: unknown model 'H900'; known: ...`.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, Self

import yaml
from pydantic import AfterValidator, BeforeValidator, Discriminator, Field, Tag, model_validator

from dra_driver.nvml.fake.mig import ci_profiles_for, create_compute_instance, create_gpu_instance
from dra_driver.nvml.fake.models import CATALOG, GpuModel, MigSpec, find_model, known_model_keys
from dra_driver.nvml.fake.node import GpuSlot, NodeSpec
from dra_driver.nvml.fake.pci import PciDoc, pci_spec
from dra_driver.nvml.fake.state import ZERO_UUID, FabricDoc, GiState, GpuState
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
from dra_driver.strictdecode import (
    BOOLEAN,
    BY_TYPE,
    INTEGER,
    LIST,
    OBJECT,
    STRING,
    DecodeError,
    Decoder,
    Items,
    Loc,
    NonEmpty,
    NonNegative,
    Opt,
    Positive,
    Problem,
    StrictModel,
    by_name,
    load_yaml,
    rejected,
)

# Fixed namespace so that generated GPU UUIDs are stable across runs and machines.
FAKE_UUID_NAMESPACE = uuid.UUID("6f1c0e8a-3d5b-5c2e-9a47-1b2d3c4e5f60")
MAX_GPUS = 128  # beyond any real chassis, so tests and benchmarks can offer many distinct devices
DEFAULT_DRIVER = "580.105.08"
DEFAULT_CUDA = 13000

_BUS_ID = re.compile(r"^(?:([0-9a-fA-F]{4}|[0-9a-fA-F]{8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_GPU_UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


class SpecError(DecodeError):
    """A node description is invalid. The message starts with the field path."""


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
        doc: object = load_yaml(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{source}: not valid YAML: {exc}") from None
    try:
        return parse_node(doc, seed=seed)
    except SpecError as exc:
        raise SpecError.of([Problem(p.path, f"{p.message} (in {source})") for p in exc.problems]) from None


# --- field types ---------------------------------------------------------------------------------


def _catalog_model(key: str) -> GpuModel:
    found = find_model(key)
    if found is None:
        raise ValueError(f"unknown model {key!r}; known: {', '.join(known_model_keys())}")
    return found


def _known_model(key: str) -> str:
    _catalog_model(key)
    return key


def _mig_model(key: str) -> str:
    found = find_model(key)
    if found is None or found.mig is None:
        known = ", ".join(m.key for m in CATALOG if m.mig is not None)
        raise ValueError(f"unknown MIG-capable model {key!r}; known: {known}")
    return key


def normalise_bus_id(text: str) -> str:
    """Accept "0000:1b:00.0", "00000000:1B:00.0" (NVML) or "1b:00.0"; return "0000:1b:00.0"."""
    match = _BUS_ID.match(text)
    if match is None:
        raise ValueError(f'bad PCI bus id {text!r}; write it like "0000:1b:00.0"')
    domain, bus, device, function = match.groups()
    domain_value = int(domain or "0", 16)
    if domain_value > 0xFFFF:
        raise ValueError(f"PCI domain of {text!r} is larger than ffff")
    return f"{domain_value:04x}:{bus.lower()}:{device.lower()}.{function}"


def _gpu_uuid(text: str) -> str:
    if not _GPU_UUID.match(text):
        raise ValueError(f'bad GPU uuid {text!r}; write it like "GPU-{uuid.UUID(int=0)}" (lower-case hex)')
    return text


def _driver_version(text: str) -> str:
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?", text):
        raise ValueError(f"expected a version like {DEFAULT_DRIVER!r}, got {text!r}")
    return text


def _cpu_text(value: object) -> object:
    """Linux cpulist text ("0-55,112-167") -> CPU ids; a list, or one id, is checked item by item."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if not isinstance(value, str):
        return value
    cpus: list[int] = []
    for part in (p.strip() for p in value.split(",")):
        lo_text, sep, hi_text = part.partition("-")
        try:
            lo = int(lo_text)
            hi = int(hi_text) if sep else lo
        except ValueError:
            raise ValueError(f'bad CPU list item {part!r}; write e.g. "0-55,112-167"') from None
        if lo < 0 or hi < lo:
            raise ValueError(f"bad CPU range {part!r}; write low-high with low <= high")
        cpus.extend(range(lo, hi + 1))
    return cpus


def _sorted_unique(cpus: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sorted(set(cpus)))


def _numa_id(key: object) -> object:
    # YAML reads `0:` as an integer key and `"0":` as a string; both mean node 0.
    return int(key) if isinstance(key, str) and key.isdigit() else key


def _placement(value: object) -> Placement:
    start, sep, size = value.partition(":") if isinstance(value, str) else ("", "", "")
    if not sep or not start.isdigit() or not size.isdigit():
        raise ValueError(f'write a placement as "start:size" in memory slices, e.g. "4:4"; got {value!r}')
    return Placement(int(start), int(size))


def _power_of_two(n: int) -> int:
    if n & (n - 1):
        raise ValueError(f"must be a power of two (1, 2, 4 or 8), got {n}")
    return n


def _pair(pair: tuple[int, ...]) -> tuple[int, ...]:
    if len(pair) not in (2, 3):
        raise ValueError("write [gpu_a, gpu_b] or [gpu_a, gpu_b, links]")
    if pair[0] == pair[1]:
        raise ValueError("a GPU cannot be linked to itself")
    if len(pair) == 3 and pair[2] < 1:
        raise rejected([((2,), f"must be >= 1 (links), got {pair[2]}")])
    return pair


def _no_bare_direct(kind: str) -> str:
    if kind == "direct":
        raise ValueError("direct NVLinks need pairs: write nvlink: {kind: direct, pairs: [[0, 1]]}")
    return kind


CpuList = Annotated[Items[NonNegative], BeforeValidator(_cpu_text), AfterValidator(_sorted_unique)]
NumaId = Annotated[int, BeforeValidator(_numa_id), Field(ge=0, le=63)]
KnownModel = Annotated[str, AfterValidator(_known_model)]


# --- the document --------------------------------------------------------------------------------


class _Pcie(StrictModel):
    gpus_per_switch: Positive = 2
    switches_per_root: Positive = 1


class _NvLink(StrictModel):
    kind: Literal["none", "nvswitch", "direct"]
    switches: Annotated[int, Field(ge=1, le=18)] = 4  # 18: the NVLink switch chips of an NVL72 rack
    links_per_gpu: Annotated[int, Field(ge=1, le=36)] | None = None  # None: the model's NVLink count
    pairs: Opt[Items[Annotated[Items[NonNegative], AfterValidator(_pair)]]] = None

    @model_validator(mode="after")
    def _fits_kind(self) -> Self:
        foreign = {
            "none": ("switches", "links_per_gpu", "pairs"),
            "nvswitch": ("pairs",),
            "direct": ("switches", "links_per_gpu"),
        }[self.kind]
        problems: list[tuple[Loc, str]] = [
            ((key,), f"does not apply to kind {self.kind}") for key in foreign if key in self.model_fields_set
        ]
        if self.kind == "direct" and not self.pairs:
            problems.append((("pairs",), "required for kind direct, e.g. pairs: [[0, 1], [2, 3]]"))
        if problems:
            raise rejected(problems)
        return self


class _Profile(StrictModel):
    """A GPU-instance profile of an inline MIG table: GpuInstanceProfile's fields, two of them spelt shorter."""

    id: NonNegative
    index: NonNegative
    name: NonEmpty
    slice_count: Annotated[Positive, Field(alias="slices")]
    instance_count: Annotated[Positive, Field(alias="instances")]
    multiprocessors: Positive
    copy_engines: NonNegative
    decoders: NonNegative
    encoders: NonNegative
    jpeg_engines: NonNegative
    ofa_engines: NonNegative
    memory_mib: Positive
    placements: Annotated[Items[Annotated[Placement, BeforeValidator(_placement)]], Field(min_length=1)]

    def value(self) -> GpuInstanceProfile:
        return GpuInstanceProfile(**dict(self))


class _MigTable(StrictModel):
    memory_slices: Annotated[int, Field(ge=1, le=8), AfterValidator(_power_of_two)]
    compute_slices: Annotated[int, Field(ge=1, le=8)]
    profiles: Annotated[Items[_Profile], Field(min_length=1)]

    @model_validator(mode="after")
    def _profiles_fit(self) -> Self:
        problems: list[tuple[Loc, str]] = []
        for i, profile in enumerate(self.profiles):
            if profile.slice_count > self.compute_slices:
                problems.append((("profiles", i, "slices"), f"must be <= compute_slices ({self.compute_slices})"))
            for j, p in enumerate(profile.placements):
                if p.size & (p.size - 1) or p.size == 0 or p.start + p.size > self.memory_slices:
                    message = f"must have a power-of-two size and fit in {self.memory_slices} memory slices"
                elif p.size != profile.placements[0].size:
                    message = "every placement of a profile has the same size"
                else:
                    continue
                problems.append((("profiles", i, "placements", j), f"placement {p.start}:{p.size} {message}"))
        for attr in ("id", "index", "name"):
            seen: set[object] = set()
            for i, profile in enumerate(self.profiles):
                if (value := getattr(profile, attr)) in seen:
                    problems.append((("profiles", i, attr), f"duplicate profile {attr} {value!r}"))
                seen.add(value)
        if problems:
            raise rejected(problems)
        return self

    def spec(self) -> MigSpec:
        profiles = sorted((p.value() for p in self.profiles), key=lambda p: p.index)
        return MigSpec(self.memory_slices, self.compute_slices, tuple(profiles))


class _MigFrom(StrictModel):
    source: Annotated[str, AfterValidator(_mig_model), Field(alias="from")]

    def spec(self) -> MigSpec | None:
        return _catalog_model(self.source).mig


def _mig_form(value: Any) -> str:
    return "from" if "from" in value else "table"


_BLANK = GpuModel("", "", Architecture.UNKNOWN, (0, 0), 0, 0, 0, 0)


class _InlineModel(StrictModel):
    base: Opt[KnownModel] = None
    name: Opt[NonEmpty] = None
    architecture: Opt[Annotated[Architecture, by_name(Architecture, any_case=True, skip=[Architecture.UNKNOWN])]] = None
    compute_capability: Opt[
        Annotated[Items[int], Field(min_length=2, max_length=2, description="write [major, minor], e.g. [9, 0]")]
    ] = None
    memory_mib: Opt[Positive] = None
    pci_device_id: Opt[Annotated[int, Field(ge=0, le=0xFFFFFFFF)]] = None
    multiprocessors: Opt[Positive] = None
    nvlink_links: Opt[Annotated[int, Field(ge=0, le=36)]] = None
    brand: Opt[NonEmpty] = None
    mig: Opt[
        Annotated[
            Annotated[Literal["none"], STRING]
            | Annotated[
                Annotated[_MigFrom, Tag("from")] | Annotated[_MigTable, Tag("table")], Discriminator(_mig_form), OBJECT
            ],
            BY_TYPE,
        ]
    ] = None

    @model_validator(mode="after")
    def _complete_without_base(self) -> Self:
        if self.base is None:
            needed = ("name", "architecture", "compute_capability", "memory_mib", "pci_device_id", "multiprocessors")
            missing = [key for key in needed if getattr(self, key) is None]
            if missing:
                message = "required for an inline model without base (or set base: <known model>)"
                raise rejected(((key,), message) for key in missing)
        return self

    def resolve(self) -> GpuModel:
        keys = ("name", "architecture", "memory_mib", "pci_device_id", "multiprocessors", "nvlink_links", "brand")
        given: dict[str, Any] = {k: getattr(self, k) for k in keys if getattr(self, k) is not None}
        if self.compute_capability is not None:
            given["compute_capability"] = (self.compute_capability[0], self.compute_capability[1])
        if self.mig is not None:
            given["mig"] = None if self.mig == "none" else self.mig.spec()
        model = replace(_catalog_model(self.base) if self.base is not None else _BLANK, **given)
        return replace(model, key=f"inline:{model.name}")


class _Instance(StrictModel):
    profile: Annotated[Annotated[NonNegative, INTEGER] | Annotated[NonEmpty, STRING], BY_TYPE]  # id or name
    start: Opt[NonNegative] = None  # placement start; default: the first free placement
    compute_instances: Opt[Items[Positive]] = None  # CI sizes in compute slices; default: one full CI


class _Group(StrictModel):
    model: Annotated[Annotated[KnownModel, STRING] | Annotated[_InlineModel, OBJECT], BY_TYPE]
    count: Annotated[int, Field(ge=1, le=MAX_GPUS)] = 1
    numa: Opt[Annotated[Annotated[NonNegative, INTEGER] | Annotated[Items[NonNegative], LIST], BY_TYPE]] = None
    bus_ids: Opt[Items[Annotated[str, AfterValidator(normalise_bus_id)]]] = None
    minors: Opt[Items[Annotated[int, Field(ge=0, le=255)]]] = None
    uuids: Opt[Items[Annotated[str, AfterValidator(_gpu_uuid)]]] = None
    mig: Annotated[Annotated[bool, BOOLEAN] | Annotated[Literal["enabled", "disabled"], STRING], BY_TYPE] = False
    instances: Items[_Instance] = ()
    # "unsupported": the GPUs answer NOT_SUPPORTED to time-slice calls (like a Tesla P4 to nvidia-smi compute-policy)
    time_slice: Annotated[Literal["supported", "unsupported"], STRING] = "supported"
    # These GPUs' fabric info, overriding the node's `fabric`: one for all, a list with one per GPU, or "none".
    fabric: Opt[
        Annotated[
            Annotated[Literal["none"], STRING] | Annotated[FabricDoc, OBJECT] | Annotated[Items[FabricDoc], LIST],
            BY_TYPE,
        ]
    ] = None
    # PCI class: "3d" (3D controller, datacenter GPUs) or "vga" (display outputs and an HD-audio function .1)
    pci_class: Annotated[Literal["3d", "vga"], STRING] = "3d"

    @property
    def gpu_model(self) -> GpuModel:
        return self.model.resolve() if isinstance(self.model, _InlineModel) else _catalog_model(self.model)

    @property
    def mig_enabled(self) -> bool:
        return self.mig in (True, "enabled")

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        problems: list[tuple[Loc, str]] = []
        for key in ("numa", "bus_ids", "minors", "uuids", "fabric"):
            if isinstance(items := getattr(self, key), tuple) and len(items) != self.count:
                problems.append(((key,), f"has {len(items)} entries but count is {self.count}; give one per GPU"))
        if self.mig_enabled and not self.gpu_model.mig_capable:
            problems.append((("mig",), f"{self.gpu_model.name} is not MIG-capable; use mig: disabled"))
        if self.instances and not self.mig_enabled:
            problems.append((("instances",), "pre-created MIG instances need mig: enabled"))
        if problems:
            raise rejected(problems)
        return self


class _Node(StrictModel):
    name: NonEmpty = "fake-node"
    driver_version: Annotated[str, AfterValidator(_driver_version)] = DEFAULT_DRIVER
    cuda_driver_version: Annotated[int, Field(ge=1000)] = DEFAULT_CUDA
    nvml_version: Opt[NonEmpty] = None  # default: "<CUDA major>.<driver version>"
    numa_nodes: (  # default: one node, CPUs unknown
        Annotated[dict[NumaId, CpuList], Field(min_length=1, description="a mapping of NUMA node id to its CPUs")]
        | None
    ) = None
    pcie: _Pcie | None = None
    nvlink: Annotated[
        Annotated[Literal["none", "nvswitch", "direct"], AfterValidator(_no_bare_direct), STRING]
        | Annotated[_NvLink, OBJECT],
        BY_TYPE,
    ] = "none"
    fabric: (
        Annotated[Annotated[Literal["auto", "none"], STRING] | Annotated[FabricDoc, OBJECT], BY_TYPE] | None
    ) = "auto"
    gpus: Annotated[Items[_Group], Field(min_length=1)]
    pci: PciDoc | None = None  # IOMMU, groups, more functions, faults (nvml/fake/pci.py)

    @model_validator(mode="after")
    def _whole_node(self) -> Self:
        problems: list[tuple[Loc, str]] = []
        total = sum(g.count for g in self.gpus)
        if total > MAX_GPUS:
            problems.append((("gpus",), f"{total} GPUs in total; at most {MAX_GPUS} are supported"))
        owner: dict[int, int] = {}
        for node, cpus in (self.numa_nodes or {}).items():
            taken = next((cpu for cpu in cpus if cpu in owner), None)
            if taken is not None:
                problems.append((("numa_nodes", node), f"CPU {taken} is already in NUMA node {owner[taken]}"))
            owner.update((cpu, node) for cpu in cpus if cpu not in owner)
        declared = sorted(self.numa_nodes or {0: ()})
        for g, group in enumerate(self.gpus):
            numa = group.numa
            for i, n in enumerate(numa if isinstance(numa, tuple) else () if numa is None else (numa,)):
                if n not in declared:
                    loc: Loc = ("gpus", g, "numa", i) if isinstance(numa, tuple) else ("gpus", g, "numa")
                    problems.append((loc, f"NUMA node {n} is not declared in numa_nodes (declared: {declared})"))
        if problems:
            raise rejected(problems)
        return self


_decode = Decoder[_Node](_Node, error=SpecError)


# --- resolving a valid document into GPU slots ---------------------------------------------------


def parse_node(doc: object, *, seed: str | None = None) -> NodeSpec:
    """Validate a decoded node document and resolve it into a NodeSpec."""
    node = _decode(doc)
    numa_nodes = tuple(sorted(node.numa_nodes.items())) if node.numa_nodes is not None else ((0, ()),)
    nvml = node.nvml_version or f"{node.cuda_driver_version // 1000}.{node.driver_version}"
    slots = _slots(node.gpus, numa_nodes, seed if seed is not None else node.name)
    slots = _apply_pcie(node.pcie or _Pcie(), slots)
    slots = _apply_nvlink(node.nvlink if isinstance(node.nvlink, _NvLink) else _NvLink(kind=node.nvlink), slots)
    slots = _apply_fabric(node.fabric, slots)
    slots = _apply_group_fabric(node.gpus, slots)
    slots = _apply_instances(node.gpus, slots)
    spec = NodeSpec(
        name=node.name,
        system=SystemInfo(node.driver_version, node.cuda_driver_version, nvml),
        numa_nodes=numa_nodes,
        gpus=tuple(slots),
        pci=pci_spec(node.pci),
    )
    try:
        spec.initial_pci()
    except ValueError as exc:
        raise SpecError("pci", str(exc)) from None
    return spec


def _default_bus_id(index: int) -> str:
    """Spread like a real chassis (13 buses apart) up to 16 GPUs; wider test nodes use further PCI domains."""
    domain, slot = divmod(index, 16)
    return f"{domain:04x}:{0x18 + 0x0D * slot:02x}:00.0"


def _slots(groups: tuple[_Group, ...], numa_nodes: tuple[tuple[int, tuple[int, ...]], ...], seed: str) -> list[GpuSlot]:
    total = sum(g.count for g in groups)
    node_ids = [n for n, _ in numa_nodes]
    slots: list[GpuSlot] = []
    where: dict[str, str] = {}  # bus id / uuid / minor -> field path, for duplicate errors
    for g, group in enumerate(groups):
        model = group.gpu_model
        for k in range(group.count):
            index = len(slots)
            # Spread GPUs evenly over NUMA nodes in index order unless the file says otherwise.
            numa = node_ids[index * len(node_ids) // total] if group.numa is None else group.numa
            generated = "GPU-" + str(uuid.uuid5(FAKE_UUID_NAMESPACE, f"{seed}/gpu/{index}"))
            gpu_uuid = group.uuids[k] if group.uuids else generated
            bus_id = group.bus_ids[k] if group.bus_ids else _default_bus_id(index)
            minor = group.minors[k] if group.minors else index
            identities = (("bus id", bus_id, "bus_ids"), ("uuid", gpu_uuid, "uuids"), ("minor", minor, "minors"))
            for kind, value, field in identities:
                key = f"{kind}={value}"
                if key in where:
                    raise SpecError(f"gpus[{g}].{field}[{k}]", f"{kind} {value} is already used by {where[key]}")
                where[key] = f"GPU {index} (gpus[{g}])"
            slots.append(
                GpuSlot(
                    index=index,
                    minor=minor,
                    uuid=gpu_uuid,
                    bus_id=bus_id,
                    serial=f"{int(gpu_uuid[4:].replace('-', '')[:12], 16) % 10**13:013d}",
                    numa_node=numa[k] if isinstance(numa, tuple) else numa,
                    pcie_root="",
                    pcie_switch=0,
                    model=model,
                    mig_enabled=group.mig_enabled,
                    time_slice_supported=group.time_slice == "supported",
                    vga=group.pci_class == "vga",
                )
            )
    return slots


def _apply_pcie(pcie: _Pcie, slots: list[GpuSlot]) -> list[GpuSlot]:
    """Group GPUs under PCIe switches and root complexes, in index order."""
    out: list[GpuSlot] = []
    root_of: dict[int, GpuSlot] = {}  # root number -> first GPU under it
    for slot in slots:
        switch = slot.index // pcie.gpus_per_switch
        root = switch // pcie.switches_per_root
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


def _apply_nvlink(nvlink: _NvLink, slots: list[GpuSlot]) -> list[GpuSlot]:
    if nvlink.kind == "none":
        return slots
    if nvlink.kind == "nvswitch":
        return _nvswitch(nvlink, slots)
    return _direct(nvlink.pairs or (), slots)


def _nvswitch(nvlink: _NvLink, slots: list[GpuSlot]) -> list[GpuSlot]:
    # NVSwitches take the lowest free buses from 0x04 up, so they never collide with a GPU.
    gpu_buses = {s.bus_id for s in slots}
    free = (f"0000:{bus:02x}:00.0" for bus in range(0x04, 0x100))
    switch_ids = tuple(b for b in free if b not in gpu_buses)[: nvlink.switches]
    wired = {s.index: nvlink.links_per_gpu or s.model.nvlink_links for s in slots}
    wired = {index: links for index, links in wired.items() if links}
    out = []
    for slot in slots:
        links = wired.get(slot.index, 0)
        nvlinks = tuple(
            NvLink(link=i, remote_type=NvLinkRemoteType.SWITCH, remote_pci_bus_id=switch_ids[i % nvlink.switches])
            for i in range(links)
        )
        peers = frozenset(i for i in wired if i != slot.index) if links else frozenset()
        out.append(replace(slot, nvlinks=nvlinks, nvlink_peers=peers))
    return out


def _direct(pairs: tuple[tuple[int, ...], ...], slots: list[GpuSlot]) -> list[GpuSlot]:
    links: dict[int, list[NvLink]] = {s.index: [] for s in slots}
    peers: dict[int, set[int]] = {s.index: set() for s in slots}
    for p, pair in enumerate(pairs):
        path = f"nvlink.pairs[{p}]"
        for i, gpu in enumerate(pair[:2]):
            if gpu >= len(slots):
                raise SpecError(f"{path}[{i}]", f"GPU {gpu} does not exist; the node has GPUs 0-{len(slots) - 1}")
        a, b = pair[:2]
        if b in peers[a]:
            raise SpecError(path, f"GPUs {a} and {b} are already paired")
        count = pair[2] if len(pair) == 3 else min(slots[a].model.nvlink_links, slots[b].model.nvlink_links)
        if count == 0:
            linkless = slots[a] if not slots[a].model.nvlink_links else slots[b]
            raise SpecError(path, f"{linkless.model.name} has no NVLinks")
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


def _apply_fabric(fabric: FabricDoc | str | None, slots: list[GpuSlot]) -> list[GpuSlot]:
    if fabric == "auto":
        # HGX/DGX Hopper+ boards behind NVSwitches report a completed fabric with no cluster (§1.5).
        completed = FabricInfo(FabricState.COMPLETED, NvmlReturn.SUCCESS, 0, ZERO_UUID)
        return [
            replace(s, fabric=completed)
            if s.model.architecture >= Architecture.HOPPER
            and any(n.remote_type is NvLinkRemoteType.SWITCH for n in s.nvlinks)
            else s
            for s in slots
        ]
    if not isinstance(fabric, FabricDoc):
        return slots
    info = fabric.value()
    return [replace(s, fabric=info) for s in slots]


def _apply_group_fabric(groups: tuple[_Group, ...], slots: list[GpuSlot]) -> list[GpuSlot]:
    """A group's own `fabric` wins over the node's for its GPUs (e.g. one tray whose GPU did not register)."""
    out = list(slots)
    first = 0
    for group in groups:
        for k in range(group.count):
            given = group.fabric
            if given == "none":
                out[first + k] = replace(out[first + k], fabric=None)
            elif isinstance(given, FabricDoc):
                out[first + k] = replace(out[first + k], fabric=given.value())
            elif isinstance(given, tuple):
                out[first + k] = replace(out[first + k], fabric=given[k].value())
        first += group.count
    return out


def _apply_instances(groups: tuple[_Group, ...], slots: list[GpuSlot]) -> list[GpuSlot]:
    """Create each group's `instances` on every GPU of the group with the real MIG rules."""
    out = list(slots)
    first = 0
    for g, group in enumerate(groups):
        for k in range(group.count):
            slot = out[first + k]
            gpu = GpuState(uuid=slot.uuid, mig_current=True, mig_pending=True)
            for i, instance in enumerate(group.instances):
                gpu = _create_instance(slot.model, gpu, instance, f"gpus[{g}].instances[{i}]")
            out[first + k] = replace(slot, instances=gpu.gis)
        first += group.count
    return out


def _create_instance(model: GpuModel, gpu: GpuState, instance: _Instance, path: str) -> GpuState:
    spec = model.mig
    assert spec is not None  # the group was checked to be MIG-enabled, which needs a MIG-capable model
    profile = _find_profile(spec, instance.profile, f"{path}.profile")
    if instance.start is not None:
        candidates = [Placement(instance.start, profile.placements[0].size)]
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
    offered = {p.slice_count: p.id for p in ci_profiles_for(profile)}
    sizes = instance.compute_instances if instance.compute_instances is not None else (profile.slice_count,)
    for j, size in enumerate(sizes):
        cpath = f"{path}.compute_instances[{j}]"
        if size not in offered:
            raise SpecError(cpath, f"{profile.name} offers compute instances of {sorted(offered)} slice(s), not {size}")
        try:
            gpu, _ = create_compute_instance(model, gpu, gi.id, offered[size])
        except NvmlError as exc:
            raise SpecError(cpath, f"cannot create a {size}-slice compute instance: {exc.detail}") from None
    return gpu


def _find_profile(spec: MigSpec, wanted: int | str, path: str) -> GpuInstanceProfile:
    found = spec.profile(wanted) if isinstance(wanted, int) else spec.profile_named(wanted)
    if found is None:
        known = ", ".join(f"{p.name} (id {p.id})" for p in spec.profiles)
        raise SpecError(path, f"unknown MIG profile {wanted!r}; known: {known}")
    return found
