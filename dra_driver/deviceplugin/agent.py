"""The device plugin's state beside DRA: what it offers the kubelet, what it allocated, and when GPUs return.

One GPU, one world at a time (docs/device-plugin.md "One GPU, one world"):
- a GPU DRA holds (a claim checkpoint record names it, or a claim guard reserved it) is reported `Unhealthy` in
  ListAndWatch, so the kubelet's allocatable drops and no pod is admitted onto it; Allocate refuses it if the
  kubelet asks anyway;
- a GPU the device plugin allocated is left out of the ResourceSlices (`withheld`) and the claim guard
  (claimguard.py) refuses a claim that names it;
- both checks and both records change under the one ownership lock (ownership.py), so neither world can take a GPU
  between the other's check and its record.
GPUs return when the kubelet's PodResources answer no longer lists them (`reconcile`, every few seconds).
What the device plugin holds, and for which pods, is published on the slices (`held`, published.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import structlog

from dra_driver.deviceplugin.cdispecs import AllocationSpecs, allocation_key
from dra_driver.deviceplugin.gpus import OfferedGpu, offered_gpus, preferred
from dra_driver.deviceplugin.ownership import Ownership, OwnershipFile
from dra_driver.deviceplugin.published import HeldGpu
from dra_driver.errors import DraDriverError
from dra_driver.inventory.catalog import AllocatableDevice
from dra_driver.kubeletplugin.driver import HealthSnapshot

log = structlog.get_logger(__name__)

HEALTHY = "Healthy"  # k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1 constants.go
UNHEALTHY = "Unhealthy"


class AllocateRefused(DraDriverError):
    """Allocate cannot give these devices; `invalid`: the request itself is wrong (not the node's state)."""

    def __init__(self, message: str, *, invalid: bool = False) -> None:
        super().__init__(message)
        self.invalid = invalid


@dataclass(frozen=True)
class ListedDevice:
    """One entry of ListAndWatch: a whole GPU by UUID, its health for the kubelet, its NUMA node."""

    id: str
    health: str
    numa_node: int | None


@dataclass(frozen=True)
class AgentSources:
    """What the agent reads of the GPU plugin (callables, so the plugin's own objects stay its own)."""

    catalog: Callable[[], Mapping[str, AllocatableDevice]]
    health: Callable[[], HealthSnapshot]  # the DRA side's health board: the same monitor for both worlds
    dra_gpus: Callable[[], set[str]]  # GPU UUIDs the claim checkpoint names (any record state)
    republish: Callable[[], None]  # the slices must be built again (`withheld` changed)


class DevicePluginAgent:
    def __init__(self, sources: AgentSources, ownership: OwnershipFile, specs: AllocationSpecs, *,
                 grace: float, clock: Callable[[], float] = time.time,
                 faults: Callable[[str], None] | None = None) -> None:  # fmt: skip
        self._sources = sources
        self._reached = faults or (lambda point: None)  # crash points (plugin/faults.py), for tests
        self.ownership = ownership
        self.specs = specs
        self._grace = grace  # an allocation younger than this is kept even where PodResources does not list it yet
        self._clock = clock
        self._changed = threading.Condition()
        self._version = 0
        # GPU UUID -> the pods PodResources last listed it for (only for `held`: what status and explain show;
        # ownership is decided by the record alone). Guarded by `_changed`'s lock.
        self._pods: dict[str, frozenset[str]] = {}

    # --- change notification (ListAndWatch waits here) -------------------------------------------------------

    def changed(self) -> None:
        with self._changed:
            self._version += 1
            self._changed.notify_all()

    def wait(self, after: int, timeout: float) -> int:
        """Wait until a change after version `after`, or `timeout`; returns the version now."""
        with self._changed:
            self._changed.wait_for(lambda: self._version != after, timeout=timeout)
            return self._version

    @property
    def version(self) -> int:
        with self._changed:
            return self._version

    # --- what the kubelet sees -------------------------------------------------------------------------------

    def offered(self) -> dict[str, OfferedGpu]:
        return offered_gpus(self._sources.catalog())

    def _dra_held(self, ownership: Ownership) -> set[str]:
        return self._sources.dra_gpus() | set(ownership.dra)

    def devices(self) -> list[ListedDevice]:
        """ListAndWatch's list: every whole GPU, Unhealthy where the health board says so or DRA holds it."""
        offered = self.offered()
        bad = {d.device for d in self._sources.health().devices if d.healthy is False}
        held = self._dra_held(self.ownership.load())
        return [
            ListedDevice(uuid, UNHEALTHY if gpu.device_name in bad or uuid in held else HEALTHY, gpu.numa_node)
            for uuid, gpu in sorted(offered.items(), key=lambda item: item[1].minor)
        ]

    def withheld(self) -> frozenset[str]:
        """GPU UUIDs the ResourceSlices must leave out: the device plugin allocated them."""
        return frozenset(self.ownership.load().allocated)

    def held(self) -> tuple[HeldGpu, ...]:
        """What the slices' annotation says the device plugin holds: each allocated GPU the node offers, with the
        pods the kubelet last listed it for."""
        catalog = self._sources.catalog()
        offered = offered_gpus(catalog)
        with self._changed:
            pods = dict(self._pods)
        allocated = [offered[u] for u in self.ownership.load().allocated if u in offered]
        return tuple(
            HeldGpu(gpu.device_name, gpu.uuid, catalog[gpu.device_name].gpu.info.name,
                    tuple(sorted(pods.get(gpu.uuid, ()))))
            for gpu in sorted(allocated, key=lambda g: g.minor)
        )  # fmt: skip

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        return preferred(self.offered(), available, must_include, size)

    # --- Allocate ----------------------------------------------------------------------------------------------

    def allocate(self, containers: Sequence[Sequence[str]]) -> list[list[str]]:
        """CDI names per container. Refuses an unknown ID or a GPU DRA holds (AllocateRefused); records every GPU
        and writes the specs before answering, so a crash after the answer still finds them owned."""
        catalog = self._sources.catalog()
        offered = offered_gpus(catalog)
        if not containers:
            raise AllocateRefused("container_requests: empty; the kubelet asks for at least one container",
                                  invalid=True)  # fmt: skip
        first: dict[str, str] = {}  # GPU -> where the request names it first (the kubelet names each GPU once)
        for c, ids in enumerate(containers):
            if not ids:
                raise AllocateRefused(f"container_requests[{c}].devices_ids: empty", invalid=True)
            for i, uuid in enumerate(ids):
                field = f"container_requests[{c}].devices_ids[{i}]"
                if uuid in first:
                    raise AllocateRefused(f"{field}: {uuid[:80]!r} is named again (first at {first[uuid]}); a GPU is "
                                          "given to one container once", invalid=True)  # fmt: skip
                first[uuid] = field
                if uuid not in offered:
                    raise AllocateRefused(f"{field}: {uuid[:80]!r} is not a whole GPU this node offers "
                                          "(a GPU in MIG mode, gone, or another node's)",
                                          invalid=True)  # fmt: skip
        answers = []
        with self.ownership.change() as changing:
            held = self._dra_held(changing.old) & {u for ids in containers for u in ids}
            if held:
                names = ", ".join(f"{offered[u].device_name} ({u})" for u in sorted(held))
                raise AllocateRefused(f"{names}: prepared for a ResourceClaim through DRA on this node; the "
                                      "device plugin reports it Unhealthy until the claim is released")  # fmt: skip
            new = changing.old
            for ids in containers:
                key = allocation_key(ids)
                # By minor number: the same GPUs asked in another order write the same spec (same bytes, same names).
                ordered = sorted(set(ids), key=lambda u: offered[u].minor)
                answers.append(self.specs.write(key, [catalog[offered[u].device_name] for u in ordered]))
                new = new.with_allocated(set(ids), self._clock(), key)
            changing.new = new
        self._reached("deviceplugin:allocate-after-record")  # recorded and specs written; the answer not yet sent
        log.info("device plugin allocated", gpus=sorted({u for ids in containers for u in ids}))
        self.changed()
        self._sources.republish()
        return answers

    # --- GPUs returning ---------------------------------------------------------------------------------------

    def reconcile(self, in_use: Mapping[str, Collection[str]] | None) -> None:
        """`in_use`: the GPU IDs PodResources lists for the resource, each with its pods ("namespace/name"); None:
        PodResources did not answer, and nothing is released on a guess. Adopts what pods hold but the record lacks
        (a plugin that lost its record, or pods started under NVIDIA's device plugin), releases what no pod holds
        any more (after the grace), drops DRA reservations whose claim never reached the checkpoint, and removes
        specs no allocation names."""
        now = self._clock()
        dra_now = self._sources.dra_gpus()
        offered = self.offered()
        with self.ownership.change() as changing:
            old = changing.old
            new = old
            if in_use is not None:
                gone = {u for u, a in old.allocated.items() if u not in in_use and now - a.at >= self._grace}
                new = new.without_allocated(gone)
                adopt = {u for u in in_use if u in offered and u not in old.allocated}
                new = new.with_allocated(adopt, now, "")
            stale = {r.claim_uid for u, r in old.dra.items() if u not in dra_now and now - r.at >= self._grace}
            new = new.without_claims(stale)
            changing.new = new
            for key in self.specs.keys_on_disk() - new.specs_in_use():
                self.specs.remove(key)
        pods_changed = False
        if in_use is not None:
            pods = {u: frozenset(p) for u, p in in_use.items() if u in new.allocated and p}
            with self._changed:
                pods_changed, self._pods = pods != self._pods, pods
        if new.allocated != old.allocated:
            self._reached("deviceplugin:release-after-record")  # recorded; ListAndWatch and the slices not yet told
        if new != old:
            log.info("device plugin ownership reconciled", released=sorted(set(old.allocated) - set(new.allocated)),
                     adopted=sorted(set(new.allocated) - set(old.allocated)),
                     dropped_reservations=sorted(set(old.dra) - set(new.dra)))  # fmt: skip
            self.changed()
        if new != old or pods_changed:
            self._sources.republish()  # also when only the pods changed: the slices' annotation names them
