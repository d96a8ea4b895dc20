"""REAL containers from RealCdiEdits' spec for a fake 570-series driver root (podman as the CDI consumer).

A CUDA container finds libcuda.so.1, libnvidia-ml.so.1 and nvidia-smi: the stand-in nvidia-smi (a real ELF linked
against libnvidia-ml.so.1, dlopening libcuda.so.1) runs by PATH lookup and reports where the container's dynamic
loader found each library, once as a Debian-family image (loader's system search path) and once as a CUDA image
(its LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64). A MIG container gets only its own
/dev/nvidia-caps entries. The fake device nodes are plain files, so the spec's device-node host paths are pointed at
/dev/null before podman reads it (what the fake CDI path does for VFIO nodes); nothing else in the spec is changed.
Skipped, with the reason, where podman cannot run containers, /var/run/cdi is not writable or gcc is missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from dra_driver.inventory.catalog import AllocatableDevice, MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.nvml.factory import open_backend
from dra_driver.plugin.cdi import ClaimSpecWriter, DeviceForCdi
from dra_driver.plugin.cdidriverfiles import RealCdiEdits
from dra_sandbox.fakedriverroot import DRIVER_VERSION, LIB_DIR, FakeDriverRoot, build_driver_root, compile_stand_ins
from dra_sandbox.runtime import ContainerRequest, PodmanRuntime
from dra_sandbox.runtime.podman import BASE_RUN_ARGS

pytestmark = [pytest.mark.podman, pytest.mark.xdist_group("system-cdi")]
CDI_DIR = Path("/var/run/cdi")
LIB = f"/{LIB_DIR}"


@dataclass(frozen=True)
class Rig:
    podman: PodmanRuntime
    global_args: tuple[str, ...]
    work: Path


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    work = Path(tempfile.mkdtemp(prefix="dra-cdi-fake-", dir="/tmp"))
    try:
        podman = PodmanRuntime(work_dir=work / "rt")
        availability = podman.availability()
        if not availability.usable:
            pytest.skip(f"podman not usable: {availability.reason}")
        try:
            CDI_DIR.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            pytest.skip(f"cannot create {CDI_DIR} (podman reads CDI specs only there and in /etc/cdi): {exc}")
        if not os.access(CDI_DIR, os.W_OK):
            pytest.skip(f"{CDI_DIR} is not writable (needs root)")
        if shutil.which("gcc") is None:
            pytest.skip("gcc is not installed (it builds the stand-in libcuda, libnvidia-ml and nvidia-smi)")
        yield Rig(podman, availability.global_args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def devices() -> Iterator[Mapping[str, AllocatableDevice]]:
    backend = open_backend("fake:dgx-h100")
    backend.init()
    try:
        yield catalog(discover(backend), MigOffering.DYNAMIC)
    finally:
        backend.shutdown()


@pytest.fixture
def publish(rig: Rig) -> Iterator[list[Path]]:
    written: list[Path] = []
    yield written
    for path in written:
        path.unlink(missing_ok=True)


def publish_spec(tree: FakeDriverRoot, device: DeviceForCdi, base: Path, written: list[Path]) -> str:
    """Write the claim's spec as the plugin would, device nodes pointed at /dev/null, into /var/run/cdi."""
    driver = f"t{uuid.uuid4().hex[:10]}.cdi-compare.example.com"
    writer = ClaimSpecWriter(base / "cdi", driver, RealCdiEdits(tree.root, tree.root, tree.dev_root, tree.proc_root),
                             "n1")
    claim_uid = str(uuid.uuid4())
    cdi_id = writer.write(claim_uid, [device])[device.allocatable.name]
    spec = json.loads(writer.spec_path(claim_uid).read_text())
    for edits in (spec["containerEdits"], *(d["containerEdits"] for d in spec["devices"])):
        for node in edits.get("deviceNodes", []):
            node["hostPath"] = "/dev/null"
    target = CDI_DIR / writer.file_name(claim_uid)
    target.write_text(json.dumps(spec))
    written.append(target)
    return cdi_id


def loader_rootfs(base: Path, program: Path) -> Path:
    """A rootfs with only glibc's loader and the libraries `program` needs besides the driver's (a minimal image)."""
    root = base / "rootfs"
    proc = subprocess.run(["ldd", str(program)], capture_output=True, text=True, check=True, timeout=30)
    for line in proc.stdout.splitlines():
        match = re.search(r"(/\S+) \(0x", line)
        if match is None or "libnvidia-ml" in line:
            continue
        source = Path(match.group(1))
        # The interpreter goes where the ELF names it; libc and the rest where a Debian image has them.
        dest = root / str(source).lstrip("/") if "=>" not in line else root / "lib/x86_64-linux-gnu" / source.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source.resolve(), dest)
    return root


