"""The ctypes client of Fabric Manager's SDK (dra_driver/nvml/real/fabricmanager.py) against a C stand-in of libnvfm
(fakelibnvfm.c, compiled here with the system `cc`): the bytes of each struct, their versions, the address FM is
asked at, one connection per call (an FM restart is survived), the mapping of fmReturn_t codes, and refusals of an
answer out of bounds. The stand-in checks every version as the SDK does (VERSION_MISMATCH otherwise), so a wrong
layout or version fails here."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import shutil
import subprocess
from collections.abc import Iterator, MutableMapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from dra_driver.nvml.fabricmanager import FabricManagerAddress, FabricManagerError, FmReturn
from dra_driver.nvml.real import fabricmanager as real_fm
from dra_driver.nvml.real.backend import RealNvml
from dra_driver.nvml.real.fabricmanager import NvfmClient
from tests.nvml.test_real import Fake, FakeGpu, addr, install_gpus

SOURCE = Path(__file__).with_name("fakelibnvfm.c")
SOCKET = "/run/nvidia-fabricmanager/socket"
# Counter slots of the stand-in (fakefm_counter).
INITS, SHUTDOWNS, CONNECTS, DISCONNECTS, OPEN, LAST_TYPE, LAST_UNIX_FLAG, LAST_TIMEOUT = range(8)
LIST_CALLS, SET_CALLS, SET_COUNT, SET_FIRST = range(8, 12)


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> str:
    compiler = shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler (cc) on this machine: the libnvfm stand-in cannot be built")
    out = tmp_path_factory.mktemp("nvfm") / "libnvfm.so.1"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-o", str(out), str(SOURCE)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return str(out)


@pytest.fixture
def fm(library: str) -> Iterator[ctypes.CDLL]:
    """The stand-in's controls (the same loaded object the client opens), reset for each test."""
    lib = ctypes.CDLL(library)
    lib.fakefm_counter.restype = ctypes.c_long
    lib.fakefm_last_address.restype = ctypes.c_char_p
    lib.fakefm_struct_version.restype = ctypes.c_uint
    lib.fakefm_listen.argtypes = [ctypes.c_int, ctypes.c_char_p]
    lib.fakefm_reset()
    yield lib
    assert lib.fakefm_counter(OPEN) == 0, "a connection was left open"
    assert lib.fakefm_initialised() == 0, "the library was left initialised"


def _client(library: str, *, tcp: str = "", unix_socket: str = SOCKET) -> NvfmClient:
    return NvfmClient(FabricManagerAddress(library=library, tcp=tcp, unix_socket=unix_socket))


def test_struct_versions_are_the_headers(fm: ctypes.CDLL) -> None:
    assert real_fm.CONNECT_PARAMS_VERSION == fm.fakefm_struct_version(0) == 272 | 2 << 24
    assert real_fm.PARTITION_LIST_VERSION == fm.fakefm_struct_version(1) == 131852 | 1 << 24
    assert real_fm.ACTIVATED_LIST_VERSION == fm.fakefm_struct_version(2) == 264 | 1 << 24


def test_lists_the_boards_partitions_over_the_unix_socket(fm: ctypes.CDLL, library: str) -> None:
    partitions = _client(library).supported_partitions()
    assert [(p.id, p.active, [g.physical_id for g in p.gpus]) for p in partitions][:7] == [
        (0, False, [1, 2, 3, 4, 5, 6, 7, 8]),
        (1, False, [1, 2, 3, 4]),
        (2, False, [5, 6, 7, 8]),
        (3, False, [1, 3]),
        (4, False, [2, 4]),
        (5, False, [5, 7]),
        (6, False, [6, 8]),
    ]
    assert len(partitions) == 15 and all(len(p.gpus) == 1 for p in partitions[7:])
    gpu = partitions[3].gpus[1]
    assert (gpu.uuid, gpu.pci_bus_id, gpu.nvlinks) == (
        "GPU-fa4e0000-0000-0000-0000-000000000003",
        "00000000:1B:00.0",
        18,
    )
    assert fm.fakefm_last_address() == SOCKET.encode()
    assert (fm.fakefm_counter(LAST_TYPE), fm.fakefm_counter(LAST_UNIX_FLAG)) == (2, 1)  # NV_FM_API_ADDR_TYPE_UNIX
    assert fm.fakefm_counter(LAST_TIMEOUT) == 5000


def test_tcp_when_an_address_is_configured_with_fms_default_port(fm: ctypes.CDLL, library: str) -> None:
    fm.fakefm_listen(1, b"127.0.0.1:6666")
    assert len(_client(library, tcp="127.0.0.1").supported_partitions()) == 15
    assert fm.fakefm_last_address() == b"127.0.0.1:6666"
    assert (fm.fakefm_counter(LAST_TYPE), fm.fakefm_counter(LAST_UNIX_FLAG)) == (1, 0)  # NV_FM_API_ADDR_TYPE_INET


