"""An engine over a fake vGPU host (the fake knob `vgpu=true`): every GPU offered as vGPUs, the vGPU effect on the
fake node's per-VF sysfs, kept in a state file so a simulated crash can be replayed from the bytes on disk (the
passthrough rig's `SnapshotFaults`)."""

from __future__ import annotations

from pathlib import Path

from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.inventory.passthrough import NO_PASSTHROUGH
from dra_driver.inventory.sharing import EXCLUSIVE
from dra_driver.inventory.vgpu import vgpu_settings
from dra_driver.nvml.factory import open_backend
from dra_driver.nvml.fake.backend import FakeNvml
from dra_driver.nvml.fake.state import read_fake_state
from dra_driver.nvml.fake.vgpu import FakeVgpuSysfs
from dra_driver.plugin.cdi import ClaimSpecWriter, FakeCdiEdits
from dra_driver.plugin.checkpoint import CheckpointStore
from dra_driver.plugin.effects.base import NodeTools
from dra_driver.plugin.effects.registry import node_effects
from dra_driver.plugin.engine import EngineSettings, PrepareEngine
from dra_driver.plugin.faults import FaultPoints
from dra_driver.plugin.sharing import TimeSlicer
from dra_driver.plugin.vgpu import VgpuMaker
from tests.plugin.conftest import DRIVER, NODE
from tests.plugin.vfiorig import VfioRig

VGPU_NODE = """
name: vgpu-node
gpus:
  - model: H100-SXM5-80GB
    count: 2
"""


class VgpuRig(VfioRig):
    """`enabled`: the plugin makes vGPUs (`--vgpu all`); else the devices are listed but the effect has no maker.
    `mdev`: the GPUs are mediated-device parents (the fake's `vgpu_mdev=true`), not SR-IOV GPUs."""

    def __init__(self, tmp: Path, node_file: str = VGPU_NODE, *, enabled: bool = True, mdev: bool = False) -> None:
        self.enabled = enabled
        self.mdev = mdev
        super().__init__(tmp, node_file)

    def restart(self, faults: FaultPoints | None = None) -> PrepareEngine:
        mdev = ",vgpu_mdev=true" if self.mdev else ""
        backend = open_backend(f"fake:{self.node_file},state={self.state_file},vgpu=true{mdev}")
        backend.init()
        assert isinstance(backend, FakeNvml)
        self.nvml = backend
        self.pci = backend.pci_sysfs()
        self.vgpu: FakeVgpuSysfs = backend.vgpu_sysfs()
        if not hasattr(self, "devices"):
            # As first discovered (nothing made yet): every type of every GPU is listed.
            self.devices = catalog(discover(backend), MigOffering.STATIC, EXCLUSIVE, NO_PASSTHROUGH,
                                   vgpu_settings("all"))  # fmt: skip
        self.cdi = ClaimSpecWriter(self.cdi_root, DRIVER, FakeCdiEdits(), NODE)
        self.checkpoint = CheckpointStore(self.checkpoint_path, boot_id_path=self.boot_id)
        tools = NodeTools(
            driver_name=DRIVER,
            cdi=self.cdi,
            time_slicer=TimeSlicer(backend),
            vgpu=VgpuMaker(self.vgpu, faults, iommufd=lambda: True) if self.enabled else None,
            rediscover=self._rediscovered,
        )
        self.engine = PrepareEngine(
            settings=EngineSettings(driver_name=DRIVER, pool_name=NODE, lock_timeout=5.0),
            claims=self.claims,
            catalog=lambda: self.devices,
            effects=node_effects(tools),
            checkpoint=self.checkpoint,
            faults=faults,
        )
        return self.engine

    def typed(self) -> dict[str, int]:
        """Every VF of the node that has a vGPU type, and every mediated device, with the type id (the fake's state
        on disk)."""
        state = read_fake_state(self.state_file)
        return {**dict(state.vgpu), **{u: t for u, _, t, _ in state.mdevs}}
