"""The crash campaign's vGPU part (docs/vgpu.md, docs/sandbox.md "Crash campaign"): the real kubelet plugin of a fake
vGPU host (`vgpu=true`: SR-IOV virtual functions; and a second host with `vgpu_mdev=true`: mediated devices) driven
with random trials in the campaign's one trial loop (crashtrials.run_together): prepare a new vGPU claim (1-2 of the
slots below, half with a VfioDeviceConfig), prepare a prepared claim again, unprepare, retry the unprepare of a
released claim, restart. With `crash_probability` the operation runs in a plugin armed to SIGKILL itself at a crash
point it reaches (mostly the `vgpu:` points, VGPU_POINT_SHARE; else the engine's own), or is SIGKILLed after a random
delay; then the plugin is restarted and the operation retried as the kubelet does.

At campaign start one vGPU is made on the host by "someone else" (another tool, a VM the host's admin runs): a VF
typed (or an mdev created) on GPU 3, where claims also get vGPUs of the same type.

Checks after every trial, from the checkpoint bytes, the CDI directory and the fake's state: prepared claims
`PrepareCompleted` with their devices, a started vGPU record each and one parsable CDI spec; released claims gone;
every vGPU on the host (typed VF or mdev) other than the foreign one is named by exactly one claim record, and every
vGPU a prepared claim's record names exists with the recorded type; the foreign vGPU is still there with its type;
no temp file. At the end (every claim unprepared) the only vGPU left is the foreign one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from dra_driver.nvml.factory import open_backend
from dra_driver.nvml.fake.backend import FakeNvml
from dra_driver.nvml.fake.state import read_fake_state
from dra_driver.plugin.checkpoint import ClaimRecord, ClaimState
from dra_driver.plugin.faults import METADATA_POINTS, PREPARE_POINTS, VGPU_POINTS
from dra_sandbox.cluster import NodeSpec, SandboxCluster
from dra_sandbox.crashcampaign import CampaignReport, CampaignSettings, ClaimModel, NodeCampaign

SRIOV_NODE: Final = "vgpu-node"
MDEV_NODE: Final = "mdev-node"
TYPE_20C: Final = 904  # the fake's quarter of a GPU: four per GPU (docs/fake-nvml.md, "vGPU")
FOREIGN_MINOR: Final = 3  # the GPU where someone else made a vGPU before the campaign
# Slots that never overlap: four quarter-GPU vGPUs on GPUs 0-2, three on GPU 3 (the foreign vGPU takes the fourth).
SLOTS: Final = tuple(f"gpu-{g}-vgpu-h100-20c-{s}" for g in range(3) for s in range(4)) + tuple(
    f"gpu-{FOREIGN_MINOR}-vgpu-h100-20c-{s}" for s in range(3)
)
FOREIGN_MDEV: Final = "0f0e0d0c-0b0a-4908-8706-050403020100"  # another tool's mdev on an mdev host
VGPU_CREATE_POINTS: Final = tuple(p for p in VGPU_POINTS if "destroy" not in p)
VGPU_DESTROY_POINTS: Final = tuple(p for p in VGPU_POINTS if "destroy" in p)
VGPU_POINT_SHARE: Final = 0.8  # share of a claim's armed crashes that land on a vgpu: point


def vgpu_node(name: str, *, mdev: bool) -> NodeSpec:
    """A DGX H100 host running the vGPU Manager (MIG off): SR-IOV VFs, or with `mdev` mediated devices."""
    knobs = "vgpu=true,vgpu_mdev=true" if mdev else "vgpu=true"
    return NodeSpec(name, f"fake:dgx-h100,mig=off,{knobs}", mig_mode="static", plugin_env={"DRA_DRIVER_VGPU": "all"})


@dataclass
class VgpuReport(CampaignReport):
    node: str = ""
    vgpu_claims: int = 0  # claims prepared on vGPU slots
    foreign: str = ""  # the vGPU someone else made (VF address or mdev UUID)

    def title(self) -> str:
        return f"vGPU crash campaign ({self.node})"

    def detail(self) -> str:
        return f"{self.vgpu_claims} vGPU claims, foreign vGPU {self.foreign} kept"


def _gpu_of(slot: str) -> str:
    return slot.split("-vgpu-")[0]


class VgpuCampaign(NodeCampaign[VgpuReport]):
    """The campaign's shared machinery (crashcampaign.NodeCampaign) on a vGPU host, with the vGPU slots, points and
    checks."""

    family = "vgpu"
    focus_share = VGPU_POINT_SHARE

    def __init__(self, cluster: SandboxCluster, node: str, settings: CampaignSettings,
                 progress: Callable[[str], None] | None = None) -> None:
        super().__init__(cluster, node, settings, VgpuReport(node=node), progress)
        self.foreign, self.foreign_type = self._seed_foreign_vgpu()
        self.report.foreign = self.foreign

    def _seed_foreign_vgpu(self) -> tuple[str, int]:
        """A vGPU no claim made, on GPU FOREIGN_MINOR: its last VF typed, or an mdev created (the fake's sysfs)."""
        admin = open_backend(self.plugin.nvml_spec, driver_root="/")
        if not isinstance(admin, FakeNvml):
            raise RuntimeError("the vGPU campaign's node is a fake NVML node")
        admin.init()
        try:
            gpu = next(g for g in admin.gpus() if g.minor == FOREIGN_MINOR)
            sysfs = admin.vgpu_sysfs()
            address = gpu.pci_bus_id.lower()
            vfs = sysfs.virtual_functions(address)
            key = vfs[-1].address if vfs else FOREIGN_MDEV
            if self.live_vgpus().get(key) == TYPE_20C:
                return key, TYPE_20C  # made before an earlier campaign on this host
            if vfs:
                sysfs.set_vgpu_type(key, TYPE_20C)
            else:
                sysfs.create_mdev(address, f"nvidia-{TYPE_20C}", key)
            return key, TYPE_20C
        finally:
            admin.shutdown()

    # --- operations ----------------------------------------------------------------------------------------------

    def _free_slots(self) -> list[str]:
        used = {d for c in (*self.prepared.values(), *self.releasing) for d in c.devices}
        return [s for s in SLOTS if s not in used]

    def op_prepare_new(self, near: ClaimModel | None = None) -> None:
        free = self._free_slots()
        if near is not None:
            close = [s for s in free if _gpu_of(s) in {_gpu_of(d) for d in near.devices}]
            free = close if close and self.rng.random() < 0.8 else free
        if not free:
            return  # every slot is taken: the next unprepare frees one
        devices = tuple(sorted(self.rng.sample(free, k=min(len(free), self.rng.choice((1, 1, 2))))))
        claim = self._new_claim(devices, "vg", self._vfio_config() if self.rng.random() < 0.5 else [])
        self.report.vgpu_claims += 1
        self._call([*PREPARE_POINTS, *METADATA_POINTS], lambda c: c.prepare([claim.ref]), self._focus(devices, True))
        claim.cdi_ids = self._prepare_until_ok(claim)
        if any(not ids for ids in claim.cdi_ids):
            self.report.violations.append(f"{claim.ref.name}: a device was reported without CDI ids: {claim.cdi_ids}")
        self.prepared[claim.ref.uid] = claim

    def _focus(self, devices: Sequence[str], create: bool) -> list[str]:
        """The vgpu: points a prepare (create) or unprepare of these devices reaches, once per vGPU (`#n`)."""
        points = VGPU_CREATE_POINTS if create else VGPU_DESTROY_POINTS
        return [p if n == 1 else f"{p}#{n}" for p in points for n in range(1, len(devices) + 1)]

    def _unprepare_focus(self, claim: ClaimModel) -> list[str]:
        return self._focus(claim.devices, False)

    # --- invariants ----------------------------------------------------------------------------------------------

    def _kind_problems(self, claims: Mapping[str, ClaimRecord], *, final: bool) -> list[str]:
        found = [
            f"prepared claim {claim.ref.name} has a device without its vGPU recorded"
            for uid, claim in self.prepared.items()
            if (record := claims.get(uid)) is not None
            and record.state is ClaimState.PREPARE_COMPLETED
            and not all(d.vgpu is not None and d.vgpu.started for d in record.devices)
        ]
        return found + self._vgpu_problems(claims, final=final)

    def live_vgpus(self) -> dict[str, int]:
        """Every vGPU on the host, by VF address or mdev UUID, with its type id (the fake's state on disk)."""
        state = read_fake_state(self.plugin.state_file)
        return {**dict(state.vgpu), **{u: t for u, _, t, _ in state.mdevs}}

    def _vgpu_problems(self, records: Mapping[str, ClaimRecord], *, final: bool) -> list[str]:
        live = self.live_vgpus()
        found = []
        if live.get(self.foreign) != self.foreign_type:
            found.append(f"the foreign vGPU {self.foreign} (type {self.foreign_type}) was touched: now "
                         f"{live.get(self.foreign, 'gone')}")
        named: Counter[str] = Counter()
        completed: dict[str, int] = {}
        for record in records.values():
            for device in record.devices:
                vgpu = device.vgpu
                key = vgpu.vf or vgpu.mdev if vgpu is not None else None
                if vgpu is None or key is None:
                    continue
                named[key] += 1
                if record.state is ClaimState.PREPARE_COMPLETED:
                    completed[key] = vgpu.type_id
        found += [f"vGPU {k} is named by {n} claim records" for k, n in named.items() if n > 1]
        if self.foreign in named:
            found.append(f"the foreign vGPU {self.foreign} is named by a claim record")
        for key, type_id in sorted(live.items()):
            if key != self.foreign and key not in named:
                found.append(f"vGPU {key} (type {type_id}) exists without a claim record")
        for key, type_id in sorted(completed.items()):
            if live.get(key) != type_id:
                found.append(f"a prepared claim's vGPU {key} (type {type_id}) is {live.get(key, 'gone')} on the host")
        if final and set(live) != {self.foreign}:
            found.append(f"vGPUs left after every claim was unprepared: {sorted(set(live) - {self.foreign})}")
        return found
