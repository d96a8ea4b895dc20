"""MPS sharing: which daemon serves a claim's devices, with which limits, and the daemons' lifecycle on the node.

Two kinds of daemon, both under `<mps-root>/<id>/{pipe,log,shm}` (`--mps-root`, default `<plugin-dir>/mps`):
- `claim-<claimUID>`: a claim whose devices resolve to `sharing.strategy: MPS` (whole GPUs or MIG devices, as in
  NVIDIA's driver): one daemon for all of the claim's MPS devices, with the limits of `mpsConfig`. The containers
  of that claim share the device(s) through it.
- `gpu-<uuid>`: the shares of one GPU (consumable capacity, device `gpu-N-shared`, or `gpu-N` itself with
  `--consumable-shares`): one daemon per GPU serving every share on it, with each share's consumed memory and compute
  (or, with `--consumable-shares <N>`, k of N shares as k/N of the SMs) as its limits.

The checkpoint is the reference count: every device record names its daemon (`mps.daemon`) before the daemon is
started, so the last record to go (unprepare, rollback, recovery) stops it, resets the compute mode and removes its
directory. A daemon's limits are derived from the records that hold it (`daemon_spec`), so adding or removing a
share re-limits the daemon to exactly the shares left.

Limits of shares: MPS enforces limits per server (the daemon's defaults, which no client can raise) and per client
(`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` in the client's environment, which can only
narrow the server's). One daemon serves all shares of a GPU, so the daemon's limits are the largest share's and
each share's own limits reach its containers through the CDI spec: a workload gets its share without doing
anything, and one that rewrites its own environment still cannot exceed the largest share on the GPU.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from dra_driver.claimconfig.api import DeviceConfig, SharingStrategy
from dra_driver.fsutil import atomic_write, bounded_name
from dra_driver.inventory.catalog import AllocatableDevice
from dra_driver.k8s.quantity import parse_quantity
from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.mps import LOG_DIR, PIPE_DIR, SHM_DIR, MpsControl, MpsDaemonSpec, MpsError, MpsShareLimits
from dra_driver.nvml.types import ComputeMode, NvmlError
from dra_driver.plugin.actuator import PrepareError
from dra_driver.plugin.checkpoint import ClaimRecord, MpsRecord, PreparedDevice
from dra_driver.plugin.faults import FaultPoints

log = structlog.get_logger(__name__)

MPS_DIR_NAME = "mps"  # under the plugin dir
MPS_DIR_MODE = 0o755  # MPS servers run as the client's UID and must traverse these directories
DAEMON_FILE = "daemon.json"  # what the daemon serves, so a sweep after a lost checkpoint can undo it
MEMORY_CAPACITY = "memory"
COMPUTE_CAPACITY = "compute"
SHARES_CAPACITY = "shares"  # `--consumable-shares <N>` (slices/attributes.py)
# A claim's UID in its daemon's id: at most a UUID's 36 characters (what the API server makes), so no UID makes the
# daemon's pipe path (its control socket, under the unix socket limit) longer than a real one does.
CLAIM_DAEMON_KEY_MAX = 36
# What the sweep recognises after `claim-` or `gpu-`: up to 64 (earlier versions named a daemon by any UID).
_DAEMON_ID = re.compile(r"^(claim|gpu)-[A-Za-z0-9_-]{1,64}$")


def claim_daemon_id(claim_uid: str) -> str:
    """`claim-<claimUID>`; a UID past 36 characters is shortened (`bounded_name`). The case is kept: two UIDs that
    differ only in case are two daemons. (Records name their daemon, so a daemon an earlier version named is found
    by its record.)"""
    return f"claim-{bounded_name(claim_uid, CLAIM_DAEMON_KEY_MAX)}"


def gpu_daemon_id(gpu_uuid: str) -> str:
    return "gpu-" + re.sub(r"[^a-z0-9-]", "-", gpu_uuid.lower().removeprefix("gpu-"))


# --- planning (pure) -------------------------------------------------------------------------------


def share_records(
    devices: Sequence[AllocatableDevice],
    configs: Sequence[DeviceConfig],
    results: Sequence[Mapping[str, Any]],
    driver_name: str,
) -> tuple[MpsRecord | None, ...]:
    """The `gpu-<uuid>` daemon and this share's own limits for each of a claim's shares of a GPU (None: not a
    share). Raises PrepareError naming the field for every share MPS cannot serve."""
    return tuple(
        _share_record(d, c, r, driver_name) if d.kind.shared else None
        for d, c, r in zip(devices, configs, results, strict=True)
    )


def claim_daemon_records(
    devices: Sequence[AllocatableDevice],
    configs: Sequence[DeviceConfig],
    uuids: Sequence[str | None],
    claim_uid: str,
) -> tuple[MpsRecord | None, ...]:
    """The `claim-<uid>` daemon and limits of each of a claim's devices whose config says `sharing.strategy: MPS`
    (None: not served by the claim's daemon). `uuids` are what each device is to CUDA (GPU or MIG UUID; None while
    a dynamic MIG device does not exist yet: keys naming it are then checked again once it does). Raises
    PrepareError naming the field for every config MPS cannot serve."""
    mps_indexes = [
        i
        for i, (d, c) in enumerate(zip(devices, configs, strict=True))
        if not d.kind.shared and c.sharing.strategy is SharingStrategy.MPS
    ]
    records: list[MpsRecord | None] = [None] * len(devices)
    for position, i in enumerate(mps_indexes):
        device, config = devices[i], configs[i]
        mps = config.sharing.mps
        limit, field = _pinned_limit(config, position, uuids[i], [uuids[j] for j in mps_indexes], device)
        _refuse_above_memory(limit, field, device)
        multi_user = bool(mps and mps.multi_user)
        if multi_user and not _volta_or_newer(device):
            raise PrepareError(
                f"sharing.mpsConfig.multiUser: GPU {device.name} has compute capability "
                f"{'.'.join(map(str, device.gpu.info.cuda_compute_capability))}; multi-user MPS needs 7.0 (Volta) "
                "or newer: remove multiUser and run the claim's containers as one UID"
            )
        records[i] = MpsRecord(
            daemon=claim_daemon_id(claim_uid),
            active_thread_percentage=mps.default_active_thread_percentage if mps else None,
            pinned_memory_limit=limit,
            uuid=uuids[i],
            multi_user=multi_user,
        )
    _refuse_split_threads(devices, records)
    return tuple(records)


def _refuse_split_threads(devices: Sequence[AllocatableDevice], records: Sequence[MpsRecord | None]) -> None:
    """MPS has one active-thread limit per server, so the devices of one daemon must agree on it (shares differ:
    their own limits are per client)."""
    pairs = zip(devices, records, strict=True)
    threads = {d.name: r.active_thread_percentage for d, r in pairs if r is not None and not r.share}
    if len(set(threads.values())) > 1:
        named = ", ".join(f"{name}: {value}" for name, value in threads.items())
        raise PrepareError(
            "sharing.mpsConfig.defaultActiveThreadPercentage differs between the claim's MPS devices "
            f"({named}); one MPS daemon serves them all with one thread limit: use one value"
        )


def _share_record(device: AllocatableDevice, config: DeviceConfig, result: Mapping[str, Any], driver: str) -> MpsRecord:
    strategy = config.sharing.strategy
    if strategy is SharingStrategy.TIME_SLICING:
        raise PrepareError(
            f"sharing strategy TimeSlicing on {device.name} is refused: shares of a GPU are served by MPS, and a GPU "
            "cannot be time-sliced and run MPS at once; remove the TimeSlicing config from this claim"
        )
    consumed = result.get("consumedCapacity")
    consumed = consumed if isinstance(consumed, dict) else {}
    memory = _consumed(consumed, MEMORY_CAPACITY, device, driver)
    compute = _consumed(consumed, COMPUTE_CAPACITY, device, driver)
    if device.share_count is not None:  # `--consumable-shares <N>`: k of N shares is k/N of the SMs
        taken = _consumed(consumed, SHARES_CAPACITY, device, driver) or 1
        compute = max(1, min(taken, device.share_count) * 100 // device.share_count)
    thread = compute if compute is None or compute <= 100 else 100
    mps = config.sharing.mps
    if mps is not None:  # an MPS config on a share can only narrow it
        _refuse_above_memory(mps.default_pinned_device_memory_limit, f"{_MPS_FIELD}.defaultPinnedDeviceMemoryLimit",
                             device)
        thread = _narrower(thread, mps.default_active_thread_percentage)
        memory = _narrower(memory, mps.default_pinned_device_memory_limit)
    if not result.get("shareID"):
        raise PrepareError(
            f"device {device.name} is offered in shares, but its allocation result has no shareID (was it allocated "
            "by a scheduler without the DRAConsumableCapacity feature?)"
        )
    return MpsRecord(
        daemon=gpu_daemon_id(device.gpu.uuid),
        active_thread_percentage=thread,
        pinned_memory_limit=memory,
        share=True,
        uuid=device.gpu.uuid,
        # Shares belong to different pods, usually of different users: without -M they would take turns.
        multi_user=_volta_or_newer(device),
    )


def _volta_or_newer(device: AllocatableDevice) -> bool:
    return tuple(device.gpu.info.cuda_compute_capability) >= (7, 0)


def _consumed(consumed: Mapping[str, object], name: str, device: AllocatableDevice, driver: str) -> int | None:
    """A consumed capacity in whole units (bytes, percent); the name may be qualified with the driver's domain."""
    for key in (name, f"{driver}/{name}"):
        raw = consumed.get(key)
        if raw is None:
            continue
        try:
            value = parse_quantity(str(raw)).as_fraction()
        except ValueError:
            raise PrepareError(
                f"status.allocation.devices.results[].consumedCapacity.{name} of {device.name} is not a quantity: "
                f"{raw!r}"
            ) from None
        return max(1, int(value)) if value > 0 else None
    return None


