"""The scenario model: what a scenario applies, deletes and expects, as frozen values.

`dra_sandbox.e2e.loader` builds these from `e2e/scenarios/<name>/` (and is the only place that reads files);
`dra_sandbox.e2e.expect` checks them against what a cluster shows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dra_sandbox.nvidiadriver import DriverAction

JsonObject = dict[str, Any]

# Pods that care where they run select a node by this label; expectations name the same value ("alias").
# The sandbox labels its nodes with it, the kind recipe too; on any other cluster, label one node per alias.
NODE_LABEL = "e2e.dra.dev/node"
NAMESPACE_PREFIX = "e2e-"

Phase = Literal["Pending", "Running", "Succeeded", "Failed"]
UuidKind = Literal["GPU", "MIG"]  # the prefix of every UUID a container saw
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class KindInfo:
    """A kind scenarios may use: how kubectl and the sandbox address it."""

    api_version: str
    resource: str  # kubectl's fully qualified resource name
    namespaced: bool
    # Older versions a scenario file may use; the API server converts them (reads stay in api_version).
    older_versions: tuple[str, ...] = ()


_RESOURCE_BETAS = ("resource.k8s.io/v1beta2", "resource.k8s.io/v1beta1")
KINDS: Mapping[str, KindInfo] = {
    "Pod": KindInfo("v1", "pods", True),
    "ResourceClaim": KindInfo("resource.k8s.io/v1", "resourceclaims.resource.k8s.io", True, _RESOURCE_BETAS),
    "ResourceClaimTemplate": KindInfo(
        "resource.k8s.io/v1", "resourceclaimtemplates.resource.k8s.io", True, _RESOURCE_BETAS
    ),
    "DeviceClass": KindInfo("resource.k8s.io/v1", "deviceclasses.resource.k8s.io", False, _RESOURCE_BETAS),
    # KEP-5055; read at v1beta2, which 1.36 (gate DRADeviceTaintRules, the kind recipe sets it) and 1.37 serve.
    "DeviceTaintRule": KindInfo("resource.k8s.io/v1beta2", "devicetaintrules.resource.k8s.io", False,
                                ("resource.k8s.io/v1",)),
    # Needs `dra-driver controller` (the chart's controller.enabled; the e2e sandbox runs it).
    "GpuSharingPolicy": KindInfo("gpu.dra.dev/v1beta1", "gpusharingpolicies.gpu.dra.dev", False),
    # Issue 24: needs the compute-domain controller (`dra-driver controller --compute-domains`, the chart's default).
    "ComputeDomain": KindInfo("gpu.dra.dev/v1beta1", "computedomains.gpu.dra.dev", True),
}
# A scenario's `cluster`: the sandbox it needs. `compute-domains`: gb200-nvl72 nodes of one NVLink clique with the
# compute-domain kubelet plugin and the controller's ComputeDomain reconciler (e2e/README.md).
COMPUTE_DOMAIN_CLUSTER = "compute-domains"
# A scenario's `driver`: its nodes start without the NVIDIA driver (the GPU Operator's driver container not done yet).
DRIVER_ABSENT_AT_START = "absent-at-start"
# Kinds the runner itself reads or writes (never in scenario files).
SYSTEM_KINDS: Mapping[str, KindInfo] = {
    "Namespace": KindInfo("v1", "namespaces", False),
    "CustomResourceDefinition": KindInfo("apiextensions.k8s.io/v1", "customresourcedefinitions.apiextensions.k8s.io",
                                         False),
    "Node": KindInfo("v1", "nodes", False),
}


def kind_info(kind: str) -> KindInfo:
    info = KINDS.get(kind) or SYSTEM_KINDS.get(kind)
    if info is None:
        raise ValueError(f"kind {kind!r} is not one the e2e runner handles: {', '.join([*KINDS, *SYSTEM_KINDS])}")
    return info


@dataclass(frozen=True, order=True)
class ObjectRef:
    """`Kind/name`; namespaced kinds live in the scenario's namespace (None for cluster-scoped kinds)."""

    kind: str
    name: str
    namespace: str | None = None

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"

    def manifest_stub(self) -> JsonObject:
        """apiVersion/kind/metadata only: enough for the sandbox helpers to address the object."""
        meta: JsonObject = {"name": self.name}
        if self.namespace is not None:
            meta["namespace"] = self.namespace
        return {"apiVersion": kind_info(self.kind).api_version, "kind": self.kind, "metadata": meta}


@dataclass(frozen=True, order=True)
class ContainerRef:
    pod: str
    container: str

    def __str__(self) -> str:
        return f"{self.pod}/{self.container}"


