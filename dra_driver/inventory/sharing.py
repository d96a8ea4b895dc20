"""How whole GPUs are offered: exclusively only, or also in shares by consumable capacity (KEP-5075).

`--sharing-mode shares` adds, next to each selected whole GPU `gpu-<minor>`, a multi-allocatable device
`gpu-<minor>-shared` whose `memory` and `compute` capacities are consumed by each allocation.
`--consumable-shares memory|unlimited|<N>` (NVIDIA's modes, same flag name) instead makes the whole GPU `gpu-<minor>`
itself multi-allocatable, in the main class, with NVIDIA's capacity shapes (docs/consumable-capacity.md). This module
holds the settings (pure values) and turns the flag texts into them, refusing bad values with a message that
names the flag and the fix. The catalog decides which GPUs get a shared device; the slice builder writes the
capacities and request policies.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from dra_driver.errors import DraDriverError
from dra_driver.inventory.model import GpuInventory, NodeInventory
from dra_driver.k8s.quantity import Quantity, QuantityError, parse_quantity

MIB = 1024 * 1024
GIB = 1024 * MIB

# The flag defaults (and the chart's values; tests/chart/test_defaults.py holds them equal).
DEFAULT_MEMORY_STEP = "1Gi"
DEFAULT_MEMORY_DEFAULT = "4Gi"
DEFAULT_COMPUTE_DEFAULT = 10

SHARING_MODE_HELP = (
    "how whole GPUs are offered: exclusive (only whole, one claim each) | shares (also as gpu-<minor>-shared, "
    "a device many claims share by consumable capacity: memory and compute percent; needs Kubernetes >= 1.34 "
    "with the DRAConsumableCapacity and DRAPartitionableDevices gates)"
)
SHARED_GPUS_HELP = (
    "with --sharing-mode shares: the GPUs to offer in shares, a comma list of indexes or UUIDs (e.g. 0,1 or "
    "GPU-1234...); empty: every GPU that is offered whole"
)
MEMORY_STEP_HELP = "with shares: memory granularity of a share (validRange min and step), e.g. 1Gi or 512Mi"
MEMORY_DEFAULT_HELP = (
    "with shares: the memory a share consumes when its claim requests none (a multiple of the step)"
)
COMPUTE_DEFAULT_HELP = (
    "with shares: the compute (percent of the GPU's SMs, 1-100) a share consumes when its claim requests none"
)


CONSUMABLE_SHARES_HELP = (
    "NVIDIA's consumable-shares modes on the main class: disabled | memory (each claim consumes the memory it "
    "requests, all of it by default) | unlimited (memory requests optional, 0 by default) | <N> (as unlimited, plus "
    "a `shares` capacity N; a claim consumes 1 share by default); the whole GPU gpu-<minor> becomes "
    "multi-allocatable and every claim of it a share enforced through MPS; excludes --sharing-mode shares"
)
MAX_SHARE_COUNT = 1000  # more clients than MPS serves per GPU (48) is already meaningless; this bounds typos


class SharingMode(enum.StrEnum):
    EXCLUSIVE = "exclusive"
    SHARES = "shares"


class ConsumableMode(enum.StrEnum):
    DISABLED = "disabled"
    MEMORY = "memory"
    UNLIMITED = "unlimited"
    COUNT = "count"  # `--consumable-shares <N>`: never spelled so by users


@dataclass(frozen=True)
class ConsumableShares:
    """NVIDIA's `--consumable-shares` on the main class: the shape of the whole GPU's consumable capacities."""

    mode: ConsumableMode = ConsumableMode.DISABLED
    count: int | None = None  # the `shares` capacity, with mode COUNT

    @property
    def enabled(self) -> bool:
        return self.mode is not ConsumableMode.DISABLED

    @property
    def label(self) -> str:
        """As the flag is written: `disabled`, `memory`, `unlimited` or the share count."""
        return str(self.count) if self.mode is ConsumableMode.COUNT else self.mode.value


NO_CONSUMABLE_SHARES = ConsumableShares()


def consumable_shares(text: str, flag: str = "--consumable-shares") -> ConsumableShares:
    """`disabled|memory|unlimited|<N>` -> ConsumableShares. Raises SharingSettingsError naming the flag and the fix."""
    value = text.strip().lower()
    if value in ("", ConsumableMode.DISABLED):
        return NO_CONSUMABLE_SHARES
    if value in (ConsumableMode.MEMORY, ConsumableMode.UNLIMITED):
        return ConsumableShares(ConsumableMode(value))
    if value.isdigit() and 1 <= int(value) <= MAX_SHARE_COUNT:
        return ConsumableShares(ConsumableMode.COUNT, int(value))
    raise SharingSettingsError(
        f"{flag} {text!r}: choose disabled, memory, unlimited or a whole number of shares per GPU from 1 to "
        f"{MAX_SHARE_COUNT}, e.g. {flag} 4"
    )


class SharingSettingsError(DraDriverError, ValueError):
    """A sharing flag (or chart value) that cannot work; the message names the flag and the fix."""


@dataclass(frozen=True)
class SharingSettings:
    """The sharing settings. The default is `exclusive`: no shared devices, nothing changes."""

    mode: SharingMode = SharingMode.EXCLUSIVE
    gpus: tuple[str, ...] = ()  # indexes or UUIDs; empty: every GPU offered whole
    memory_step: int = GIB  # bytes
    memory_default: int = 4 * GIB  # bytes
    compute_default: int = DEFAULT_COMPUTE_DEFAULT  # percent
    consumable: ConsumableShares = NO_CONSUMABLE_SHARES  # --consumable-shares: the whole GPU itself in shares

    @property
    def enabled(self) -> bool:
        return self.mode is SharingMode.SHARES

    def selects(self, gpu: GpuInventory) -> bool:
        """Whether `gpu` is meant to be shared (before asking whether it can be offered whole)."""
        if not self.enabled and not self.consumable.enabled:
            return False
        if not self.gpus:
            return True
        return str(gpu.info.index) in self.gpus or gpu.uuid in self.gpus

    def fits(self, gpu: GpuInventory) -> bool:
        """The GPU's memory holds a default share and one step above the minimum (the API server requires
        validRange min + step <= the capacity value)."""
        memory = shared_memory_bytes(gpu)
        if self.consumable.enabled:  # NVIDIA's shapes: min 0 or 1Mi, step 1Mi
            return memory is not None and memory >= 2 * MIB
        return memory is not None and memory >= max(self.memory_default, 2 * self.memory_step)

    def unknown_gpus(self, inventory: NodeInventory) -> list[str]:
        """`--shared-gpus` entries that name no GPU of this node."""
        known = {str(g.info.index) for g in inventory.gpus} | {g.uuid for g in inventory.gpus}
        return [name for name in self.gpus if name not in known]


EXCLUSIVE = SharingSettings()


def unknown_gpus_message(unknown: list[str], inventory: NodeInventory) -> str:
    known = ", ".join(f"{g.info.index} ({g.uuid})" for g in inventory.gpus) or "none"
    return (
        f"--shared-gpus names {', '.join(unknown)}, which is no GPU of this node; use indexes or UUIDs of: {known}"
    )


def shared_memory_bytes(gpu: GpuInventory) -> int | None:
    """The GPU's memory rounded down to a whole MiB (the published `memory` capacity of its shared device)."""
    total = gpu.info.memory_total_bytes
    return None if total is None else total - total % MIB


