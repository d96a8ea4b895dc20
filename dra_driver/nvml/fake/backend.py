"""FakeNvml: an NvmlBackend over a described node, with real MIG semantics and test hooks.

The node (identity, locality, wiring) is fixed at construction (fake_node); runtime state (MIG
mode, GPU/compute instances, busy processes, compute mode) lives in a store, in memory or in a
state file shared across processes (fake_store); the MIG rules are pure functions (fake_mig).
Fault injection, event injection and GPU-loss are per instance and never persisted.

See docs/fake-nvml.md.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, TypedDict, TypeVar, Unpack

from dra_driver.nvml import types as nvt
from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.fake import mig as fake_mig
from dra_driver.nvml.fake import pci as fake_pci
from dra_driver.nvml.fake import vgpu as fake_vgpu
from dra_driver.nvml.fake.driver import DriverStore, FakeDriver
from dra_driver.nvml.fake.fmpartitions import FakeFabricManager
from dra_driver.nvml.fake.inbox import Inbox
from dra_driver.nvml.fake.models import MIB
from dra_driver.nvml.fake.mps import FakeMpsControl
from dra_driver.nvml.fake.node import GpuSlot, NodeSpec, initial_state, pcie_level, with_clique, with_initial_mig
from dra_driver.nvml.fake.nodefile import load_node_file, load_preset
from dra_driver.nvml.fake.state import FakeNodeState, GpuState
from dra_driver.nvml.fake.store import FileStore, MemoryStore, StateStore
from dra_driver.nvml.fake.vgpu import FakeVgpuSysfs
from dra_driver.pci.fake import FakePciSysfs

T = TypeVar("T")

# The NvmlBackend methods, i.e. the call names fault injection accepts: read off the protocol, so a method added
# there can be failed here without another list to keep in step.
CALL_NAMES: tuple[str, ...] = tuple(
    name for name, member in vars(NvmlBackend).items() if inspect.isfunction(member) and not name.startswith("_")
)

SUPPORTED_EVENTS = nvt.EVENT_SINGLE_BIT_ECC | nvt.EVENT_DOUBLE_BIT_ECC | nvt.EVENT_XID_CRITICAL
# The call log keeps the most recent calls only: a fake plugin serving for days (the sandbox, the chart's fake
# mode) would otherwise grow by every NVML call of every prepare, usage sample and health check (found by
# bench/soak_bench.py with tracemalloc: ~85 bytes per call, without end).
CALL_LOG_LIMIT = 10_000

ProfileQueryMode = Literal["auto", "supported", "not_supported"]


@dataclass(frozen=True)
class FakeSettings:
    """Behaviour knobs (also settable as `,key=value` in a backend spec; see factory)."""

    state_path: Path | None = None  # keep runtime state in this file (survives restarts)
    auto_reset: bool = False  # Ampere: the MIG-mode reset succeeds at once when the GPU is idle
    passthrough: bool = False  # Ampere: reset not exposed (VM) -> activation RESET_REQUIRED
    # GI profile queries while MIG is disabled: "auto" = work on Hopper+, NOT_SUPPORTED on Ampere.
    profiles_when_mig_disabled: ProfileQueryMode = "auto"
    # The node starts with no NVIDIA kernel driver loaded (the GPU Operator's driver container is still installing):
    # init fails with DRIVER_NOT_LOADED until load_driver(). With a state file, only when no driver sidecar exists.
    driver_absent: bool = False
    # The NVIDIA vGPU Manager is installed (a KVM host): Ampere+ GPUs report vGPU types and have SR-IOV VFs
    # (nvml/fake/vgpu.py).
    vgpu: bool = False
    vgpu_mdev: bool = False  # with `vgpu`: the GPUs are mediated-device parents instead of SR-IOV GPUs
    # Fabric Manager runs in shared NVSwitch mode: the board's predefined GPU partitions (nvml/fake/fmpartitions.py).
    fabric_partitions: bool = False


@dataclass(frozen=True)
class _Lost:
    """Queue marker: the GPU fell off the bus; wait_event raises GPU_IS_LOST for it."""

    gpu_uuid: str


@dataclass
class _Events:
    """Event subscription and queue, guarded by `cond`."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    registered: dict[str, int] = field(default_factory=dict)  # uuid -> event mask
    queue: deque[nvt.GpuEvent | _Lost] = field(default_factory=deque)


