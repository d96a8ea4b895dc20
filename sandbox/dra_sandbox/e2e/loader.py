"""Read and strictly validate scenario directories (`e2e/scenarios/<name>/`).

A scenario directory holds plain Kubernetes YAML files plus `expect.yaml` (format: e2e/README.md).
Everything wrong is collected and reported together, each problem naming the file and the field path
and saying what to write instead, so an author fixes a scenario in one pass.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Self

import yaml
from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dra_driver.inventory.sharing import consumable_shares
from dra_driver.k8s.names import DNS_LABEL_RE, DNS_SUBDOMAIN_MAX, DNS_SUBDOMAIN_RE, is_dns_label
from dra_driver.strictdecode import (
    DecodeError,
    Decoder,
    Items,
    Loc,
    Opt,
    StrictModel,
    invalid,
    load_yaml_all,
    rejected,
    type_name,
)
from dra_sandbox.e2e.scenario import (
    KINDS,
    NAMESPACE_PREFIX,
    NODE_LABEL,
    VGPU_SRIOV,
    ClaimExpect,
    ComputeDomainExpect,
    ContainerExpect,
    ContainerRef,
    DeviceTaintExpect,
    DriverChange,
    EventsExpect,
    Expectations,
    JsonObject,
    NodeExpect,
    ObjectRef,
    Phase,
    PodExpect,
    PolicyExpect,
    Scenario,
    SliceExpect,
    Step,
    UuidKind,
    namespace_for,
)
from dra_sandbox.nvidiadriver import DriverAction, check_version

EXPECT_FILE = "expect.yaml"
YAML_SUFFIXES = (".yaml", ".yml")
_MAX_NAME = 63 - len(NAMESPACE_PREFIX)  # the namespace e2e-<name> must stay a DNS label
_RESTART_POLICIES = ("Always", "Never", "OnFailure")
# A pod expected Running must keep running on a real cluster; one expected Succeeded must be allowed to end.
_PHASE_POLICIES = {"Running": ("Always",), "Succeeded": ("Never", "OnFailure")}


class ScenarioError(ValueError):
    """One or more problems in scenario files; `problems` lists them, each naming file and field."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


def parse_yaml_documents(text: str, source: str) -> list[Any]:
    """All documents of a YAML text (empty ones dropped). Raises ScenarioError naming `source`."""
    try:
        docs = load_yaml_all(text)
    except yaml.YAMLError as exc:
        raise ScenarioError([f"{source}: not valid YAML: {exc}"]) from None
    return [d for d in docs if d is not None]


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, message: str) -> None:
        self.items.append(f"{where}: {message}")


# --- Kubernetes files -----------------------------------------------------------------------------


def _check_object(doc: Any, where: str, namespace: str, problems: _Problems) -> JsonObject | None:
    if not isinstance(doc, dict):
        problems.add(where, f"must be a Kubernetes object (a mapping), got {type_name(doc)}")
        return None
    kind = doc.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        problems.add(f"{where}.kind", f"{kind!r} is not supported here; use one of {', '.join(KINDS)}")
        return None
    info = KINDS[kind]
    if doc.get("apiVersion") != info.api_version and doc.get("apiVersion") not in info.older_versions:
        allowed = " or ".join((info.api_version, *info.older_versions))
        problems.add(f"{where}.apiVersion", f"{doc.get('apiVersion')!r}: {kind} must use apiVersion {allowed}")
    meta = doc.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        problems.add(f"{where}.metadata.name", "required (a string); generateName is not supported")
        return None
    name = meta["name"]
    pattern = DNS_LABEL_RE if kind == "Pod" else DNS_SUBDOMAIN_RE
    if len(name) > DNS_SUBDOMAIN_MAX or not pattern.fullmatch(name):
        problems.add(f"{where}.metadata.name", f"{name!r} is not a valid {kind} name (lower-case DNS name)")
    if "namespace" in meta:
        problems.add(
            f"{where}.metadata.namespace",
            f"remove it: the runner puts every object in the scenario's own namespace ({namespace})",
        )
    if not isinstance(doc.get("spec"), dict):
        problems.add(f"{where}.spec", "required (a mapping)")
        return None
    obj = dict(doc)
    if info.namespaced:
        obj["metadata"] = {**meta, "namespace": namespace}
    if kind == "Pod":
        _check_pod(obj, where, problems)
    return obj


