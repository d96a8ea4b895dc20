"""Node description files (YAML) and the built-in presets (JSON) -> NodeSpec, validated strictly.

The format is documented in docs/fake-nvml.md; the presets in presets/*.json use the same format (JSON is YAML
too), so every preset doubles as a worked example. The document readers below check shapes, types, ranges and
what one part of a file says about another, reporting every mistake at once; resolving a valid document into GPU
slots then applies the hardware rules (unique identities, NVLink budgets, MIG instances that fit). Errors name the
field: `gpus[2].model: unknown model 'H900'; known: ...`.

The readers are hand-written (docread.py), not pydantic models: the fake is the NVML of every test, bench and
sandbox node, and its models cost the plugin ≈ 9-11 MiB of RSS and ≈ 0.25 s of CPU at start
(docs/benchmarks.md "Issue 37, item 2"). YAML is loaded only for a node file a user wrote.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar, Literal

from dra_driver.errors import DecodeError, Problem
from dra_driver.nvml.fake.docread import (
    NON_EMPTY,
    NON_NEGATIVE,
    POSITIVE,
    STRING,
    Field,
    Rejected,
    boolean,
    by_type,
    checked,
    choice,
    fail,
    fields,
    given,
    integer,
    items,
    join,
    mapping,
    member_named,
    nullable,
    problems_at,
    string,
    then,
)
from dra_driver.nvml.fake.mig import ci_profiles_for, create_compute_instance, create_gpu_instance
from dra_driver.nvml.fake.models import CATALOG, GpuModel, MigSpec, find_model, known_model_keys
from dra_driver.nvml.fake.node import GpuSlot, NodeSpec
from dra_driver.nvml.fake.pci import NO_PCI_SPEC, PciSpec, read_pci_spec
from dra_driver.nvml.fake.state import ZERO_UUID, GiState, GpuState, read_fabric
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

_BUS_ID = re.compile(r"^(?:([0-9a-fA-F]{4}|[0-9a-fA-F]{8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_GPU_UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


class SpecError(DecodeError):
    """A node description is invalid. The message starts with the field path."""


# --- entry points --------------------------------------------------------------------------------


def preset_names() -> tuple[str, ...]:
    folder = resources.files("dra_driver.nvml.fake").joinpath("presets")
    return tuple(sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json")))


def load_preset(name: str, *, seed: str | None = None) -> NodeSpec:
    """A built-in preset (presets/<name>.json: node files in JSON, which needs no YAML parser at start-up; any
    YAML reader reads them as node files too)."""
    names = preset_names()
    if name not in names:
        raise ValueError(f"unknown fake NVML preset {name!r}; valid presets: {', '.join(names)}")
    text = resources.files("dra_driver.nvml.fake").joinpath("presets", f"{name}.json").read_text()
    return _parsed(json.loads(text), f"preset {name}", seed)


def load_node_file(path: Path | str, *, seed: str | None = None) -> NodeSpec:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"cannot read fake node file {path}: {exc.strerror}") from None
    return parse_node_text(text, source=str(path), seed=seed)


def parse_node_text(text: str, *, source: str = "node file", seed: str | None = None) -> NodeSpec:
    # YAML only for a node file a user wrote: the presets are JSON, so a plugin on a preset never loads it.
    import yaml

    from dra_driver.strictdecode import load_yaml

    try:
        doc: object = load_yaml(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{source}: not valid YAML: {exc}") from None
    return _parsed(doc, source, seed)


def _parsed(doc: object, source: str, seed: str | None) -> NodeSpec:
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


_CPU_ITEMS = items(NON_NEGATIVE)


def _cpu_list(value: object, path: str) -> tuple[int, ...]:
    return tuple(sorted(set(_CPU_ITEMS(checked(_cpu_text, value, path), path))))


_NUMA_ID = integer(0, 63)


def _numa_id(key: object, path: str) -> int:
    # YAML reads `0:` as an integer key and `"0":` as a string (JSON only has the latter); both mean node 0.
    return _NUMA_ID(int(key) if isinstance(key, str) and key.isdigit() else key, path)


def _placement(value: object, path: str) -> Placement:
    start, sep, size = value.partition(":") if isinstance(value, str) else ("", "", "")
    if not sep or not start.isdigit() or not size.isdigit():
        fail(path, f'write a placement as "start:size" in memory slices, e.g. "4:4"; got {value!r}')
    return Placement(int(start), int(size))


def _power_of_two(n: int) -> int:
    if n & (n - 1):
        raise ValueError(f"must be a power of two (1, 2, 4 or 8), got {n}")
    return n


_PAIR_ITEMS = items(NON_NEGATIVE)


def _pair(value: object, path: str) -> tuple[int, ...]:
    pair = _PAIR_ITEMS(value, path)
    if len(pair) not in (2, 3):
        fail(path, "write [gpu_a, gpu_b] or [gpu_a, gpu_b, links]")
    if pair[0] == pair[1]:
        fail(path, "a GPU cannot be linked to itself")
    if len(pair) == 3 and pair[2] < 1:
        fail(join(path, 2), f"must be >= 1 (links), got {pair[2]}")
    return pair


def _bare_nvlink(value: object, path: str) -> _NvLink:
    """`nvlink: none` or `nvlink: nvswitch` (the defaults of an `nvlink` object); `direct` needs pairs."""
    kind = choice(*_NVLINK_KINDS)(value, path)
    if kind == "direct":
        fail(path, "direct NVLinks need pairs: write nvlink: {kind: direct, pairs: [[0, 1]]}")
    return _NvLink("none" if kind == "none" else "nvswitch")


KNOWN_MODEL = string(check=_known_model)


# --- the document --------------------------------------------------------------------------------
# Each part of a node file is a frozen value read by its `read` (docread.py: strict, every problem at once, each at
# its field path); a part's whole-object rules run once its fields are all valid.


@dataclass(frozen=True)
class _Pcie:
    """A node file's PCIe tree: GPUs per switch, switches per root port."""

    gpus_per_switch: int = 2
    switches_per_root: int = 1

    _FIELDS: ClassVar = (Field("gpus_per_switch", POSITIVE, 2), Field("switches_per_root", POSITIVE, 1))

    @classmethod
    def read(cls, value: object, path: str) -> _Pcie:
        return cls(**fields(value, path, cls._FIELDS))


