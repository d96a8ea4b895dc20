"""Assembles the kubelet plugin from its parts and runs it until SIGTERM."""

from __future__ import annotations

import signal
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import structlog

from dra_driver.inventory.catalog import AllocatableDevice, MigPolicy, catalog
from dra_driver.inventory.discover import discover
from dra_driver.kube.client import KubeRest
from dra_driver.nvml.backend import NvmlBackend
from dra_driver.plugin.actuator import DeviceActuator, ExclusiveActuator
from dra_driver.plugin.cdi import ClaimSpecWriter, EditsBuilder, FakeCdiEdits, RealCdiEdits
from dra_driver.plugin.checkpoint import DEFAULT_BOOT_ID_PATH, CheckpointStore
from dra_driver.plugin.claims import KubeClaimSource
from dra_driver.plugin.engine import EngineSettings, PrepareEngine
from dra_driver.plugin.faults import FaultPoints
from dra_driver.plugin.health import DeviceHealthBoard
from dra_driver.plugin.healthz import HealthEndpoint
from dra_driver.plugin.server import PluginServer

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class PluginConfig:
    node_name: str
    driver_name: str
    plugin_dir: Path
    registry_dir: Path
    cdi_root: Path
    driver_root: Path
    host_driver_root: Path
    mig_policy: MigPolicy
    fake_cdi: bool
    healthz_port: int | None  # None: no HTTP health endpoint
    boot_id_path: Path = DEFAULT_BOOT_ID_PATH
    cleanup_interval: float = 600.0
    shutdown_grace: float = 10.0


class KubeletPlugin:
    def __init__(
        self,
        config: PluginConfig,
        *,
        nvml: NvmlBackend,
        rest: KubeRest,
        faults: FaultPoints | None = None,
        actuator: DeviceActuator | None = None,
    ) -> None:
        self.config = config
        self.nvml = nvml
        self.rest = rest
        self.stopped = threading.Event()
        self._devices: Mapping[str, AllocatableDevice] = {}
        self._devices_lock = threading.Lock()
        edits: EditsBuilder = (
            FakeCdiEdits() if config.fake_cdi else RealCdiEdits(config.driver_root, config.host_driver_root)
        )
        self.health = DeviceHealthBoard(pool=config.node_name)
        self.engine = PrepareEngine(
            settings=EngineSettings(driver_name=config.driver_name, pool_name=config.node_name),
            claims=KubeClaimSource(rest),
            catalog=self.devices,
            actuator=actuator or ExclusiveActuator(),
            cdi=ClaimSpecWriter(config.cdi_root, config.driver_name, edits),
            checkpoint=CheckpointStore(config.plugin_dir / "checkpoint.json", boot_id_path=config.boot_id_path),
            faults=faults,
        )
        self.server = PluginServer(
            driver_name=config.driver_name,
            plugin_dir=config.plugin_dir,
            registry_dir=config.registry_dir,
            engine=self.engine,
            health=self.health,
        )
        self.healthz = (
            HealthEndpoint(self.server.probe, port=config.healthz_port) if config.healthz_port is not None else None
        )
        self._cleanup_thread = threading.Thread(target=self._cleanup_loop, name="stale-claims", daemon=True)

    def devices(self) -> Mapping[str, AllocatableDevice]:
        with self._devices_lock:
            return self._devices

    def rediscover(self) -> Mapping[str, AllocatableDevice]:
        """Re-read the hardware and swap in the new device catalog."""
        devices = catalog(discover(self.nvml), self.config.mig_policy)
        with self._devices_lock:
            self._devices = devices
        self.health.update(devices)
        return devices

    def start(self) -> None:
        self.config.plugin_dir.mkdir(parents=True, exist_ok=True)
        devices = self.rediscover()
        log.info("inventory ready", node=self.config.node_name, devices=len(devices))
        rolled_back = self.engine.recover()
        if rolled_back:
            log.info("recovered half-prepared claims", count=len(rolled_back))
        self.server.start()
        if self.healthz is not None:
            self.healthz.start()
        self._cleanup_thread.start()

    def stop(self) -> None:
        if self.stopped.is_set():
            return
        self.stopped.set()
        log.info("shutting down: no new calls, finishing in-flight ones")
        self.server.stop(grace=self.config.shutdown_grace)
        if self.healthz is not None:
            self.healthz.stop()
        self.engine.close()

    def run_until_signal(self) -> int:
        requested = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            log.info("signal received", signal=signal.Signals(signum).name)
            requested.set()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            requested.wait()
        finally:
            self.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return 0

    def _cleanup_loop(self) -> None:
        # Startup first: claims deleted while the plugin was down are released right away.
        while not self.stopped.is_set():
            try:
                self.engine.cleanup_stale()
            except Exception:
                log.exception("stale-claim cleanup failed")
            self.stopped.wait(self.config.cleanup_interval)