def _check_pod(pod: JsonObject, where: str, problems: _Problems) -> None:
    spec = pod["spec"]
    if spec.get("restartPolicy") not in _RESTART_POLICIES:
        problems.add(
            f"{where}.spec.restartPolicy",
            f"set it explicitly to one of {', '.join(_RESTART_POLICIES)} (Always for pods that must keep holding "
            f"their devices, Never for run-to-completion), got {spec.get('restartPolicy')!r}",
        )
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        problems.add(f"{where}.spec.containers", "required: a non-empty list")
        return
    for i, container in enumerate(containers):
        if not isinstance(container, dict) or not isinstance(container.get("name"), str):
            problems.add(f"{where}.spec.containers[{i}].name", "required (a string)")


def _pod_containers(pod: JsonObject) -> list[str]:
    return [c["name"] for c in pod["spec"].get("containers") or [] if isinstance(c, dict) and "name" in c]


# --- expect.yaml ----------------------------------------------------------------------------------
# The models check expect.yaml's shape; validators that read the _Context (passed as pydantic's
# validation context) check references in step order as pydantic walks the steps, so shape and
# reference problems of the whole file come out together, each at its exact path.


class _Context:
    """What the steps so far have applied and deleted, to check references in order."""

    def __init__(self, scenario: str, files: Mapping[str, tuple[JsonObject, ...]]) -> None:
        self.namespace = namespace_for(scenario)
        self.files = files
        self.defined: dict[tuple[str, str], JsonObject] = {}
        for objs in files.values():
            for obj in objs:
                self.defined[(obj["kind"], obj["metadata"]["name"])] = obj
        self.live: set[tuple[str, str]] = set()
        self.ever_applied: set[tuple[str, str]] = set()
        self.used_files: set[str] = set()

    def ref(self, kind: str, name: str) -> ObjectRef:
        namespaced = KINDS[kind].namespaced
        return ObjectRef(kind, name, self.namespace if namespaced else None)

    def policy_classes(self) -> set[str]:
        """The DeviceClasses the scenario's GpuSharingPolicies make (spec.deviceClassName, else the name)."""
        return {str((obj.get("spec") or {}).get("deviceClassName") or name)
                for (kind, name), obj in self.defined.items() if kind == "GpuSharingPolicy"}

    def pods_applied(self) -> dict[str, JsonObject]:
        return {name: self.defined[(k, name)] for (k, name) in self.ever_applied if k == "Pod"}

    def known_files(self) -> str:
        return "files: " + (", ".join(sorted(self.files)) or "none")

    def object_key(self, text: object) -> tuple[str, str]:
        if not isinstance(text, str) or "/" not in text:
            raise ValueError(f"must be 'Kind/name' (e.g. 'Pod/holder'), got {text!r}")
        kind, _, name = text.partition("/")
        if kind not in KINDS:
            raise ValueError(f"{text!r}: kind {kind!r} is not one of {', '.join(KINDS)}")
        if (kind, name) not in self.defined:
            raise ValueError(f"{text!r} is not defined in any file of this scenario")
        return kind, name


def _context(info: ValidationInfo) -> _Context:
    assert isinstance(info.context, _Context)
    return info.context


def _applied(name: str, info: ValidationInfo) -> str:
    ctx = _context(info)
    if name not in ctx.files:
        raise ValueError(f"{name!r} is not a Kubernetes file of this scenario ({ctx.known_files()})")
    ctx.used_files.add(name)
    for obj in ctx.files[name]:
        key = (obj["kind"], obj["metadata"]["name"])
        ctx.live.add(key)
        ctx.ever_applied.add(key)
    return name


def _refused(name: str, info: ValidationInfo) -> str:
    """A file whose objects the cluster must refuse: used, but never applied (nothing to delete later)."""
    ctx = _context(info)
    if name not in ctx.files:
        raise ValueError(f"{name!r} is not a Kubernetes file of this scenario ({ctx.known_files()})")
    ctx.used_files.add(name)
    return name