NvLinkKind = Literal["none", "nvswitch", "direct"]
_NVLINK_KINDS = ("none", "nvswitch", "direct")


@dataclass(frozen=True)
class _NvLink:
    """A node file's NVLink wiring: its kind, switch chips and links per GPU."""

    kind: NvLinkKind
    switches: int = 4  # 18: the NVLink switch chips of an NVL72 rack
    links_per_gpu: int | None = None  # None: the model's NVLink count
    pairs: tuple[tuple[int, ...], ...] | None = None

    _FIELDS: ClassVar = (
        Field("kind", choice(*_NVLINK_KINDS), choices=_NVLINK_KINDS),
        Field("switches", integer(1, 18), 4),
        Field("links_per_gpu", nullable(integer(1, 36)), None),
        Field("pairs", items(_pair), None, opt=True),
    )
    _FOREIGN: ClassVar = {"none": ("switches", "links_per_gpu", "pairs"), "nvswitch": ("pairs",),
                          "direct": ("switches", "links_per_gpu")}  # fmt: skip

    @classmethod
    def read(cls, value: object, path: str) -> _NvLink:
        nvlink = cls(**fields(value, path, cls._FIELDS))
        problems: list[tuple[str, str]] = [
            (key, f"does not apply to kind {nvlink.kind}") for key in cls._FOREIGN[nvlink.kind] if given(value, key)
        ]
        if nvlink.kind == "direct" and not nvlink.pairs:
            problems.append(("pairs", "required for kind direct, e.g. pairs: [[0, 1], [2, 3]]"))
        if problems:
            raise problems_at(path, problems)
        return nvlink


_PLACEMENTS = items(_placement, min_len=1)


def _profile(value: object, path: str) -> GpuInstanceProfile:
    """A GPU-instance profile of an inline MIG table: GpuInstanceProfile's fields, two of them spelt shorter."""
    spec = (
        Field("id", NON_NEGATIVE), Field("index", NON_NEGATIVE), Field("name", NON_EMPTY), Field("slices", POSITIVE),
        Field("instances", POSITIVE), Field("multiprocessors", POSITIVE), Field("copy_engines", NON_NEGATIVE),
        Field("decoders", NON_NEGATIVE), Field("encoders", NON_NEGATIVE), Field("jpeg_engines", NON_NEGATIVE),
        Field("ofa_engines", NON_NEGATIVE), Field("memory_mib", POSITIVE), Field("placements", _PLACEMENTS),
    )  # fmt: skip
    doc = fields(value, path, spec)
    doc["slice_count"], doc["instance_count"] = doc.pop("slices"), doc.pop("instances")
    return GpuInstanceProfile(**doc)