def test_activate_deactivate_and_fms_refusals_as_errors(fm: ctypes.CDLL, library: str) -> None:
    client = _client(library)
    client.activate(3)
    assert fm.fakefm_active(3) == 1
    assert [p.id for p in client.supported_partitions() if p.active] == [3]
    with pytest.raises(FabricManagerError) as busy:
        client.activate(1)  # shares GPUs 1 and 3
    assert busy.value.code is FmReturn.IN_USE
    assert "fmActivateFabricPartition(1) failed: the partition is already active, or one of its GPUs" in str(busy.value)
    with pytest.raises(FabricManagerError) as unknown:
        client.activate(40)
    assert unknown.value.code is FmReturn.BADPARAM
    client.deactivate(3)
    assert fm.fakefm_active(3) == 0
    with pytest.raises(FabricManagerError) as inactive:
        client.deactivate(3)
    assert inactive.value.code is FmReturn.UNINITIALIZED  # what FabricPartitioner.release counts as done


def test_each_call_opens_and_closes_its_own_session(fm: ctypes.CDLL, library: str) -> None:
    client = _client(library)
    client.supported_partitions()
    client.activate(7)
    with pytest.raises(FabricManagerError):
        client.activate(7)
    assert [fm.fakefm_counter(c) for c in (INITS, SHUTDOWNS, CONNECTS, DISCONNECTS, OPEN)] == [3, 3, 3, 3, 0]


def test_an_fm_restart_between_calls_is_survived(fm: ctypes.CDLL, library: str) -> None:
    client = _client(library)
    client.activate(4)
    fm.fakefm_restart()  # a new FM instance: shared NVSwitch mode does not re-activate partitions
    assert [p.id for p in client.supported_partitions() if p.active] == []
    client.activate(4)
    assert fm.fakefm_active(4) == 1


def test_set_activated_sends_the_list(fm: ctypes.CDLL, library: str) -> None:
    client = _client(library)
    client.set_activated((5, 8))
    assert [fm.fakefm_counter(c) for c in (SET_CALLS, SET_COUNT, SET_FIRST)] == [1, 2, 5]
    assert (fm.fakefm_active(5), fm.fakefm_active(8)) == (1, 1)
    with pytest.raises(FabricManagerError) as overlapping:
        client.set_activated((1, 7))
    assert overlapping.value.code is FmReturn.BADPARAM
    with pytest.raises(FabricManagerError, match="distinct ids"):
        client.set_activated((5, 5))


def test_fm_not_answering_is_the_clear_refusal(fm: ctypes.CDLL, library: str) -> None:
    fm.fakefm_set_up(0)
    with pytest.raises(FabricManagerError) as down:
        _client(library).supported_partitions()
    assert down.value.code is FmReturn.CONNECTION_NOT_VALID
    message = str(down.value)
    assert message.startswith(
        "Fabric Manager SDK not available: Fabric Manager did not answer at UNIX socket " + SOCKET
    )
    assert "FABRIC_MODE=1" in message
    with pytest.raises(FabricManagerError, match="did not answer at UNIX socket /run/other"):
        fm.fakefm_set_up(1)
        _client(library, unix_socket="/run/other").activate(0)
    assert fm.fakefm_active(0) == 0


def test_a_missing_or_foreign_library_is_the_clear_refusal(fm: ctypes.CDLL, tmp_path: Path) -> None:
    with pytest.raises(FabricManagerError) as missing:
        _client(str(tmp_path / "libnvfm.so.1")).supported_partitions()
    assert missing.value.code is FmReturn.NOT_SUPPORTED
    assert str(missing.value).startswith("Fabric Manager SDK not available: libnvfm could not be loaded")
    assert "--fabric-manager-library" in str(missing.value)
    libc = ctypes.util.find_library("c")
    assert libc is not None
    with pytest.raises(FabricManagerError, match="lacks fmLibInit, fmLibShutdown, fmConnect"):
        NvfmClient(FabricManagerAddress(library="/lib/libc"), load_library=lambda _: ctypes.CDLL(libc)).activate(1)


@pytest.mark.parametrize(
    ("mode", "field"),
    [
        (1, "numPartitions is 65, above FM_MAX_FABRIC_PARTITIONS (64)"),
        (2, "partitionInfo[0] (partition 0).numGpus is 17, not 1 to FM_MAX_NUM_GPUS (16)"),
        (3, "partitionInfo[2] (partition 2).gpuInfo[1].uuid has no terminating NUL in its 80 bytes"),
        (4, "partition ids [0, 0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14] are not unique"),
        (5, "partitionInfo[3] (partition 3).isActive is 2, not 0 or 1"),
    ],
)
def test_an_answer_out_of_bounds_is_refused_naming_the_field(
    fm: ctypes.CDLL, library: str, mode: int, field: str
) -> None:
    fm.fakefm_set_hostile(mode)
    with pytest.raises(FabricManagerError) as bad:
        _client(library).supported_partitions()
    assert bad.value.code is FmReturn.GENERIC_ERROR
    assert f"Fabric Manager answered an invalid partition list: {field}; nothing of it is used" in str(bad.value)