def _live(kind: str, name: str, info: ValidationInfo) -> str:
    """`name` of an object of `kind` that a file of the scenario defines and that is applied at this step."""
    ctx = _context(info)
    if (kind, name) not in ctx.defined:
        raise ValueError(f"{kind} {name!r} is not defined in any file of this scenario")
    if (kind, name) not in ctx.live:
        raise ValueError(f"{kind} {name!r} is not present at this step (apply its file first)")
    return name


def _policy_live(name: str, info: ValidationInfo) -> str:
    return _live("GpuSharingPolicy", name, info)


def _deleted(item: object, info: ValidationInfo) -> tuple[ObjectRef, ...]:
    ctx = _context(info)
    if isinstance(item, str) and item in ctx.files:
        # A file's objects go in reverse order (pods before the claims they use); like
        # `kubectl delete -f`, objects an earlier deletion removed already are skipped.
        keys = [k for k in ((o["kind"], o["metadata"]["name"]) for o in reversed(ctx.files[item])) if k in ctx.live]
    elif isinstance(item, str) and item.endswith(YAML_SUFFIXES):
        raise ValueError(f"{item!r} is not a Kubernetes file of this scenario ({ctx.known_files()})")
    else:
        key = ctx.object_key(item)
        if key not in ctx.live:
            raise ValueError(f"{item} is not present at this step (apply it first, and delete it once)")
        keys = [key]
    ctx.live.difference_update(keys)
    return tuple(ctx.ref(*key) for key in keys)


def _gone(item: object, info: ValidationInfo) -> ObjectRef:
    ctx = _context(info)
    if isinstance(item, str) and item.startswith("DeviceClass/") and item.partition("/")[2] in ctx.policy_classes():
        return ctx.ref("DeviceClass", item.partition("/")[2])  # the controller's class of a scenario's policy
    key = ctx.object_key(item)
    if key in ctx.live:
        raise ValueError(f"{item} is still applied at this step; delete it first")
    return ctx.ref(*key)


def _evicted(item: object, info: ValidationInfo) -> ObjectRef:
    """A pod the cluster deletes by itself at this step (a NoExecute device taint): applied until now, gone after."""
    ctx = _context(info)
    if not isinstance(item, str) or "/" in item:
        raise ValueError(f"must be a pod name, got {item!r}")
    if ("Pod", item) not in ctx.live:
        raise ValueError(f"pod {item!r} is not present at this step (apply its file first; it was not or was deleted)")
    ctx.live.discard(("Pod", item))
    return ctx.ref("Pod", item)


def _container(item: object, info: ValidationInfo) -> ContainerRef:
    if not isinstance(item, str) or item.count("/") != 1:
        raise ValueError(f"must be 'pod/container', got {item!r}")
    pod_name, container = item.split("/")
    applied = _context(info).pods_applied()
    if pod_name not in applied:
        raise ValueError(f"pod {pod_name!r} is not applied by this or an earlier step")
    if container not in _pod_containers(applied[pod_name]):
        raise ValueError(f"pod {pod_name} has no container {container!r}")
    return ContainerRef(pod_name, container)


def _group(group: object) -> object:
    if not isinstance(group, list) or len(group) < 2:
        raise ValueError("must be a list of at least two 'pod/container'")
    return group


def _distinct(group: tuple[ContainerRef, ...]) -> tuple[ContainerRef, ...]:
    if len(set(group)) != len(group):
        raise ValueError("names a container twice")
    return group


def _regex(pattern: str) -> str:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"invalid regular expression {pattern!r}: {exc}") from None
    return pattern


def _node_alias(node: str) -> str:
    if not DNS_LABEL_RE.fullmatch(node):
        raise ValueError(f"must be a node alias (the node's {NODE_LABEL} label value), got {node!r}")
    return node


def _one_of(value: object, fields: tuple[str, ...]) -> object:
    # An expectation with none of its fields expects nothing: surely a mistake.
    if isinstance(value, dict) and not any(k in value for k in fields):
        raise ValueError(f"needs at least one of {', '.join(fields)}")
    return value