_MIG_TABLE = (
    Field("memory_slices", then(integer(1, 8), _power_of_two)),
    Field("compute_slices", integer(1, 8)),
    Field("profiles", items(_profile, min_len=1)),
)


def _mig_table(value: object, path: str) -> MigSpec:
    doc = fields(value, path, _MIG_TABLE)
    memory_slices, compute_slices = doc["memory_slices"], doc["compute_slices"]
    profiles: tuple[GpuInstanceProfile, ...] = doc["profiles"]
    problems: list[tuple[tuple[str | int, ...], str]] = []
    for i, profile in enumerate(profiles):
        if profile.slice_count > compute_slices:
            problems.append((("profiles", i, "slices"), f"must be <= compute_slices ({compute_slices})"))
        for j, p in enumerate(profile.placements):
            if p.size & (p.size - 1) or p.size == 0 or p.start + p.size > memory_slices:
                message = f"must have a power-of-two size and fit in {memory_slices} memory slices"
            elif p.size != profile.placements[0].size:
                message = "every placement of a profile has the same size"
            else:
                continue
            problems.append((("profiles", i, "placements", j), f"placement {p.start}:{p.size} {message}"))
    for attr in ("id", "index", "name"):
        seen: set[object] = set()
        for i, profile in enumerate(profiles):
            if (found := getattr(profile, attr)) in seen:
                problems.append((("profiles", i, attr), f"duplicate profile {attr} {found!r}"))
            seen.add(found)
    if problems:
        raise problems_at(path, problems)
    return MigSpec(memory_slices, compute_slices, tuple(sorted(profiles, key=lambda p: p.index)))


_MIG_FROM = (Field("from", string(check=_mig_model)),)


def _mig_object(value: object, path: str) -> MigSpec | None:
    if given(value, "from"):
        return _catalog_model(fields(value, path, _MIG_FROM)["from"]).mig
    return _mig_table(value, path)


_NONE = choice("none")
_NO_MIG = object()  # `mig: none` of an inline model: no MIG at all (None: the base model's)


def _no_mig(value: object, path: str) -> object:
    _NONE(value, path)
    return _NO_MIG

_BLANK = GpuModel("", "", Architecture.UNKNOWN, (0, 0), 0, 0, 0, 0)
_INLINE_MODEL = (
    Field("base", KNOWN_MODEL, None, opt=True),
    Field("name", NON_EMPTY, None, opt=True),
    Field("architecture", member_named(Architecture, any_case=True, skip=[Architecture.UNKNOWN]), None, opt=True),
    Field("compute_capability", items(integer(), min_len=2, max_len=2, hint="write [major, minor], e.g. [9, 0]"),
          None, opt=True),
    Field("memory_mib", POSITIVE, None, opt=True),
    Field("pci_device_id", integer(0, 0xFFFFFFFF), None, opt=True),
    Field("multiprocessors", POSITIVE, None, opt=True),
    Field("nvlink_links", integer(0, 36), None, opt=True),
    Field("brand", NON_EMPTY, None, opt=True),
    Field("mig", by_type(a_string=_no_mig, an_object=_mig_object), None, opt=True),
)  # fmt: skip
_NEEDED_WITHOUT_BASE = ("name", "architecture", "compute_capability", "memory_mib", "pci_device_id", "multiprocessors")


def _inline_model(value: object, path: str) -> GpuModel:
    doc = fields(value, path, _INLINE_MODEL)
    base = doc.pop("base")
    if base is None:
        missing = [key for key in _NEEDED_WITHOUT_BASE if doc[key] is None]
        if missing:
            message = "required for an inline model without base (or set base: <known model>)"
            raise problems_at(path, ((key, message) for key in missing))
    given_fields: dict[str, Any] = {k: v for k, v in doc.items() if v is not None}
    if "mig" in given_fields and given_fields["mig"] is _NO_MIG:
        given_fields["mig"] = None
    model = replace(_catalog_model(base) if base is not None else _BLANK, **given_fields)
    return replace(model, key=f"inline:{model.name}")