class NodeKnobs(TypedDict, total=False):
    """What `FakeNvml.preset` and `FakeNvml.from_file` take besides the node: the `seed=`, `mig=` and `clique=` knobs
    of a `fake:` spec (docs/fake-nvml.md; None or absent: as the node describes) and the settings."""

    seed: str | None
    mig: bool | None
    clique: int | None
    settings: FakeSettings | None


def _adjusted(node: NodeSpec, knobs: NodeKnobs) -> NodeSpec:
    """The `mig=` and `clique=` knobs applied to a described node."""
    mig, clique = knobs.get("mig"), knobs.get("clique")
    node = with_initial_mig(node, mig) if mig is not None else node
    return with_clique(node, clique) if clique is not None else node


class FakeNvml:
    """A fake node implementing `NvmlBackend`. Thread-safe; see the module docstring."""

    def __init__(self, node: NodeSpec, settings: FakeSettings | None = None) -> None:
        self._node = node
        self._settings = settings if settings is not None else FakeSettings()
        start = initial_state(node)
        self._store: StateStore
        self._file_store: FileStore | None = None
        if self._settings.state_path is not None:
            self._file_store = FileStore(Path(self._settings.state_path), start)
            self._store = self._file_store
        else:
            self._store = MemoryStore(start)
        settings = self._settings
        self._reset = fake_mig.MigResetBehaviour(auto_reset=settings.auto_reset, passthrough=settings.passthrough)
        self._lock = threading.Lock()  # guards the fields below (not the MIG state: the store does)
        self._refs = 0
        self._faults: dict[str, deque[nvt.NvmlReturn]] = {}
        self._lost: set[str] = set()
        self._calls: deque[str] = deque(maxlen=CALL_LOG_LIMIT)
        self._events = _Events()
        self._inbox = Inbox.at_end(self._settings.state_path) if self._settings.state_path is not None else None
        initial_driver = FakeDriver(loaded=not settings.driver_absent, version=node.system.driver_version)
        self._driver = DriverStore(initial_driver, self._settings.state_path)
        self._generation = -1  # the driver generation this handle was opened in (init)

    @classmethod
    def preset(cls, name: str, **knobs: Unpack[NodeKnobs]) -> FakeNvml:
        return cls(_adjusted(load_preset(name, seed=knobs.get("seed")), knobs), knobs.get("settings"))

    @classmethod
    def from_file(cls, path: Path | str, **knobs: Unpack[NodeKnobs]) -> FakeNvml:
        return cls(_adjusted(load_node_file(path, seed=knobs.get("seed")), knobs), knobs.get("settings"))

    @property
    def node(self) -> NodeSpec:
        return self._node

    @property
    def settings(self) -> FakeSettings:
        return self._settings

    def __repr__(self) -> str:
        where = f", state={self._settings.state_path}" if self._settings.state_path else ""
        return f"FakeNvml(node={self._node.name!r}, gpus={len(self._node.gpus)}{where})"

    # --- plumbing --------------------------------------------------------------------------------

    def _record(self, call: str) -> nvt.NvmlReturn | None:
        """Log the call and take the next fault injected for it (None: none is). The caller holds the lock."""
        self._calls.append(call)
        pending = self._faults.get(call)
        code = pending.popleft() if pending else None
        if pending is not None and not pending:
            del self._faults[call]
        return code

    def _enter(self, call: str, *, about_gpu: bool = False) -> None:
        """Record the call, fire an injected fault, and refuse calls before init (as NVML does) or while the driver
        is unloaded or was reloaded since init (see fake/driver.py)."""
        with self._lock:
            code = self._record(call)
            initialised = self._refs > 0
        if code is not None:
            raise nvt.NvmlError(code, call=call, detail="injected fault")
        if not initialised:
            raise nvt.NvmlError(nvt.NvmlReturn.UNINITIALIZED, call=call, detail="call init() first")
        driver = self._driver.read()
        if not driver.loaded:
            code = nvt.NvmlReturn.GPU_IS_LOST if about_gpu else nvt.NvmlReturn.DRIVER_NOT_LOADED
            raise nvt.NvmlError(code, call=call, detail="the nvidia kernel driver was unloaded")
        if driver.generation != self._generation:
            raise nvt.NvmlError(
                nvt.NvmlReturn.UNINITIALIZED,
                call=call,
                detail=f"the nvidia driver was reloaded ({driver.version}) since init(); shutdown() and init() again",
            )

    def _slot(self, call: str, gpu_uuid: str) -> GpuSlot:
        slot = self._node.slot(gpu_uuid)
        if slot is None:
            raise nvt.NvmlError(nvt.NvmlReturn.NOT_FOUND, call=call, detail=f"no GPU with uuid {gpu_uuid!r}")
        with self._lock:
            lost = gpu_uuid in self._lost
        if lost:
            raise nvt.NvmlError(nvt.NvmlReturn.GPU_IS_LOST, call=call, detail=gpu_uuid)
        return slot

    def _gpu(self, call: str, gpu_uuid: str) -> GpuSlot:
        self._enter(call, about_gpu=True)
        return self._slot(call, gpu_uuid)

    def _state_of(self, slot: GpuSlot) -> GpuState:
        return self._store.snapshot().gpu(slot.uuid)

    def _mutate(self, slot: GpuSlot, change: Callable[[GpuState], tuple[GpuState, T]]) -> T:
        def apply(state: FakeNodeState) -> tuple[FakeNodeState, T]:
            new_gpu, result = change(state.gpu(slot.uuid))
            return state.with_gpu(new_gpu), result

        return self._store.update(apply)

    def _helper_slot(self, helper: str, gpu_uuid: str) -> GpuSlot:
        slot = self._node.slot(gpu_uuid)
        if slot is None:
            raise ValueError(f"{helper}: unknown GPU uuid {gpu_uuid!r}; this node has {', '.join(self._node.uuids)}")
        return slot

    # --- lifecycle -------------------------------------------------------------------------------

    def init(self) -> None:
        with self._lock:
            code = self._record("init")
        if code is not None:
            raise nvt.NvmlUnavailableError(f"fake NVML: init failed with injected NVML_ERROR_{code.name}")
        driver = self._driver.read()
        if not driver.loaded:
            raise nvt.NvmlUnavailableError(
                "fake NVML: the nvidia kernel driver is not loaded (NVML_ERROR_DRIVER_NOT_LOADED). Fix: load it "
                "(`dra-sandbox nvidia-driver load --node <node>`, or FakeNvml.load_driver) as the GPU Operator's "
                "driver container would"
            )
        if self._file_store is not None:
            self._file_store.open()  # FakeStateError (an NvmlUnavailableError) names the file
        with self._lock:
            self._refs += 1
            self._generation = driver.generation

    def shutdown(self) -> None:
        # Allowed on a handle a driver reload made stale: that is how a process gets back to a working init().
        with self._lock:
            code = self._record("shutdown")
            initialised = self._refs > 0
        if code is not None:
            raise nvt.NvmlError(code, call="shutdown", detail="injected fault")
        if not initialised:
            raise nvt.NvmlError(nvt.NvmlReturn.UNINITIALIZED, call="shutdown", detail="call init() first")
        with self._lock:
            self._refs -= 1

    # --- system and enumeration ------------------------------------------------------------------

    def system_info(self) -> nvt.SystemInfo:
        self._enter("system_info")
        system = self._node.system
        version = self._driver.read().version
        if version == system.driver_version:
            return system
        nvml = system.nvml_version.replace(system.driver_version, version)
        return replace(system, driver_version=version, nvml_version=nvml)

    def gpus(self) -> list[nvt.GpuInfo]:
        self._enter("gpus")
        # A GPU bound to another driver (vfio-pci for a VM) is not the nvidia driver's: NVML does not list it.
        pci = self._store.snapshot().pci
        return [
            nvt.GpuInfo(
                index=s.index,
                minor=s.minor,
                uuid=s.uuid,
                name=s.model.name,
                brand=s.model.brand,
                architecture=s.model.architecture,
                cuda_compute_capability=s.model.compute_capability,
                memory_total_bytes=s.model.memory_mib * MIB,
                pci_bus_id=s.bus_id,
                pci_device_id=s.model.pci_device_id,
                serial=s.serial,
                multiprocessors=s.model.multiprocessors,
            )
            for s in self._node.gpus
            if pci is None or pci.driver_of(s.bus_id) == fake_pci.NVIDIA
        ]

    # --- host locality and topology --------------------------------------------------------------

    def numa_node(self, gpu_uuid: str) -> int | None:
        slot = self._gpu("numa_node", gpu_uuid)
        return slot.numa_node if len(self._node.numa_nodes) > 1 else None

    def numa_neighbours(self, numa_node: int) -> tuple[int, ...]:
        self._enter("numa_neighbours")
        # Node files declare no sockets or SLIT distances: every fake NUMA node is a socket of its own.
        return ()

    def cpu_affinity(self, gpu_uuid: str) -> tuple[int, ...]:
        slot = self._gpu("cpu_affinity", gpu_uuid)
        return self._node.cpus_of(slot.numa_node)

    def pcie_root(self, gpu_uuid: str) -> str | None:
        return self._gpu("pcie_root", gpu_uuid).pcie_root

    def topology_common_ancestor(self, gpu_a: str, gpu_b: str) -> nvt.TopologyLevel:
        a = self._gpu("topology_common_ancestor", gpu_a)
        b = self._slot("topology_common_ancestor", gpu_b)
        return pcie_level(a, b)

    def nvlinks(self, gpu_uuid: str) -> list[nvt.NvLink]:
        return list(self._gpu("nvlinks", gpu_uuid).nvlinks)

    def nvlink_p2p_ok(self, gpu_a: str, gpu_b: str) -> bool:
        a = self._gpu("nvlink_p2p_ok", gpu_a)
        b = self._slot("nvlink_p2p_ok", gpu_b)
        return b.index in a.nvlink_peers

    def fabric_info(self, gpu_uuid: str) -> nvt.FabricInfo | None:
        """What the node description says, unless the state (file) sets this GPU's fabric at run time (a fault).
        A GPU without fabric (None) or with state NOT_SUPPORTED answers None, as the real backend does."""
        slot = self._gpu("fabric_info", gpu_uuid)
        info = self._store.snapshot().fabric_of(slot.uuid) or slot.fabric
        if info is None or info.state is nvt.FabricState.NOT_SUPPORTED:
            return None
        return info

    # --- compute mode ----------------------------------------------------------------------------

    def compute_mode(self, gpu_uuid: str) -> nvt.ComputeMode:
        return self._state_of(self._gpu("compute_mode", gpu_uuid)).compute_mode

    def set_compute_mode(self, gpu_uuid: str, mode: nvt.ComputeMode) -> None:
        slot = self._gpu("set_compute_mode", gpu_uuid)
        if mode is nvt.ComputeMode.EXCLUSIVE_THREAD:
            # Removed from current drivers [unverified exact code].
            raise nvt.NvmlError(
                nvt.NvmlReturn.NOT_SUPPORTED, call="set_compute_mode", detail="EXCLUSIVE_THREAD was removed"
            )

        def change(gpu: GpuState) -> tuple[GpuState, None]:
            return replace(gpu, compute_mode=nvt.ComputeMode(mode)), None

        self._mutate(slot, change)

    # --- time-slicing --------------------------------------------------------------------------

    def time_slice(self, gpu_uuid: str) -> nvt.TimeSlice:
        slot = self._gpu("time_slice", gpu_uuid)
        self._check_time_slice_support(slot, "time_slice")
        return self._state_of(slot).time_slice

    def set_time_slice(self, gpu_uuid: str, value: nvt.TimeSlice) -> None:
        slot = self._gpu("set_time_slice", gpu_uuid)
        self._check_time_slice_support(slot, "set_time_slice")

        def change(gpu: GpuState) -> tuple[GpuState, None]:
            return replace(gpu, time_slice=nvt.TimeSlice(value)), None

        self._mutate(slot, change)

    @staticmethod
    def _check_time_slice_support(slot: GpuSlot, call: str) -> None:
        # Like `nvidia-smi compute-policy` on a GPU without compute-policy support (Tesla P4: exit status 3).
        if not slot.time_slice_supported:
            raise nvt.NvmlError(
                nvt.NvmlReturn.NOT_SUPPORTED, call=call, detail="this GPU has no compute-policy time-slice support"
            )

    # --- MIG -------------------------------------------------------------------------------------

    def mig_mode(self, gpu_uuid: str) -> nvt.MigMode | None:
        slot = self._gpu("mig_mode", gpu_uuid)
        if not slot.model.mig_capable:
            return None
        gpu = self._state_of(slot)
        return nvt.MigMode(current=gpu.mig_current, pending=gpu.mig_pending)

    def set_mig_mode(self, gpu_uuid: str, enabled: bool) -> nvt.NvmlReturn:
        slot = self._gpu("set_mig_mode", gpu_uuid)
        return self._mutate(slot, lambda gpu: fake_mig.set_mig_mode(slot.model, gpu, enabled, self._reset))

    def gpu_instance_profiles(self, gpu_uuid: str) -> list[nvt.GpuInstanceProfile]:
        call = "gpu_instance_profiles"
        slot = self._gpu(call, gpu_uuid)
        spec = fake_mig.mig_spec(slot.model, call)
        if not self._state_of(slot).mig_current and not self._profiles_visible_without_mig(slot):
            raise nvt.NvmlError(nvt.NvmlReturn.NOT_SUPPORTED, call=call, detail="MIG mode is disabled")
        return list(spec.profiles)

    def _profiles_visible_without_mig(self, slot: GpuSlot) -> bool:
        policy = self._settings.profiles_when_mig_disabled
        if policy == "auto":
            return slot.model.architecture >= nvt.Architecture.HOPPER
        return policy == "supported"

    def create_gpu_instance(self, gpu_uuid: str, profile_id: int, placement: nvt.Placement) -> nvt.GpuInstance:
        slot = self._gpu("create_gpu_instance", gpu_uuid)
        gi = self._mutate(slot, lambda gpu: fake_mig.create_gpu_instance(slot.model, gpu, profile_id, placement))
        return fake_mig.gpu_instance_value(slot.uuid, gi)

    def destroy_gpu_instance(self, gpu_uuid: str, gpu_instance_id: int) -> None:
        slot = self._gpu("destroy_gpu_instance", gpu_uuid)
        self._mutate(slot, lambda gpu: (fake_mig.destroy_gpu_instance(slot.model, gpu, gpu_instance_id), None))

    def gpu_instances(self, gpu_uuid: str) -> list[nvt.GpuInstance]:
        call = "gpu_instances"
        slot = self._gpu(call, gpu_uuid)
        gpu = self._state_of(slot)
        fake_mig.require_mig_on(slot.model, gpu, call)
        return [fake_mig.gpu_instance_value(slot.uuid, gi) for gi in gpu.gis]

    def compute_instance_profiles(self, gpu_uuid: str, gpu_instance_id: int) -> list[nvt.ComputeInstanceProfile]:
        slot = self._gpu("compute_instance_profiles", gpu_uuid)
        return fake_mig.compute_instance_profiles(slot.model, self._state_of(slot), gpu_instance_id)

    def create_compute_instance(self, gpu_uuid: str, gpu_instance_id: int, profile_id: int) -> nvt.ComputeInstance:
        slot = self._gpu("create_compute_instance", gpu_uuid)
        ci = self._mutate(
            slot, lambda gpu: fake_mig.create_compute_instance(slot.model, gpu, gpu_instance_id, profile_id)
        )
        return fake_mig.compute_instance_value(slot.uuid, gpu_instance_id, ci)

    def destroy_compute_instance(self, gpu_uuid: str, gpu_instance_id: int, compute_instance_id: int) -> None:
        slot = self._gpu("destroy_compute_instance", gpu_uuid)
        self._mutate(
            slot,
            lambda gpu: (
                fake_mig.destroy_compute_instance(slot.model, gpu, gpu_instance_id, compute_instance_id),
                None,
            ),
        )

    def compute_instances(self, gpu_uuid: str, gpu_instance_id: int) -> list[nvt.ComputeInstance]:
        call = "compute_instances"
        slot = self._gpu(call, gpu_uuid)
        gpu = self._state_of(slot)
        fake_mig.require_mig_on(slot.model, gpu, call)
        gi = gpu.gi(gpu_instance_id)
        if gi is None:
            raise nvt.NvmlError(nvt.NvmlReturn.NOT_FOUND, call=call, detail=f"no GPU instance {gpu_instance_id}")
        return [fake_mig.compute_instance_value(slot.uuid, gi.id, ci) for ci in gi.cis]

    def mig_devices(self, gpu_uuid: str) -> list[nvt.MigDevice]:
        slot = self._gpu("mig_devices", gpu_uuid)
        return fake_mig.mig_devices(slot.model, self._state_of(slot))

    # --- passthrough (VFIO) ----------------------------------------------------------------------

    def running_processes(self, gpu_uuid: str) -> tuple[int, ...]:
        """The `busy` pids of the GPU at every scope (whole GPU, GPU and compute instances)."""
        slot = self._gpu("running_processes", gpu_uuid)
        return tuple(sorted(set(self._state_of(slot).pids_within())))

    def persistence_mode(self, gpu_uuid: str) -> bool:
        return self._state_of(self._gpu("persistence_mode", gpu_uuid)).persistence_mode

    def set_persistence_mode(self, gpu_uuid: str, enabled: bool) -> None:
        slot = self._gpu("set_persistence_mode", gpu_uuid)
        self._mutate(slot, lambda gpu: (replace(gpu, persistence_mode=bool(enabled)), None))

    def vgpu_state(self, gpu_uuid: str) -> nvt.VgpuState | None:
        slot = self._gpu("vgpu_state", gpu_uuid)
        if not self._settings.vgpu:
            return None
        return fake_vgpu.vgpus_of(self._node, self._store.snapshot(), slot)

    def vgpu_sysfs(self) -> FakeVgpuSysfs:
        """The GPUs' SR-IOV virtual functions and their vGPU types, kept in the same state (file) as the GPUs."""
        return FakeVgpuSysfs(self._store, self._node, self._settings.vgpu, self._settings.vgpu_mdev)

    def fabric_manager(self) -> FakeFabricManager:
        """Fabric Manager's partitions of this node, kept in the same state (file) as the GPUs."""
        self._enter("fabric_manager")
        return FakeFabricManager(self._store, self._node, self._settings.fabric_partitions)

    def pci_sysfs(self) -> FakePciSysfs:
        """The node's PCI functions (drivers, IOMMU groups), kept in the same state (file) as the GPUs."""
        return FakePciSysfs(self._store, self._node)

    # --- usage -----------------------------------------------------------------------------------

    def device_usage(self, uuid: str, *, held: bool = False) -> nvt.DeviceUtilisation:
        """The load model (`modelled_usage`: a held device runs a steady deterministic load, an idle one none)
        overlaid with what the state file's `usage.<uuid>` sets. A MIG device reports memory only."""
        call = "device_usage"
        self._enter(call)
        state = self._store.snapshot()
        if uuid.startswith("MIG-"):
            found = self._mig_device(state, uuid)
            if found is None:
                raise nvt.NvmlError(nvt.NvmlReturn.NOT_FOUND, call=call, detail=f"no MIG device with uuid {uuid!r}")
            self._slot(call, found.parent_uuid)  # a lost parent: GPU_IS_LOST
            model = nvt.modelled_usage(uuid, held=held, memory_total_bytes=found.memory_bytes, mig=True)
            explicit = state.usage_of(uuid)
            if explicit is None or explicit.memory_used_bytes is None:
                return model
            return replace(model, memory_used_bytes=explicit.memory_used_bytes)
        slot = self._slot(call, uuid)
        model = nvt.modelled_usage(uuid, held=held, memory_total_bytes=slot.model.memory_mib * MIB, mig=False)
        explicit = state.usage_of(uuid)
        if explicit is None:
            return model
        return replace(model, **{k: v for k, v in vars(explicit).items() if v is not None})

    def _mig_device(self, state: FakeNodeState, uuid: str) -> nvt.MigDevice | None:
        for slot in self._node.gpus:
            if not slot.model.mig_capable:
                continue
            for device in fake_mig.mig_devices(slot.model, state.gpu(slot.uuid)):
                if device.uuid == uuid:
                    return device
        return None

    def set_fabric(self, gpu_uuid: str, fabric: nvt.FabricInfo | None) -> None:
        """Test helper: what `fabric_info` answers for this GPU from now on, e.g. a registration still IN_PROGRESS,
        COMPLETED with an error status, or an UNHEALTHY summary (`dataclasses.replace` of the current value); None
        goes back to the node description. Kept in the state (file), so another process (a plugin) sees it."""
        slot = self._helper_slot("set_fabric", gpu_uuid)
        self._store.update(lambda state: (state.with_fabric(slot.uuid, fabric), None))

    def set_usage(self, uuid: str, usage: nvt.DeviceUtilisation | None) -> None:
        """Test helper: set a device's usage explicitly (None fields: the load model); None clears it. Kept in the
        state (file), like `usage:` written there by hand."""
        self._store.update(lambda state: (state.with_usage(uuid, usage), None))

    # --- health events ---------------------------------------------------------------------------

    def register_events(self, gpu_uuids: list[str], event_mask: int) -> int:
        call = "register_events"
        self._enter(call)
        slots = [self._slot(call, u) for u in gpu_uuids]
        self._drain_inbox()  # events posted before the subscription are lost, as with NVML
        registered = event_mask & SUPPORTED_EVENTS
        with self._events.cond:
            for slot in slots:
                self._events.registered[slot.uuid] = self._events.registered.get(slot.uuid, 0) | registered
        return registered

    def wait_event(self, timeout_ms: int) -> nvt.GpuEvent | None:
        """Next queued event, else None after at most `timeout_ms` (at once when it is <= 0)."""
        self._enter("wait_event")
        events = self._events
        deadline = time.monotonic() + max(0, timeout_ms) / 1000
        while True:
            self._drain_inbox()
            with events.cond:
                remaining = deadline - time.monotonic()
                if not events.queue and remaining > 0:
                    # Short waits while another process may post to the inbox; one wait otherwise.
                    events.cond.wait_for(
                        lambda: bool(events.queue), timeout=min(remaining, 0.05) if self._inbox else remaining
                    )
                if events.queue:
                    item = events.queue.popleft()
                    break
                if time.monotonic() >= deadline:
                    return None
        if isinstance(item, _Lost):
            raise nvt.NvmlError(nvt.NvmlReturn.GPU_IS_LOST, call="wait_event", detail=item.gpu_uuid)
        return item

    def _drain_inbox(self) -> None:
        if self._inbox is None:
            return
        for record in self._inbox.read_new():
            try:
                slot = self._slot("wait_event", str(record["gpu"]))
            except nvt.NvmlError:
                continue  # an event for a GPU this node does not have
            if record.get("lost"):
                with self._lock:
                    self._lost.add(slot.uuid)
                self._queue_event(slot, _Lost(slot.uuid), 0)
                continue
            event = nvt.GpuEvent(
                gpu_uuid=slot.uuid,
                event_type=int(record["type"]),
                data=int(record.get("data", 0)),
                gpu_instance_id=int(record.get("gi", nvt.NO_INSTANCE)),
                compute_instance_id=int(record.get("ci", nvt.NO_INSTANCE)),
            )
            self._queue_event(slot, event, event.event_type)

    # --- test helpers (not part of NvmlBackend) --------------------------------------------------

    def inject_fault(self, call_name: str, code: nvt.NvmlReturn, count: int = 1) -> None:
        """Make the next `count` calls of protocol method `call_name` raise NvmlError(code)
        (`init` raises NvmlUnavailableError instead, as a real init failure does)."""
        if call_name not in CALL_NAMES:
            raise ValueError(f"inject_fault: unknown call {call_name!r}; valid: {', '.join(CALL_NAMES)}")
        if count < 1:
            raise ValueError(f"inject_fault: count must be >= 1, got {count}")
        with self._lock:
            self._faults.setdefault(call_name, deque()).extend([nvt.NvmlReturn(code)] * count)

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def calls(self) -> list[str]:
        """Names of the protocol methods called so far (the last CALL_LOG_LIMIT), in order (a copy)."""
        with self._lock:
            return list(self._calls)

    def state(self) -> FakeNodeState:
        """The current runtime state (re-read from the state file when there is one)."""
        return self._store.snapshot()

    def mps_control(self) -> FakeMpsControl:
        """The node's MPS control daemons, kept in the same state (file) as the GPUs."""
        return FakeMpsControl(self._store)

    def _queue_event(self, slot: GpuSlot, event: nvt.GpuEvent | _Lost, event_type: int) -> bool:
        # Like NVML, an event nobody subscribed to is not kept for a later subscriber.
        with self._events.cond:
            mask = self._events.registered.get(slot.uuid)
            if mask is None or not (mask & event_type or isinstance(event, _Lost)):
                return False
            self._events.queue.append(event)
            self._events.cond.notify_all()
        return True

    def inject_xid(self, gpu_uuid: str, xid: int, gi: int | None = None, ci: int | None = None) -> bool:
        """Queue an Xid critical-error event; returns False when the GPU is not registered for it."""
        slot = self._helper_slot("inject_xid", gpu_uuid)
        if ci is not None and gi is None:
            raise ValueError("inject_xid: a compute instance needs its gpu instance (gi=...)")
        if gi is not None:
            target = self._store.snapshot().gpu(slot.uuid).gi(gi)
            if target is None or (ci is not None and all(c.id != ci for c in target.cis)):
                raise ValueError(f"inject_xid: no MIG instance gi={gi} ci={ci} on {gpu_uuid}")
        event = nvt.GpuEvent(
            gpu_uuid=slot.uuid,
            event_type=nvt.EVENT_XID_CRITICAL,
            data=xid,
            gpu_instance_id=nvt.NO_INSTANCE if gi is None else gi,
            compute_instance_id=nvt.NO_INSTANCE if ci is None else ci,
        )
        return self._queue_event(slot, event, nvt.EVENT_XID_CRITICAL)

    def inject_ecc(self, gpu_uuid: str, *, double_bit: bool = True) -> bool:
        """Queue an ECC error event (double- or single-bit)."""
        slot = self._helper_slot("inject_ecc", gpu_uuid)
        kind = nvt.EVENT_DOUBLE_BIT_ECC if double_bit else nvt.EVENT_SINGLE_BIT_ECC
        return self._queue_event(slot, nvt.GpuEvent(gpu_uuid=slot.uuid, event_type=kind, data=0), kind)

    def inject_gpu_lost(self, gpu_uuid: str) -> None:
        """The GPU falls off the bus: every call about it now raises GPU_IS_LOST, and a registered
        event set gets one GPU_IS_LOST from wait_event. reset_gpu brings it back."""
        slot = self._helper_slot("inject_gpu_lost", gpu_uuid)
        with self._lock:
            self._lost.add(slot.uuid)
        self._queue_event(slot, _Lost(slot.uuid), 0)

    def set_busy(
        self, gpu_uuid: str, pids: tuple[int, ...] | list[int], gi: int | None = None, ci: int | None = None
    ) -> None:
        """Declare the processes running on a GPU, a GPU instance or a compute instance (replacing
        the previous list at that scope; empty clears). Busy targets refuse destroy/toggle/reset."""
        slot = self._helper_slot("set_busy", gpu_uuid)
        pid_tuple = tuple(pids)
        if any(p < 1 for p in pid_tuple):
            raise ValueError(f"set_busy: pids must be positive, got {list(pid_tuple)}")
        self._mutate(slot, lambda gpu: (fake_mig.set_busy(slot.model, gpu, pid_tuple, gi, ci), None))

    def driver(self) -> FakeDriver:
        """The node's kernel driver now (re-read from the sidecar when there is a state file)."""
        return self._driver.read()

    def unload_driver(self) -> None:
        """`rmmod nvidia`: init fails, and calls on open handles fail (see fake/driver.py). Idempotent."""
        driver = self._driver.read()
        if driver.loaded:
            self._driver.write(replace(driver, loaded=False))

    def load_driver(self, version: str | None = None) -> None:
        """`modprobe nvidia` (of `version`, default the last one): a new driver generation. What the old driver
        held is gone: MIG instances (a pending MIG mode activates), MPS daemons, busy processes, compute mode,
        time-slice and persistence mode. Open handles stay stale until shutdown() + init(). Loading over a loaded
        driver is a reload."""
        driver = self._driver.read()

        def fresh(state: FakeNodeState) -> tuple[FakeNodeState, None]:
            gpus = tuple(
                replace(
                    g,
                    gis=(),
                    busy=(),
                    mig_current=g.mig_pending,
                    compute_mode=nvt.ComputeMode.DEFAULT,
                    time_slice=nvt.TimeSlice.DEFAULT,
                    persistence_mode=False,
                )
                for g in state.gpus
            )
            return replace(state, gpus=gpus, mps_daemons=()), None

        self._store.update(fresh)
        with self._lock:
            self._lost.clear()
        with self._events.cond:
            self._events.registered.clear()
            self._events.queue.clear()
        self._driver.write(FakeDriver(loaded=True, version=version or driver.version, generation=driver.generation + 1))

    def reset_gpu(self, gpu_uuid: str) -> None:
        """`nvidia-smi -r`: drop all GPU/compute instances and activate a pending MIG mode.
        Raises NvmlError(IN_USE) while processes run on the GPU. Also recovers a lost GPU."""
        slot = self._helper_slot("reset_gpu", gpu_uuid)
        self._mutate(slot, lambda gpu: (fake_mig.reset_gpu(gpu), None))
        with self._lock:
            self._lost.discard(slot.uuid)