Regex = Annotated[str, Field(min_length=1, description="a regular expression"), AfterValidator(_regex)]
Seconds = Annotated[float, Field(gt=0, description="seconds")]
_GROUPS = "groups, each a list of at least two 'pod/container'"
Group = Annotated[
    Items[Annotated[ContainerRef, BeforeValidator(_container)]], BeforeValidator(_group), AfterValidator(_distinct)
]


class _ContainerDoc(StrictModel):
    devices: Opt[Annotated[int, Field(ge=0, description="devices the container got")]] = None
    uuid: Opt[UuidKind] = None
    env: Annotated[dict[str, Regex], Field(description="VARIABLE: regex")] = Field(default_factory=dict)
    device_nodes: Annotated[Items[Regex], Field(
        alias="deviceNodes", description="regexes, each matched by a device node path the container got")] = ()
    mounts: Annotated[Items[Regex], Field(description="regexes, each matched by a mount target the container got")] = ()

    @model_validator(mode="before")
    @classmethod
    def _expects_something(cls, data: Any) -> Any:
        return _one_of(data, ("devices", "uuid", "env", "deviceNodes", "mounts"))

    @model_validator(mode="after")
    def _sensible(self) -> Self:
        if self.uuid is not None and self.devices == 0:
            raise invalid("makes no sense with devices: 0; remove one of them", "uuid")
        return self

    def value(self) -> ContainerExpect:
        return ContainerExpect(devices=self.devices, uuid=self.uuid, env=self.env,
                               device_nodes=tuple(self.device_nodes), mounts=tuple(self.mounts))


class _PodDoc(StrictModel):
    phase: Phase
    node: Opt[Annotated[str, AfterValidator(_node_alias)]] = None
    message: Opt[Regex] = None  # required for Pending: what the scheduling explanation must match
    containers: dict[str, _ContainerDoc] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _fits_phase(self) -> Self:
        problems: list[tuple[Loc, str]] = []
        if self.phase == "Pending":
            if self.node is not None:
                problems.append((("node",), "a Pending pod has no node; remove node or expect another phase"))
            if self.message is None:
                problems.append((("message",), "required for Pending: a regex the scheduling explanation must match"))
            if self.containers:
                problems.append((("containers",), "a Pending pod has no containers to look at; remove containers"))
        elif self.message is not None:
            problems.append((("message",), "only for phase Pending (the scheduling explanation)"))
        if problems:
            raise rejected(problems)
        return self


class _PolicyDoc(StrictModel):
    ready: Literal["True", "False"]
    reason: Opt[Regex] = None
    message: Opt[Regex] = None


class _ComputeDomainDoc(StrictModel):
    status: Literal["Ready", "NotReady"]
    nodes: Opt[Annotated[int, Field(ge=0, description="entries in status.nodes")]] = None


def _domain_live(name: str, info: ValidationInfo) -> str:
    return _live("ComputeDomain", name, info)


# --- the node's NVIDIA driver (issue 26) -------------------------------------------------------------------------

_REASON_RE = re.compile(r"[A-Z][A-Za-z0-9]*")  # an Event reason is CamelCase (NvidiaDriverNotReady)
NodeAlias = Annotated[str, AfterValidator(_node_alias)]


def _reason(reason: str) -> str:
    if not _REASON_RE.fullmatch(reason):
        raise ValueError(f"must be an Event reason (CamelCase, e.g. NvidiaDriverNotReady), got {reason!r}")
    return reason


Reason = Annotated[str, AfterValidator(_reason)]


class _EventsDoc(StrictModel):
    events: Annotated[dict[Reason, Regex], Field(
        min_length=1, description="Event reason: regex its message must match")] = Field(default_factory=dict)
    no_events: Annotated[Items[Reason], Field(min_length=1, description="Event reasons that must not be there")] = (
        Field(default=(), alias="noEvents"))

    @model_validator(mode="after")
    def _not_both(self) -> Self:
        both = sorted(set(self.events) & set(self.no_events))
        if both:
            raise invalid(f"{', '.join(both)} cannot be both expected and not", "noEvents")
        return self

    def value(self) -> EventsExpect:
        return EventsExpect(dict(self.events), tuple(self.no_events))


