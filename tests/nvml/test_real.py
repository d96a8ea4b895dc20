"""RealNvml against patched pynvml functions that behave like the real wrappers.

Every patched function takes the same arguments as the pynvml wrapper it replaces and returns the
same kind of object: real pynvml ctypes structs (nvmlPciInfo_t, c_nvmlMemory_t,
c_nvmlGpuInstanceProfileInfo_v2_t, c_nvmlGpuInstanceInfo_t, c_nvmlEventData_t, …), real ctypes
handle pointers, caller-made arrays filled in place, counts written through byref, and real
pynvml.NVMLError(code) exceptions.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml
import pytest

from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.real.backend import RealNvml
from dra_driver.nvml.real.calls import MAX_ARRAY_SLOTS
from dra_driver.nvml.types import (
    Architecture,
    ComputeInstance,
    ComputeInstanceProfile,
    ComputeMode,
    FabricHealth,
    FabricInfo,
    FabricState,
    GpuEvent,
    GpuInstance,
    MigDevice,
    MigMode,
    NvLink,
    NvLinkRemoteType,
    NvmlError,
    NvmlLibraryStaleError,
    NvmlReturn,
    NvmlUnavailableError,
    Placement,
    SystemInfo,
    TimeSlice,
    TopologyLevel,
)
from tests.narrow import present

MIB = 1024 * 1024
U0 = "GPU-0b0b2c36-3e5d-5e4b-8b0e-3f1d2a9c0001"
U1 = "GPU-0b0b2c36-3e5d-5e4b-8b0e-3f1d2a9c0002"
U2 = "GPU-0b0b2c36-3e5d-5e4b-8b0e-3f1d2a9c0003"
MIG_A = "MIG-5a1e7c1c-7d0e-5b8e-9a53-1a2b3c4d0001"
MIG_B = "MIG-5a1e7c1c-7d0e-5b8e-9a53-1a2b3c4d0002"

# --- harness --------------------------------------------------------------------------------------


def addr(handle: Any) -> int:
    value = ctypes.cast(handle, ctypes.c_void_p).value
    assert value is not None
    return value


def new_handle(struct: type[ctypes.Structure]) -> Any:
    return ctypes.pointer(struct())


def same_handle(handle: Any, pointer_type: Any) -> Any:
    """A different Python object for the same NVML handle (what a second pynvml call returns)."""
    return ctypes.cast(handle, pointer_type)


def raises(code: int) -> Callable[..., Any]:
    def fn(*_args: Any) -> Any:
        raise pynvml.NVMLError(code)

    return fn


class Fake:
    """Installs recorded replacements for pynvml functions."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.mp = monkeypatch
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def on(self, name: str, fn: Callable[..., Any]) -> None:
        assert hasattr(pynvml, name), f"pynvml has no {name}: the test would patch nothing real"

        def recorded(*args: Any) -> Any:
            self.calls.append((name, args))
            return fn(*args)

        self.mp.setattr(pynvml, name, recorded)

    def fail(self, name: str, code: int) -> None:
        self.on(name, raises(code))

    def args(self, name: str) -> list[tuple[Any, ...]]:
        return [a for n, a in self.calls if n == name]

    def count(self, name: str) -> int:
        return len(self.args(name))


@dataclass
class FakeGpu:
    uuid: str
    bus_id: str  # as NVML prints it: 8-digit domain, upper case
    minor: int
    name: str = "NVIDIA H100 80GB HBM3"
    brand: int = 14
    arch: int = 9
    cc: tuple[int, int] = (9, 0)
    memory_mib: int = 81559
    serial: str = "1650923000001"
    pci_device_id: int = 0x233010DE
    handle: Any = field(default_factory=lambda: new_handle(pynvml.struct_c_nvmlDevice_t))


def pci_info(bus_id: str, device_id: int = 0x233010DE) -> Any:
    info = pynvml.nvmlPciInfo_t()
    info.busId = bus_id.encode()
    info.busIdLegacy = bus_id.encode()
    info.pciDeviceId = device_id
    info.domain = int(bus_id.split(":")[0], 16)
    info.bus = int(bus_id.split(":")[1], 16)
    return info


def memory(total_bytes: int) -> Any:
    m = pynvml.c_nvmlMemory_t()
    m.total = total_bytes
    m.free = total_bytes // 2
    m.used = total_bytes - m.free
    return m


def install_gpus(fake: Fake, gpus: list[FakeGpu]) -> Callable[[Any], FakeGpu]:
    by_addr = {addr(g.handle): g for g in gpus}

    def gpu(handle: Any) -> FakeGpu:
        found = by_addr.get(addr(handle))
        if found is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return found

    def by_uuid(uuid: bytes | str) -> Any:
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for g in gpus:
            if g.uuid == text:
                return same_handle(g.handle, pynvml.c_nvmlDevice_t)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    fake.on("nvmlInitWithFlags", lambda flags: None)
    fake.on("nvmlShutdown", lambda: None)
    fake.on("nvmlSystemGetDriverVersion", lambda: "580.105.08")
    fake.on("nvmlSystemGetCudaDriverVersion_v2", lambda: 13000)
    fake.on("nvmlSystemGetNVMLVersion", lambda: "13.580.105.08")
    fake.on("nvmlDeviceGetCount", lambda: len(gpus))
    fake.on("nvmlDeviceGetHandleByIndex", lambda i: same_handle(gpus[i].handle, pynvml.c_nvmlDevice_t))
    fake.on("nvmlDeviceGetHandleByUUID", by_uuid)
    fake.on("nvmlDeviceGetUUID", lambda h: gpu(h).uuid)
    fake.on("nvmlDeviceGetName", lambda h: gpu(h).name)
    fake.on("nvmlDeviceGetMinorNumber", lambda h: gpu(h).minor)
    fake.on("nvmlDeviceGetBrand", lambda h: gpu(h).brand)
    fake.on("nvmlDeviceGetArchitecture", lambda h: gpu(h).arch)
    fake.on("nvmlDeviceGetCudaComputeCapability", lambda h: gpu(h).cc)
    fake.on("nvmlDeviceGetMemoryInfo", lambda h: memory(gpu(h).memory_mib * MIB))
    fake.on("nvmlDeviceGetPciInfo", lambda h: pci_info(gpu(h).bus_id, gpu(h).pci_device_id))
    fake.on("nvmlDeviceGetSerial", lambda h: gpu(h).serial)
    return gpu


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Fake:
    return Fake(monkeypatch)


@pytest.fixture
def gpus() -> list[FakeGpu]:
    return [
        FakeGpu(uuid=U0, bus_id="00000000:53:00.0", minor=0),
        FakeGpu(uuid=U1, bus_id="00000000:CA:00.0", minor=3, serial="1650923000002"),
    ]


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    root.mkdir()
    return root


@pytest.fixture
def backend(fake: Fake, gpus: list[FakeGpu], sysfs: Path) -> RealNvml:
    install_gpus(fake, gpus)
    b = RealNvml(sysfs_root=str(sysfs), environ={})
    b.init()
    return b


def h0(gpus: list[FakeGpu]) -> int:
    return addr(gpus[0].handle)


# --- protocol and lifecycle -----------------------------------------------------------------------


def test_satisfies_the_protocol() -> None:
    assert isinstance(RealNvml(), NvmlBackend)


def test_init_and_shutdown_are_reference_counted(fake: Fake, gpus: list[FakeGpu]) -> None:
    install_gpus(fake, gpus)
    b = RealNvml(environ={})
    b.init()
    b.init()
    assert fake.count("nvmlInitWithFlags") == 1
    assert fake.args("nvmlInitWithFlags") == [(0,)]
    b.shutdown()
    assert fake.count("nvmlShutdown") == 0
    assert b.system_info().driver_version == "580.105.08"  # still open after one of two shutdowns
    b.shutdown()
    assert fake.count("nvmlShutdown") == 1
    b.shutdown()  # extra shutdown: no-op, no unbalanced nvmlShutdown
    assert fake.count("nvmlShutdown") == 1
    with pytest.raises(NvmlError) as info:
        b.gpus()
    assert info.value.code is NvmlReturn.UNINITIALIZED and info.value.call == "gpus"


def test_init_flags_are_passed(fake: Fake, gpus: list[FakeGpu]) -> None:
    install_gpus(fake, gpus)
    RealNvml(init_flags=1, environ={}).init()
    assert fake.args("nvmlInitWithFlags") == [(1,)]


def test_calls_before_init_are_uninitialized(fake: Fake, gpus: list[FakeGpu]) -> None:
    install_gpus(fake, gpus)
    b = RealNvml(environ={})
    calls: list[tuple[str, Callable[[], object]]] = [
        ("system_info", lambda: b.system_info()),
        ("mig_mode", lambda: b.mig_mode(U0)),
        ("wait_event", lambda: b.wait_event(0)),
    ]
    for op, call in calls:
        with pytest.raises(NvmlError) as info:
            call()
        assert info.value.code is NvmlReturn.UNINITIALIZED
        assert info.value.call == op
        assert "init()" in str(info.value)
    assert fake.count("nvmlDeviceGetHandleByUUID") == 0


