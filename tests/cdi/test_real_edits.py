"""RealCdiEdits on a fake 570-series driver root: the exact edits for a whole GPU, a MIG device, MPS and time-slicing,
with and without the container toolkit's hooks, and the claims of docs/nvml-real.md "CDI edits compared with
nvidia-ctk"."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from dra_driver.cdi import ContainerEdits, Hook, Mount
from dra_driver.inventory.catalog import AllocatableDevice, MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.nvml.factory import open_backend
from dra_driver.plugin.cdi import CONTAINER_LIB_DIR, ClaimSpecWriter, DeviceForCdi, MpsClient
from dra_driver.plugin.cdidriverfiles import READ_ONLY, SOCKET_OPTIONS, RealCdiEdits
from dra_sandbox.fakedriverroot import (
    BINARIES,
    COMPUTE_LIBRARIES,
    CONFIG_FILES,
    DRIVER_VERSION,
    GRAPHICS_LIBRARIES,
    LIB_DIR,
    FakeDriverRoot,
    build_driver_root,
)

V = DRIVER_VERSION
LIB = f"/{LIB_DIR}"
HOOK = Path("/usr/local/nvidia/toolkit/nvidia-cdi-hook")


@pytest.fixture(scope="module")
def devices() -> Iterator[Mapping[str, AllocatableDevice]]:
    backend = open_backend("fake:dgx-h100")
    backend.init()
    try:
        yield catalog(discover(backend), MigOffering.DYNAMIC)
    finally:
        backend.shutdown()


@pytest.fixture
def tree(tmp_path: Path) -> FakeDriverRoot:
    return build_driver_root(tmp_path)


def edits(tree: FakeDriverRoot, hook_path: Path | None = None) -> RealCdiEdits:
    return RealCdiEdits(tree.root, Path("/"), tree.dev_root, tree.proc_root, hook_path=hook_path)


def whole(devices: Mapping[str, AllocatableDevice], sharing: str = "Exclusive", mps: MpsClient | None = None,
          minor: int = 1) -> DeviceForCdi:
    device = devices[f"gpu-{minor}"]
    return DeviceForCdi(device, device.gpu.uuid, sharing, ("gpu",), mps=mps)


def mig(devices: Mapping[str, AllocatableDevice]) -> DeviceForCdi:
    device = devices["gpu-0-mig-1g10gb-19-6"]
    return DeviceForCdi(device, "MIG-2f1e0a52-9c1d-5e2b-8a77-0d3e6b1c4f10", "Exclusive", ("mig",),
                        gpu_instance_id=13, compute_instance_id=0)


def by_target(e: ContainerEdits) -> dict[str, Mount]:
    targets = [m.container_path for m in e.mounts]
    assert len(targets) == len(set(targets)), "a container path is mounted twice"
    return {m.container_path: m for m in e.mounts}


def names_of_library(stem: str, soname: str | None, dev_link: bool) -> list[str]:
    names = [f"{stem}.so.{V}"]
    if soname is not None:
        names.append(f"{stem}.so.{soname}")
        if dev_link:
            names.append(f"{stem}.so")
    return names


# ---- what every non-VFIO claim gets (spec-level edits) ------------------------------------------------------------


def test_claim_edits_without_hooks_bind_every_name_in_both_dirs(tree: FakeDriverRoot,
                                                                devices: Mapping[str, AllocatableDevice]) -> None:
    e = edits(tree).claim_edits([whole(devices)])
    mounts = by_target(e)
    expected: dict[str, Mount] = {}
    for lib in COMPUTE_LIBRARIES:
        host = f"/{LIB_DIR}/{lib.stem}.so.{V}"
        for name in names_of_library(lib.stem, lib.soname_suffix, lib.dev_link):
            for container_dir in (LIB, CONTAINER_LIB_DIR):
                expected[f"{container_dir}/{name}"] = Mount(host, f"{container_dir}/{name}", READ_ONLY)
    for name in BINARIES:
        expected[f"/usr/bin/{name}"] = Mount(f"/usr/bin/{name}", f"/usr/bin/{name}", READ_ONLY)
    for fw in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
        path = f"/lib/firmware/nvidia/{V}/{fw}"
        expected[path] = Mount(path, path, READ_ONLY)
    for sock in ("/run/nvidia-persistenced/socket", "/run/nvidia-fabricmanager/socket"):
        expected[sock] = Mount(sock, sock, SOCKET_OPTIONS)
    assert mounts == expected
    assert e.hooks == ()
    assert e.env == ("NVIDIA_VISIBLE_DEVICES=void", f"CUDA_VISIBLE_DEVICES={devices['gpu-1'].gpu.uuid}")
    assert [n.path for n in e.device_nodes] == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                                                "/dev/nvidia-modeset"]


def test_claim_edits_with_hooks_mount_real_files_once_and_run_the_toolkit_hooks(
    tree: FakeDriverRoot, devices: Mapping[str, AllocatableDevice]
) -> None:
    e = edits(tree, HOOK).claim_edits([whole(devices)])
    libs = {t: m for t, m in by_target(e).items() if ".so" in t}
    assert libs == {f"{LIB}/{lib.stem}.so.{V}": Mount(f"{LIB}/{lib.stem}.so.{V}", f"{LIB}/{lib.stem}.so.{V}",
                                                        READ_ONLY) for lib in COMPUTE_LIBRARIES}
    assert e.hooks == (
        Hook("createContainer", str(HOOK), ("nvidia-cdi-hook", "create-symlinks", "--link",
                                             f"libcuda.so.1::{LIB}/libcuda.so")),
        Hook("createContainer", str(HOOK), ("nvidia-cdi-hook", "enable-cuda-compat", f"--host-driver-version={V}")),
        Hook("createContainer", str(HOOK), ("nvidia-cdi-hook", "update-ldcache", "--folder", LIB)),
        Hook("createContainer", str(HOOK), ("nvidia-cdi-hook", "disable-device-node-modification")),
    )
    assert "/usr/bin/nvidia-smi" in by_target(e)
    assert not any(k.startswith("LD_LIBRARY_PATH=") for k in e.env)


def test_nvidia_ctk_as_the_hook_program_gets_its_hook_subcommand(tree: FakeDriverRoot,
                                                                 devices: Mapping[str, AllocatableDevice]) -> None:
    e = edits(tree, Path("/usr/bin/nvidia-ctk")).claim_edits([whole(devices)])
    assert {h.args[:3] for h in e.hooks} == {("nvidia-ctk", "hook", n) for n in (
        "create-symlinks", "enable-cuda-compat", "update-ldcache", "disable-device-node-modification")}


def test_host_driver_root_prefixes_host_paths_only(tree: FakeDriverRoot, devices: Mapping[str, AllocatableDevice]) -> None:
    e = RealCdiEdits(tree.root, Path("/run/nvidia/driver"), tree.dev_root, tree.proc_root).claim_edits(
        [whole(devices)])
    smi = by_target(e)["/usr/bin/nvidia-smi"]
    assert smi.host_path == "/run/nvidia/driver/usr/bin/nvidia-smi"
    cuda = by_target(e)[f"{LIB}/libcuda.so.1"]
    assert cuda.host_path == f"/run/nvidia/driver{LIB}/libcuda.so.{V}"


def test_graphics_files_and_host_mps_dir_are_not_injected(tree: FakeDriverRoot,
                                                          devices: Mapping[str, AllocatableDevice]) -> None:
    for hook in (None, HOOK):
        targets = set(by_target(edits(tree, hook).claim_edits([whole(devices)])))
        for lib in GRAPHICS_LIBRARIES:
            assert not any(Path(t).name.startswith(f"{lib.stem}.so") for t in targets), lib.stem
        for rel in CONFIG_FILES:
            assert f"/{rel}" not in targets and f"/etc/{rel.removeprefix('usr/share/')}" not in targets
        assert "/tmp/nvidia-mps" not in targets
        assert not any("gbm" in t for t in targets)


def test_missing_files_are_left_out_and_a_socket_under_var_run_is_found(tmp_path: Path,
                                                                       devices: Mapping[str, AllocatableDevice]) -> None:
    tree = build_driver_root(tmp_path)
    (tree.root / "usr/bin/nvidia-debugdump").unlink()
    for fw in (tree.root / "lib/firmware/nvidia" / V).iterdir():
        fw.unlink()
    fm = tree.root / "run/nvidia-fabricmanager/socket"
    (tree.root / "var/run/nvidia-fabricmanager").mkdir(parents=True)
    fm.rename(tree.root / "var/run/nvidia-fabricmanager/socket")
    (tree.dev_root / "nvidia-modeset").unlink()
    e = edits(tree).claim_edits([whole(devices)])
    targets = by_target(e)
    assert "/usr/bin/nvidia-debugdump" not in targets
    assert not any(t.startswith("/lib/firmware") for t in targets)
    assert targets["/run/nvidia-fabricmanager/socket"].host_path == "/var/run/nvidia-fabricmanager/socket"
    assert "/dev/nvidia-modeset" not in [n.path for n in e.device_nodes]


def test_a_plain_file_where_a_socket_belongs_is_not_mounted(tmp_path: Path,
                                                           devices: Mapping[str, AllocatableDevice]) -> None:
    tree = build_driver_root(tmp_path)
    sock = tree.root / "run/nvidia-persistenced/socket"
    sock.unlink()
    sock.write_text("not a socket")
    assert "/run/nvidia-persistenced/socket" not in by_target(edits(tree).claim_edits([whole(devices)]))


def test_a_library_link_leaving_the_driver_root_is_skipped(tmp_path: Path,
                                                          devices: Mapping[str, AllocatableDevice]) -> None:
    tree = build_driver_root(tmp_path / "node")
    outside = tmp_path / "elsewhere.so"
    outside.write_text("x")
    (tree.lib_dir / "libcuda.so.1").unlink()
    (tree.lib_dir / "libcuda.so.1").symlink_to(outside)
    targets = by_target(edits(tree).claim_edits([whole(devices)]))
    assert f"{LIB}/libcuda.so.1" not in targets and f"{LIB}/libcuda.so.{V}" in targets


# ---- per-device edits ----------------------------------------------------------------------------------------------


def test_whole_gpu_gets_its_own_node_only(tree: FakeDriverRoot, devices: Mapping[str, AllocatableDevice]) -> None:
    e = edits(tree).device_edits(whole(devices))
    assert [n.path for n in e.device_nodes] == ["/dev/nvidia1"]
    assert e.mounts == () and e.hooks == ()


def test_mig_device_gets_parent_node_and_only_its_own_caps(tree: FakeDriverRoot,
                                                          devices: Mapping[str, AllocatableDevice]) -> None:
    tree.add_mig_instance(minor=0, gi=13, ci=0, gi_cap_minor=111, ci_cap_minor=112)
    tree.add_mig_instance(minor=0, gi=14, ci=0, gi_cap_minor=120, ci_cap_minor=121)  # another claim's instance
    e = edits(tree).device_edits(mig(devices))
    assert [n.path for n in e.device_nodes] == ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap111",
                                                "/dev/nvidia-caps/nvidia-cap112"]


def test_mps_and_time_sliced_get_the_same_driver_edits_as_exclusive(tree: FakeDriverRoot,
                                                                    devices: Mapping[str, AllocatableDevice],
                                                                    tmp_path: Path) -> None:
    builder = edits(tree)
    exclusive = builder.claim_edits([whole(devices)])
    sliced = builder.claim_edits([whole(devices, sharing="TimeSlicing")])
    assert sliced == exclusive
    client = MpsClient(str(tmp_path / "pipe"), str(tmp_path / "shm"), ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",))
    shared = builder.claim_edits([whole(devices, sharing="MPS", mps=client)])
    assert shared.device_nodes == exclusive.device_nodes and shared.hooks == exclusive.hooks
    assert shared.mounts[: len(exclusive.mounts)] == exclusive.mounts
    assert [m.container_path for m in shared.mounts[len(exclusive.mounts):]] == ["/tmp/nvidia-mps", "/dev/shm"]
    assert shared.env == (*exclusive.env, "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
                          "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50")
    for sharing in ("TimeSlicing", "MPS"):
        assert builder.device_edits(whole(devices, sharing=sharing)).device_nodes == \
            builder.device_edits(whole(devices)).device_nodes


def test_void_is_set_even_where_the_claim_has_several_requests(tree: FakeDriverRoot,
                                                               devices: Mapping[str, AllocatableDevice]) -> None:
    a = whole(devices, minor=1)
    b = DeviceForCdi(devices["gpu-2"], devices["gpu-2"].gpu.uuid, "Exclusive", ("other",))
    e = edits(tree).claim_edits([a, b])
    # Without it an image's NVIDIA_VISIBLE_DEVICES=all would make the legacy NVIDIA runtime add every GPU.
    assert e.env == ("NVIDIA_VISIBLE_DEVICES=void",)


# ---- the written spec ----------------------------------------------------------------------------------------------


def test_written_spec_version_and_shape(tree: FakeDriverRoot, devices: Mapping[str, AllocatableDevice],
                                        tmp_path: Path) -> None:
    writer = ClaimSpecWriter(tmp_path / "cdi", "gpu.example.com", edits(tree, HOOK), "node-a")
    uid = "0b5a3f0e-6a57-4d43-9d1c-1f2e3d4c5b6a"
    writer.write(uid, [whole(devices)])
    spec = json.loads(writer.spec_path(uid).read_text())
    assert spec["cdiVersion"] == "0.5.0"  # hostPath on device nodes (the fake dev root); podman 4.3 reads it
    assert [h["args"][1] for h in spec["containerEdits"]["hooks"]] == [
        "create-symlinks", "enable-cuda-compat", "update-ldcache", "disable-device-node-modification"]
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia1", "hostPath": "/dev/nvidia1"}]
    assert writer.problem(uid, [whole(devices)]) is None


def test_the_comparison_table_names_everything_the_code_injects() -> None:
    from dra_driver.plugin import cdidriverfiles as cdi

    doc = (Path(__file__).parents[2] / "docs/nvml-real.md").read_text()
    section = doc.split("## CDI edits compared with nvidia-ctk", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) >= 20
    for hook in (cdi.HOOK_CREATE_SYMLINKS, cdi.HOOK_ENABLE_CUDA_COMPAT, cdi.HOOK_UPDATE_LDCACHE,
                 cdi.HOOK_DISABLE_DEVICE_NODE_MODIFICATION):
        assert f"`{hook}" in section, hook
    for binary in cdi.DRIVER_BINARIES:
        assert binary in section, binary
    for pattern in cdi.DRIVER_LIBRARY_GLOBS:
        stem = pattern.removesuffix(".so*")
        assert stem in section, stem
    for node in cdi.CONTROL_NODES:
        assert f"`{node}`" in section, node
    assert "`NVIDIA_VISIBLE_DEVICES`" in section and "`void`" in section
    assert "`hook_path`" in section