class _NodeDoc(_EventsDoc):
    annotations: Annotated[dict[str, Regex], Field(
        min_length=1, description="annotation key: regex its value must match")] = Field(default_factory=dict)
    plugin_ready: Opt[bool] = Field(default=None, alias="pluginReady",
                                    description="the node's kubelet plugin's /healthz readiness")

    @model_validator(mode="before")
    @classmethod
    def _expects_something(cls, data: Any) -> Any:
        return _one_of(data, ("annotations", "events", "noEvents", "pluginReady"))

    def node(self, alias: str) -> NodeExpect:
        return NodeExpect(alias, dict(self.annotations), self.value(), self.plugin_ready)


class _ClaimEventsDoc(_EventsDoc):
    @model_validator(mode="before")
    @classmethod
    def _expects_something(cls, data: Any) -> Any:
        return _one_of(data, ("events", "noEvents"))


def _claim_applied(name: str, info: ValidationInfo) -> str:
    """A ResourceClaim of the scenario, applied by this or an earlier step (its Events outlive it)."""
    ctx = _context(info)
    if ("ResourceClaim", name) not in ctx.defined:
        raise ValueError(f"ResourceClaim {name!r} is not defined in any file of this scenario (a claim made from a "
                         "template has a generated name: use a ResourceClaim)")
    if ("ResourceClaim", name) not in ctx.ever_applied:
        raise ValueError(f"ResourceClaim {name!r} is not applied by this or an earlier step")
    return name


def _driver_version(version: str) -> str:
    problem = check_version(version, "load", "")
    if problem is not None:
        raise ValueError(problem.strip())
    return version


class _SliceDoc(StrictModel):
    count: Opt[Annotated[int, Field(ge=0, description="ResourceSlices of the driver on the node (0: none)")]] = None
    driver_version: Opt[Annotated[str, AfterValidator(_driver_version)]] = Field(default=None, alias="driverVersion")

    @model_validator(mode="before")
    @classmethod
    def _expects_something(cls, data: Any) -> Any:
        return _one_of(data, ("count", "driverVersion"))

    @model_validator(mode="after")
    def _sensible(self) -> Self:
        if self.count == 0 and self.driver_version is not None:
            raise invalid("no device shows a version when no slice is published (count: 0); remove one of them",
                          "driverVersion")
        return self


class _TaintDoc(StrictModel):
    key: Annotated[str, StringConstraints(min_length=1), Field(description="the taint's key")]
    effect: Opt[Literal["NoSchedule", "NoExecute", "None"]] = None
    devices: Literal["all", "none"] = "all"

    @model_validator(mode="after")
    def _sensible(self) -> Self:
        if self.devices == "none" and self.effect is not None:
            raise invalid("makes no sense with devices: none (no device has the key); remove it", "effect")
        return self


class _DriverDoc(StrictModel):
    node: NodeAlias
    action: DriverAction
    version: Opt[str] = None

    @model_validator(mode="after")
    def _version_fits(self) -> Self:
        problem = check_version(self.version, self.action, "version")
        if problem is not None:
            raise invalid(problem.removeprefix("version "), "version")
        return self

    def value(self) -> DriverChange:
        return DriverChange(self.node, self.action, self.version)