def run_in_container(rig: Rig, cdi_id: str, rootfs: Path, env: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    argv = ["podman", *rig.global_args, *BASE_RUN_ARGS]
    for item in env:
        argv += ["--env", item]
    argv += ["--device", cdi_id, "--rootfs", str(rootfs), "nvidia-smi"]  # found through the container's PATH
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def whole_gpu(devices: Mapping[str, AllocatableDevice]) -> DeviceForCdi:
    device = devices["gpu-1"]
    return DeviceForCdi(device, device.gpu.uuid, "Exclusive", ("gpu",))


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the fake tree has the x86_64 Debian library dir")
def test_cuda_container_finds_libcuda_libnvidia_ml_and_nvidia_smi(rig: Rig, devices: Mapping[str, AllocatableDevice],
                                                                  publish: list[Path], tmp_path: Path) -> None:
    tree = build_driver_root(tmp_path / "node")
    compile_stand_ins(tree)
    cdi_id = publish_spec(tree, whole_gpu(devices), tmp_path, publish)
    rootfs = loader_rootfs(tmp_path, tree.root / "usr/bin/nvidia-smi")

    # A Debian-family image: the loader's system search path has the driver's library dir.
    plain = run_in_container(rig, cdi_id, rootfs)
    assert plain.returncode == 0, plain.stderr
    assert f"NVML {LIB}/libnvidia-ml.so.1 {DRIVER_VERSION}" in plain.stdout.splitlines()
    assert f"CUDA {LIB}/libcuda.so.1 12080" in plain.stdout.splitlines()

    # A CUDA image (any distribution): its own LD_LIBRARY_PATH names /usr/local/nvidia/lib64.
    cuda_image = run_in_container(rig, cdi_id, loader_rootfs(tmp_path / "b", tree.root / "usr/bin/nvidia-smi"),
                                  env=("LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64",))
    assert cuda_image.returncode == 0, cuda_image.stderr
    assert f"NVML /usr/local/nvidia/lib64/libnvidia-ml.so.1 {DRIVER_VERSION}" in cuda_image.stdout.splitlines()
    assert "CUDA /usr/local/nvidia/lib64/libcuda.so.1 12080" in cuda_image.stdout.splitlines()


def test_mig_container_gets_only_its_own_caps_and_the_driver_files(rig: Rig, devices: Mapping[str, AllocatableDevice],
                                                                  publish: list[Path], tmp_path: Path) -> None:
    tree = build_driver_root(tmp_path / "node")
    tree.add_mig_instance(minor=0, gi=13, ci=0, gi_cap_minor=111, ci_cap_minor=112)
    tree.add_mig_instance(minor=0, gi=14, ci=0, gi_cap_minor=120, ci_cap_minor=121)  # another claim's instance
    device = devices["gpu-0-mig-1g10gb-19-6"]
    mig = DeviceForCdi(device, "MIG-2f1e0a52-9c1d-5e2b-8a77-0d3e6b1c4f10", "Exclusive", ("mig",),
                       gpu_instance_id=13, compute_instance_id=0)
    cdi_id = publish_spec(tree, mig, tmp_path, publish)
    spec = json.loads(publish[0].read_text())
    caps_in_spec = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"] if "caps" in n["path"]]
    assert caps_in_spec == ["/dev/nvidia-caps/nvidia-cap111", "/dev/nvidia-caps/nvidia-cap112"]

    paths = (f"{LIB}/libcuda.so.1", f"{LIB}/libnvidia-ml.so.1", "/usr/bin/nvidia-smi",
             "/usr/local/nvidia/lib64/libcuda.so.1")
    result = rig.podman.run(ContainerRequest("mig", cdi_devices=(cdi_id,), inspect_paths=paths))
    assert result.ok, result.error
    nodes = {d.path for d in result.device_nodes}
    assert {p for p in nodes if p.startswith("/dev/nvidia-caps/")} == {"/dev/nvidia-caps/nvidia-cap111",
                                                                       "/dev/nvidia-caps/nvidia-cap112"}
    assert "/dev/nvidia0" in nodes and "/dev/nvidia1" not in nodes and "/dev/nvidiactl" in nodes
    # Each name is bound to the versioned real file (the file's content is its own real name).
    assert result.files[f"{LIB}/libcuda.so.1"] == f"libcuda.so.{DRIVER_VERSION}"
    assert result.files["/usr/local/nvidia/lib64/libcuda.so.1"] == f"libcuda.so.{DRIVER_VERSION}"
    assert result.files[f"{LIB}/libnvidia-ml.so.1"] == f"libnvidia-ml.so.{DRIVER_VERSION}"
    assert result.files["/usr/bin/nvidia-smi"] == f"nvidia-smi {DRIVER_VERSION}"
    assert result.env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert "LD_LIBRARY_PATH" not in result.env
