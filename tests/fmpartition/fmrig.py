"""An engine over a fake HGX node whose Fabric Manager runs in shared NVSwitch mode (the fake knob
`fabric_partitions=true`): the board's partitions offered as `fm-partition-<id>`, the effect on the fake FM and PCI
state, kept in a state file so a simulated crash can be replayed from the bytes on disk (`SnapshotFaults`)."""

from __future__ import annotations

from pathlib import Path

from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.inventory.fmpartitions import partition_devices
from dra_driver.inventory.passthrough import passthrough_settings
from dra_driver.inventory.sharing import EXCLUSIVE
from dra_driver.nvml.fabricmanager import FabricManager
from dra_driver.nvml.factory import open_backend
from dra_driver.nvml.fake.backend import FakeNvml
from dra_driver.plugin.cdi import ClaimSpecWriter, FakeCdiEdits
from dra_driver.plugin.checkpoint import CheckpointStore
from dra_driver.plugin.effects.base import NodeTools
from dra_driver.plugin.effects.registry import node_effects
from dra_driver.plugin.engine import EngineSettings, PrepareEngine
from dra_driver.plugin.faults import FaultPoints
from dra_driver.plugin.fmpartition import FabricPartitioner
from dra_driver.plugin.sharing import TimeSlicer
from dra_driver.plugin.vfio import VfioBinder
from tests.plugin.conftest import DRIVER, NODE
from tests.plugin.vfiorig import VfioRig

HGX_NODE = """
name: hgx-node
gpus:
  - model: H100-SXM5-80GB
    count: 4
"""


# The 4-GPU board's partitions: 0 all four; 1 GPUs 0, 1; 2 GPUs 2, 3; 3 … 6 one GPU each.
PAIR = "fm-partition-1"  # GPUs 0 and 1
GPU0, GPU1 = "0000:18:00.0", "0000:25:00.0"


class FmRig(VfioRig):
    """`enabled`: `--fabric-partitions` (else the devices are listed but the effect has no partitioner)."""

    def __init__(self, tmp: Path, *, enabled: bool = True) -> None:
        self.enabled = enabled
        super().__init__(tmp, HGX_NODE)

    def restart(self, faults: FaultPoints | None = None) -> PrepareEngine:
        backend = open_backend(f"fake:{self.node_file},state={self.state_file},fabric_partitions=true")
        backend.init()
        assert isinstance(backend, FakeNvml)
        self.nvml = backend
        self.pci = backend.pci_sysfs()
        self.fm: FabricManager = backend.fabric_manager()
        if not hasattr(self, "devices"):
            inventory = discover(backend)
            self.devices = {
                **catalog(inventory, MigOffering.STATIC, EXCLUSIVE, passthrough_settings("all")),
                **partition_devices(inventory, self.fm.supported_partitions()),
            }
        self.cdi = ClaimSpecWriter(self.cdi_root, DRIVER, FakeCdiEdits(), NODE)
        self.checkpoint = CheckpointStore(self.checkpoint_path, boot_id_path=self.boot_id)
        vfio = VfioBinder(self.pci, backend, faults)
        tools = NodeTools(
            driver_name=DRIVER,
            cdi=self.cdi,
            time_slicer=TimeSlicer(backend),
            vfio=vfio,
            fm_partitions=FabricPartitioner(self.fm, vfio, faults) if self.enabled else None,
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

    def active(self) -> list[int]:
        return [p.id for p in self.fm.supported_partitions() if p.active]

    def on_vfio(self) -> list[str]:
        """The GPUs (by bus id) bound to vfio-pci now."""
        return sorted(a for a, d in self.drivers().items() if d == "vfio-pci")
