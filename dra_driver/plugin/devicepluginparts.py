"""The device-plugin API beside DRA (`--device-plugin`, docs/device-plugin.md), wired to the GPU plugin's parts: the
catalog, the health board, the claim checkpoint, the claim source, the CDI edits and the slice republish. The
device plugin itself is `dra_driver/deviceplugin/`; this module only joins the two."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import structlog

from dra_driver.cdi.model import ContainerEdits
from dra_driver.deviceplugin.agent import AgentSources, DevicePluginAgent
from dra_driver.deviceplugin.cdispecs import AllocationSpecs, SpecEdits
from dra_driver.deviceplugin.claimguard import DevicePluginGuard
from dra_driver.deviceplugin.ownership import FILE_NAME, OwnershipFile
from dra_driver.deviceplugin.server import DevicePluginServer
from dra_driver.deviceplugin.settings import DevicePluginSettings
from dra_driver.inventory.catalog import AllocatableDevice
from dra_driver.kubeletplugin.claims import ClaimSource
from dra_driver.kubeletplugin.driver import HealthSnapshot
from dra_driver.plugin.cdi import DeviceForCdi, EditsBuilder
from dra_driver.plugin.engine import PrepareEngine
from dra_driver.plugin.nodedevices import NodeDevices
from dra_driver.plugin.settings import PluginSettings, cdi_edits

log = structlog.get_logger(__name__)


def gpu_spec_edits(edits: EditsBuilder) -> SpecEdits:
    """The edits a claim of exactly these whole GPUs gets (one request, exclusive), for the device plugin's specs."""

    def build(gpus: Sequence[AllocatableDevice]) -> tuple[tuple[ContainerEdits, ...], ContainerEdits]:
        devices = [DeviceForCdi(allocatable=g, visible_uuid=g.gpu.uuid, sharing="Exclusive") for g in gpus]
        return tuple(edits.device_edits(d) for d in devices), edits.claim_edits(devices)

    return build


def checkpoint_gpus(engine: PrepareEngine) -> set[str]:
    """Every GPU a claim record names (any state: a claim being prepared or undone holds its GPU too)."""
    return {d.gpu_uuid for r in engine.prepared_claims().claims.values() for d in (*r.devices, *r.allocated)
            if d.gpu_uuid is not None}  # fmt: skip


@dataclass(frozen=True)
class DevicePluginParts:
    agent: DevicePluginAgent
    guard: DevicePluginGuard
    server: DevicePluginServer


def device_plugin_parts(settings: PluginSettings, dp: DevicePluginSettings, *, engine: PrepareEngine,
                        claims: ClaimSource, catalog: Callable[[], Mapping[str, AllocatableDevice]],
                        health: Callable[[], HealthSnapshot], slices: NodeDevices, republish: Callable[[], None],
                        clock: Callable[[], float] = time.time,
                        faults: Callable[[str], None] | None = None) -> DevicePluginParts:  # fmt: skip
    ownership = OwnershipFile(settings.plugin_dir / FILE_NAME)
    specs = AllocationSpecs(settings.cdi_root, settings.driver_name, settings.node_name,
                            gpu_spec_edits(cdi_edits(settings)))  # fmt: skip
    # A SIGKILL mid-write leaves a temp file of the record or of a spec (both only written under the record's lock).
    for path in ownership.sweep_temp_files([(settings.cdi_root, specs.is_temp_file)]):
        log.info("removed a temp file left by an interrupted write", path=str(path))
    agent = DevicePluginAgent(
        AgentSources(catalog=catalog, health=health, dra_gpus=lambda: checkpoint_gpus(engine), republish=republish),
        ownership, specs, grace=dp.grace, faults=faults,
    )  # fmt: skip
    guard = DevicePluginGuard(ownership, claims, catalog, driver_name=settings.driver_name,
                              pool_name=settings.node_name, changed=agent.changed, clock=clock,
                              faults=faults)  # fmt: skip
    slices.withheld = agent.withheld  # the slices leave out what the device plugin allocated
    slices.held = agent.held  # and say so in their annotation (deviceplugin/published.py)
    return DevicePluginParts(agent, guard, DevicePluginServer(dp, agent))