class _ExpectDoc(StrictModel):
    pods: dict[str, _PodDoc] = Field(default_factory=dict)
    same_devices: Items[Group] = Field(default=(), alias="sameDevices", min_length=1, description=_GROUPS)
    distinct_devices: Items[Group] = Field(default=(), alias="distinctDevices", min_length=1, description=_GROUPS)
    gone: Items[Annotated[ObjectRef, BeforeValidator(_gone)]] = Field(
        default=(), min_length=1, description="'Kind/name' of objects that must no longer exist"
    )
    policies: dict[Annotated[str, AfterValidator(_policy_live)], _PolicyDoc] = Field(default_factory=dict)
    compute_domains: dict[Annotated[str, AfterValidator(_domain_live)], _ComputeDomainDoc] = Field(
        default_factory=dict, alias="computeDomains")
    evicted: Items[Annotated[ObjectRef, BeforeValidator(_evicted)]] = Field(
        default=(), min_length=1, description="names of applied pods the cluster deletes by itself at this step "
        "(evicted for a NoExecute device taint); they must no longer exist"
    )
    slices: dict[NodeAlias, _SliceDoc] = Field(default_factory=dict)
    device_taints: dict[NodeAlias, _TaintDoc] = Field(default_factory=dict, alias="deviceTaints")
    nodes: dict[NodeAlias, _NodeDoc] = Field(default_factory=dict)
    claims: dict[Annotated[str, AfterValidator(_claim_applied)], _ClaimEventsDoc] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _expects_something(cls, data: Any) -> Any:
        return _one_of(data, _EXPECT_KEYS)

    @field_validator("pods")
    @classmethod
    def _pods_present(cls, pods: dict[str, _PodDoc], info: ValidationInfo) -> dict[str, _PodDoc]:
        ctx = _context(info)
        problems: list[tuple[Loc, str]] = []
        for name, want in pods.items():
            if ("Pod", name) not in ctx.defined:
                problems.append(((name,), f"pod {name!r} is not defined in any file of this scenario"))
                continue
            if ("Pod", name) not in ctx.live:
                why = "apply its file first; it was not or was deleted"
                problems.append(((name,), f"pod {name!r} is not present at this step ({why})"))
                continue
            pod = ctx.defined[("Pod", name)]
            policy = pod["spec"].get("restartPolicy")
            if want.phase in _PHASE_POLICIES and policy not in _PHASE_POLICIES[want.phase]:
                needed = " or ".join(_PHASE_POLICIES[want.phase])
                message = f"{want.phase} needs the pod's restartPolicy to be {needed}, it is {policy!r}"
                problems.append(((name, "phase"), message))
            names = _pod_containers(pod)
            problems += [
                ((name, "containers", c), f"pod {name} has no such container ({', '.join(names)})")
                for c in want.containers if c not in names
            ]
        if problems:
            raise rejected(problems)
        return pods

    def value(self) -> Expectations:
        pods = tuple(
            PodExpect(name, p.phase, p.node, p.message, {c: e.value() for c, e in p.containers.items()})
            for name, p in self.pods.items()
        )
        policies = tuple(PolicyExpect(name, p.ready, p.reason, p.message) for name, p in self.policies.items())
        domains = tuple(ComputeDomainExpect(name, d.status, d.nodes) for name, d in self.compute_domains.items())
        return Expectations(
            pods, self.same_devices, self.distinct_devices, (*self.gone, *self.evicted), policies, domains,
            slices=tuple(SliceExpect(alias, d.count, d.driver_version) for alias, d in self.slices.items()),
            device_taints=tuple(DeviceTaintExpect(alias, t.key, t.effect, t.devices)
                                for alias, t in self.device_taints.items()),
            nodes=tuple(n.node(alias) for alias, n in self.nodes.items()),
            claims=tuple(ClaimExpect(name, c.value()) for name, c in self.claims.items()),
        )


_EXPECT_KEYS = ("pods", "sameDevices", "distinctDevices", "gone", "policies", "evicted", "computeDomains", "slices",
                "deviceTaints", "nodes", "claims")