@dataclass(frozen=True)
class _Instance:
    """A node file's pre-created GPU instance (static MIG) and its compute instances."""

    profile: int | str  # id or name
    start: int | None = None  # placement start; default: the first free placement
    compute_instances: tuple[int, ...] | None = None  # CI sizes in compute slices; default: one full CI

    _FIELDS: ClassVar = (
        Field("profile", by_type(an_integer=NON_NEGATIVE, a_string=NON_EMPTY)),
        Field("start", NON_NEGATIVE, None, opt=True),
        Field("compute_instances", items(POSITIVE), None, opt=True),
    )

    @classmethod
    def read(cls, value: object, path: str) -> _Instance:
        return cls(**fields(value, path, cls._FIELDS))


GroupFabric = Literal["none"] | FabricInfo | tuple[FabricInfo, ...]


@dataclass(frozen=True)
class _Group:
    """A node file's group of identical GPUs: model, count, NUMA placement."""

    gpu_model: GpuModel
    count: int = 1
    numa: int | tuple[int, ...] | None = None
    bus_ids: tuple[str, ...] | None = None
    minors: tuple[int, ...] | None = None
    uuids: tuple[str, ...] | None = None
    mig: bool | str = False
    instances: tuple[_Instance, ...] = ()
    # "unsupported": the GPUs answer NOT_SUPPORTED to time-slice calls (like a Tesla P4 to nvidia-smi compute-policy)
    time_slice: str = "supported"
    # These GPUs' fabric info, overriding the node's `fabric`: one for all, a list with one per GPU, or "none".
    fabric: GroupFabric | None = None
    # PCI class: "3d" (3D controller, datacenter GPUs) or "vga" (display outputs and an HD-audio function .1)
    pci_class: str = "3d"

    _FIELDS: ClassVar = (
        Field("model", by_type(a_string=then(STRING, _catalog_model), an_object=_inline_model)),
        Field("count", integer(1, MAX_GPUS), 1),
        Field("numa", by_type(an_integer=NON_NEGATIVE, a_list=items(NON_NEGATIVE)), None, opt=True),
        Field("bus_ids", items(string(check=normalise_bus_id)), None, opt=True),
        Field("minors", items(integer(0, 255)), None, opt=True),
        Field("uuids", items(string(check=_gpu_uuid)), None, opt=True),
        Field("mig", by_type(a_boolean=boolean, a_string=choice("enabled", "disabled")), False),
        Field("instances", items(_Instance.read), ()),
        Field("time_slice", choice("supported", "unsupported"), "supported"),
        Field("fabric", by_type(a_string=_NONE, an_object=read_fabric, a_list=items(read_fabric)), None, opt=True),
        Field("pci_class", choice("3d", "vga"), "3d"),
    )

    @property
    def mig_enabled(self) -> bool:
        return self.mig in (True, "enabled")

    @classmethod
    def read(cls, value: object, path: str) -> _Group:
        doc = fields(value, path, cls._FIELDS)
        group = cls(gpu_model=doc.pop("model"), **doc)
        problems: list[tuple[str, str]] = []
        for key in ("numa", "bus_ids", "minors", "uuids", "fabric"):
            if isinstance(found := getattr(group, key), tuple) and len(found) != group.count:
                problems.append((key, f"has {len(found)} entries but count is {group.count}; give one per GPU"))
        if group.mig_enabled and not group.gpu_model.mig_capable:
            problems.append(("mig", f"{group.gpu_model.name} is not MIG-capable; use mig: disabled"))
        if group.instances and not group.mig_enabled:
            problems.append(("instances", "pre-created MIG instances need mig: enabled"))
        if problems:
            raise problems_at(path, problems)
        return group


NodeFabric = Literal["auto", "none"] | FabricInfo


