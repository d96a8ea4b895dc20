"""The crash campaign's Fabric Manager part (docs/passthrough.md "Fabric Manager partitions", docs/sandbox.md "Crash
campaign"): the real kubelet plugin (`--fabric-partitions on`) of a fake HGX node whose FM runs in shared NVSwitch
mode (`fabric_partitions=true`), driven with random trials in the campaign's one trial loop (crashtrials.run_together):
prepare a new claim of one or two `fm-partition-<id>` devices (half with a VfioDeviceConfig), prepare a prepared claim
again, unprepare (after a crashed unprepare another claim may take a partition over the same GPUs first), retry the
unprepare of a released claim, restart, and a stale allocation (a partition over a GPU another claim's partition or
someone else's holds) that must be refused. With `crash_probability` the operation runs in a plugin armed to SIGKILL
itself at a point it reaches (mostly the `fmpartition:` points and the `vfio:` points of the members' binding, per
function as `#n`; else the engine's own), or is SIGKILLed after a random delay; then the plugin is restarted and the
operation retried as the kubelet does (after a crashed prepare the pod may go away instead: the claim is unprepared).

At campaign start someone else (an admin's VM) holds the last GPU: bound to vfio-pci and its one-GPU partition
activated, before the plugin (restarted) looks.

Checks after every trial, from the checkpoint bytes, the CDI directory and the fake's state: what every part's claims
must hold (crashcampaign.NodeCampaign: prepared claims completed with one parsable CDI spec and their metadata,
released ones gone); a partition is active iff a prepared claim's record holds it (activating, every member bound) or
it is the foreign one; no record names a partition twice or the foreign one; every member GPU of a held partition is
bound to its vfio driver and every other GPU to nvidia (the shared PCI checks, the foreign GPU on the driver its owner
chose), none bound to no driver; no temp file. At the end only the foreign partition is active, its GPU still on
vfio-pci.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from dra_driver.nvml.fabricmanager import FabricPartition
from dra_driver.nvml.factory import open_backend
from dra_driver.nvml.fake.backend import FakeNvml
from dra_driver.nvml.fake.state import read_fake_state
from dra_driver.plugin.checkpoint import ClaimRecord, ClaimState
from dra_driver.plugin.faults import FM_PARTITION_POINTS, VFIO_POINTS
from dra_sandbox.cluster import NodeSpec, SandboxCluster
from dra_sandbox.crashcampaign import CampaignReport, CampaignSettings, ClaimModel, NodeCampaign

FM_NODE: Final = "fm-node"
PREFIX: Final = "fm-partition-"
VFIO_DRIVER: Final = "vfio-pci"
FM_PREPARE_POINTS: Final = tuple(p for p in FM_PARTITION_POINTS if "deactivate" not in p)
FM_UNPREPARE_POINTS: Final = tuple(p for p in FM_PARTITION_POINTS if "deactivate" in p)
VFIO_BIND_POINTS: Final = tuple(p for p in VFIO_POINTS if "restore" not in p)
VFIO_RESTORE_POINTS: Final = tuple(p for p in VFIO_POINTS if "restore" in p)


def fm_node(name: str = FM_NODE) -> NodeSpec:
    """A DGX H100 (MIG off) whose Fabric Manager offers the board's 15 partitions; its plugin passes them through."""
    return NodeSpec(name, "fake:dgx-h100,mig=off,fabric_partitions=true", mig_mode="static",
                    plugin_env={"DRA_DRIVER_FABRIC_PARTITIONS": "on"})  # fmt: skip


@dataclass
class FmReport(CampaignReport):
    partition_claims: int = 0  # claims prepared on fm-partition devices
    foreign: int = -1  # the partition someone else activated

    def title(self) -> str:
        return "FM partition crash campaign"

    def detail(self) -> str:
        return (f"{self.partition_claims} partition claims ({self.abandoned} abandoned after a crash, "
                f"{self.refused_conflicts} stale allocations refused), foreign partition {self.foreign} kept")