def test_library_not_found_names_searched_paths(fake: Fake, tmp_path: Path) -> None:
    fake.fail("nvmlInitWithFlags", pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    root = tmp_path / "driver"
    root.mkdir()
    b = RealNvml(driver_root=str(root), environ={"LD_LIBRARY_PATH": "/usr/local/nvidia/lib64"}, machine="x86_64")
    with pytest.raises(NvmlUnavailableError) as info:
        b.init()
    msg = str(info.value)
    assert "\n" not in msg
    assert "libnvidia-ml.so.1 was not found" in msg
    assert "LD_LIBRARY_PATH=/usr/local/nvidia/lib64" in msg
    assert "ld.so cache" in msg
    for rel in ("usr/lib64", "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "lib64"):
        assert str(root / rel) in msg
    assert "install the NVIDIA driver" in msg and "--driver-root" in msg
    cause = info.value.__cause__
    assert isinstance(cause, NvmlError) and cause.code is NvmlReturn.LIBRARY_NOT_FOUND
    assert isinstance(cause.__cause__, pynvml.NVMLError)
    assert b.library_path is None


def test_driver_not_loaded_is_actionable(fake: Fake) -> None:
    fake.fail("nvmlInitWithFlags", pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(NvmlUnavailableError) as info:
        RealNvml(environ={}).init()
    msg = str(info.value)
    assert "\n" not in msg
    assert "NVML_ERROR_DRIVER_NOT_LOADED" in msg
    assert "modprobe nvidia" in msg


@pytest.mark.parametrize(
    ("code", "needle"),
    [
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "does not match the loaded nvidia kernel module"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "permission denied"),
        (pynvml.NVML_ERROR_UNKNOWN, "NVML_ERROR_UNKNOWN"),
    ],
)
def test_other_init_failures_are_unavailable(fake: Fake, code: int, needle: str) -> None:
    fake.fail("nvmlInitWithFlags", code)
    with pytest.raises(NvmlUnavailableError, match=needle):
        RealNvml(environ={}).init()


def test_a_version_mismatch_after_a_driver_upgrade_is_a_stale_library(fake: Fake, gpus: list[FakeGpu]) -> None:
    """Once an init worked in this process, LIB_RM_VERSION_MISMATCH means the module changed under the library
    pynvml holds (docs/nvml-real.md, "After a driver upgrade"): NvmlLibraryStaleError, which the plugin exits on."""
    install_gpus(fake, gpus)
    b = RealNvml(environ={})
    b.init()
    b.shutdown()
    fake.fail("nvmlInitWithFlags", pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    with pytest.raises(NvmlLibraryStaleError, match="the NVIDIA driver was upgraded under this process") as info:
        b.init()
    cause = info.value.__cause__
    assert isinstance(cause, NvmlError) and cause.code is NvmlReturn.LIB_RM_VERSION_MISMATCH
    # The first init of a process keeps the start-up message (a driver root of the wrong driver).
    with pytest.raises(NvmlUnavailableError) as first:
        RealNvml(environ={}).init()
    assert not isinstance(first.value, NvmlLibraryStaleError)


def test_failed_init_leaves_the_backend_closed_and_retryable(fake: Fake, gpus: list[FakeGpu]) -> None:
    install_gpus(fake, gpus)
    outcomes = iter([pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED), None])

    def init(_flags: int) -> None:
        err = next(outcomes)
        if err is not None:
            raise err

    fake.on("nvmlInitWithFlags", init)
    b = RealNvml(environ={})
    with pytest.raises(NvmlUnavailableError):
        b.init()
    b.shutdown()  # the usual `finally: shutdown()` must not call nvmlShutdown for a failed init
    assert fake.count("nvmlShutdown") == 0
    b.init()
    assert [g.uuid for g in b.gpus()] == [U0, U1]


def write_lib(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x7fELF")
    return path


def test_driver_root_library_is_preloaded_by_path_before_nvml_init(
    fake: Fake, gpus: list[FakeGpu], tmp_path: Path
) -> None:
    """pynvml dlopens by soname only. The preload by absolute path must happen before nvmlInit, so the
    soname lookup inside pynvml finds the already-loaded driver-root object."""
    install_gpus(fake, gpus)
    root = tmp_path / "run-nvidia-driver"
    lib = write_lib(root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")
    write_lib(root / "usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1")
    events: list[str] = []
    loaded: list[str] = []

    def load(path: str) -> object:
        events.append("preload")
        loaded.append(path)
        return object()

    fake.on("nvmlInitWithFlags", lambda flags: events.append("nvmlInit"))
    b = RealNvml(driver_root=str(root), load_library=load, machine="x86_64", environ={})
    b.init()
    assert events == ["preload", "nvmlInit"]
    assert loaded == [str(lib)]
    assert b.library_path == str(lib)
    b.init()
    assert events == ["preload", "nvmlInit"]  # a second reference loads nothing again


def test_driver_root_prefers_usr_lib64_then_host_multiarch(tmp_path: Path, fake: Fake) -> None:
    fake.on("nvmlInitWithFlags", lambda flags: None)
    root = tmp_path / "d"
    arm = write_lib(root / "usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1")
    write_lib(root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")
    loaded: list[str] = []
    RealNvml(driver_root=str(root), load_library=lambda p: loaded.append(p), machine="aarch64", environ={}).init()
    assert loaded == [str(arm)]
    lib64 = write_lib(root / "usr/lib64/libnvidia-ml.so.1")
    RealNvml(driver_root=str(root), load_library=lambda p: loaded.append(p), machine="aarch64", environ={}).init()
    assert loaded[-1] == str(lib64)


def test_driver_root_library_that_fails_to_load(fake: Fake, tmp_path: Path) -> None:
    fake.on("nvmlInitWithFlags", lambda flags: None)
    lib = write_lib(tmp_path / "lib64/libnvidia-ml.so.1")

    def load(path: str) -> object:
        raise OSError(f"{path}: invalid ELF header")

    with pytest.raises(NvmlUnavailableError) as info:
        RealNvml(driver_root=str(tmp_path), load_library=load, environ={}).init()
    assert str(lib) in str(info.value) and "invalid ELF header" in str(info.value)
    assert fake.count("nvmlInitWithFlags") == 0


def test_driver_root_without_library_falls_back_to_loader_search(fake: Fake, tmp_path: Path) -> None:
    fake.on("nvmlInitWithFlags", lambda flags: None)
    loaded: list[str] = []
    b = RealNvml(driver_root=str(tmp_path), load_library=lambda p: loaded.append(p), environ={})
    b.init()
    assert loaded == []
    assert b.library_path is None
    assert fake.count("nvmlInitWithFlags") == 1


def test_driver_not_loaded_names_the_driver_root_library(fake: Fake, tmp_path: Path) -> None:
    lib = write_lib(tmp_path / "usr/lib64/libnvidia-ml.so.1")
    fake.fail("nvmlInitWithFlags", pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(NvmlUnavailableError) as info:
        RealNvml(driver_root=str(tmp_path), load_library=lambda p: object(), environ={}).init()
    assert f"{lib} was loaded but the NVIDIA kernel driver is not running" in str(info.value)


def _nvml_loadable() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_nvml_loadable(), reason="this machine has an NVIDIA driver")
def test_unpatched_pynvml_on_a_gpu_less_machine(tmp_path: Path) -> None:
    """No patching at all: the real pynvml tries to dlopen libnvidia-ml.so.1 and fails."""
    assert pynvml.nvmlInitWithFlags.__module__ == "pynvml"  # really unpatched
    b = RealNvml(driver_root=str(tmp_path), environ={"LD_LIBRARY_PATH": "/nowhere"})
    with pytest.raises(NvmlUnavailableError) as info:
        b.init()
    msg = str(info.value)
    assert msg.startswith("NVML is unavailable: libnvidia-ml.so.1 was not found")
    assert "\n" not in msg
    assert "LD_LIBRARY_PATH=/nowhere" in msg
    assert str(tmp_path / "usr/lib64") in msg
    assert "Fix: install the NVIDIA driver" in msg
    b.shutdown()  # closed: a no-op, nothing raised


# --- errors ---------------------------------------------------------------------------------------


def test_every_pynvml_error_becomes_nvml_error_with_the_call_name(backend: RealNvml, fake: Fake) -> None:
    fake.fail("nvmlSystemGetDriverVersion", pynvml.NVML_ERROR_IN_USE)
    with pytest.raises(NvmlError) as info:
        backend.system_info()
    assert info.value.code is NvmlReturn.IN_USE
    assert info.value.call == "nvmlSystemGetDriverVersion"
    assert not isinstance(info.value, pynvml.NVMLError)
    assert isinstance(info.value.__cause__, pynvml.NVMLError)


def test_unmapped_code_becomes_unknown(backend: RealNvml, fake: Fake) -> None:
    fake.fail("nvmlSystemGetDriverVersion", 4242)
    with pytest.raises(NvmlError) as info:
        backend.system_info()
    assert info.value.code is NvmlReturn.UNKNOWN


def test_library_mismatch_error_becomes_function_not_found(backend: RealNvml, fake: Fake) -> None:
    def mismatch() -> int:
        raise pynvml.NVMLLibraryMismatchError("Unversioned function called …")

    fake.on("nvmlSystemGetCudaDriverVersion_v2", mismatch)
    with pytest.raises(NvmlError) as info:
        backend.system_info()
    assert info.value.code is NvmlReturn.FUNCTION_NOT_FOUND
    assert info.value.call == "nvmlSystemGetCudaDriverVersion_v2"


# --- system and identity --------------------------------------------------------------------------


def test_system_info(backend: RealNvml) -> None:
    info = backend.system_info()
    assert info == SystemInfo(driver_version="580.105.08", cuda_driver_version=13000, nvml_version="13.580.105.08")
    assert info.cuda_version == "13.0"


def test_gpus_identity(backend: RealNvml) -> None:
    got = backend.gpus()
    assert [g.index for g in got] == [0, 1]
    assert [g.minor for g in got] == [0, 3]  # minor is not the index
    g = got[0]
    assert g.uuid == U0
    assert g.name == "NVIDIA H100 80GB HBM3"
    assert g.brand == "Nvidia"
    assert g.architecture is Architecture.HOPPER
    assert g.cuda_compute_capability == (9, 0)
    assert g.memory_total_bytes == 81559 * MIB
    assert g.pci_bus_id == "0000:53:00.0"
    assert got[1].pci_bus_id == "0000:ca:00.0"
    assert g.pci_device_id == 0x233010DE
    assert g.serial == "1650923000001"


def test_gpus_not_supported_fields(backend: RealNvml, fake: Fake, gpus: list[FakeGpu]) -> None:
    gpus[0].brand = 2
    gpus[1].arch = 77
    fake.fail("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_NOT_SUPPORTED)
    fake.fail("nvmlDeviceGetSerial", pynvml.NVML_ERROR_NOT_SUPPORTED)
    got = backend.gpus()
    assert [g.memory_total_bytes for g in got] == [None, None]
    assert [g.serial for g in got] == [None, None]
    assert got[0].brand == "Tesla"
    assert got[1].architecture is Architecture.UNKNOWN


def test_architecture_not_supported_is_unknown(backend: RealNvml, fake: Fake) -> None:
    fake.fail("nvmlDeviceGetArchitecture", pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert {g.architecture for g in backend.gpus()} == {Architecture.UNKNOWN}


@pytest.mark.parametrize("name", ["nvmlDeviceGetSerial", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetArchitecture"])
def test_identity_real_failures_propagate(backend: RealNvml, fake: Fake, name: str) -> None:
    fake.fail(name, pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(NvmlError) as info:
        backend.gpus()
    assert info.value.code is NvmlReturn.GPU_IS_LOST and info.value.call == name


# --- handle cache ---------------------------------------------------------------------------------


def test_handles_are_cached_by_uuid(backend: RealNvml, fake: Fake) -> None:
    fake.on("nvmlDeviceGetComputeMode", lambda h: 0)
    backend.compute_mode(U0)
    backend.compute_mode(U0)
    backend.compute_mode(U1)
    assert [a[0] for a in fake.args("nvmlDeviceGetHandleByUUID")] == [U0, U1]


def test_enumeration_warms_the_cache(backend: RealNvml, fake: Fake) -> None:
    fake.on("nvmlDeviceGetComputeMode", lambda h: 0)
    backend.gpus()
    backend.compute_mode(U1)
    assert fake.count("nvmlDeviceGetHandleByUUID") == 0


def test_mig_device_handles_are_not_cached(backend: RealNvml, fake: Fake, gpus: list[FakeGpu]) -> None:
    fake.on("nvmlDeviceGetHandleByUUID", lambda u: same_handle(gpus[0].handle, pynvml.c_nvmlDevice_t))
    fake.on("nvmlDeviceGetComputeMode", lambda h: 0)
    backend.compute_mode(MIG_A)
    backend.compute_mode(MIG_A)
    assert fake.count("nvmlDeviceGetHandleByUUID") == 2


def test_unknown_uuid_is_not_found_naming_the_uuid(backend: RealNvml) -> None:
    with pytest.raises(NvmlError) as info:
        backend.mig_mode("GPU-does-not-exist")
    assert info.value.code is NvmlReturn.NOT_FOUND
    assert info.value.call == "nvmlDeviceGetHandleByUUID"
    assert "GPU-does-not-exist" in str(info.value)


@pytest.mark.parametrize("bad", ["", "   ", None, 7])
def test_bad_uuid_names_the_field(backend: RealNvml, bad: Any) -> None:
    with pytest.raises(ValueError, match="gpu_uuid must be a GPU UUID"):
        backend.mig_mode(bad)
    with pytest.raises(ValueError, match="gpu_b must be a GPU UUID"):
        backend.topology_common_ancestor(U0, bad)
    with pytest.raises(ValueError, match="gpu_a must be a GPU UUID"):
        backend.nvlink_p2p_ok(bad, U0)


def test_shutdown_drops_the_cache(backend: RealNvml, fake: Fake) -> None:
    fake.on("nvmlDeviceGetComputeMode", lambda h: 0)
    backend.compute_mode(U0)
    backend.shutdown()
    backend.init()
    backend.compute_mode(U0)
    assert fake.count("nvmlDeviceGetHandleByUUID") == 2


def test_concurrent_lookups_share_one_handle(backend: RealNvml, fake: Fake, gpus: list[FakeGpu]) -> None:
    """Many threads miss the cache at once; all must end up with the one cached handle object."""
    barrier = threading.Barrier(8)

    def slow_lookup(_uuid: str) -> Any:
        barrier.wait(timeout=10)  # every thread is inside the (unlocked) lookup at the same time
        return same_handle(gpus[0].handle, pynvml.c_nvmlDevice_t)

    fake.on("nvmlDeviceGetHandleByUUID", slow_lookup)
    seen: list[Any] = []

    def compute_mode(h: Any) -> int:
        seen.append(h)
        return 0

    fake.on("nvmlDeviceGetComputeMode", compute_mode)
    threads = [threading.Thread(target=backend.compute_mode, args=(U0,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert len(seen) == 8
    assert len({id(h) for h in seen}) == 1
    assert fake.count("nvmlDeviceGetHandleByUUID") == 8


# --- NUMA, CPU affinity, PCIe root ----------------------------------------------------------------


def words(*positions: int, size: int) -> Any:
    array = (ctypes.c_ulonglong * size)()
    for p in positions:
        array[p // 64] |= 1 << (p % 64)
    return array


def test_numa_from_memory_affinity(backend: RealNvml, fake: Fake) -> None:
    fake.on("nvmlDeviceGetMemoryAffinity", lambda h, n, scope: words(1, size=n))
    fake.fail("nvmlDeviceGetNumaNodeId", pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert backend.numa_node(U0) == 1
    (_, node_set_size, scope) = fake.args("nvmlDeviceGetMemoryAffinity")[0]
    assert scope == pynvml.NVML_AFFINITY_SCOPE_NODE
    assert node_set_size * 64 >= 1024
    assert fake.count("nvmlDeviceGetNumaNodeId") == 0


def test_numa_node_in_a_later_word(backend: RealNvml, fake: Fake) -> None:
    fake.on("nvmlDeviceGetMemoryAffinity", lambda h, n, scope: words(65, size=n))
    assert backend.numa_node(U0) == 65


def write_numa(sysfs: Path, bus_id: str, value: str) -> None:
    device = sysfs / "devices" / "pci0000:00" / bus_id
    device.mkdir(parents=True)
    (device / "numa_node").write_text(value + "\n")
    links = sysfs / "bus" / "pci" / "devices"
    links.mkdir(parents=True, exist_ok=True)
    (links / bus_id).symlink_to(device)


@pytest.mark.parametrize(
    ("affinity", "sysfs_value", "expected"),
    [
        ("not-supported", "1", 1),
        ("function-not-found", "0", 0),
        ("two-nodes", "1", 1),
        ("no-node", "1", 1),
        ("not-supported", "-1", None),
        ("not-supported", None, None),
    ],
)
def test_numa_sysfs_fallback(
    backend: RealNvml, fake: Fake, sysfs: Path, affinity: str, sysfs_value: str | None, expected: int | None
) -> None:
    if affinity == "not-supported":
        fake.fail("nvmlDeviceGetMemoryAffinity", pynvml.NVML_ERROR_NOT_SUPPORTED)
    elif affinity == "function-not-found":
        fake.fail("nvmlDeviceGetMemoryAffinity", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    elif affinity == "two-nodes":
        fake.on("nvmlDeviceGetMemoryAffinity", lambda h, n, scope: words(0, 1, size=n))
    else:
        fake.on("nvmlDeviceGetMemoryAffinity", lambda h, n, scope: words(size=n))
    if sysfs_value is not None:
        write_numa(sysfs, "0000:53:00.0", sysfs_value)
    assert backend.numa_node(U0) == expected


def test_numa_real_failure_propagates(backend: RealNvml, fake: Fake) -> None:
    fake.fail("nvmlDeviceGetMemoryAffinity", pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(NvmlError) as info:
        backend.numa_node(U0)
    assert info.value.code is NvmlReturn.GPU_IS_LOST


def test_cpu_affinity(backend: RealNvml, fake: Fake) -> None:
    fake.on("nvmlDeviceGetCpuAffinity", lambda h, n: words(0, 1, 2, 63, 64, 130, size=n))
    assert backend.cpu_affinity(U0) == (0, 1, 2, 63, 64, 130)
    (_, cpu_set_size) = fake.args("nvmlDeviceGetCpuAffinity")[0]
    assert cpu_set_size * 64 >= 4096


def test_cpu_affinity_not_supported_is_empty(backend: RealNvml, fake: Fake) -> None:
    fake.fail("nvmlDeviceGetCpuAffinity", pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert backend.cpu_affinity(U0) == ()
    fake.fail("nvmlDeviceGetCpuAffinity", pynvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(NvmlError):
        backend.cpu_affinity(U0)


def test_pcie_root_from_fake_sysfs(backend: RealNvml, sysfs: Path) -> None:
    # /sys/bus/pci/devices/<bdf> is a relative symlink into /sys/devices/pciDDDD:BB/…
    device = sysfs / "devices" / "pci0000:c0" / "0000:c0:01.1" / "0000:c1:00.0" / "0000:ca:00.0"
    device.mkdir(parents=True)
    links = sysfs / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    (links / "0000:ca:00.0").symlink_to("../../../devices/pci0000:c0/0000:c0:01.1/0000:c1:00.0/0000:ca:00.0")
    assert backend.pcie_root(U1) == "pci0000:c0"
    assert backend.pcie_root(U0) is None  # no sysfs entry for the other GPU


# --- topology, NVLink, P2P, fabric ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("level", "expected"), [(0, TopologyLevel.INTERNAL), (40, TopologyLevel.NODE), (35, TopologyLevel.SYSTEM)]
)
def test_topology_common_ancestor(
    backend: RealNvml, fake: Fake, gpus: list[FakeGpu], level: int, expected: TopologyLevel
) -> None:
    fake.on("nvmlDeviceGetTopologyCommonAncestor", lambda a, b: level)
    assert backend.topology_common_ancestor(U0, U1) is expected
    a, b = fake.args("nvmlDeviceGetTopologyCommonAncestor")[0]
    assert (addr(a), addr(b)) == (addr(gpus[0].handle), addr(gpus[1].handle))


def test_topology_error_propagates(backend: RealNvml, fake: Fake) -> None:
    fake.fail("nvmlDeviceGetTopologyCommonAncestor", pynvml.NVML_ERROR_NOT_SUPPORTED)
    with pytest.raises(NvmlError) as info:
        backend.topology_common_ancestor(U0, U1)
    assert info.value.call == "nvmlDeviceGetTopologyCommonAncestor"


def test_nvlinks_walk(backend: RealNvml, fake: Fake) -> None:
    # link 0 active to a switch, 1 inactive, 2 not supported (skipped), 3 active to a GPU whose remote
    # type NVML cannot tell, 4 active with an out-of-range type, 5 is past the last link (stop).
    states: dict[int, int | None] = {0: 1, 1: 0, 2: None, 3: 1, 4: 1}

    def state(h: Any, link: int) -> int:
        if link not in states:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        value = states[link]
        if value is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def remote_type(h: Any, link: int) -> int:
        if link == 3:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        remote_types: dict[int, int] = {0: pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH, 4: 9}
        return remote_types[link]

    fake.on("nvmlDeviceGetNvLinkState", state)
    fake.on("nvmlDeviceGetNvLinkRemoteDeviceType", remote_type)
    fake.on(
        "nvmlDeviceGetNvLinkRemotePciInfo",
        lambda h, link: pci_info(f"00000000:0{link}:00.0" if link else "00000000:A5:00.0"),
    )
    assert backend.nvlinks(U0) == [
        NvLink(link=0, remote_type=NvLinkRemoteType.SWITCH, remote_pci_bus_id="0000:a5:00.0"),
        NvLink(link=3, remote_type=NvLinkRemoteType.UNKNOWN, remote_pci_bus_id="0000:03:00.0"),
        NvLink(link=4, remote_type=NvLinkRemoteType.UNKNOWN, remote_pci_bus_id="0000:04:00.0"),
    ]
    assert [a[1] for a in fake.args("nvmlDeviceGetNvLinkState")] == [0, 1, 2, 3, 4, 5]
    assert [a[1] for a in fake.args("nvmlDeviceGetNvLinkRemotePciInfo")] == [0, 3, 4]


def test_no_nvlink_gpu_has_no_links(backend: RealNvml, fake: Fake) -> None:
    fake.fail("nvmlDeviceGetNvLinkState", pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert backend.nvlinks(U0) == []
    assert fake.count("nvmlDeviceGetNvLinkState") == pynvml.NVML_NVLINK_MAX_LINKS


def test_nvlink_real_failures_propagate(backend: RealNvml, fake: Fake) -> None:
    fake.fail("nvmlDeviceGetNvLinkState", pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(NvmlError) as info:
        backend.nvlinks(U0)
    assert info.value.code is NvmlReturn.GPU_IS_LOST
    fake.on("nvmlDeviceGetNvLinkState", lambda h, link: 1)
    fake.fail("nvmlDeviceGetNvLinkRemoteDeviceType", pynvml.NVML_ERROR_UNKNOWN)
    fake.on("nvmlDeviceGetNvLinkRemotePciInfo", lambda h, link: pci_info("00000000:A5:00.0"))
    with pytest.raises(NvmlError) as info:
        backend.nvlinks(U0)
    assert info.value.call == "nvmlDeviceGetNvLinkRemoteDeviceType"


@pytest.mark.parametrize(("status", "expected"), [(pynvml.NVML_P2P_STATUS_OK, True), (5, False), (2, False)])
def test_nvlink_p2p(backend: RealNvml, fake: Fake, status: int, expected: bool) -> None:
    fake.on("nvmlDeviceGetP2PStatus", lambda a, b, index: status)
    assert backend.nvlink_p2p_ok(U0, U1) is expected
    (_, _, index) = fake.args("nvmlDeviceGetP2PStatus")[0]
    assert index == 2 and type(index) is int  # never pynvml's tuple-valued CAPS constants


def test_nvlink_p2p_not_supported_is_false(backend: RealNvml, fake: Fake) -> None:
    fake.fail("nvmlDeviceGetP2PStatus", pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert backend.nvlink_p2p_ok(U0, U1) is False
    fake.fail("nvmlDeviceGetP2PStatus", pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(NvmlError):
        backend.nvlink_p2p_ok(U0, U1)


CLUSTER = bytes.fromhex("6f2c1e4a9b3d4e5f8a7b6c5d4e3f2a1b")


def fabric_filler(
    state: int,
    status: int = 0,
    clique: int = 3,
    cluster: bytes = CLUSTER,
    health: int = 1,
    accept: tuple[int, ...] | None = None,
) -> Callable[..., int]:
    """Fills the caller's struct as NVML does; `accept`: the struct versions this "driver" knows (another one gets
    ARGUMENT_VERSION_MISMATCH, as from a driver older than the struct)."""

    def fill(handle: Any, ref: Any) -> int:
        info = ref._obj  # the caller's struct, passed byref
        if accept is not None and info.version not in accept:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        info.state = state
        info.status = status
        info.cliqueId = clique
        for i, b in enumerate(cluster):
            info.clusterUuid[i] = b
        if hasattr(info, "healthSummary"):
            info.healthSummary = health
        return int(pynvml.NVML_SUCCESS)  # pynvml is unannotated

    return fill


def test_fabric_info_v3_struct_filled_by_reference(backend: RealNvml, fake: Fake) -> None:
    assert hasattr(pynvml, "c_nvmlGpuFabricInfo_v3_t"), "the pinned nvidia-ml-py has the v3 struct"
    fake.on(
        "nvmlDeviceGetGpuFabricInfoV",
        fabric_filler(pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, health=pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY),
    )
    fake.fail("nvmlDeviceGetGpuFabricInfo", pynvml.NVML_ERROR_UNKNOWN)  # must not be reached
    info = backend.fabric_info(U0)
    assert info == FabricInfo(
        state=FabricState.COMPLETED,
        status=NvmlReturn.SUCCESS,
        clique_id=3,
        cluster_uuid="6f2c1e4a-9b3d-4e5f-8a7b-6c5d4e3f2a1b",
        health_summary=FabricHealth.UNHEALTHY,
    )
    assert info.clique == "6f2c1e4a-9b3d-4e5f-8a7b-6c5d4e3f2a1b.3"
    (_, ref) = fake.args("nvmlDeviceGetGpuFabricInfoV")[0]
    assert isinstance(ref._obj, pynvml.c_nvmlGpuFabricInfo_v3_t)
    assert ref._obj.version == pynvml.nvmlGpuFabricInfo_v3 == 0x3000028
    assert fake.count("nvmlDeviceGetGpuFabricInfo") == 0


def test_fabric_driver_without_v3_gets_the_v2_struct(backend: RealNvml, fake: Fake) -> None:
    fake.on(
        "nvmlDeviceGetGpuFabricInfoV",
        fabric_filler(pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, accept=(pynvml.nvmlGpuFabricInfo_v2,)),
    )
    info = present(backend.fabric_info(U0))
    assert info.clique == "6f2c1e4a-9b3d-4e5f-8a7b-6c5d4e3f2a1b.3"
    assert info.health_summary is FabricHealth.NOT_SUPPORTED  # v2 has no summary
    versions = [ref._obj.version for _, ref in fake.args("nvmlDeviceGetGpuFabricInfoV")]
    assert versions == [0x3000028, 0x2000024]
    assert fake.count("nvmlDeviceGetGpuFabricInfo") == 0


def test_fabric_pynvml_without_v3_uses_v2(backend: RealNvml, fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(pynvml, "c_nvmlGpuFabricInfo_v3_t")
    fake.on("nvmlDeviceGetGpuFabricInfoV", fabric_filler(pynvml.NVML_GPU_FABRIC_STATE_COMPLETED))
    assert present(backend.fabric_info(U0)).health_summary is FabricHealth.NOT_SUPPORTED
    (_, ref) = fake.args("nvmlDeviceGetGpuFabricInfoV")[0]
    assert ref._obj.version == pynvml.nvmlGpuFabricInfo_v2


def test_fabric_single_node_hgx_has_no_clique(backend: RealNvml, fake: Fake) -> None:
    fake.on(
        "nvmlDeviceGetGpuFabricInfoV",
        fabric_filler(pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, clique=0, cluster=bytes(16)),
    )
    info = backend.fabric_info(U0)
    assert info is not None and info.cluster_uuid == "00000000-0000-0000-0000-000000000000"
    assert info.clique is None


def test_fabric_not_supported_is_none(backend: RealNvml, fake: Fake) -> None:
    fake.fail("nvmlDeviceGetGpuFabricInfoV", pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert backend.fabric_info(U0) is None
    assert fake.count("nvmlDeviceGetGpuFabricInfo") == 0  # NOT_SUPPORTED is an answer, not a reason to fall back
    fake.on("nvmlDeviceGetGpuFabricInfoV", fabric_filler(pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED))
    assert backend.fabric_info(U0) is None


def test_fabric_falls_back_to_the_deprecated_call(backend: RealNvml, fake: Fake) -> None:
    fake.fail("nvmlDeviceGetGpuFabricInfoV", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    fake.on(
        "nvmlDeviceGetGpuFabricInfo",
        fabric_filler(pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, status=pynvml.NVML_ERROR_NOT_READY),
    )
    info = backend.fabric_info(U0)
    assert info is not None
    assert info.state is FabricState.IN_PROGRESS and info.status is NvmlReturn.NOT_READY
    assert info.health_summary is FabricHealth.NOT_SUPPORTED
    (_, ref) = fake.args("nvmlDeviceGetGpuFabricInfo")[0]
    assert isinstance(ref._obj, pynvml.c_nvmlGpuFabricInfo_t)


def test_fabric_driver_knowing_no_struct_version_falls_back(backend: RealNvml, fake: Fake) -> None:
    fake.fail("nvmlDeviceGetGpuFabricInfoV", pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    fake.on("nvmlDeviceGetGpuFabricInfo", fabric_filler(pynvml.NVML_GPU_FABRIC_STATE_COMPLETED))
    assert present(backend.fabric_info(U0)).clique == "6f2c1e4a-9b3d-4e5f-8a7b-6c5d4e3f2a1b.3"
    assert fake.count("nvmlDeviceGetGpuFabricInfoV") == 2  # v3, then v2
    assert fake.count("nvmlDeviceGetGpuFabricInfo") == 1


def test_fabric_v1_only_pynvml(backend: RealNvml, fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(pynvml, "nvmlDeviceGetGpuFabricInfoV")
    fake.on("nvmlDeviceGetGpuFabricInfo", fabric_filler(7))  # unknown state: not a usable clique
    info = backend.fabric_info(U0)
    assert info is not None and info.state is FabricState.NOT_STARTED and info.clique is None
    fake.fail("nvmlDeviceGetGpuFabricInfo", pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert backend.fabric_info(U0) is None
    fake.fail("nvmlDeviceGetGpuFabricInfo", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    assert backend.fabric_info(U0) is None
    fake.fail("nvmlDeviceGetGpuFabricInfo", pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(NvmlError):
        backend.fabric_info(U0)


def test_fabric_v2_real_failure_propagates(backend: RealNvml, fake: Fake) -> None:
    fake.fail("nvmlDeviceGetGpuFabricInfoV", pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(NvmlError) as info:
        backend.fabric_info(U0)
    assert info.value.code is NvmlReturn.GPU_IS_LOST


def test_fabric_unknown_health_code_reads_as_not_supported(backend: RealNvml, fake: Fake) -> None:
    fake.on("nvmlDeviceGetGpuFabricInfoV", fabric_filler(pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, health=9))
    assert present(backend.fabric_info(U0)).health_summary is FabricHealth.NOT_SUPPORTED


# --- compute mode ---------------------------------------------------------------------------------


def test_compute_mode_get_and_set(backend: RealNvml, fake: Fake, gpus: list[FakeGpu]) -> None:
    fake.on("nvmlDeviceGetComputeMode", lambda h: pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
    fake.on("nvmlDeviceSetComputeMode", lambda h, mode: None)
    assert backend.compute_mode(U0) is ComputeMode.EXCLUSIVE_PROCESS
    backend.set_compute_mode(U1, ComputeMode.DEFAULT)
    (handle, mode) = fake.args("nvmlDeviceSetComputeMode")[0]
    assert addr(handle) == addr(gpus[1].handle) and mode == 0 and type(mode) is int


def test_compute_mode_unknown_value(backend: RealNvml, fake: Fake) -> None:
    fake.on("nvmlDeviceGetComputeMode", lambda h: 9)
    with pytest.raises(NvmlError, match="unknown compute mode 9"):
        backend.compute_mode(U0)


def test_set_compute_mode_errors(backend: RealNvml, fake: Fake) -> None:
    fake.fail("nvmlDeviceSetComputeMode", pynvml.NVML_ERROR_NO_PERMISSION)
    with pytest.raises(NvmlError) as info:
        backend.set_compute_mode(U0, ComputeMode.PROHIBITED)
    assert info.value.code is NvmlReturn.NO_PERMISSION and info.value.call == "nvmlDeviceSetComputeMode"
    with pytest.raises(ValueError, match="mode must be a ComputeMode"):
        backend.set_compute_mode(U0, 3)  # type: ignore[arg-type]


def test_time_slice_is_set_with_nvidia_smi_and_never_read(
    backend: RealNvml, fake: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVML has no compute-policy time-slice call (its timeslice calls are the vGPU scheduler's): the setter runs
    nvidia-smi compute-policy, nothing reads it back, and the vGPU calls are never made."""
    from dra_driver.nvml.real import computepolicy
    from dra_driver.plugin.sharing import TimeSlicer

    script = tmp_path / "nvidia-smi"
    script.write_text('#!/bin/sh\necho "$@" >> "$0.calls"\n')
    script.chmod(0o755)
    monkeypatch.setattr(computepolicy, "find_nvidia_smi", lambda _root: str(script))
    with pytest.raises(NvmlError) as info:
        backend.time_slice(U0)
    assert info.value.code is NvmlReturn.NOT_SUPPORTED and "compute-policy" in str(info.value)
    backend.set_time_slice(U1, TimeSlice.LONG)
    calls = tmp_path / "nvidia-smi.calls"
    assert calls.read_text().splitlines() == [f"compute-policy -i {U1} --set-timeslice 3"]
    assert fake.count("nvmlDeviceSetVgpuSchedulerState") == 0
    slicer = TimeSlicer(backend)
    assert slicer.current(U0) is None
    assert slicer.reset(U0) is False  # unreadable and not set by this plugin: not ours to touch
    assert len(calls.read_text().splitlines()) == 1
    assert slicer.reset(U1, set_by_us=True) is True  # a record says we set it: back to Default
    assert calls.read_text().splitlines()[-1] == f"compute-policy -i {U1} --set-timeslice 0"


def test_time_slice_of_an_unknown_gpu_is_an_nvml_error(backend: RealNvml, fake: Fake) -> None:
    fake.fail("nvmlDeviceGetHandleByUUID", pynvml.NVML_ERROR_NOT_FOUND)
    with pytest.raises(NvmlError) as info:
        backend.set_time_slice("GPU-00000000-0000-0000-0000-00000000dead", TimeSlice.SHORT)
    assert info.value.code is NvmlReturn.NOT_FOUND


# --- MIG mode -------------------------------------------------------------------------------------


def test_mig_mode(backend: RealNvml, fake: Fake) -> None:
    fake.on("nvmlDeviceGetMigMode", lambda h: [1, 0])
    mode = backend.mig_mode(U0)
    assert mode == MigMode(current=True, pending=False) and mode.change_pending


def test_mig_mode_not_capable_is_none(backend: RealNvml, fake: Fake) -> None:
    fake.fail("nvmlDeviceGetMigMode", pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert backend.mig_mode(U0) is None
    fake.fail("nvmlDeviceGetMigMode", pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(NvmlError):
        backend.mig_mode(U0)


@pytest.mark.parametrize(
    ("activation", "expected"),
    [
        (pynvml.NVML_SUCCESS, NvmlReturn.SUCCESS),
        (pynvml.NVML_ERROR_IN_USE, NvmlReturn.IN_USE),
        (pynvml.NVML_ERROR_RESET_REQUIRED, NvmlReturn.RESET_REQUIRED),
    ],
)
def test_set_mig_mode_returns_activation_status(
    backend: RealNvml, fake: Fake, activation: int, expected: NvmlReturn
) -> None:
    fake.on("nvmlDeviceSetMigMode", lambda h, mode: activation)
    assert backend.set_mig_mode(U0, True) is expected
    assert backend.set_mig_mode(U0, False) is expected
    assert [a[1] for a in fake.args("nvmlDeviceSetMigMode")] == [
        pynvml.NVML_DEVICE_MIG_ENABLE,
        pynvml.NVML_DEVICE_MIG_DISABLE,
    ]


def test_set_mig_mode_request_failure_raises(backend: RealNvml, fake: Fake) -> None:
    fake.fail("nvmlDeviceSetMigMode", pynvml.NVML_ERROR_NO_PERMISSION)
    with pytest.raises(NvmlError) as info:
        backend.set_mig_mode(U0, True)
    assert info.value.code is NvmlReturn.NO_PERMISSION and info.value.call == "nvmlDeviceSetMigMode"


def test_set_mig_mode_refreshes_the_cached_handle(backend: RealNvml, fake: Fake) -> None:
    fake.on("nvmlDeviceSetMigMode", lambda h, mode: 0)
    fake.on("nvmlDeviceGetMigMode", lambda h: [1, 1])
    backend.mig_mode(U0)
    backend.set_mig_mode(U0, True)  # served from the cache, then evicted
    assert fake.count("nvmlDeviceGetHandleByUUID") == 1
    backend.mig_mode(U0)
    assert fake.count("nvmlDeviceGetHandleByUUID") == 2


# --- MIG profiles, instances and devices ----------------------------------------------------------

# H100 80GB HBM3, by profile INDEX: (id, slices, instances, SM, CE, DEC, ENC, JPEG, OFA, MiB, starts, size)
H100_PROFILES: dict[int, tuple[int, int, int, int, int, int, int, int, int, int, tuple[int, ...], int]] = {
    0x0: (19, 1, 7, 16, 1, 1, 0, 1, 0, 9984, (0, 1, 2, 3, 4, 5, 6), 1),
    0x1: (14, 2, 3, 32, 2, 2, 0, 2, 0, 20096, (0, 2, 4), 2),
    0x2: (9, 3, 2, 60, 3, 3, 0, 3, 0, 40448, (0, 4), 4),
    0x3: (5, 4, 1, 64, 4, 4, 0, 4, 0, 40448, (0,), 4),
    0x4: (0, 7, 1, 132, 8, 7, 0, 7, 1, 81152, (0,), 8),
    0x7: (20, 1, 1, 16, 1, 1, 0, 1, 1, 9984, (0, 1, 2, 3, 4, 5, 6), 1),
    0x9: (15, 1, 4, 26, 1, 1, 0, 1, 0, 20096, (0, 2, 4, 6), 2),
}
# CI profiles by CI profile INDEX: (id, slices, instances, SM)
CI_PROFILES = {0: (0, 1, 7, 16), 1: (1, 2, 3, 32), 2: (2, 3, 2, 60)}


class FakeMig:
    """MIG state of one H100 behind the pynvml MIG wrappers (caller arrays, byref counts)."""

    def __init__(self, fake: Fake, parent: FakeGpu) -> None:
        self.fake = fake
        self.parent = parent
        self.enabled = True
        self.gis: dict[int, dict[str, Any]] = {}  # GI id -> {profile, start, size, handle, cis}
        self.report_needed_count = True
        self.install()

    def _gi_by_handle(self, gi: Any) -> tuple[int, dict[str, Any]]:
        for gi_id, g in self.gis.items():
            if addr(g["handle"]) == addr(gi):
                return gi_id, g
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _ci_by_handle(self, ci: Any) -> tuple[int, dict[str, Any], int, dict[str, Any]]:
        for gi_id, g in self.gis.items():
            for ci_id, c in g["cis"].items():
                if addr(c["handle"]) == addr(ci):
                    return gi_id, g, ci_id, c
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def add_gi(self, gi_id: int, profile_id: int, start: int, size: int) -> Any:
        handle = new_handle(pynvml.struct_c_nvmlGpuInstance_t)
        self.gis[gi_id] = {"profile": profile_id, "start": start, "size": size, "handle": handle, "cis": {}}
        return handle

    def add_ci(self, gi_id: int, ci_id: int, profile_id: int) -> Any:
        handle = new_handle(pynvml.struct_c_nvmlComputeInstance_t)
        self.gis[gi_id]["cis"][ci_id] = {"profile": profile_id, "handle": handle}
        return handle

    def _fill(self, items: list[Any], array: Any, count_ref: Any) -> int:
        count = count_ref._obj  # the caller's c_uint, passed byref
        if len(array) < len(items):
            if self.report_needed_count:
                count.value = len(items)
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, item in enumerate(items):
            array[i] = item
        count.value = len(items)
        return int(pynvml.NVML_SUCCESS)  # pynvml is unannotated

    def install(self) -> None:
        f = self.fake

        def profile_info(h: Any, index: int) -> Any:
            assert addr(h) == addr(self.parent.handle)
            if index == 0x11:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if index not in H100_PROFILES:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            pid, sl, inst, sm, ce, dec, enc, jpg, ofa, mib, _, _ = H100_PROFILES[index]
            info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
            info.id, info.sliceCount, info.instanceCount = pid, sl, inst
            info.multiprocessorCount, info.copyEngineCount = sm, ce
            info.decoderCount, info.encoderCount, info.jpegCount, info.ofaCount = dec, enc, jpg, ofa
            info.memorySizeMB = mib
            info.name = f"MIG {sl}g.{round(mib / 1000)}gb"
            return info

        def placements(h: Any, profile_id: int, array: Any, count_ref: Any) -> int:
            row = next((p for p in H100_PROFILES.values() if p[0] == profile_id), None)
            if row is None:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            starts, size = row[10], row[11]
            items = [pynvml.c_nvmlGpuInstancePlacement_t(s, size) for s in reversed(starts)]
            return self._fill(items, array, count_ref)

        def create_gi(h: Any, profile_id: int, placement_ref: Any) -> Any:
            placement = placement_ref._obj
            assert isinstance(placement, pynvml.c_nvmlGpuInstancePlacement_t)
            if not self.enabled:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            for g in self.gis.values():
                if g["start"] < placement.start + placement.size and placement.start < g["start"] + g["size"]:
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            gi_id = min(i for i in range(1, 15) if i not in self.gis)
            handle = self.add_gi(gi_id, profile_id, placement.start, placement.size)
            return same_handle(handle, pynvml.c_nvmlGpuInstance_t)

        def gi_info(gi: Any) -> Any:
            gi_id, g = self._gi_by_handle(gi)
            info = pynvml.c_nvmlGpuInstanceInfo_t()
            info.device = self.parent.handle
            info.id, info.profileId = gi_id, g["profile"]
            info.placement = pynvml.c_nvmlGpuInstancePlacement_t(g["start"], g["size"])
            return info

        def gi_by_id(h: Any, gi_id: int) -> Any:
            if not self.enabled:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            if gi_id not in self.gis:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
            return same_handle(self.gis[gi_id]["handle"], pynvml.c_nvmlGpuInstance_t)

        def gi_destroy(gi: Any) -> int:
            gi_id, g = self._gi_by_handle(gi)
            if g["cis"]:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_IN_USE)
            del self.gis[gi_id]
            return int(pynvml.NVML_SUCCESS)  # pynvml is unannotated

        def list_gis(h: Any, profile_id: int, array: Any, count_ref: Any) -> int:
            if not self.enabled:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            items = [g["handle"] for _, g in sorted(self.gis.items(), reverse=True) if g["profile"] == profile_id]
            return self._fill(items, array, count_ref)

        def ci_profile_info(gi: Any, index: int, eng: int) -> Any:
            self._gi_by_handle(gi)
            assert eng == pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            if index == 7:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if index not in CI_PROFILES:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            pid, sl, inst, sm = CI_PROFILES[index]
            info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
            info.id, info.sliceCount, info.instanceCount, info.multiprocessorCount = pid, sl, inst, sm
            return info

        def create_ci(gi: Any, profile_id: int) -> Any:
            gi_id, g = self._gi_by_handle(gi)
            ci_id = min(i for i in range(8) if i not in g["cis"])
            return same_handle(self.add_ci(gi_id, ci_id, profile_id), pynvml.c_nvmlComputeInstance_t)

        def ci_info(ci: Any) -> Any:
            _, g, ci_id, c = self._ci_by_handle(ci)
            info = pynvml.c_nvmlComputeInstanceInfo_t()
            info.device = self.parent.handle  # the PARENT GPU, as real NVML reports it
            info.gpuInstance = g["handle"]
            info.id, info.profileId = ci_id, c["profile"]
            return info

        def ci_by_id(gi: Any, ci_id: int) -> Any:
            _, g = self._gi_by_handle(gi)
            if ci_id not in g["cis"]:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
            return same_handle(g["cis"][ci_id]["handle"], pynvml.c_nvmlComputeInstance_t)

        def ci_destroy(ci: Any) -> int:
            _, g, ci_id, _ = self._ci_by_handle(ci)
            del g["cis"][ci_id]
            return int(pynvml.NVML_SUCCESS)  # pynvml is unannotated

        def list_cis(gi: Any, profile_id: int, array: Any, count_ref: Any) -> int:
            _, g = self._gi_by_handle(gi)
            items = [c["handle"] for _, c in sorted(g["cis"].items(), reverse=True) if c["profile"] == profile_id]
            return self._fill(items, array, count_ref)

        f.on("nvmlDeviceGetGpuInstanceProfileInfo", profile_info)
        f.on("nvmlDeviceGetGpuInstancePossiblePlacements", placements)
        f.on("nvmlDeviceCreateGpuInstanceWithPlacement", create_gi)
        f.on("nvmlGpuInstanceGetInfo", gi_info)
        f.on("nvmlDeviceGetGpuInstanceById", gi_by_id)
        f.on("nvmlGpuInstanceDestroy", gi_destroy)
        f.on("nvmlDeviceGetGpuInstances", list_gis)
        f.on("nvmlGpuInstanceGetComputeInstanceProfileInfo", ci_profile_info)
        f.on("nvmlGpuInstanceCreateComputeInstance", create_ci)
        f.on("nvmlComputeInstanceGetInfo", ci_info)
        f.on("nvmlGpuInstanceGetComputeInstanceById", ci_by_id)
        f.on("nvmlComputeInstanceDestroy", ci_destroy)
        f.on("nvmlGpuInstanceGetComputeInstances", list_cis)


@pytest.fixture
def mig(backend: RealNvml, fake: Fake, gpus: list[FakeGpu]) -> FakeMig:
    return FakeMig(fake, gpus[0])


def test_gi_profiles_keep_index_and_id_apart(backend: RealNvml, mig: FakeMig, fake: Fake) -> None:
    profiles = backend.gpu_instance_profiles(U0)
    assert [(p.index, p.id, p.name) for p in profiles] == [
        (0x0, 19, "1g.10gb"),
        (0x1, 14, "2g.20gb"),
        (0x2, 9, "3g.40gb"),
        (0x3, 5, "4g.40gb"),
        (0x4, 0, "7g.80gb"),
        (0x7, 20, "1g.10gb+me"),
        (0x9, 15, "1g.20gb"),
    ]
    # INDEX goes to the profile-info call (every index, unsupported ones skipped); ID to the placements call.
    assert [a[1] for a in fake.args("nvmlDeviceGetGpuInstanceProfileInfo")] == list(
        range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT)
    )
    assert [a[1] for a in fake.args("nvmlDeviceGetGpuInstancePossiblePlacements")][:3] == [19, 14, 9]
    seven = profiles[4]
    assert (seven.slice_count, seven.instance_count, seven.multiprocessors, seven.copy_engines) == (7, 1, 132, 8)
    assert (seven.decoders, seven.encoders, seven.jpeg_engines, seven.ofa_engines) == (7, 0, 7, 1)
    assert seven.memory_mib == 81152 and seven.memory_bytes == 81152 * MIB
    assert seven.placements == (Placement(0, 8),)
    assert profiles[2].placements == (Placement(0, 4), Placement(4, 4))  # sorted by start
    assert profiles[0].placements == tuple(Placement(s, 1) for s in range(7))


def test_placements_array_sized_from_instance_count_and_grown(backend: RealNvml, mig: FakeMig, fake: Fake) -> None:
    profiles = {p.id: p for p in backend.gpu_instance_profiles(U0)}
    # 1g.10gb+me: instanceCount 1 but seven placements -> INSUFFICIENT_SIZE, then the size NVML asked for.
    assert profiles[20].placements == tuple(Placement(s, 1) for s in range(7))
    sizes = [len(a[2]) for a in fake.args("nvmlDeviceGetGpuInstancePossiblePlacements") if a[1] == 20]
    assert sizes == [1, 7]
    sizes_3g = [len(a[2]) for a in fake.args("nvmlDeviceGetGpuInstancePossiblePlacements") if a[1] == 9]
    assert sizes_3g == [2]  # instanceCount was enough: one call
    array = fake.args("nvmlDeviceGetGpuInstancePossiblePlacements")[0][2]
    assert array._type_ is pynvml.c_nvmlGpuInstancePlacement_t


def test_placements_grow_by_doubling_when_count_is_not_reported(backend: RealNvml, mig: FakeMig, fake: Fake) -> None:
    mig.report_needed_count = False
    profiles = {p.id: p for p in backend.gpu_instance_profiles(U0)}
    assert len(profiles[20].placements) == 7
    sizes = [len(a[2]) for a in fake.args("nvmlDeviceGetGpuInstancePossiblePlacements") if a[1] == 20]
    assert sizes == [1, 2, 4, 8]


def test_placements_give_up_at_the_cap(backend: RealNvml, mig: FakeMig, fake: Fake) -> None:
    fake.fail("nvmlDeviceGetGpuInstancePossiblePlacements", pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    with pytest.raises(NvmlError) as info:
        backend.gpu_instance_profiles(U0)
    assert info.value.code is NvmlReturn.INSUFFICIENT_SIZE
    sizes = [len(a[2]) for a in fake.args("nvmlDeviceGetGpuInstancePossiblePlacements")]
    assert sizes[-1] == MAX_ARRAY_SLOTS


def test_placements_not_supported_is_empty(backend: RealNvml, mig: FakeMig, fake: Fake) -> None:
    fake.fail("nvmlDeviceGetGpuInstancePossiblePlacements", pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert all(p.placements == () for p in backend.gpu_instance_profiles(U0))


def test_profile_name_falls_back_to_nvml_label_without_memory_total(
    backend: RealNvml, mig: FakeMig, fake: Fake
) -> None:
    fake.fail("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_NOT_SUPPORTED)
    names = [p.name for p in backend.gpu_instance_profiles(U0)]
    assert names[0] == "1g.10gb"  # from "MIG 1g.10gb"
    assert names[2] == "3g.40gb"


def test_profile_index_beyond_the_formula_uses_nvml_label(
    backend: RealNvml, mig: FakeMig, fake: Fake, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pynvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0x13)
    original = pynvml.nvmlDeviceGetGpuInstanceProfileInfo

    def with_future_profile(h: Any, index: int) -> Any:
        if index == 0x12:
            info = original(h, 0x2)
            info.name = "MIG 3g.40gb+future"
            info.id = 42
            return info
        return original(h, index)

    fake.on("nvmlDeviceGetGpuInstanceProfileInfo", with_future_profile)
    profiles = backend.gpu_instance_profiles(U0)
    assert (profiles[-1].index, profiles[-1].id, profiles[-1].name) == (0x12, 42, "3g.40gb+future")
    assert profiles[-1].placements == ()


def test_non_mig_gpu_has_no_profiles(backend: RealNvml, fake: Fake) -> None:
    fake.fail("nvmlDeviceGetGpuInstanceProfileInfo", pynvml.NVML_ERROR_NOT_SUPPORTED)
    fake.fail("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_GPU_IS_LOST)  # never consulted
    assert backend.gpu_instance_profiles(U0) == []
    assert backend.gpu_instances(U0) == []


def test_profile_info_real_failure_propagates(backend: RealNvml, fake: Fake) -> None:
    fake.fail("nvmlDeviceGetGpuInstanceProfileInfo", pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(NvmlError) as info:
        backend.gpu_instance_profiles(U0)
    assert info.value.call == "nvmlDeviceGetGpuInstanceProfileInfo"


def test_create_gpu_instance_with_placement_by_reference(backend: RealNvml, mig: FakeMig, fake: Fake) -> None:
    gi = backend.create_gpu_instance(U0, 9, Placement(4, 4))
    assert gi == GpuInstance(gpu_uuid=U0, id=1, profile_id=9, placement=Placement(4, 4))
    (_, profile_id, ref) = fake.args("nvmlDeviceCreateGpuInstanceWithPlacement")[0]
    assert profile_id == 9 and (ref._obj.start, ref._obj.size) == (4, 4)
    with pytest.raises(NvmlError) as info:  # occupied slot
        backend.create_gpu_instance(U0, 14, Placement(4, 2))
    assert info.value.code is NvmlReturn.INSUFFICIENT_RESOURCES
    assert info.value.call == "nvmlDeviceCreateGpuInstanceWithPlacement"
    assert "profile ID 14 at 4:2" in str(info.value)


@pytest.mark.parametrize("placement", [Placement(-1, 1), Placement(0, 0)])
def test_create_gpu_instance_rejects_bad_placement(backend: RealNvml, mig: FakeMig, placement: Placement) -> None:
    with pytest.raises(ValueError, match="placement must have start >= 0 and size > 0"):
        backend.create_gpu_instance(U0, 19, placement)


def test_gpu_instances_lists_every_profile_sorted_by_id(backend: RealNvml, mig: FakeMig, fake: Fake) -> None:
    for gi_id, pid, start in [(9, 19, 2), (7, 19, 0), (8, 19, 1), (3, 14, 4), (2, 9, 4)]:
        mig.add_gi(gi_id, pid, start, {19: 1, 14: 2, 9: 4}[pid])
    got = backend.gpu_instances(U0)
    assert [(g.id, g.profile_id, g.placement.start) for g in got] == [
        (2, 9, 4),
        (3, 14, 4),
        (7, 19, 0),
        (8, 19, 1),
        (9, 19, 2),
    ]
    assert all(g.gpu_uuid == U0 for g in got)
    queried = [a[1] for a in fake.args("nvmlDeviceGetGpuInstances")]
    assert len(queried) == len(set(queried))  # one query per profile ID


def test_gpu_instances_grow_past_instance_count(backend: RealNvml, mig: FakeMig, fake: Fake) -> None:
    for gi_id, start in [(7, 0), (8, 1)]:
        mig.add_gi(gi_id, 0, start, 1)  # two GIs of a profile whose instanceCount says 1
    assert [g.id for g in backend.gpu_instances(U0)] == [7, 8]
    assert [len(a[2]) for a in fake.args("nvmlDeviceGetGpuInstances") if a[1] == 0] == [1, 2]


def test_gpu_instances_mig_disabled_is_empty(backend: RealNvml, mig: FakeMig) -> None:
    mig.enabled = False
    assert backend.gpu_instances(U0) == []


def test_gpu_instances_real_failure_propagates(backend: RealNvml, mig: FakeMig, fake: Fake) -> None:
    fake.fail("nvmlDeviceGetGpuInstances", pynvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(NvmlError):
        backend.gpu_instances(U0)


def test_gpu_instances_duplicate_profile_ids_are_queried_once(backend: RealNvml, mig: FakeMig, fake: Fake) -> None:
    original = pynvml.nvmlDeviceGetGpuInstanceProfileInfo

    def twin(h: Any, index: int) -> Any:
        return original(h, 0x0 if index == 0x7 else index)  # index 7 answers with ID 19 too

    fake.on("nvmlDeviceGetGpuInstanceProfileInfo", twin)
    mig.add_gi(7, 19, 0, 1)
    assert [g.id for g in backend.gpu_instances(U0)] == [7]
    assert [a[1] for a in fake.args("nvmlDeviceGetGpuInstances")].count(19) == 1


def test_destroy_gpu_instance(backend: RealNvml, mig: FakeMig, fake: Fake) -> None:
    mig.add_gi(2, 9, 4, 4)
    backend.destroy_gpu_instance(U0, 2)
    assert 2 not in mig.gis
    with pytest.raises(NvmlError) as info:
        backend.destroy_gpu_instance(U0, 2)
    assert info.value.code is NvmlReturn.NOT_FOUND and info.value.call == "nvmlDeviceGetGpuInstanceById"
    assert "GI 2" in str(info.value)


def test_destroy_gpu_instance_with_compute_instances_is_in_use(backend: RealNvml, mig: FakeMig) -> None:
    mig.add_gi(2, 9, 4, 4)
    mig.add_ci(2, 0, 2)
    with pytest.raises(NvmlError) as info:
        backend.destroy_gpu_instance(U0, 2)
    assert info.value.code is NvmlReturn.IN_USE and info.value.call == "nvmlGpuInstanceDestroy"


def test_compute_instance_profiles(backend: RealNvml, mig: FakeMig, fake: Fake) -> None:
    mig.add_gi(2, 9, 4, 4)
    assert backend.compute_instance_profiles(U0, 2) == [
        ComputeInstanceProfile(index=0, id=0, slice_count=1, instance_count=7, multiprocessors=16),
        ComputeInstanceProfile(index=1, id=1, slice_count=2, instance_count=3, multiprocessors=32),
        ComputeInstanceProfile(index=2, id=2, slice_count=3, instance_count=2, multiprocessors=60),
    ]
    gi_handle_addr = addr(mig.gis[2]["handle"])
    assert {addr(a[0]) for a in fake.args("nvmlGpuInstanceGetComputeInstanceProfileInfo")} == {gi_handle_addr}
    assert [a[1] for a in fake.args("nvmlGpuInstanceGetComputeInstanceProfileInfo")] == list(
        range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
    )


def test_compute_instance_profile_real_failure_propagates(backend: RealNvml, mig: FakeMig, fake: Fake) -> None:
    mig.add_gi(2, 9, 4, 4)
    fake.fail("nvmlGpuInstanceGetComputeInstanceProfileInfo", pynvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(NvmlError):
        backend.compute_instance_profiles(U0, 2)


def test_compute_instance_lifecycle(backend: RealNvml, mig: FakeMig, fake: Fake) -> None:
    gi = backend.create_gpu_instance(U0, 9, Placement(0, 4))
    ci = backend.create_compute_instance(U0, gi.id, 2)
    assert ci == ComputeInstance(gpu_uuid=U0, gpu_instance_id=gi.id, id=0, profile_id=2)
    ci1 = backend.create_compute_instance(U0, gi.id, 0)
    assert backend.compute_instances(U0, gi.id) == [ci, ci1]
    backend.destroy_compute_instance(U0, gi.id, 0)
    assert backend.compute_instances(U0, gi.id) == [ci1]
    with pytest.raises(NvmlError) as info:
        backend.destroy_compute_instance(U0, gi.id, 0)
    assert info.value.code is NvmlReturn.NOT_FOUND and info.value.call == "nvmlGpuInstanceGetComputeInstanceById"


def test_compute_instances_skip_not_supported_and_raise_others(backend: RealNvml, mig: FakeMig, fake: Fake) -> None:
    mig.add_gi(2, 9, 4, 4)
    mig.add_ci(2, 0, 2)
    fake.fail("nvmlGpuInstanceGetComputeInstances", pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert backend.compute_instances(U0, 2) == []
    fake.fail("nvmlGpuInstanceGetComputeInstances", pynvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(NvmlError):
        backend.compute_instances(U0, 2)


def install_mig_devices(fake: Fake, slots: dict[int, Any], max_count: int = 7) -> dict[int, Any]:
    """slots: index -> (uuid, gi, ci, memory_mib or None) or an NVML error code for that slot."""
    handles = {i: new_handle(pynvml.struct_c_nvmlDevice_t) for i, s in slots.items() if isinstance(s, tuple)}
    by_addr = {addr(h): slots[i] for i, h in handles.items()}
    real_uuid: Callable[[Any], str] = pynvml.nvmlDeviceGetUUID
    real_memory = pynvml.nvmlDeviceGetMemoryInfo

    def by_index(h: Any, index: int) -> Any:
        slot = slots.get(index, pynvml.NVML_ERROR_NOT_FOUND)
        if isinstance(slot, int):
            raise pynvml.NVMLError(slot)
        return same_handle(handles[index], pynvml.c_nvmlDevice_t)

    def uuid(h: Any) -> str:
        return by_addr[addr(h)][0] if addr(h) in by_addr else real_uuid(h)

    def mem(h: Any) -> Any:
        if addr(h) not in by_addr:
            return real_memory(h)
        mib = by_addr[addr(h)][3]
        if mib is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return memory(mib * MIB)

    fake.on("nvmlDeviceGetMaxMigDeviceCount", lambda h: max_count)
    fake.on("nvmlDeviceGetMigDeviceHandleByIndex", by_index)
    fake.on("nvmlDeviceGetUUID", uuid)
    fake.on("nvmlDeviceGetMemoryInfo", mem)
    fake.on("nvmlDeviceGetGpuInstanceId", lambda h: by_addr[addr(h)][1])
    fake.on("nvmlDeviceGetComputeInstanceId", lambda h: by_addr[addr(h)][2])
    return handles


def test_mig_devices_use_each_mig_handles_own_uuid(
    backend: RealNvml, mig: FakeMig, fake: Fake, gpus: list[FakeGpu]
) -> None:
    """The §1.6 pitfall: nvmlComputeInstanceGetInfo().device is the PARENT, so its UUID is the parent's."""
    mig.add_gi(7, 19, 0, 1)
    mig.add_ci(7, 0, 0)
    mig.add_gi(2, 9, 4, 4)
    mig.add_ci(2, 0, 2)
    install_mig_devices(
        fake,
        {
            0: (MIG_A, 2, 0, 40320),
            1: pynvml.NVML_ERROR_NOT_FOUND,
            2: pynvml.NVML_ERROR_INVALID_ARGUMENT,
            3: (MIG_B, 7, 0, None),
        },
    )
    # The trap is armed: asking the CI for its device gives the parent GPU.
    ci = pynvml.nvmlGpuInstanceGetComputeInstanceById(mig.gis[2]["handle"], 0)
    assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlComputeInstanceGetInfo(ci).device) == U0

    devices = backend.mig_devices(U0)
    assert devices == [
        MigDevice(
            uuid=MIG_A, parent_uuid=U0, gpu_instance_id=2, compute_instance_id=0, index=0, memory_bytes=40320 * MIB
        ),
        MigDevice(uuid=MIG_B, parent_uuid=U0, gpu_instance_id=7, compute_instance_id=0, index=3, memory_bytes=None),
    ]
    assert U0 not in {d.uuid for d in devices}
    assert [a[1] for a in fake.args("nvmlDeviceGetMigDeviceHandleByIndex")] == list(range(7))
    assert {addr(a[0]) for a in fake.args("nvmlDeviceGetMigDeviceHandleByIndex")} == {addr(gpus[0].handle)}


def test_mig_devices_non_mig_gpu_and_failures(backend: RealNvml, fake: Fake) -> None:
    fake.fail("nvmlDeviceGetMaxMigDeviceCount", pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert backend.mig_devices(U0) == []
    install_mig_devices(fake, {0: pynvml.NVML_ERROR_GPU_IS_LOST})
    with pytest.raises(NvmlError) as info:
        backend.mig_devices(U0)
    assert info.value.code is NvmlReturn.GPU_IS_LOST and info.value.call == "nvmlDeviceGetMigDeviceHandleByIndex"
    fake.fail("nvmlDeviceGetMaxMigDeviceCount", pynvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(NvmlError):
        backend.mig_devices(U0)


def test_mig_device_uuid_usable_as_a_handle(backend: RealNvml, fake: Fake) -> None:
    handles = install_mig_devices(fake, {0: (MIG_A, 2, 0, 40320)})
    fake.on("nvmlDeviceGetHandleByUUID", lambda u: same_handle(handles[0], pynvml.c_nvmlDevice_t))
    fake.on("nvmlDeviceGetComputeMode", lambda h: 0)
    assert backend.compute_mode(MIG_A) is ComputeMode.DEFAULT


# --- events ---------------------------------------------------------------------------------------


@pytest.fixture
def events(backend: RealNvml, fake: Fake, gpus: list[FakeGpu]) -> dict[str, Any]:
    gpus.append(FakeGpu(uuid=U2, bus_id="00000000:75:00.0", minor=5))
    install_gpus(fake, gpus)
    event_set = new_handle(pynvml.struct_c_nvmlEventSet_t)
    supported: dict[str, int | None] = {U0: 0xFF9F, U1: None, U2: pynvml.nvmlEventTypePState}
    uuid_of = {addr(g.handle): g.uuid for g in gpus}

    def supported_types(h: Any) -> int:
        value = supported[uuid_of[addr(h)]]
        if value is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    fake.on("nvmlEventSetCreate", lambda: same_handle(event_set, pynvml.c_nvmlEventSet_t))
    fake.on("nvmlEventSetFree", lambda s: None)
    fake.on("nvmlDeviceGetSupportedEventTypes", supported_types)
    fake.on("nvmlDeviceRegisterEvents", lambda h, mask, s: None)
    return {"set": event_set, "supported": supported}


HEALTH_MASK = (
    pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError | pynvml.nvmlEventTypeSingleBitEccError
)


def event_data(device: Any, event_type: int, data: int, gi: int = 0xFFFFFFFF, ci: int = 0xFFFFFFFF) -> Any:
    d = pynvml.c_nvmlEventData_t()
    d.device = device
    d.eventType, d.eventData, d.gpuInstanceId, d.computeInstanceId = event_type, data, gi, ci
    return d


def test_register_events_masks_and_skips(
    backend: RealNvml, fake: Fake, events: dict[str, Any], gpus: list[FakeGpu]
) -> None:
    mask = backend.register_events([U0, U1, U2], HEALTH_MASK)
    assert mask == HEALTH_MASK  # U0 supports all three; U1 has no events; U2 none of these
    registered = fake.args("nvmlDeviceRegisterEvents")
    assert len(registered) == 1
    (handle, registered_mask, event_set) = registered[0]
    assert addr(handle) == addr(gpus[0].handle) and registered_mask == HEALTH_MASK
    assert addr(event_set) == addr(events["set"])


def test_register_events_reuses_one_set(backend: RealNvml, fake: Fake, events: dict[str, Any]) -> None:
    events["supported"][U2] = pynvml.nvmlEventTypeXidCriticalError
    assert backend.register_events([U0], pynvml.nvmlEventTypeXidCriticalError) == pynvml.nvmlEventTypeXidCriticalError
    assert backend.register_events([U2], HEALTH_MASK) == pynvml.nvmlEventTypeXidCriticalError
    assert fake.count("nvmlEventSetCreate") == 1
    assert {addr(a[2]) for a in fake.args("nvmlDeviceRegisterEvents")} == {addr(events["set"])}


def test_register_events_register_not_supported_skips_and_other_errors_raise(
    backend: RealNvml, fake: Fake, events: dict[str, Any]
) -> None:
    fake.fail("nvmlDeviceRegisterEvents", pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert backend.register_events([U0], HEALTH_MASK) == 0
    fake.fail("nvmlDeviceRegisterEvents", pynvml.NVML_ERROR_NO_PERMISSION)
    with pytest.raises(NvmlError) as info:
        backend.register_events([U0], HEALTH_MASK)
    assert info.value.code is NvmlReturn.NO_PERMISSION and info.value.call == "nvmlDeviceRegisterEvents"


def test_register_events_rejects_bad_mask(backend: RealNvml, events: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="event_mask"):
        backend.register_events([U0], -1)


def test_wait_event_maps_the_handle_back_to_the_uuid(
    backend: RealNvml, fake: Fake, events: dict[str, Any], gpus: list[FakeGpu]
) -> None:
    backend.register_events([U0], HEALTH_MASK)
    # NVML hands back a fresh pointer object for the same device: only the address matches.
    fake.on(
        "nvmlEventSetWait_v2",
        lambda s, t: event_data(
            same_handle(gpus[0].handle, pynvml.c_nvmlDevice_t), pynvml.nvmlEventTypeXidCriticalError, 79, 3, 0
        ),
    )
    fake.fail("nvmlDeviceGetUUID", pynvml.NVML_ERROR_UNKNOWN)  # the registered map answers, not NVML
    assert backend.wait_event(5000) == GpuEvent(
        gpu_uuid=U0, event_type=pynvml.nvmlEventTypeXidCriticalError, data=79, gpu_instance_id=3, compute_instance_id=0
    )
    (event_set, timeout) = fake.args("nvmlEventSetWait_v2")[0]
    assert addr(event_set) == addr(events["set"]) and timeout == 5000


def test_wait_event_unregistered_device_asks_nvml(
    backend: RealNvml, fake: Fake, events: dict[str, Any], gpus: list[FakeGpu]
) -> None:
    backend.register_events([U0], HEALTH_MASK)
    fake.on("nvmlEventSetWait_v2", lambda s, t: event_data(gpus[1].handle, pynvml.nvmlEventTypeDoubleBitEccError, 0))
    event = backend.wait_event(0)
    assert event is not None and event.gpu_uuid == U1 and event.gpu_instance_id == 0xFFFFFFFF
    fake.fail("nvmlDeviceGetUUID", pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(NvmlError) as info:
        backend.wait_event(0)
    assert info.value.code is NvmlReturn.GPU_IS_LOST


def test_wait_event_null_device_asks_nvml(backend: RealNvml, fake: Fake, events: dict[str, Any]) -> None:
    backend.register_events([U0], HEALTH_MASK)
    fake.on("nvmlEventSetWait_v2", lambda s, t: event_data(None, pynvml.nvmlEventTypeXidCriticalError, 48))
    fake.fail("nvmlDeviceGetUUID", pynvml.NVML_ERROR_INVALID_ARGUMENT)
    with pytest.raises(NvmlError) as info:
        backend.wait_event(0)
    assert info.value.call == "nvmlDeviceGetUUID"


def test_wait_event_timeout_is_none_and_gpu_lost_raises(backend: RealNvml, fake: Fake, events: dict[str, Any]) -> None:
    backend.register_events([U0], HEALTH_MASK)
    fake.fail("nvmlEventSetWait_v2", pynvml.NVML_ERROR_TIMEOUT)
    assert backend.wait_event(10) is None
    fake.fail("nvmlEventSetWait_v2", pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(NvmlError) as info:
        backend.wait_event(10)
    assert info.value.code is NvmlReturn.GPU_IS_LOST and info.value.call == "nvmlEventSetWait_v2"


def test_wait_event_needs_registration_and_a_sane_timeout(backend: RealNvml, events: dict[str, Any]) -> None:
    with pytest.raises(NvmlError) as info:
        backend.wait_event(0)
    assert info.value.code is NvmlReturn.UNINITIALIZED and "register_events" in str(info.value)
    with pytest.raises(ValueError, match="timeout_ms"):
        backend.wait_event(-5)


def test_shutdown_frees_the_event_set_even_if_free_fails(backend: RealNvml, fake: Fake, events: dict[str, Any]) -> None:
    backend.register_events([U0], HEALTH_MASK)
    fake.fail("nvmlEventSetFree", pynvml.NVML_ERROR_UNKNOWN)
    backend.shutdown()
    assert [addr(a[0]) for a in fake.args("nvmlEventSetFree")] == [addr(events["set"])]
    assert fake.count("nvmlShutdown") == 1
    backend.init()
    with pytest.raises(NvmlError, match="register_events"):
        backend.wait_event(0)  # the old set is gone with the old session


def test_shutdown_failure_is_reported(backend: RealNvml, fake: Fake) -> None:
    fake.fail("nvmlShutdown", pynvml.NVML_ERROR_UNINITIALIZED)
    with pytest.raises(NvmlError) as info:
        backend.shutdown()
    assert info.value.call == "nvmlShutdown"