@dataclass(frozen=True)
class ContainerExpect:
    devices: int | None = None  # devices the container got (DRA_DEVICE_*_UUID, else NVIDIA_VISIBLE_DEVICES)
    uuid: UuidKind | None = None  # every entry starts with "<uuid>-"
    env: Mapping[str, str] = field(default_factory=dict)  # variable -> regex (re.search)
    # Regexes (re.search) each matched by a device node path / a mount target the container got (sandbox only:
    # the kubelet simulator's record; e.g. /dev/vfio/<group> of a passthrough GPU, the device metadata file).
    device_nodes: tuple[str, ...] = ()
    mounts: tuple[str, ...] = ()


@dataclass(frozen=True)
class PodExpect:
    name: str
    phase: Phase
    node: str | None = None  # node alias (value of NODE_LABEL on the pod's node)
    message: str | None = None  # regex the scheduling explanation must match (Pending only)
    containers: Mapping[str, ContainerExpect] = field(default_factory=dict)


@dataclass(frozen=True)
class PolicyExpect:
    """A GpuSharingPolicy's Ready condition, as the controller reports it (for its current generation)."""

    name: str
    ready: Literal["True", "False"]
    reason: str | None = None  # regex (re.search) on the condition's reason
    message: str | None = None  # regex (re.search) on the condition's message


@dataclass(frozen=True)
class ComputeDomainExpect:
    """A ComputeDomain's `status.status` (Ready | NotReady) and, optionally, how many `status.nodes` it lists."""

    name: str
    status: Literal["Ready", "NotReady"]
    nodes: int | None = None


# --- the node's NVIDIA driver (issue 26): what the plugin publishes and reports while it comes and goes ---------------


@dataclass(frozen=True)
class SliceExpect:
    """The ResourceSlices of this driver on the node of alias `node`."""

    node: str
    count: int | None = None  # how many slices (0: none published, e.g. while there is no driver)
    # The `driverVersion` attribute every device that has one shows (compared as published: semver, so "580.200.01"
    # expects "580.200.1"); at least one device must have it.
    driver_version: str | None = None


@dataclass(frozen=True)
class DeviceTaintExpect:
    """A taint with `key` (and `effect`, when given) on every device (`devices: all`) or on none (`none`) of the
    driver's slices on the node of alias `node`."""

    node: str
    key: str
    effect: Literal["NoSchedule", "NoExecute", "None"] | None = None
    devices: Literal["all", "none"] = "all"


@dataclass(frozen=True)
class EventsExpect:
    """Events about one object: each reason of `events` with a message matching its regex; none of `no_events`."""

    events: Mapping[str, str] = field(default_factory=dict)
    no_events: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeExpect:
    """The Node of alias `alias`: annotations (key -> regex), its Events, and its plugin's /healthz readiness."""

    alias: str
    annotations: Mapping[str, str] = field(default_factory=dict)
    events: EventsExpect = field(default_factory=EventsExpect)
    plugin_ready: bool | None = None


@dataclass(frozen=True)
class ClaimExpect:
    """A ResourceClaim of the scenario: its Events (e.g. PreparedClaimLost after a driver reload)."""

    name: str
    events: EventsExpect = field(default_factory=EventsExpect)


@dataclass(frozen=True)
class DriverChange:
    """A step's `nvidiaDriver`: unload, load or reload the NVIDIA driver of the node of alias `node` (sandbox only)."""

    node: str
    action: DriverAction
    version: str | None = None


@dataclass(frozen=True)
class Expectations:
    pods: tuple[PodExpect, ...] = ()
    same_devices: tuple[tuple[ContainerRef, ...], ...] = ()  # each group saw identical device lists
    distinct_devices: tuple[tuple[ContainerRef, ...], ...] = ()  # no device seen by two members of a group
    gone: tuple[ObjectRef, ...] = ()  # objects that must no longer exist
    policies: tuple[PolicyExpect, ...] = ()
    compute_domains: tuple[ComputeDomainExpect, ...] = ()
    slices: tuple[SliceExpect, ...] = ()
    device_taints: tuple[DeviceTaintExpect, ...] = ()
    nodes: tuple[NodeExpect, ...] = ()
    claims: tuple[ClaimExpect, ...] = ()


@dataclass(frozen=True)
class Step:
    number: int  # 1-based, as reports show it
    name: str
    apply: tuple[str, ...] = ()  # scenario file names, applied in order
    delete: tuple[ObjectRef, ...] = ()  # deleted in order, then waited for until gone
    expect: Expectations = field(default_factory=Expectations)
    timeout: float | None = None
    # file name -> regex: applying the file's objects must be refused (admission), with a matching message.
    apply_fails: Mapping[str, str] = field(default_factory=dict)
    nvidia_driver: DriverChange | None = None  # act on a node's NVIDIA driver (the sandbox's fake one)

    @property
    def title(self) -> str:
        return f"step {self.number} ({self.name})" if self.name else f"step {self.number}"