class FmCampaign(NodeCampaign[FmReport]):
    """The campaign's shared machinery (crashcampaign.NodeCampaign) on a node whose FM offers partitions."""

    family = "fmpartition"  # with the vfio: points of the members' binding, 80% of a claim's armed crashes

    def __init__(self, cluster: SandboxCluster, settings: CampaignSettings,
                 progress: Callable[[str], None] | None = None, node: str = FM_NODE) -> None:  # fmt: skip
        super().__init__(cluster, node, settings, FmReport(), progress)
        self._read_gpus()
        self.table = {p.id: p for p in self._partitions()}
        # FM names every GPU of the board, also one NVML no longer lists (on vfio-pci since an earlier campaign).
        for gpu in (g for p in self.table.values() for g in p.gpus):
            domain, rest = gpu.pci_bus_id.split(":", 1)
            self.gpu_address.setdefault(gpu.uuid, f"{int(domain, 16):04x}:{rest.lower()}")
        self.foreign = self._seed_foreign_partition()
        self.report.foreign = self.foreign
        foreign_gpus = self._members(self.foreign)
        # The partitions the plugin offers (every member on nvidia) and the stale ones over the foreign GPU.
        self.slots = tuple(f"{PREFIX}{p}" for p in sorted(self.table) if not self._members(p) & foreign_gpus)
        self.beyond = tuple(f"{PREFIX}{p}" for p in sorted(self.table) if self._members(p) & foreign_gpus)
        pci = read_fake_state(self.plugin.state_file).pci
        if pci is None:
            raise RuntimeError(f"the FM campaign's node {node} has no PCI state")
        for slot in self.slots:
            groups = {pci.function(self.gpu_address[u]).iommu_group for u in self._members(_id(slot))}
            self.functions_moved[slot] = sum(1 for f in pci.functions if f.iommu_group in groups and f.driver)
            self.slot_persistent[slot] = any(self.boot_persistence[u] for u in self._members(_id(slot)))

    def _admin(self) -> FakeNvml:
        admin = open_backend(self.plugin.nvml_spec, driver_root="/")
        if not isinstance(admin, FakeNvml):
            raise RuntimeError("the FM campaign's node is a fake NVML node")
        admin.init()
        return admin

    def _partitions(self) -> tuple[FabricPartition, ...]:
        admin = self._admin()
        try:
            return admin.fabric_manager().supported_partitions()
        finally:
            admin.shutdown()

    def _members(self, partition: int) -> frozenset[str]:
        return frozenset(g.uuid for g in self.table[partition].gpus)

    def _seed_foreign_partition(self) -> int:
        """Someone else's VM: the board's last GPU bound to vfio-pci and its one-GPU partition (FM's last) activated
        (the fake's sysfs and FM, as an admin's tools would), then the plugin restarted so that it starts from that
        node."""
        foreign = max(self.table)
        [gpu] = self.table[foreign].gpus
        address = self.gpu_address[gpu.uuid]
        self.bound_elsewhere = {address: VFIO_DRIVER}
        if foreign in read_fake_state(self.plugin.state_file).fm_active:
            return foreign  # made before an earlier campaign on this node
        admin = self._admin()
        try:
            pci = admin.pci_sysfs()
            pci.load_module(VFIO_DRIVER.replace("-", "_"))
            pci.set_driver_override(address, VFIO_DRIVER)
            pci.unbind(address, "nvidia")
            pci.bind(address, VFIO_DRIVER)
            admin.fabric_manager().activate(foreign)
        finally:
            admin.shutdown()
        self.plugin.stop()
        self.plugin.start()
        self.plugin.wait_serving()
        return foreign

    # --- operations ----------------------------------------------------------------------------------------------

    def _held(self) -> set[str]:
        """GPUs of the partitions prepared claims hold, and of those whose unprepare has not succeeded yet."""
        return {u for c in (*self.prepared.values(), *self.releasing) for d in c.devices for u in self._members(_id(d))}

    def _free_slots(self) -> list[str]:
        held = self._held()
        return [s for s in self.slots if not self._members(_id(s)) & held]

    def op_prepare_new(self, near: ClaimModel | None = None) -> None:
        free = self._free_slots()
        if near is not None:
            # Another partition over the GPUs of the claim whose unprepare crashed (a half, a pair or one of them).
            gpus = {u for d in near.devices for u in self._members(_id(d))}
            close = [s for s in free if self._members(_id(s)) & gpus]
            free = close if close and self.rng.random() < 0.8 else free
        if not free:
            return  # every GPU is taken: the next unprepare frees some
        first = self.rng.choice(free)
        rest = [s for s in free if not self._members(_id(s)) & self._members(_id(first))]
        devices = tuple(sorted([first, self.rng.choice(rest)] if rest and self.rng.random() < 1 / 3 else [first]))
        claim = self._new_claim(devices, "fm", self._vfio_config() if self.rng.random() < 0.5 else [], vfio=True)
        self.report.partition_claims += 1
        self._prepare_or_abandon(claim, [*self._vfio_points(devices, VFIO_BIND_POINTS),
                                         *self._per_partition(devices, FM_PREPARE_POINTS)])  # fmt: skip

    def _per_partition(self, devices: Sequence[str], points: Sequence[str]) -> list[str]:
        """The fmpartition: points reached once per partition of the claim (`#n` at the n-th)."""
        return [p if n == 1 else f"{p}#{n}" for p in points for n in range(1, len(devices) + 1)]

    def _unprepare_focus(self, claim: ClaimModel) -> list[str]:
        return [*self._per_partition(claim.devices, FM_UNPREPARE_POINTS),
                *self._vfio_points(claim.devices, VFIO_RESTORE_POINTS)]  # fmt: skip

    def op_conflict(self) -> None:
        """A stale allocation: a partition over a GPU another claim's partition holds, or over the foreign GPU. The
        checks then see no partition activated or deactivated and no GPU moved."""
        held = self._held()
        over_held = [s for s in self.slots if self._members(_id(s)) & held]
        slot = self.rng.choice(over_held if over_held and self.rng.random() < 0.7 else list(self.beyond))
        self._expect_refused(self._new_claim((slot,), "fm-stale", vfio=True),
                             "over a GPU held by another claim or someone else's VM")  # fmt: skip

    def kind_operations(self) -> Sequence[tuple[Callable[[], None], int]]:
        return ((self.op_conflict, 1),)

    # --- invariants ----------------------------------------------------------------------------------------------

    def active(self) -> set[int]:
        """The partitions FM has active now (the fake's state on disk)."""
        return set(read_fake_state(self.plugin.state_file).fm_active)

    def _kind_problems(self, claims: Mapping[str, ClaimRecord], *, final: bool) -> list[str]:
        found: list[str] = []
        named: Counter[int] = Counter()
        held: set[int] = set()
        for record in claims.values():
            for device in record.devices:
                made = device.fm_partition
                if made is None:
                    continue
                named[made.partition_id] += 1
                if record.state is ClaimState.PREPARE_COMPLETED:
                    held.add(made.partition_id)
                    if not made.activating or not all(g.started for g in made.gpus):
                        found.append(f"prepared claim {record.name} holds partition {made.partition_id} without "
                                     "its activation and every member's binding recorded")  # fmt: skip
        found += [f"partition {p} is named by {n} claim records" for p, n in named.items() if n > 1]
        if self.foreign in named:
            found.append(f"the foreign partition {self.foreign} is named by a claim record")
        found += [
            f"prepared claim {c.ref.name} has a device without its partition recorded"
            for uid, c in self.prepared.items()
            if (r := claims.get(uid)) is not None and not all(d.fm_partition is not None for d in r.devices)
        ]
        active = self.active()
        if self.foreign not in active:
            found.append(f"the foreign partition {self.foreign} was deactivated")
        mine = active - {self.foreign}
        if mine != held:
            found.append(f"active partitions {sorted(mine)} (besides the foreign one), prepared claims hold "
                         f"{sorted(held)}")  # fmt: skip
        state = read_fake_state(self.plugin.state_file)
        return found + self._pci_problems(list(claims.values()), state, final=final)


def _id(slot: str) -> int:
    return int(slot.removeprefix(PREFIX))