class _StepDoc(StrictModel):
    name: str = ""
    apply: Opt[
        Annotated[Items[Annotated[str, AfterValidator(_applied)]], Field(min_length=1, description="file names")]
    ] = None
    # Each entry, a 'Kind/name' or a file, stands for the objects it deletes.
    delete: Opt[
        Annotated[
            Items[Annotated[Items[ObjectRef], BeforeValidator(_deleted)]],
            Field(min_length=1, description="'Kind/name' or file names"),
        ]
    ] = None
    # file name -> regex: the cluster must refuse the file's objects (an admission webhook), saying this.
    apply_fails: Opt[
        Annotated[
            dict[Annotated[str, AfterValidator(_refused)], Regex],
            Field(min_length=1, description="file name: regex of the refusal"),
        ]
    ] = Field(default=None, alias="applyFails")
    # Unload, load or reload a node's NVIDIA driver (the sandbox's fake driver; a real cluster SKIPs the scenario).
    nvidia_driver: Opt[_DriverDoc] = Field(default=None, alias="nvidiaDriver")
    timeout: Seconds | None = None
    expect: Opt[_ExpectDoc] = Field(default=None, description="at least one of " + ", ".join(_EXPECT_KEYS))

    @model_validator(mode="after")
    def _one_action(self) -> Self:
        if sum(a is not None for a in (self.apply, self.delete, self.apply_fails, self.nvidia_driver)) != 1:
            raise ValueError("needs exactly one of apply (files), delete (objects or files), applyFails (files) or "
                             "nvidiaDriver (a node's driver)")
        if self.expect is None and self.apply_fails is None:
            raise ValueError("needs expect (only an applyFails step may leave it out)")
        return self

    def value(self, number: int) -> Step:
        deleted = tuple(ref for refs in self.delete or () for ref in refs)
        expect = self.expect.value() if self.expect is not None else Expectations()
        driver = self.nvidia_driver.value() if self.nvidia_driver is not None else None
        return Step(number, self.name, self.apply or (), deleted, expect, self.timeout, dict(self.apply_fails or {}),
                    driver)


def _consumable_mode(text: str) -> str:
    mode = consumable_shares(text, flag="consumableShares")
    if not mode.enabled:
        raise ValueError("name the mode the scenario needs (memory, unlimited or a share count), or leave it out")
    return mode.label


class _ExpectFile(StrictModel):
    description: Annotated[
        str, StringConstraints(strip_whitespace=True, min_length=1), Field(description="what the scenario proves")
    ]
    timeout: Seconds | None = None
    consumable_shares: Annotated[str, AfterValidator(_consumable_mode)] | None = Field(
        default=None,
        alias="consumableShares",
        description="the nodes' --consumable-shares mode the scenario needs: memory, unlimited or a share count",
    )
    cluster: Opt[Literal["compute-domains"]] = Field(
        default=None, description="the sandbox the scenario needs: compute-domains (gb200-nvl72 nodes, issue 24)")
    passthrough: bool = Field(
        default=False, description="needs nodes whose GPUs are offered for passthrough (docs/passthrough.md)")
    vgpu: bool | Literal["mdev"] = Field(default=False, description=(
        "needs vGPU hosts offering their GPUs as vGPUs (docs/vgpu.md): true (SR-IOV VFs) or mdev (mediated devices)"))
    fabric_partitions: bool = Field(default=False, alias="fabricPartitions", description=(
        "needs nodes offering Fabric Manager's GPU partitions (docs/passthrough.md)"))
    device_plugin: bool = Field(default=False, alias="devicePlugin", description=(
        "needs nodes serving nvidia.com/gpu through the device-plugin API beside DRA (docs/device-plugin.md)"))
    driver: Opt[Literal["absent-at-start"]] = Field(
        default=None, description="absent-at-start: the scenario's nodes start without the NVIDIA driver (sandbox)")
    steps: Items[_StepDoc] = Field(min_length=1, description="what to apply or delete and expect, in order")


_decode_expect = Decoder[_ExpectFile](_ExpectFile)


def _node_aliases(files: Mapping[str, tuple[JsonObject, ...]], steps: Iterable[Step]) -> frozenset[str]:
    aliases: set[str] = set()
    for step in steps:
        expect = step.expect
        aliases.update(p.node for p in expect.pods if p.node)
        aliases.update(e.node for e in expect.slices)
        aliases.update(e.node for e in expect.device_taints)
        aliases.update(n.alias for n in expect.nodes)
        if step.nvidia_driver is not None:
            aliases.add(step.nvidia_driver.node)
    for objs in files.values():
        for obj in objs:
            if obj["kind"] == "Pod":
                selector = obj["spec"].get("nodeSelector") or {}
                if isinstance(selector, dict) and isinstance(selector.get(NODE_LABEL), str):
                    aliases.add(selector[NODE_LABEL])
    return frozenset(aliases)


