"""An engine over a fake node whose GPUs are also offered for passthrough (`gpu-<minor>-vfio`), with the VFIO binder
on the fake node's PCI state, kept in a state file so a simulated crash can be replayed from the bytes on disk."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.inventory.passthrough import passthrough_settings
from dra_driver.inventory.sharing import EXCLUSIVE
from dra_driver.nvml.factory import open_backend
from dra_driver.nvml.fake.backend import FakeNvml
from dra_driver.pci.fake import FakePciSysfs
from dra_driver.pci.model import NO_REBIND, RebindAllowance
from dra_driver.plugin.cdi import ClaimSpecWriter, FakeCdiEdits
from dra_driver.plugin.checkpoint import CheckpointStore
from dra_driver.plugin.effects.base import NodeTools
from dra_driver.plugin.effects.registry import node_effects
from dra_driver.plugin.engine import EngineSettings, PrepareEngine
from dra_driver.plugin.faults import FaultPoints
from dra_driver.plugin.sharing import TimeSlicer
from dra_driver.plugin.vfio import VfioBinder
from tests.plugin.conftest import DRIVER, NODE, FakeClaims

VGA_NODE = """
name: vga-node
gpus:
  - model: H100-SXM5-80GB
    count: 2
  - model: L4
    count: 2
    pci_class: vga
pci:
  functions:
    - {address: "0000:3f:00.2", group_of: "0000:3f:00.0", class_code: 0x0c0330, driver: xhci_hcd}
"""


def vfio_config(policy: str = "LegacyOnly", api_device: bool = False) -> list[dict[str, Any]]:
    parameters = {
        "apiVersion": "gpu.dra.dev/v1beta1",
        "kind": "VfioDeviceConfig",
        "iommu": {"backendPolicy": policy, "enableAPIDevice": api_device},
    }
    return [{"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters": parameters}}]


class Crashed(BaseException):
    """A simulated SIGKILL at a crash point (BaseException: nothing in the plugin catches it as an error)."""


class SnapshotFaults(FaultPoints):
    """At the armed point: copy the node's state (checkpoint, CDI specs, fake NVML/PCI state) as a SIGKILL would
    leave it, then stop the operation. `restore` puts those bytes back: the restarted plugin finds exactly them."""

    def __init__(self, rig: VfioRig, point: str, nth: int = 1) -> None:
        super().__init__()
        self.rig, self.point, self.nth, self.hits = rig, point, nth, 0
        self.snapshot: Path | None = None

    def reached(self, point: str) -> None:
        if point != self.point:
            return
        self.hits += 1
        if self.hits == self.nth:
            self.snapshot = self.rig.tmp / "crash-snapshot"
            shutil.copytree(self.rig.tmp / "node", self.snapshot)
            raise Crashed(point)

    def restore(self) -> None:
        assert self.snapshot is not None
        shutil.rmtree(self.rig.tmp / "node")
        shutil.copytree(self.snapshot, self.rig.tmp / "node")
        shutil.rmtree(self.snapshot)


class VfioRig:
    def __init__(self, tmp: Path, node_file: str = VGA_NODE, allow_rebind: RebindAllowance = NO_REBIND) -> None:
        self.tmp = tmp
        self.allow_rebind = allow_rebind
        (tmp / "node").mkdir()
        self.node_file = tmp / "vga-node.yaml"
        self.node_file.write_text(node_file)
        self.state_file = tmp / "node" / "nvml-state.json"
        self.cdi_root = tmp / "node" / "cdi"
        self.checkpoint_path = tmp / "node" / "plugin" / "checkpoint.json"
        self.checkpoint_path.parent.mkdir(parents=True)
        self.boot_id = tmp / "boot_id"
        self.boot_id.write_text("boot-1\n")
        self.claims = FakeClaims()
        self.rediscoveries = 0
        self.restart()

    def restart(self, faults: FaultPoints | None = None) -> PrepareEngine:
        """A new plugin process: a fresh NVML backend over the state file, a new engine, recovery run."""
        backend = open_backend(f"fake:{self.node_file},state={self.state_file}")
        backend.init()
        assert isinstance(backend, FakeNvml)
        self.nvml = backend
        self.pci: FakePciSysfs = backend.pci_sysfs()
        if not hasattr(self, "devices"):
            # As first discovered (every GPU on nvidia): a passed-through GPU keeps its catalog entry (app.py).
            self.devices = catalog(discover(backend), MigOffering.STATIC, EXCLUSIVE, passthrough_settings("all"))
        self.cdi = ClaimSpecWriter(self.cdi_root, DRIVER, FakeCdiEdits(), NODE)
        self.checkpoint = CheckpointStore(self.checkpoint_path, boot_id_path=self.boot_id)
        tools = NodeTools(
            driver_name=DRIVER,
            cdi=self.cdi,
            time_slicer=TimeSlicer(backend),
            vfio=VfioBinder(self.pci, backend, faults, allow_rebind=self.allow_rebind),
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

    def _rediscovered(self) -> None:
        self.rediscoveries += 1

    def drivers(self) -> dict[str, str | None]:
        return {f.address: f.driver for f in self.pci.state().functions}

    def spec_path(self, uid: str) -> Path:
        return self.cdi_root / f"k8s.{DRIVER}-claim_{NODE}_{uid}.json"

    def gpu(self, name: str) -> Any:
        return self.devices[name].gpu
