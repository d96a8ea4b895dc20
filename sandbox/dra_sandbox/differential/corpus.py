"""The scheduling corpus: claim and pod specs, made deterministically (the same list, in the same order, every run).

Each case is one pod with its claims (and maybe extended resources and tolerations). The suite runs every case once
per node shape (fleet.SHAPES), each copy pinned by `nodeSelector` to a node of its own, so the verdicts say which
shapes are feasible and no case sees another's allocations. Categories follow the issue's list: CEL selectors,
prioritized lists (firstAvailable), counters (partitionable MIG devices), consumable capacity, taints and
tolerations, extended resources, admin access, config `requests`, constraints, and claims that fit nowhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from dra_driver.defaults import DRIVER_NAME

from .fleet import CONFIG_CLASS, DEVICE_TAINT, NODE_TAINT, OTHER_CLASS

GPU: Final = DRIVER_NAME
MIG: Final = f"mig.{DRIVER_NAME}"
VFIO: Final = f"vfio.{DRIVER_NAME}"
SHARE: Final = f"gpu-share.{DRIVER_NAME}"
A: Final = f"device.attributes['{DRIVER_NAME}']"
CAP: Final = f"device.capacity['{DRIVER_NAME}']"
NAMESPACE: Final = "differential"
ADMIN_NAMESPACE: Final = "differential-admin"  # labelled resource.kubernetes.io/admin-access=true
EXTENDED: Final = f"{DRIVER_NAME}/gpu"
CLASS_RESOURCE: Final = "deviceclass.resource.kubernetes.io/"
CATEGORIES: Final = ("cel", "first-available", "counters", "consumable", "taints", "extended", "admin-access",
                     "config", "constraints", "fits-nowhere")

Json = dict[str, Any]


@dataclass(frozen=True)
class Case:
    id: str  # stable: `<category>-<nnn>`; part of object names
    category: str
    claims: tuple[tuple[str, Json], ...]  # (pod claim name, ResourceClaim spec)
    namespace: str = NAMESPACE
    tolerations: tuple[Json, ...] = ()
    extended: Mapping[str, str] = field(default_factory=dict)  # container limits
    note: str = ""


def exactly(cls: str = GPU, count: int | None = None, *, selectors: Sequence[str] = (), mode: str | None = None,
            admin: bool | None = None, tolerations: Sequence[Json] = (), memory: str | None = None) -> Json:
    spec: Json = {"deviceClassName": cls}
    if selectors:
        spec["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if mode is not None:
        spec["allocationMode"] = mode
    if count is not None:
        spec["count"] = count
    if admin is not None:
        spec["adminAccess"] = admin
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    if memory is not None:
        spec["capacity"] = {"requests": {"memory": memory}}
    return spec


def sub(name: str, cls: str = GPU, count: int | None = None, *, selectors: Sequence[str] = (),
        tolerations: Sequence[Json] = (), memory: str | None = None) -> Json:
    return {"name": name, **exactly(cls, count, selectors=selectors, tolerations=tolerations, memory=memory)}


def request(name: str, spec: Json | None = None, *, first: Sequence[Json] = ()) -> Json:
    if first:
        return {"name": name, "firstAvailable": [dict(s) for s in first]}
    return {"name": name, "exactly": spec if spec is not None else exactly()}


def claim(*requests: Json, constraints: Sequence[Json] = (), config: Sequence[Json] = ()) -> Json:
    devices: Json = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = [dict(c) for c in constraints]
    if config:
        devices["config"] = [dict(c) for c in config]
    return {"devices": devices}


def opaque(requests: Sequence[str] | None, kind: str = "GpuConfig", **params: Any) -> Json:
    entry: Json = {"opaque": {"driver": DRIVER_NAME, "parameters": {"apiVersion": "gpu.dra.dev/v1beta1",
                                                                     "kind": kind, **params}}}
    if requests is not None:
        entry["requests"] = list(requests)
    return entry


class _Ids:
    def __init__(self) -> None:
        self.cases: list[Case] = []

    def add(self, category: str, *claims: tuple[str, Json], **kw: Any) -> None:
        number = sum(1 for c in self.cases if c.category == category)
        self.cases.append(Case(f"{category}-{number:03d}", category, tuple(claims), **kw))


def _cel(ids: _Ids) -> None:
    expressions = (
        f"{A}.productName == 'NVIDIA L4'",
        f"{A}.productName.startsWith('NVIDIA H100')",
        f"{A}.architecture in ['Hopper', 'Ampere']",
        f"{A}.index == 1",
        f"{A}.index >= 0 && {A}.index < 1",
        f"{CAP}.memory.compareTo(quantity('40Gi')) >= 0",
        f"{CAP}.memory.isGreaterThan(quantity('80Gi'))",
        f"{A}.cudaComputeCapability.isGreaterThan(semver('8.9.0'))",
        f"{A}.cudaComputeCapability.major() == 8",
        "device.attributes['resource.kubernetes.io'].pciBusID.endsWith(':00.0')",
        f"{A}.brand.lowerAscii() == 'nvidia'",
        f"{A}.uuid.matches('^GPU-[0-9a-f]{{8}}-')",
        f"'migCapable' in {A} && {A}.migCapable",
        f"has({A}.numaNode) && {A}.numaNode == 0",
        f"{A}.?profile.orValue('none') == 'none'",
        f"{A}.productName.split(' ').exists(w, w == 'A100-SXM4-80GB')",
        "device.driver == 'gpu.dra.dev'",
        "false",
    )
    for expression in expressions:
        for count in (1, 2):
            ids.add("cel", ("gpu", claim(request("gpu", exactly(GPU, count, selectors=[expression])))))
    for expression in (f"{A}.profile == '3g.40gb'", f"{A}.profile.startsWith('1g.')",
                       f"{CAP}.memory.compareTo(quantity('20Gi')) <= 0", f"{A}.index == 0 && {A}.profile == '7g.80gb'"):
        ids.add("cel", ("mig", claim(request("mig", exactly(MIG, 1, selectors=[expression])))))
    # Two selectors (ANDed), a selector that fails at run time on some devices, one that does not compile.
    ids.add("cel", ("gpu", claim(request("gpu", exactly(GPU, 1, selectors=[f"{A}.index == 1",
                                                                           f"{A}.productName.contains('L4')"])))))
    ids.add("cel", ("gpu", claim(request("gpu", exactly(GPU, 1, selectors=[f"{A}.profile == '1g.10gb'"])))),
            note="runtime error: no such key on whole GPUs")
    ids.add("cel", ("gpu", claim(request("gpu", exactly(GPU, 1, selectors=[f"{A}.index =="])))),
            note="does not compile: the API server refuses the claim")
    ids.add("cel", ("gpu", claim(request("gpu", exactly(GPU, 1, selectors=[f"{A}.index"])))),
            note="not a bool: the API server refuses the claim")


def _first_available(ids: _Ids) -> None:
    l4 = f"{A}.productName == 'NVIDIA L4'"
    h100 = f"{A}.productName.startsWith('NVIDIA H100')"
    lists: tuple[tuple[Json, ...], ...] = (
        (sub("h100", GPU, 1, selectors=[h100]), sub("l4", GPU, 1, selectors=[l4])),
        (sub("l4", GPU, 1, selectors=[l4]), sub("any", GPU, 1)),
        (sub("two", GPU, 2), sub("one", GPU, 1)),
        (sub("three", GPU, 3), sub("two", GPU, 2)),
        (sub("big", MIG, 1, selectors=[f"{A}.profile == '7g.80gb'"]), sub("small", MIG, 1)),
        (sub("mig", MIG, 2, selectors=[f"{A}.profile == '3g.40gb'"]), sub("gpu", GPU, 1)),
        (sub("nothing", GPU, 1, selectors=["false"]), sub("gpu", GPU, 1)),
        (sub("nothing", GPU, 1, selectors=["false"]), sub("none", GPU, 1, selectors=["false"])),
        (sub("vfio", VFIO, 1), sub("share", SHARE, 1), sub("gpu", GPU, 1)),
        (sub("other", OTHER_CLASS, 1), sub("gpu", GPU, 1)),
        (sub("shared", GPU, 1, memory="10Gi"), sub("whole", GPU, 1)),
        (sub("tainted", GPU, 2, tolerations=[{"key": DEVICE_TAINT["key"], "operator": "Exists"}]),
         sub("untainted", GPU, 1)),
        (sub("missing", "no-such-class.gpu.dra.dev", 1), sub("gpu", GPU, 1)),
        (sub("a", GPU, 1), sub("b", GPU, 1), sub("c", GPU, 1), sub("d", GPU, 1), sub("e", GPU, 1),
         sub("f", GPU, 1), sub("g", GPU, 1), sub("h", GPU, 1)),
    )
    for options in lists:
        ids.add("first-available", ("gpu", claim(request("gpu", first=options))))
    # Two requests with lists, and a list beside an exact request.
    for options in lists[:6]:
        ids.add("first-available", ("gpu", claim(request("first", first=options), request("also", exactly(GPU, 1)))))
    ids.add("first-available", ("gpu", claim(request("a", first=lists[2]), request("b", first=lists[2]))))
    ids.add("first-available", ("gpu", claim(request("a", first=lists[4]), request("b", first=lists[4]))))


def _counters(ids: _Ids) -> None:
    for profile in ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"):
        for count in (1, 2, 3, 8):
            ids.add("counters", ("mig", claim(request("mig", exactly(MIG, count,
                                                                     selectors=[f"{A}.profile == '{profile}'"])))))
    same_gpu = [{"matchAttribute": f"{DRIVER_NAME}/parentUUID", "requests": ["a", "b"]}]
    for first, second in (("3g.40gb", "3g.40gb"), ("4g.40gb", "3g.40gb"), ("4g.40gb", "4g.40gb"),
                          ("7g.80gb", "1g.10gb"), ("2g.20gb", "2g.20gb")):
        ids.add("counters", ("mig", claim(request("a", exactly(MIG, 1, selectors=[f"{A}.profile == '{first}'"])),
                                          request("b", exactly(MIG, 1, selectors=[f"{A}.profile == '{second}'"])),
                                          constraints=same_gpu)))
    # A whole GPU and a MIG device of the same GPU draw on one counter set.
    ids.add("counters", ("c", claim(request("whole", exactly(GPU, 1, selectors=[f"{A}.index == 0"])),
                                    request("mig", exactly(MIG, 1, selectors=[f"{A}.index == 0"])))))
    ids.add("counters", ("c", claim(request("whole", exactly(GPU, 2)), request("mig", exactly(MIG, 1)))))
    ids.add("counters", ("mig", claim(request("mig", exactly(MIG, mode="All",
                                                            selectors=[f"{A}.profile == '7g.80gb'"])))))
    ids.add("counters", ("mig", claim(request("mig", exactly(MIG, mode="All")))),
            note="All MIG placements at once: their counters overlap")
    # Two claims of one pod sharing a GPU's counters.
    ids.add("counters", ("a", claim(request("mig", exactly(MIG, 1, selectors=[f"{A}.profile == '4g.40gb'"])))),
            ("b", claim(request("mig", exactly(MIG, 1, selectors=[f"{A}.profile == '4g.40gb'"])))),
            ("c", claim(request("mig", exactly(MIG, 1, selectors=[f"{A}.profile == '4g.40gb'"])))))


def _consumable(ids: _Ids) -> None:
    for memory in ("1Mi", "1Gi", "10Gi", "40Gi", "81559Mi", "81560Mi", "100Gi", "1536Ki", "0.5Gi", "1"):
        ids.add("consumable", ("gpu", claim(request("gpu", exactly(GPU, 1, memory=memory)))))
    for memory in ("30Gi", "50Gi"):
        for count in (2, 3, 4):
            ids.add("consumable", ("gpu", claim(request("gpu", exactly(GPU, count, memory=memory)))))
    # Several requests on one claim, and several claims: the shares add up per device.
    ids.add("consumable", ("gpu", claim(request("a", exactly(GPU, 1, memory="60Gi")),
                                        request("b", exactly(GPU, 1, memory="60Gi")))))
    ids.add("consumable", ("gpu", claim(request("a", exactly(GPU, 1, memory="60Gi")),
                                        request("b", exactly(GPU, 1, memory="60Gi")),
                                        request("c", exactly(GPU, 1, memory="60Gi")))))
    ids.add("consumable", ("gpu", claim(request("a", exactly(GPU, 1, memory="40Gi")),
                                        request("b", exactly(GPU, 1, memory="40Gi")),
                                        constraints=[{"distinctAttribute": f"{DRIVER_NAME}/uuid"}])))
    ids.add("consumable", ("gpu", claim(request("a", exactly(GPU, 1, memory="10Gi")),
                                        request("b", exactly(GPU, 1, memory="10Gi")),
                                        constraints=[{"matchAttribute": f"{DRIVER_NAME}/uuid"}])))
    ids.add("consumable", ("x", claim(request("gpu", exactly(GPU, 1, memory="50Gi")))),
            ("y", claim(request("gpu", exactly(GPU, 1, memory="50Gi")))),
            ("z", claim(request("gpu", exactly(GPU, 1, memory="50Gi")))))
    ids.add("consumable", ("gpu", claim(request("gpu", exactly(GPU, mode="All", memory="1Gi")))))
    ids.add("consumable", ("gpu", claim(request("gpu", exactly(GPU, 1)))), note="no capacity asked: the default")


def _taints(ids: _Ids) -> None:
    node_tolerations: tuple[tuple[Json, ...], ...] = (
        (),
        ({"key": NODE_TAINT["key"], "operator": "Exists"},),
        ({"key": NODE_TAINT["key"], "operator": "Equal", "value": "planned", "effect": "NoSchedule"},),
        ({"key": NODE_TAINT["key"], "operator": "Equal", "value": "other"},),
        ({"key": NODE_TAINT["key"], "operator": "Exists", "effect": "NoExecute"},),
        ({"operator": "Exists"},),
    )
    device_tolerations: tuple[tuple[Json, ...], ...] = (
        (),
        ({"key": DEVICE_TAINT["key"], "operator": "Exists"},),
        ({"key": DEVICE_TAINT["key"], "operator": "Equal", "value": "79", "effect": "NoSchedule"},),
        ({"key": DEVICE_TAINT["key"], "operator": "Equal", "value": "48"},),
        ({"operator": "Exists", "effect": "NoExecute"},),
    )
    for pod_tolerations in node_tolerations:
        for count, dev_tolerations in ((1, ()), (2, ()), (2, device_tolerations[1])):
            ids.add("taints", ("gpu", claim(request("gpu", exactly(GPU, count, tolerations=dev_tolerations)))),
                    tolerations=pod_tolerations)
    for dev_tolerations in device_tolerations[2:]:
        for count in (1, 2):
            ids.add("taints", ("gpu", claim(request("gpu", exactly(GPU, count, tolerations=dev_tolerations)))),
                    tolerations=node_tolerations[1])
    ids.add("taints", ("gpu", claim(request("gpu", exactly(GPU, 1, selectors=[f"{A}.index == 0"],
                                                           tolerations=device_tolerations[1])))),
            tolerations=node_tolerations[1])
    ids.add("taints", ("gpu", claim(request("gpu", exactly(GPU, 1, selectors=[f"{A}.index == 0"])))),
            tolerations=node_tolerations[1])
    ids.add("taints", ("gpu", claim(request("gpu", exactly(GPU, mode="All", tolerations=device_tolerations[1])))),
            tolerations=node_tolerations[1])
    ids.add("taints", ("gpu", claim(request("gpu", exactly(GPU, mode="All")))), tolerations=node_tolerations[1])


def _extended(ids: _Ids) -> None:
    for limits in ({EXTENDED: "1"}, {EXTENDED: "2"}, {EXTENDED: "3"}, {f"{CLASS_RESOURCE}{GPU}": "1"},
                   {f"{CLASS_RESOURCE}{MIG}": "1"}, {f"{CLASS_RESOURCE}{MIG}": "4"}, {f"{CLASS_RESOURCE}{SHARE}": "1"},
                   {f"{CLASS_RESOURCE}{OTHER_CLASS}": "1"}, {"nvidia.com/gpu": "1"},
                   {EXTENDED: "1", f"{CLASS_RESOURCE}{MIG}": "1"}):
        ids.add("extended", extended=limits)
    ids.add("extended", ("gpu", claim(request("gpu", exactly(GPU, 1)))), extended={EXTENDED: "1"})
    ids.add("extended", ("gpu", claim(request("gpu", exactly(GPU, 2)))), extended={EXTENDED: "1"})
    ids.add("extended", extended={EXTENDED: "1"}, tolerations=({"key": NODE_TAINT["key"], "operator": "Exists"},))


def _admin(ids: _Ids) -> None:
    for namespace in (ADMIN_NAMESPACE, NAMESPACE):
        ids.add("admin-access", ("gpu", claim(request("gpu", exactly(GPU, 1, admin=True)))), namespace=namespace)
        ids.add("admin-access", ("gpu", claim(request("gpu", exactly(GPU, mode="All", admin=True)))),
                namespace=namespace)
    ids.add("admin-access", ("gpu", claim(request("gpu", exactly(GPU, 1, admin=False)))), namespace=NAMESPACE)
    ids.add("admin-access", ("gpu", claim(request("gpu", exactly(MIG, 2, admin=True)))), namespace=ADMIN_NAMESPACE)
    # Admin access sees devices another request of the pod holds, and ignores counters.
    ids.add("admin-access", ("user", claim(request("gpu", exactly(GPU, 2)))),
            ("admin", claim(request("gpu", exactly(GPU, 2, admin=True)))), namespace=ADMIN_NAMESPACE)
    ids.add("admin-access", ("gpu", claim(request("a", exactly(GPU, 1)), request("b", exactly(GPU, 1, admin=True)),
                                          constraints=[{"matchAttribute": f"{DRIVER_NAME}/uuid"}])),
            namespace=ADMIN_NAMESPACE)
    ids.add("admin-access", ("gpu", claim(request("gpu", exactly(GPU, 1, admin=True, memory="10Gi")))),
            namespace=ADMIN_NAMESPACE)
    ids.add("admin-access", ("gpu", claim(request("gpu", exactly(GPU, 1, admin=True,
                                                                 tolerations=[{"operator": "Exists"}])))),
            namespace=ADMIN_NAMESPACE, tolerations=({"operator": "Exists"},))


def _config(ids: _Ids) -> None:
    two = (request("a", exactly(GPU, 1)), request("b", exactly(GPU, 1)))
    for requests in (None, [], ["a"], ["b"], ["a", "b"], ["b", "a"], ["c"], ["a", "a"]):
        ids.add("config", ("gpu", claim(*two, config=[opaque(requests, sharing={"strategy": "TimeSlicing"})])))
    ids.add("config", ("gpu", claim(*two, config=[opaque(["a"]), opaque(["b"], kind="MigDeviceConfig"),
                                                   opaque(None)])))
    ids.add("config", ("gpu", claim(request("gpu", exactly(GPU, 1)),
                                    config=[opaque(["gpu"], kind="MigDeviceConfig", sharing={"strategy": "MPS"})])),
            note="issue 32 defect 1: the config's requests as written")
    first = request("gpu", first=(sub("mig", MIG, 1), sub("whole", GPU, 1)))
    for requests in (["gpu"], ["gpu/mig"], ["gpu/whole"], ["gpu/mig", "gpu/whole"], ["gpu/none"]):
        ids.add("config", ("gpu", claim(first, config=[opaque(requests)])))
    ids.add("config", ("gpu", claim(request("gpu", exactly(CONFIG_CLASS, 1)))))
    ids.add("config", ("gpu", claim(request("gpu", exactly(CONFIG_CLASS, 1)), config=[opaque(["gpu"])])))
    ids.add("config", ("gpu", claim(request("gpu", first=(sub("cfg", CONFIG_CLASS, 1), sub("plain", GPU, 1))),
                                    config=[opaque(["gpu/plain"])])))
    ids.add("config", ("gpu", claim(request("gpu", exactly(GPU, 1)),
                                    config=[{"requests": ["gpu"], "opaque": {"driver": "other.example.com",
                                                                              "parameters": {"x": 1}}}])))
    ids.add("config", ("gpu", claim(request("gpu", exactly(GPU, 1)),
                                    config=[{"requests": ["gpu"], "opaque": {"driver": DRIVER_NAME}}])),
            note="no parameters: the API server refuses the claim")


def _constraints(ids: _Ids) -> None:
    for attribute in ("productName", "architecture", "numaNode", "index", "uuid", "cudaComputeCapability",
                      "profile"):
        ids.add("constraints", ("gpu", claim(request("a", exactly(GPU, 1)), request("b", exactly(GPU, 1)),
                                             constraints=[{"matchAttribute": f"{DRIVER_NAME}/{attribute}"}])))
    ids.add("constraints", ("gpu", claim(request("gpu", exactly(GPU, 2)),
                                         constraints=[{"matchAttribute": f"{DRIVER_NAME}/productName"}])))
    ids.add("constraints", ("gpu", claim(request("a", exactly(GPU, 1)), request("b", exactly(MIG, 1)),
                                         constraints=[{"requests": ["a", "b"],
                                                       "matchAttribute": f"{DRIVER_NAME}/productName"}])))
    ids.add("constraints", ("gpu", claim(request("a", exactly(MIG, 2)), request("b", exactly(MIG, 1)),
                                         constraints=[{"requests": ["a"],
                                                       "matchAttribute": f"{DRIVER_NAME}/parentUUID"},
                                                      {"distinctAttribute": f"{DRIVER_NAME}/profile"}])))
    ids.add("constraints", ("gpu", claim(request("gpu", exactly(GPU, 2)),
                                         constraints=[{"matchAttribute": "resource.kubernetes.io/pcieRoot"}])))
    ids.add("constraints", ("gpu", claim(request("gpu", exactly(GPU, 2)),
                                         constraints=[{"matchAttribute": "resource.kubernetes.io/numaNode"}])))


def _nowhere(ids: _Ids) -> None:
    specs = (
        exactly(GPU, 16),
        exactly(GPU, 3),
        exactly(MIG, 15, selectors=[f"{A}.profile == '1g.10gb'"]),
        exactly("no-such-class.gpu.dra.dev", 1),
        exactly(OTHER_CLASS, 1),
        exactly(VFIO, 1),
        exactly(SHARE, 1),
        exactly(GPU, 1, selectors=[f"{A}.productName == 'NVIDIA B200'"]),
        exactly(GPU, 1, selectors=[f"{CAP}.memory.compareTo(quantity('200Gi')) >= 0"]),
        exactly(OTHER_CLASS, mode="All"),
        exactly(GPU, 1, memory="200Gi"),
    )
    for spec in specs:
        ids.add("fits-nowhere", ("gpu", claim(request("gpu", spec))))
    one, two = claim(request("gpu", exactly(GPU, 1))), claim(request("gpu", exactly(GPU, 2)))
    ids.add("fits-nowhere", ("a", two), ("b", one))
    ids.add("fits-nowhere", ("a", one), ("b", one), ("c", one))
    ids.add("fits-nowhere", ("gpu", claim(request("a", exactly(GPU, 1, selectors=[f"{A}.index == 0"])),
                                          request("b", exactly(GPU, 1, selectors=[f"{A}.index == 1"])),
                                          constraints=[{"matchAttribute": f"{DRIVER_NAME}/index"}])))
    ids.add("fits-nowhere", ("gpu", claim(request("gpu", exactly(GPU, 1)))),
            extended={EXTENDED: "2"})
    ids.add("fits-nowhere", ("gpu", claim(request("gpu", exactly(GPU, 1)))),
            extended={"nvidia.com/gpu": "1"})


GENERATORS: Final[tuple[Callable[[_Ids], None], ...]] = (
    _cel, _first_available, _counters, _consumable, _taints, _extended, _admin, _config, _constraints, _nowhere)


def cases() -> list[Case]:
    """Every case, in a fixed order."""
    ids = _Ids()
    for generate in GENERATORS:
        generate(ids)
    return ids.cases


def short(all_cases: Sequence[Case], per_category: int = 4) -> list[Case]:
    """A spread of the corpus for `make test`: per category, cases evenly spaced over its list."""
    out: list[Case] = []
    for category in CATEGORIES:
        mine = [c for c in all_cases if c.category == category]
        step = max(1, len(mine) // per_category)
        out.extend(mine[::step][:per_category])
    return out


def batches(items: Sequence[Case], size: int) -> Iterator[list[Case]]:
    for start in range(0, len(items), size):
        yield list(items[start:start + size])
