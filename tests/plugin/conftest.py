"""Builders for prepare-engine tests: a fake node, claims as the API server returns them."""

from __future__ import annotations

import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import AllocatableDevice, MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.kubeletplugin.driver import ClaimRef
from dra_driver.nvml.factory import open_backend, open_mps_control
from dra_driver.plugin.app import PluginSettings
from dra_driver.plugin.cdi import ClaimSpecWriter, FakeCdiEdits
from dra_driver.plugin.checkpoint import CheckpointStore
from dra_driver.plugin.effects.base import NodeTools
from dra_driver.plugin.effects.registry import node_effects
from dra_driver.plugin.engine import EngineSettings, PrepareEngine
from dra_driver.plugin.mig import MigActuator
from dra_driver.plugin.mps import MpsDaemons
from dra_driver.plugin.sharing import TimeSlicer

DRIVER = DRIVER_NAME
NODE = "node-a"


class FakeClaims:
    """A ClaimSource backed by a dict, counting reads."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads = 0
        self.lists = 0
        self._lock = threading.Lock()

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            self.reads += 1
        return self.objects.get((namespace, name))

    def list_claims(self) -> list[dict[str, Any]]:
        with self._lock:
            self.lists += 1
        return list(self.objects.values())

    def add(
        self,
        name: str,
        devices: list[str],
        *,
        namespace: str = "default",
        config: list[dict[str, Any]] | None = None,
        driver: str = DRIVER,
        pool: str = NODE,
        admin: bool = False,
        same_request: bool = False,
    ) -> ClaimRef:
        uid = str(uuid.uuid4())
        results = []
        for i, dev in enumerate(devices):
            request = "r0" if same_request else f"r{i}"
            result: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": dev}
            if admin:
                result["adminAccess"] = True
            results.append(result)
        self.objects[(namespace, name)] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": results, "config": config or []}}},
        }
        return ClaimRef(namespace, name, uid)


class EngineRig:
    def __init__(
        self, tmp: Path, preset: str = "dgx-h100", policy: MigOffering = MigOffering.STATIC, backend_spec: str = ""
    ) -> None:
        self.tmp = tmp
        self.policy = policy
        self.backend = open_backend(backend_spec or f"fake:{preset}")
        self.backend.init()
        self.devices: Mapping[str, AllocatableDevice] = catalog(discover(self.backend), policy)
        # Dynamic MIG's hardware code (None on a static node: dynamic MIG devices are refused there).
        self.actuator: Any = MigActuator(self.backend) if policy is MigOffering.DYNAMIC else None
        self.claims = FakeClaims()
        self.cdi_root = tmp / "cdi"
        self.boot_id = tmp / "boot_id"
        self.boot_id.write_text("boot-1\n")
        self.checkpoint_path = tmp / "plugin" / "checkpoint.json"
        self.checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
        self.engine = self.new_engine()

    def new_engine(self, recovery_lock_timeout: float = 120.0) -> PrepareEngine:
        """An engine over this node; `cdi` and `checkpoint` are the newest engine's (tests reach into them)."""
        self.cdi = ClaimSpecWriter(self.cdi_root, DRIVER, FakeCdiEdits(), NODE)
        self.checkpoint = CheckpointStore(self.checkpoint_path, boot_id_path=self.boot_id)
        tools = NodeTools(
            driver_name=DRIVER, cdi=self.cdi, mig=self.actuator, time_slicer=TimeSlicer(self.backend), mps=self.mps()
        )
        return PrepareEngine(
            settings=EngineSettings(
                driver_name=DRIVER, pool_name=NODE, lock_timeout=5.0, recovery_lock_timeout=recovery_lock_timeout
            ),
            claims=self.claims,
            catalog=lambda: self.devices,
            effects=node_effects(tools),
            checkpoint=self.checkpoint,
        )

    def mps(self) -> MpsDaemons | None:
        control = open_mps_control(self.backend)
        return MpsDaemons(self.checkpoint_path.parent / "mps", control, self.backend) if control else None

    def spec_path(self, uid: str) -> Path:
        return self.cdi_root / f"k8s.{DRIVER}-claim_{NODE}_{uid}.json"


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[EngineRig]:
    r = EngineRig(tmp_path)
    yield r
    r.engine.close()


# ---- a whole kubelet plugin (KubeletPlugin) on fake GPUs ----------------------------------------------------------


@pytest.fixture
def work() -> Iterator[Path]:
    """The plugin's directories with a boot id, short and under /tmp: its unix sockets live there (AF_UNIX paths
    stop at 108 bytes)."""
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="dra-kp-"))
    (path / "boot_id").write_text("b\n")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def plugin_settings(work: Path, node: str, mig_offering: MigOffering) -> PluginSettings:
    """A kubelet plugin for `node` with everything under `work`: fake CDI edits, no health endpoint, no health
    monitor. Tests set the rest with dataclasses.replace."""
    return PluginSettings(
        node_name=node, driver_name=DRIVER_NAME, plugin_dir=work / "p", registry_dir=work / "r",
        cdi_root=work / "cdi", driver_root=Path("/"), host_driver_root=Path("/"), mig_offering=mig_offering,
        fake_cdi=True, healthz_port=None, boot_id_path=work / "boot_id", health_monitor=False,
    )  # fmt: skip
