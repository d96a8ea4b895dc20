"""The GPU plugin's claim side: its engine, and the prepare pipeline the kubelet's calls reach.

`claim_pipeline` is the one place that says what runs on NodePrepareResources and NodeUnprepareResources.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dra_driver.inventory.catalog import AllocatableDevice
from dra_driver.kubeletplugin.claims import KubeClaimSource
from dra_driver.kubeletplugin.metadata import MetadataFiles
from dra_driver.kubeletplugin.pipeline import Guard, Observer, PreparePipeline
from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.mps import MpsControl
from dra_driver.observability.metrics import PluginMetrics
from dra_driver.pci.sysfs import PciSysfs
from dra_driver.plugin.cdi import DurableSpecs
from dra_driver.plugin.checkpoint import CheckpointStore
from dra_driver.plugin.claimevents import ClaimEvents
from dra_driver.plugin.devicemetadata import MetadataAttributes
from dra_driver.plugin.effects.registry import node_effects, node_tools
from dra_driver.plugin.engine import EngineSettings, PrepareEngine
from dra_driver.plugin.faults import FaultPoints
from dra_driver.plugin.mig import MigActuator
from dra_driver.plugin.reloadgate import ReloadGate
from dra_driver.plugin.settings import PluginSettings

if TYPE_CHECKING:
    # Types only: the device plugin's guard exists only with `--device-plugin on`, the Event recorder and the
    # status.devices report are built by plugin/app.py; none of their modules is needed to build the pipeline.
    from dra_driver.deviceplugin.claimguard import DevicePluginGuard
    from dra_driver.k8s.events import EventRecorder
    from dra_driver.plugin.devicestatus import DeviceStatusReport


def claim_pipeline(
    engine: PrepareEngine,
    *,
    reload_gate: ReloadGate,
    descriptions: MetadataAttributes,
    metadata: MetadataFiles,
    events: EventRecorder | None,
    device_status: DeviceStatusReport | None,
    device_plugin: DevicePluginGuard | None = None,
) -> PreparePipeline:
    """What runs on NodePrepareResources and NodeUnprepareResources, in this order (kubeletplugin/pipeline.py):

    guards
      1. driver reload (reloadgate.py): while the NVIDIA driver reloads, prepares are refused, and so are unprepares
         that need the driver (their records are kept); the kubelet retries
      2. with --device-plugin (deviceplugin/claimguard.py): a claim on a GPU the device plugin allocated is refused;
         the others' GPUs are reserved for DRA (its observer, last, drops the reservation of a failed or unprepared
         claim)
    engine (engine.py): each claim prepared or unprepared; a prepare reads the checkpoint once, and its answer
      carries the record it wrote, which the observers read instead of the checkpoint
    observers
      1. device descriptions (devicemetadata.py): each prepared device's KEP-5304 attributes, from its record
         (while device metadata is on)
      2. device metadata files (kubeletplugin/metadata.py): written, with their CDI ids added to the answer;
         removed on unprepare; a claim whose files cannot be written or removed fails
      3. durable CDI specs (cdi.py `DurableSpecs`): the engine's claim specs are renamed into the CDI dir without
         its fsync; the metadata spec's fsync of that dir covers them, else this one does, before any answer,
         Event or status.devices write (docs/architecture.md "Durable files")
      4. driver reload (reloadgate.py): a claim the engine failed asks the reload watcher whether the driver went
      5. Events (claimevents.py): a Warning on each failed claim, a Normal one for each note of a prepare
         (without Events: `--events=false` or no API server)
      6. status.devices (devicestatus.py): each outcome queued for the background writer (without an API server:
         none)
    Metrics: each claim operation's outcome and duration, the prepared claims and devices, are the engine's
    (engine.py, preparedmetrics.py); the status writes count their outcomes (devicestatus.py).
    """
    # The claim specs' CDI dir is the metadata specs' (one --cdi-root): `DurableSpecs` syncs what is still pending.
    observers: list[Observer] = [descriptions, metadata, DurableSpecs(metadata.writer.cdi_root), reload_gate]
    if events is not None:
        observers.append(ClaimEvents(events))
    if device_status is not None:
        observers.append(device_status)
    guards: list[Guard] = [reload_gate]
    if device_plugin is not None:
        guards.append(device_plugin)
        observers.append(device_plugin)
    return PreparePipeline(engine, guards=guards, observers=observers)


@dataclass(frozen=True)
class ClaimEngineParts:
    """The engine and what it was built on, which other parts of the plugin read too."""

    engine: PrepareEngine
    checkpoint: CheckpointStore
    claims: KubeClaimSource
    mig: MigActuator | None


def claim_engine(
    settings: PluginSettings,
    *,
    nvml: NvmlBackend,
    checkpoint: CheckpointStore,
    claims: KubeClaimSource,
    pci: PciSysfs,
    devices: Callable[[], Mapping[str, AllocatableDevice]],
    rediscover: Callable[[], None],
    metrics: PluginMetrics,
    faults: FaultPoints | None,
    mps_control: MpsControl | None,
) -> ClaimEngineParts:
    """The engine with the GPU driver's effects and the node tools they use (both from plugin/effects/registry.py,
    the one place a device kind is registered)."""
    tools = node_tools(
        settings, nvml=nvml, pci=pci, metrics=metrics, faults=faults, mps_control=mps_control, rediscover=rediscover
    )
    engine = PrepareEngine(
        settings=EngineSettings(driver_name=settings.driver_name, pool_name=settings.node_name),
        claims=claims,
        catalog=devices,
        effects=node_effects(tools),
        checkpoint=checkpoint,
        faults=faults,
        metrics=metrics,
    )
    return ClaimEngineParts(engine=engine, checkpoint=checkpoint, claims=claims, mig=tools.mig)