def _memory(flag: str, text: str) -> int:
    try:
        quantity: Quantity = parse_quantity(text.strip())
    except QuantityError as exc:
        raise SharingSettingsError(f"{flag} {text!r} is not a quantity: {exc}; e.g. {flag} 1Gi") from exc
    if quantity.sign() <= 0 or not quantity.is_integer() or quantity.as_int64() % MIB != 0:
        raise SharingSettingsError(f"{flag} {text!r} must be a positive whole number of MiB, e.g. {flag} 1Gi or 512Mi")
    return quantity.as_int64()


def sharing_settings(
    mode: str,
    *,
    shared_gpus: str = "",
    memory_step: str = DEFAULT_MEMORY_STEP,
    memory_default: str = DEFAULT_MEMORY_DEFAULT,
    compute_default: int | str = DEFAULT_COMPUTE_DEFAULT,
    consumable: str = ConsumableMode.DISABLED.value,
) -> SharingSettings:
    """Flag texts -> a checked SharingSettings. Raises SharingSettingsError naming the flag and the fix."""
    try:
        parsed_mode = SharingMode(mode)
    except ValueError:
        choices = " | ".join(m.value for m in SharingMode)
        raise SharingSettingsError(f"--sharing-mode {mode!r}: choose one of {choices}") from None
    shares = consumable_shares(consumable)
    if shares.enabled and parsed_mode is SharingMode.SHARES:
        raise SharingSettingsError(
            f"--consumable-shares {shares.label} and --sharing-mode shares exclude each other (the first shares the "
            "whole GPU gpu-<minor> in the main class, the second adds gpu-<minor>-shared beside it); choose one: "
            "--sharing-mode exclusive with --consumable-shares, or --consumable-shares disabled"
        )
    gpus = tuple(part.strip() for part in shared_gpus.split(",") if part.strip())
    if len(set(gpus)) != len(gpus):
        raise SharingSettingsError(f"--shared-gpus {shared_gpus!r} names a GPU twice; list each index or UUID once")
    step = _memory("--share-memory-step", memory_step)
    default = _memory("--share-memory-default", memory_default)
    if default < step or default % step != 0:
        suggestion = _binary(max(step, default - default % step))
        raise SharingSettingsError(
            f"--share-memory-default {memory_default} must be a multiple of --share-memory-step {memory_step} "
            "(a share's memory range starts at one step and grows by whole steps, and the default must lie on it); "
            f"e.g. --share-memory-default {suggestion}"
        )
    try:
        compute = int(str(compute_default).strip())
    except ValueError:
        raise SharingSettingsError(
            f"--share-compute-default {compute_default!r} must be a whole percent from 1 to 100, e.g. 10"
        ) from None
    if not 1 <= compute <= 100:
        raise SharingSettingsError(
            f"--share-compute-default {compute} must be a whole percent from 1 to 100 (of the GPU's SMs), e.g. 10"
        )
    return SharingSettings(parsed_mode, gpus, step, default, compute, shares)


def _binary(value: int) -> str:
    """Bytes as the shortest binary-suffixed quantity: 4294967296 -> "4Gi"."""
    for suffix, unit in (("Ti", 1024 * GIB), ("Gi", GIB), ("Mi", MIB)):
        if value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)