@dataclass(frozen=True)
class _Node:
    """A node file as read, before it is resolved into a NodeSpec."""

    gpus: tuple[_Group, ...]
    name: str = "fake-node"
    driver_version: str = DEFAULT_DRIVER
    cuda_driver_version: int = DEFAULT_CUDA
    nvml_version: str | None = None  # default: "<CUDA major>.<driver version>"
    numa_nodes: dict[int, tuple[int, ...]] | None = None  # default: one node, CPUs unknown
    pcie: _Pcie | None = None
    nvlink: _NvLink = _NvLink("none")
    fabric: NodeFabric | None = "auto"
    pci: PciSpec = NO_PCI_SPEC  # IOMMU, groups, more functions, faults (nvml/fake/pci.py)

    _FIELDS: ClassVar = (
        Field("name", NON_EMPTY, "fake-node"),
        Field("driver_version", string(check=_driver_version), DEFAULT_DRIVER),
        Field("cuda_driver_version", integer(1000), DEFAULT_CUDA),
        Field("nvml_version", NON_EMPTY, None, opt=True),
        Field("numa_nodes", nullable(mapping(_numa_id, _cpu_list, min_len=1,
                                             hint="a mapping of NUMA node id to its CPUs")), None),
        Field("pcie", nullable(_Pcie.read), None),
        Field("nvlink", by_type(a_string=_bare_nvlink, an_object=_NvLink.read), _NvLink("none")),
        Field("fabric", nullable(by_type(a_string=choice("auto", "none"), an_object=read_fabric)), "auto"),
        Field("gpus", items(_Group.read, min_len=1)),
        Field("pci", lambda value, path: NO_PCI_SPEC if value is None else read_pci_spec(value, path), NO_PCI_SPEC),
    )  # fmt: skip

    @classmethod
    def read(cls, value: object) -> _Node:
        node = cls(**fields(value, "", cls._FIELDS))
        problems: list[tuple[tuple[str | int, ...], str]] = []
        total = sum(g.count for g in node.gpus)
        if total > MAX_GPUS:
            problems.append((("gpus",), f"{total} GPUs in total; at most {MAX_GPUS} are supported"))
        owner: dict[int, int] = {}
        for numa_node, cpus in (node.numa_nodes or {}).items():
            taken = next((cpu for cpu in cpus if cpu in owner), None)
            if taken is not None:
                problems.append((("numa_nodes", str(numa_node)), f"CPU {taken} is already in NUMA node {owner[taken]}"))
            owner.update((cpu, numa_node) for cpu in cpus if cpu not in owner)
        declared = sorted(node.numa_nodes or {0: ()})
        for g, group in enumerate(node.gpus):
            numa = group.numa
            for i, n in enumerate(numa if isinstance(numa, tuple) else () if numa is None else (numa,)):
                if n not in declared:
                    loc: tuple[str | int, ...] = ("gpus", g, "numa", *((i,) if isinstance(numa, tuple) else ()))
                    problems.append((loc, f"NUMA node {n} is not declared in numa_nodes (declared: {declared})"))
        if problems:
            raise problems_at("", problems)
        return node


def _decode(doc: object) -> _Node:
    try:
        return _Node.read(doc)
    except Rejected as exc:
        raise SpecError.of(exc.problems) from None


# --- resolving a valid document into GPU slots ---------------------------------------------------


def parse_node(doc: object, *, seed: str | None = None) -> NodeSpec:
    """Validate a decoded node document and resolve it into a NodeSpec."""
    node = _decode(doc)
    numa_nodes = tuple(sorted(node.numa_nodes.items())) if node.numa_nodes is not None else ((0, ()),)
    nvml = node.nvml_version or f"{node.cuda_driver_version // 1000}.{node.driver_version}"
    slots = _slots(node.gpus, numa_nodes, seed if seed is not None else node.name)
    slots = _apply_pcie(node.pcie or _Pcie(), slots)
    slots = _apply_nvlink(node.nvlink, slots)
    slots = _apply_fabric(node.fabric, slots)
    slots = _apply_group_fabric(node.gpus, slots)
    slots = _apply_instances(node.gpus, slots)
    spec = NodeSpec(
        name=node.name,
        system=SystemInfo(node.driver_version, node.cuda_driver_version, nvml),
        numa_nodes=numa_nodes,
        gpus=tuple(slots),
        pci=node.pci,
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


def _apply_fabric(fabric: NodeFabric | None, slots: list[GpuSlot]) -> list[GpuSlot]:
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
    if not isinstance(fabric, FabricInfo):
        return slots
    return [replace(s, fabric=fabric) for s in slots]


def _apply_group_fabric(groups: tuple[_Group, ...], slots: list[GpuSlot]) -> list[GpuSlot]:
    """A group's own `fabric` wins over the node's for its GPUs (e.g. one tray whose GPU did not register)."""
    out = list(slots)
    first = 0
    for group in groups:
        for k in range(group.count):
            own = group.fabric
            if own == "none":
                out[first + k] = replace(out[first + k], fabric=None)
            elif isinstance(own, FabricInfo):
                out[first + k] = replace(out[first + k], fabric=own)
            elif isinstance(own, tuple):
                out[first + k] = replace(out[first + k], fabric=own[k])
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