@dataclass(frozen=True)
class Scenario:
    name: str
    directory: Path
    description: str
    files: Mapping[str, tuple[JsonObject, ...]]  # file name -> its objects (namespace already set)
    steps: tuple[Step, ...]
    node_aliases: frozenset[str]  # node aliases the scenario needs
    timeout: float | None = None
    # The nodes' `--consumable-shares` mode the scenario needs (`memory`, `unlimited` or a share count; None: any
    # cluster). The sandbox starts a cluster per mode; on a real cluster the scenario is skipped unless a node
    # publishes GPUs in that mode.
    consumable_shares: str | None = None
    # The sandbox the scenario needs (None: the default one); see COMPUTE_DOMAIN_CLUSTER.
    cluster: str | None = None
    # Needs nodes whose GPUs are offered for passthrough (`<driver>/passthrough=true`, docs/passthrough.md): the
    # sandbox starts a cluster with it; on a real cluster the scenario is skipped unless a node publishes a VFIO device.
    passthrough: bool = False
    # Needs nodes that are vGPU hosts offering their GPUs as vGPUs (`--vgpu all`, the fake's `vgpu=true`; docs/vgpu.md):
    # VGPU_SRIOV (vGPUs on SR-IOV VFs) or VGPU_MDEV (mediated devices, the fake's `vgpu_mdev=true`); None: neither. The
    # sandbox starts a cluster of them; on a real cluster the scenario is skipped unless a node publishes a vGPU.
    vgpu: str | None = None
    # Needs nodes whose Fabric Manager offers GPU partitions (`--fabric-partitions on`, the fake's
    # `fabric_partitions=true`; docs/passthrough.md): the sandbox starts a cluster of them; on a real cluster the
    # scenario is skipped unless a node publishes a partition.
    fabric_partitions: bool = False
    # Needs nodes whose kubelet plugin also serves nvidia.com/gpu through the kubelet's device-plugin API
    # (`--device-plugin on`, docs/device-plugin.md): the sandbox starts a cluster with it (its kubelets run the
    # device manager); on another cluster the scenario is skipped unless a Node's allocatable shows nvidia.com/gpu.
    device_plugin: bool = False
    # The nodes' NVIDIA driver at start: None (loaded, any cluster) or DRIVER_ABSENT_AT_START (the sandbox starts
    # the scenario's nodes without it). Scenarios with it or with `nvidiaDriver` steps need a cluster whose driver
    # the runner can change (the sandbox): a real cluster SKIPs them.
    driver: str | None = None

    @property
    def acts_on_driver(self) -> bool:
        return self.driver is not None or any(step.nvidia_driver is not None for step in self.steps)

    @property
    def namespace(self) -> str:
        return namespace_for(self.name)

    def objects(self, file_name: str) -> tuple[JsonObject, ...]:
        return self.files[file_name]

    def cluster_scoped(self) -> tuple[ObjectRef, ...]:
        """Cluster-scoped objects the scenario creates: the runner deletes them when it is done."""
        refs = {
            ObjectRef(obj["kind"], obj["metadata"]["name"])
            for objs in self.files.values()
            for obj in objs
            if not kind_info(obj["kind"]).namespaced
        }
        return tuple(sorted(refs))


def published_consumable_shares(slices: list[JsonObject], driver: str) -> frozenset[str]:
    """The `--consumable-shares` modes the driver's ResourceSlices show (whole GPUs of type `gpu` that are
    multi-allocatable): a share count where a `shares` capacity is published, `memory` where a claim that names no
    memory takes all of it (the policy default is the value), else `unlimited`."""
    modes: set[str] = set()
    for item in slices:
        spec = item.get("spec") or {}
        if spec.get("driver") != driver:
            continue
        for device in spec.get("devices") or ():
            kind = ((device.get("attributes") or {}).get("type") or {}).get("string")
            if not device.get("allowMultipleAllocations") or kind != "gpu":
                continue
            capacity = device.get("capacity") or {}
            memory = capacity.get("memory") or {}
            if "shares" in capacity:
                modes.add(str((capacity["shares"] or {}).get("value")))
            elif (memory.get("requestPolicy") or {}).get("default") == memory.get("value"):
                modes.add("memory")
            else:
                modes.add("unlimited")
    return frozenset(modes)


VGPU_SRIOV, VGPU_MDEV = "sriov", "mdev"  # a scenario's kind of vGPU host (`vgpu: true` / `vgpu: mdev`)


def publishes_type(slices: list[JsonObject], driver: str, device_type: str) -> bool:
    """Whether the driver's ResourceSlices hold a device whose attribute `type` is `device_type`."""
    return any(
        ((device.get("attributes") or {}).get("type") or {}).get("string") == device_type
        for item in slices if (item.get("spec") or {}).get("driver") == driver
        for device in (item.get("spec") or {}).get("devices") or ()
    )


def namespace_for(scenario_name: str) -> str:
    return NAMESPACE_PREFIX + scenario_name