def _narrower(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


_MPS_FIELD = "sharing.mpsConfig"


def device_memory_bytes(device: AllocatableDevice) -> int | None:
    """What a device holds: the MIG profile's memory for a MIG device, else the whole GPU's (None: unknown)."""
    if device.profile is not None:
        return device.profile.memory_bytes
    return device.gpu.info.memory_total_bytes


def _refuse_above_memory(limit: int | None, field: str, device: AllocatableDevice) -> None:
    """A pinned-memory limit above what the device has can only be a mistake (MPS would never enforce it)."""
    memory = device_memory_bytes(device)
    if limit is None or memory is None or limit <= memory:
        return
    kind = "MIG device" if device.profile is not None else "GPU"
    raise PrepareError(
        f"{field}: {_mib(limit)} is more than {kind} {device.name} has ({_mib(memory)}, {memory} bytes); use a "
        f"limit of at most {memory // (1024 * 1024)}Mi, or leave it out for no limit"
    )


def _mib(value: int) -> str:
    mib = value / (1024 * 1024)
    return f"{mib:.0f}Mi" if mib < 10**12 else f"{value} bytes"


def _pinned_limit(
    config: DeviceConfig, position: int, uuid: str | None, claim_uuids: Sequence[str | None], device: AllocatableDevice
) -> tuple[int | None, str]:
    """`defaultPerDevicePinnedMemoryLimit[<uuid> or <index>]`, else `defaultPinnedDeviceMemoryLimit`, with the field
    it came from. The index is the device's position among the claim's MPS devices; a key that names none of them
    is an error."""
    mps = config.sharing.mps
    default_field = f"{_MPS_FIELD}.defaultPinnedDeviceMemoryLimit"
    if mps is None:
        return None, default_field
    field = f"{_MPS_FIELD}.defaultPerDevicePinnedMemoryLimit"
    known = [u for u in claim_uuids if u is not None]
    for key in mps.default_per_device_pinned_memory_limit:
        if key.isdigit():
            if int(key) >= len(claim_uuids):
                raise PrepareError(
                    f'{field}["{key}"]: the claim has {len(claim_uuids)} device(s) served by MPS (indexes 0-'
                    f"{len(claim_uuids) - 1}); use an index below {len(claim_uuids)} or a device UUID"
                )
        elif key not in known and len(known) == len(claim_uuids):
            raise PrepareError(
                f'{field}["{key}"]: no device of this claim has that UUID (its MPS devices: {", ".join(known)}); '
                "use one of them or an index"
            )
    per_device = mps.default_per_device_pinned_memory_limit
    if uuid is not None and uuid in per_device:
        return per_device[uuid], f'{field}["{uuid}"]'
    if str(position) in per_device:
        return per_device[str(position)], f'{field}["{position}"]'
    return mps.default_pinned_device_memory_limit, default_field


def refuse_mixed(devices: Sequence[AllocatableDevice], records: Sequence[MpsRecord | None]) -> None:
    """A CUDA process talks to one MPS daemon (one CUDA_MPS_PIPE_DIRECTORY), so a claim's MPS devices must all be
    served by one daemon; and one share per GPU and claim (two would be the same GPU twice in a container)."""
    daemons = sorted({r.daemon for r in records if r is not None})
    if len(daemons) > 1:
        named = ", ".join(f"{d.name} ({r.daemon})" for d, r in zip(devices, records, strict=True) if r is not None)
        raise PrepareError(
            f"the claim's MPS devices would need {len(daemons)} MPS daemons ({named}), but a container can use only "
            "one: put shares of different GPUs, or shares and MPS-shared devices, in separate claims"
        )
    shared = [d.name for d, r in zip(devices, records, strict=True) if r is not None and r.share]
    if len(shared) != len(set(shared)):
        raise PrepareError(
            f"the claim holds {len(shared)} shares of {shared[0]}: one claim gets at most one share per GPU; ask for "
            "the sum in one request, or add a distinctAttribute constraint on gpu.dra.dev/uuid"
        )


# --- the daemon a set of records describes (pure) -------------------------------------------------


@dataclass(frozen=True)
class DaemonHolding:
    """One device record that holds a daemon, with the claim it belongs to."""

    claim: str  # namespace/name
    device: PreparedDevice

    @property
    def mps(self) -> MpsRecord:
        assert self.device.mps is not None
        return self.device.mps


def daemon_holdings(records: Iterable[ClaimRecord], daemon: str, *, excluding: str = "") -> list[DaemonHolding]:
    """Every device record (prepared or being prepared) that names this daemon, except those of claim `excluding`."""
    found = []
    for record in records:
        if record.uid == excluding:
            continue
        seen: set[tuple[str, str | None]] = set()
        for device in (*record.devices, *record.allocated):
            key = (device.device, device.share_id)
            if device.mps is not None and device.mps.daemon == daemon and key not in seen:
                seen.add(key)
                found.append(DaemonHolding(f"{record.namespace}/{record.name}", device))
    return found


def daemon_spec(root: Path, daemon: str, held: Sequence[DaemonHolding]) -> MpsDaemonSpec:
    """The daemon the holders need: every UUID they use, and limits no holder exceeds — for shares the largest
    share's (each share narrows its own clients), for a claim's devices its config's."""
    uuids = sorted({h.mps.uuid for h in held if h.mps.uuid is not None})
    threads = [h.mps.active_thread_percentage for h in held]
    thread = None if not threads or any(t is None for t in threads) else max(t for t in threads if t is not None)
    limits: dict[str, int] = {}
    for uuid in uuids:
        values = [h.mps.pinned_memory_limit for h in held if h.mps.uuid == uuid]
        if values and all(v is not None for v in values):
            limits[uuid] = max(v for v in values if v is not None)
    shares = tuple(
        MpsShareLimits(
            share_id=h.device.share_id or "",
            claim=h.claim,
            active_thread_percentage=h.mps.active_thread_percentage,
            pinned_memory_limit=h.mps.pinned_memory_limit,
        )
        for h in sorted(held, key=lambda h: h.device.share_id or "")
        if h.mps.share
    )
    return MpsDaemonSpec(
        id=daemon,
        directory=str(root / daemon),
        visible_uuids=tuple(uuids),
        active_thread_percentage=thread,
        pinned_memory_limits=limits,
        shares=shares,
        multi_user=any(h.mps.multi_user for h in held),
    )


def whole_gpus(held: Sequence[DaemonHolding]) -> list[str]:
    """The physical GPUs whose compute mode the daemon needs (whole GPUs; MIG devices keep theirs)."""
    return sorted({h.device.gpu_uuid for h in held if h.device.gpu_uuid and h.device.mig is None and _whole(h)})


def _whole(holder: DaemonHolding) -> bool:
    return holder.mps.uuid is None or holder.mps.uuid == holder.device.gpu_uuid


# --- the daemons on the node (I/O) ----------------------------------------------------------------


class MpsDaemons:
    """Directories, compute mode and control daemon of every MPS daemon on the node."""

    def __init__(self, root: Path, control: MpsControl, nvml: NvmlBackend, faults: FaultPoints | None = None) -> None:
        self.root = root
        self._control = control
        self._nvml = nvml
        self._faults = faults or FaultPoints()

    def ensure(self, spec: MpsDaemonSpec, gpus: Sequence[str]) -> None:
        """Make the daemon run as `spec` says: directories, compute mode ExclusiveProcess on its whole GPUs, the
        control daemon with its limits. Idempotent (also how a changed set of shares re-limits a daemon)."""
        directory = Path(spec.directory)
        try:
            self.root.mkdir(mode=MPS_DIR_MODE, parents=True, exist_ok=True)
            os.chmod(self.root, MPS_DIR_MODE)
            for sub in ("", PIPE_DIR, LOG_DIR, SHM_DIR):
                path = directory / sub if sub else directory
                path.mkdir(mode=MPS_DIR_MODE, exist_ok=True)
                os.chmod(path, MPS_DIR_MODE)
            record = {"id": spec.id, "visibleUuids": list(spec.visible_uuids), "computeModeGpus": list(gpus)}
            atomic_write(directory / DAEMON_FILE, (json.dumps(record, sort_keys=True) + "\n").encode(), mode=0o644)
        except OSError as exc:
            raise PrepareError(f"creating the MPS directories {directory} failed: {exc}") from None
        self._faults.reached("sharing:after-mps-dirs")
        for gpu in gpus:
            self._exclusive_process(gpu)
        self._faults.reached("sharing:after-compute-mode")
        try:
            self._control.start(spec)
        except MpsError as exc:
            raise PrepareError(f"starting the MPS control daemon {spec.id} failed: {exc}") from None
        self._faults.reached("sharing:after-mps-start")
        log.info(
            "MPS daemon running",
            daemon=spec.id,
            uuids=list(spec.visible_uuids),
            active_thread_percentage=spec.active_thread_percentage,
            shares=len(spec.shares),
        )

    def _exclusive_process(self, gpu: str) -> None:
        try:
            mode = self._nvml.compute_mode(gpu)
            if mode is ComputeMode.EXCLUSIVE_PROCESS:
                return
            if mode is not ComputeMode.DEFAULT:
                raise PrepareError(
                    f"GPU {gpu} is in compute mode {mode.name} (set outside this driver); MPS needs ExclusiveProcess, "
                    "and only a GPU in Default mode is switched: set it back with `nvidia-smi -i <uuid> -c DEFAULT`"
                )
            self._nvml.set_compute_mode(gpu, ComputeMode.EXCLUSIVE_PROCESS)
        except NvmlError as exc:
            raise PrepareError(f"setting compute mode ExclusiveProcess on GPU {gpu} for MPS failed: {exc}") from None
        log.info("compute mode set", gpu_uuid=gpu, compute_mode="ExclusiveProcess")

    def release(self, daemon: str, gpus: Sequence[str]) -> None:
        """Stop the daemon, put its whole GPUs back to compute mode Default and remove its directory. Idempotent:
        each step is safe to repeat after a crash."""
        spec = MpsDaemonSpec(id=daemon, directory=str(self.root / daemon), visible_uuids=())
        try:
            self._control.stop(spec)
        except MpsError as exc:
            raise PrepareError(f"stopping the MPS control daemon {daemon} failed: {exc}") from None
        self._faults.reached("sharing:after-mps-stop")
        for gpu in gpus:
            try:
                if self._nvml.compute_mode(gpu) is ComputeMode.EXCLUSIVE_PROCESS:
                    self._nvml.set_compute_mode(gpu, ComputeMode.DEFAULT)
                    log.info("compute mode reset", gpu_uuid=gpu, compute_mode="Default")
            except NvmlError as exc:
                raise PrepareError(f"resetting the compute mode of GPU {gpu} to Default failed: {exc}") from None
        self._faults.reached("sharing:after-compute-mode-reset")
        shutil.rmtree(self.root / daemon, ignore_errors=True)
        if (self.root / daemon).exists():
            raise PrepareError(f"removing the MPS directory {self.root / daemon} failed")
        log.info("MPS daemon stopped", daemon=daemon)

    def problems(self, spec: MpsDaemonSpec, gpus: Sequence[str]) -> list[str]:
        """What no longer matches: the daemon not running (e.g. killed with the plugin's container), its directory
        gone, a GPU out of ExclusiveProcess."""
        found = []
        if not Path(spec.pipe_directory).is_dir():
            found.append(f"MPS directory {spec.directory} is missing")
        status = self._control.status(spec)
        if not status.running:
            found.append(f"MPS daemon {spec.id} is not running ({status.detail or 'gone'})")
        elif status.active_thread_percentage != spec.active_thread_percentage and spec.active_thread_percentage:
            found.append(
                f"MPS daemon {spec.id} runs active thread percentage {status.active_thread_percentage}, "
                f"recorded {spec.active_thread_percentage}"
            )
        for gpu in gpus:
            try:
                mode = self._nvml.compute_mode(gpu)
            except NvmlError:
                continue
            if mode is not ComputeMode.EXCLUSIVE_PROCESS:
                found.append(f"GPU {gpu} is in compute mode {mode.name}, MPS needs ExclusiveProcess")
        return found

    def on_disk(self) -> list[str]:
        """Ids of the daemon directories under the MPS root."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and _DAEMON_ID.fullmatch(p.name))

    def recorded_gpus(self, daemon: str) -> list[str]:
        """The GPUs a daemon's own file says it switched to ExclusiveProcess (for a sweep without a checkpoint)."""
        try:
            raw = json.loads((self.root / daemon / DAEMON_FILE).read_text())
            gpus = raw.get("computeModeGpus", []) if isinstance(raw, dict) else []
            return sorted(str(g) for g in gpus if isinstance(g, str))
        except (OSError, ValueError):
            return []


def share_env(device: PreparedDevice) -> tuple[str, ...]:
    """A share's own limits for its clients (MPS client variables; they narrow the daemon's)."""
    if device.mps is None or not device.mps.share:
        return ()
    env = []
    if device.mps.active_thread_percentage is not None:
        env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={device.mps.active_thread_percentage}")
    if device.mps.pinned_memory_limit is not None:
        # The client sees only its one GPU through the daemon, as ordinal 0.
        env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={device.mps.pinned_memory_limit // (1024 * 1024)}M")
    return tuple(env)