def test_an_unknown_return_code_is_a_generic_error_naming_it(fm: ctypes.CDLL, library: str) -> None:
    fm.fakefm_set_hostile(6)
    with pytest.raises(FabricManagerError) as odd:
        _client(library).supported_partitions()
    assert odd.value.code is FmReturn.GENERIC_ERROR
    assert "fmGetSupportedFabricPartitions returned -31, a code this driver does not know" in str(odd.value)


def test_h100_boards_leave_uuid_and_bus_id_empty(fm: ctypes.CDLL, library: str) -> None:
    fm.fakefm_set_blank_ids(1)
    gpu = _client(library).supported_partitions()[0].gpus[0]
    assert (gpu.physical_id, gpu.uuid, gpu.pci_bus_id) == (1, "", "")


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("library", "libnvfm.so", "--fabric-manager-library 'libnvfm.so': give an absolute path"),
        ("tcp", "fm.local:6666", "--fabric-manager-address 'fm.local:6666': give FM's command address as <ipv4>"),
        ("tcp", "127.0.0.1:99999", "--fabric-manager-address '127.0.0.1:99999'"),
        ("unix_socket", "run/fm", "--fabric-manager-socket 'run/fm': give the absolute path"),
        ("unix_socket", "/" + "a" * 300, "at most 255 bytes"),
    ],
)
def test_a_bad_address_is_refused_naming_the_flag(field: str, value: str, words: str) -> None:
    changes: dict[str, Any] = {field: value}
    with pytest.raises(ValueError) as refused:
        replace(FabricManagerAddress(), **changes)
    assert words in str(refused.value)


def test_the_real_backend_names_members_fm_leaves_blank_by_module_id(
    fm: ctypes.CDLL, library: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """H100 and later: FM reports a member by its physical id (the module id) only; the real NVML backend fills in
    the UUID and bus id of the GPU with that module id, and remembers them for GPUs that leave NVML (vfio-pci)."""
    fake = Fake(monkeypatch)
    gpus = [FakeGpu(uuid=f"GPU-{n}", bus_id=f"00000000:{0x18 + n:02X}:00.0", minor=n - 1) for n in (1, 2)]
    install_gpus(fake, gpus)
    modules = {addr(g.handle): n for n, g in zip((1, 2), gpus, strict=True)}
    fake.on("nvmlDeviceGetModuleId", lambda h: modules[addr(h)])
    fm.fakefm_set_blank_ids(1)
    backend = RealNvml(sysfs_root=str(tmp_path), environ={}, fabric_manager=FabricManagerAddress(library=library))
    backend.init()
    try:
        listed = backend.fabric_manager().supported_partitions()
    finally:
        backend.shutdown()
    by_id = {p.id: p for p in listed}
    assert [(g.physical_id, g.uuid, g.pci_bus_id) for g in by_id[7].gpus + by_id[8].gpus] == [
        (1, "GPU-1", "0000:19:00.0"),  # NVML's bus id, normalised as sysfs writes it
        (2, "GPU-2", "0000:1a:00.0"),
    ]
    assert [g.uuid for g in by_id[9].gpus] == [""]  # module 3: no such GPU here, left unnamed (not offered)
    # NVML closed (or the GPUs gone to vfio-pci): the module ids seen before still name them.
    assert backend.fabric_manager().supported_partitions()[7].gpus[0].uuid == "GPU-1"


def test_the_real_backend_without_fabric_partitions_refuses_saying_why() -> None:
    with pytest.raises(FabricManagerError) as off:
        RealNvml(environ={}).fabric_manager().supported_partitions()
    assert off.value.code is FmReturn.NOT_SUPPORTED
    assert str(off.value).startswith("Fabric Manager SDK not available: --fabric-partitions is off")


def test_a_failing_listing_is_logged_once_until_it_changes(fm: ctypes.CDLL, library: str) -> None:
    client = _client(library)
    fm.fakefm_set_up(0)
    saved = structlog.get_config()  # another test may have configured the process for warnings only
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    try:
        logs = _listings(client, fm)
    finally:
        structlog.configure(**saved)
    assert [(e["log_level"], e["event"]) for e in logs] == [
        ("warning", "Fabric Manager's partitions cannot be listed; none is offered"),
        ("info", "Fabric Manager's partitions are listed again"),
    ]
    assert "did not answer at UNIX socket" in logs[0]["error"]


def _listings(client: NvfmClient, fm: ctypes.CDLL) -> list[MutableMapping[str, Any]]:
    with capture_logs() as logs:
        for _ in range(3):  # discovery lists the partitions at every rediscovery
            with pytest.raises(FabricManagerError):
                client.supported_partitions()
        fm.fakefm_set_up(1)
        client.supported_partitions()
        client.supported_partitions()
    return logs


def test_a_library_another_user_initialised_is_left_initialised(fm: ctypes.CDLL, library: str) -> None:
    assert fm.fmLibInit() == 0  # someone else in the process (fmLibInit answers them IN_USE afterwards)
    _client(library).activate(9)
    assert fm.fakefm_initialised() == 1 and fm.fakefm_counter(SHUTDOWNS) == 0  # not shut down under them
    assert fm.fakefm_active(9) == 1
    assert fm.fmLibShutdown() == 0
