"""What the GPU driver's engine (engine.py: its rules on the layer's claim engine) and recovery (recovery.py)
share: the settings, the claim source, the per-GPU locks and the parts of the node they work on."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from dra_driver.inventory.catalog import AllocatableDevice
from dra_driver.kubeletplugin.claimrecord import device_result
from dra_driver.kubeletplugin.claims import ClaimSource
from dra_driver.kubeletplugin.driver import PrepareResult
from dra_driver.kubeletplugin.statedirs import KeyedLocks, OperationLock
from dra_driver.plugin.actuator import PrepareError
from dra_driver.plugin.checkpoint import CheckpointStore, ClaimRecord, PreparedDevice
from dra_driver.plugin.effects.registry import ClaimEffects
from dra_driver.plugin.faults import FaultPoints


@dataclass(frozen=True)
class EngineSettings:
    driver_name: str
    pool_name: str
    lock_timeout: float = 10.0
    max_parallel_claims: int = 64
    # Recovery holds the node's operation lock exclusively: wait this long for in-flight claims (of any plugin
    # instance on the node) to finish.
    recovery_lock_timeout: float = 120.0


def gpu_locks() -> KeyedLocks:
    """One lock per physical GPU (the layer's KeyedLocks): a claim waits for the GPUs it needs, others prepare
    concurrently."""
    return KeyedLocks(busy=lambda key: PrepareError(f"GPU {key} is busy with another claim; the kubelet will retry"))


@dataclass(frozen=True)
class EngineParts:
    settings: EngineSettings
    claims: ClaimSource
    catalog: Callable[[], Mapping[str, AllocatableDevice]]
    effects: ClaimEffects
    checkpoint: CheckpointStore
    operations: OperationLock  # claim operations hold it shared, recovery exclusive, across the node's instances
    faults: FaultPoints
    locks: KeyedLocks = field(default_factory=gpu_locks)


def claim_gpus(record: ClaimRecord) -> list[str]:
    """The physical GPUs a record's devices are on: the locks an operation on it takes."""
    return [d.gpu_uuid for d in (*record.devices, *record.allocated) if d.gpu_uuid]


def prepare_result(
    devices: Sequence[PreparedDevice], notes: tuple[str, ...] = (), *, record: ClaimRecord | None = None
) -> PrepareResult:
    """The kubelet's answer for `devices`; `record`: the claim record it came from (PrepareResult.record)."""
    return PrepareResult(notes=notes, record=record, devices=tuple(device_result(d, d.share_id) for d in devices))