def load_scenario(directory: Path) -> Scenario:
    """Read one scenario directory. Raises ScenarioError listing every problem found."""
    directory = Path(directory)
    name = directory.name
    problems = _Problems()
    if not is_dns_label(name) or len(name) > _MAX_NAME:
        problems.add(
            str(directory),
            f"scenario name {name!r} must be a lower-case DNS label of at most {_MAX_NAME} characters "
            f"(its namespace is {NAMESPACE_PREFIX}<name>)",
        )
    namespace = namespace_for(name)
    expect_path = directory / EXPECT_FILE
    if not expect_path.is_file():
        raise ScenarioError([f"{expect_path}: missing; every scenario needs an {EXPECT_FILE} (see e2e/README.md)"])
    files: dict[str, tuple[JsonObject, ...]] = {}
    seen: dict[tuple[str, str], str] = {}
    for path in sorted(p for p in directory.iterdir() if p.suffix in YAML_SUFFIXES and p.name != EXPECT_FILE):
        try:
            docs = parse_yaml_documents(path.read_text(encoding="utf-8"), str(path))
        except ScenarioError as exc:
            problems.items.extend(exc.problems)
            continue
        objs: list[JsonObject] = []
        for i, doc in enumerate(docs):
            obj = _check_object(doc, f"{path}: document {i + 1}", namespace, problems)
            if obj is None:
                continue
            key = (obj["kind"], obj["metadata"]["name"])
            if key in seen:
                problems.add(f"{path}: document {i + 1}", f"{key[0]}/{key[1]} is already defined in {seen[key]}")
                continue
            seen[key] = path.name
            objs.append(obj)
        if not objs:
            problems.add(str(path), "holds no Kubernetes object; remove the file or add objects")
        files[path.name] = tuple(objs)
    try:
        raw_docs = parse_yaml_documents(expect_path.read_text(encoding="utf-8"), str(expect_path))
    except ScenarioError as exc:
        raise ScenarioError(problems.items + exc.problems) from None
    where = str(expect_path)
    if len(raw_docs) != 1 or not isinstance(raw_docs[0], dict):
        problems.add(where, "must be one YAML mapping with description and steps")
        raise ScenarioError(problems.items)
    ctx = _Context(name, files)
    try:
        doc = _decode_expect(raw_docs[0], context=ctx)
    except DecodeError as exc:
        problems.items.extend(f"{where}: {p}" for p in exc.problems)
    for unused in sorted(set(files) - ctx.used_files):
        problems.add(str(directory / unused), "is never applied by a step; apply it or remove it")
    if problems.items:
        raise ScenarioError(problems.items)
    steps = tuple(step.value(i + 1) for i, step in enumerate(doc.steps))
    return Scenario(
        name=name,
        directory=directory,
        description=doc.description,
        files=files,
        steps=steps,
        node_aliases=_node_aliases(files, steps),
        timeout=doc.timeout,
        consumable_shares=doc.consumable_shares,
        cluster=doc.cluster,
        passthrough=doc.passthrough,
        vgpu=VGPU_SRIOV if doc.vgpu is True else doc.vgpu or None,
        fabric_partitions=doc.fabric_partitions,
        device_plugin=doc.device_plugin,
        driver=doc.driver,
    )


def load_scenarios(root: Path, only: Iterable[str] = ()) -> list[Scenario]:
    """Every scenario under `root` (sorted by name), or just those `only` selects: a scenario's name selects it,
    any other word every scenario whose name contains it (`--only driver`: the driver-lifecycle scenarios).

    Raises ScenarioError with the problems of every bad scenario, and for words in `only` that select none.
    """
    root = Path(root)
    if not root.is_dir():
        raise ScenarioError([f"{root}: scenario directory not found; pass --scenarios DIR (e.g. e2e/scenarios)"])
    available = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    selected = [[word] if word in available else [n for n in available if word in n] for word in only]
    wanted = list(dict.fromkeys(name for names in selected for name in names)) or available
    unknown = [word for word, names in zip(only, selected, strict=True) if not names]
    if unknown:
        raise ScenarioError(
            [f"--only: no scenario named {', '.join(unknown)} under {root}; available: {', '.join(available)}"]
        )
    scenarios: list[Scenario] = []
    problems: list[str] = []
    for scenario_name in wanted:
        try:
            scenarios.append(load_scenario(root / scenario_name))
        except ScenarioError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ScenarioError(problems)
    return scenarios
