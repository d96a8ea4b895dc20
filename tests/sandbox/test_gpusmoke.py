"""`dra-sandbox gpu-smoke` (sandbox/dra_sandbox/gpusmoke.py): its skip/fail decision, and its steps on fake NVML
(the same code that runs on a real node, minus the container step): what it prepares, that every CDI spec goes,
that MIG mode never changes and that it destroys exactly the MIG instances it made."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from dra_driver.nvml.backend import NvmlBackend
from dra_driver.nvml.factory import open_backend
from dra_driver.nvml.types import NvmlUnavailableError, Placement
from dra_sandbox import cli
from dra_sandbox.gpusmoke import Decision, decide, nvidia_pci_gpus, smoke_main

REPO = Path(__file__).resolve().parents[2]


def pci_device(sysfs: Path, bus_id: str, vendor: str, pci_class: str) -> None:
    device = sysfs / "bus/pci/devices" / bus_id
    device.mkdir(parents=True)
    (device / "vendor").write_text(vendor + "\n")
    (device / "class").write_text(pci_class + "\n")


def run_smoke(*argv: str, open_nvml: object = None) -> tuple[int, list[str]]:
    args = cli.parser().parse_args(["gpu-smoke", *argv])
    out = io.StringIO()
    code = smoke_main(args, out=out, open_nvml=open_nvml)  # type: ignore[arg-type]
    return code, out.getvalue().splitlines()


class Unavailable:
    """An NVML whose init fails as on a machine without the driver."""

    def init(self) -> None:
        raise NvmlUnavailableError("NVML is unavailable: libnvidia-ml.so.1 was not found")


def mig_modes(backend: NvmlBackend) -> dict[str, bool | None]:
    return {g.uuid: (m.current if (m := backend.mig_mode(g.uuid)) else None) for g in backend.gpus()}


def test_nvidia_pci_gpus_finds_display_and_3d_controllers_of_nvidia_only(tmp_path: Path) -> None:
    pci_device(tmp_path, "0000:17:00.0", "0x10de", "0x030200")  # 3D controller (H100, A100 ...)
    pci_device(tmp_path, "0000:65:00.0", "0x10de", "0x030000")  # VGA (L4, workstation cards)
    pci_device(tmp_path, "0000:66:00.1", "0x10de", "0x040300")  # the same card's audio function
    pci_device(tmp_path, "0000:00:02.0", "0x8086", "0x030000")  # an Intel iGPU
    assert nvidia_pci_gpus(tmp_path) == ("0000:17:00.0", "0000:65:00.0")
    assert nvidia_pci_gpus(tmp_path / "nothing") == ()


def test_decide() -> None:
    assert decide((), "NVML: not found", None).skip is not None
    assert decide(("0000:17:00.0",), "NVML: DRIVER_NOT_LOADED", None) == Decision(
        fail="NVIDIA GPU(s) at 0000:17:00.0 but NVML: DRIVER_NOT_LOADED"
    )
    assert decide((), None, 0) == Decision(skip="NVML is available but reports no GPU")
    assert decide((), None, 2) == Decision()


def test_no_gpu_prints_one_skip_line_and_succeeds(tmp_path: Path) -> None:
    code, lines = run_smoke("--sysfs-root", str(tmp_path), open_nvml=lambda spec, root: Unavailable())
    assert code == 0
    assert lines == [
        "gpu-smoke: SKIP: no NVIDIA GPU on this machine (no PCI display/3D controller of vendor 0x10de; NVML: NVML "
        "is unavailable: libnvidia-ml.so.1 was not found)"
    ]


def test_a_gpu_nvml_cannot_open_fails(tmp_path: Path) -> None:
    pci_device(tmp_path, "0000:17:00.0", "0x10de", "0x030200")
    code, lines = run_smoke("--sysfs-root", str(tmp_path), open_nvml=lambda spec, root: Unavailable())
    assert code == 1
    assert len(lines) == 1 and lines[0].startswith("gpu-smoke: FAIL: NVIDIA GPU(s) at 0000:17:00.0 but NVML")


def test_make_gpu_smoke_here_skips_cleanly() -> None:
    """The real command on this machine: where it has no NVIDIA GPU, exactly one SKIP line and exit 0."""
    if nvidia_pci_gpus(Path("/sys")):
        pytest.skip("this machine has an NVIDIA GPU: `make gpu-smoke` runs for real here")
    proc = subprocess.run([sys.executable, "-m", "dra_sandbox", "gpu-smoke"], capture_output=True, text=True,
                          timeout=120, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-smoke: SKIP: no NVIDIA GPU on this machine"), proc.stdout


def test_whole_gpu_prepared_unprepared_and_every_spec_removed(tmp_path: Path) -> None:
    cdi = tmp_path / "cdi"
    code, lines = run_smoke("--nvml", "fake:a30x4", "--cdi-root", str(cdi))
    text = "\n".join(lines)
    assert code == 0, text
    assert "gpu-smoke: inventory: driver 580.105.08, 4 GPU(s)" in lines
    assert "gpu-smoke: published: 4 gpu" in lines
    assert any(line.startswith("gpu-smoke: prepared gpu-0 (GPU-") for line in lines), text
    assert "gpu-smoke: unprepared gpu-0: CDI spec removed" in lines
    assert "MIG step skipped (MIG mode is never changed here)" in text
    assert lines[-1].startswith("gpu-smoke: PASS: prepared and unprepared gpu-0 on ")
    assert list(cdi.iterdir()) == []  # the claim's spec and its metadata spec are gone


def test_mig_enabled_gpu_gets_an_instance_made_and_destroyed_and_mig_mode_kept(tmp_path: Path) -> None:
    spec = f"fake:dgx-a100,state={tmp_path / 'state.json'}"
    before = open_backend(spec)
    before.init()
    modes = mig_modes(before)
    before.shutdown()
    code, lines = run_smoke("--nvml", spec, "--cdi-root", str(tmp_path / "cdi"))
    text = "\n".join(lines)
    assert code == 0, text
    assert "gpu-smoke: published: 1 mig" in lines
    assert "whole GPU: none published with MIG off" in text
    assert any(line.startswith("gpu-smoke: MIG: created 1g.5gb") for line in lines), text
    assert any(line.startswith("gpu-smoke: prepared gpu-0-mig-1g5gb-") for line in lines), text
    assert any(line.startswith("gpu-smoke: MIG: destroyed GPU instance") for line in lines), text
    after = open_backend(spec)
    after.init()
    assert mig_modes(after) == modes and all(modes.values())
    assert all(after.gpu_instances(g.uuid) == [] for g in after.gpus())


def test_an_existing_mig_device_is_used_and_left_in_place(tmp_path: Path) -> None:
    spec = f"fake:dgx-a100,state={tmp_path / 'state.json'}"
    admin = open_backend(spec)
    admin.init()
    gpu = admin.gpus()[3]
    profile = min(admin.gpu_instance_profiles(gpu.uuid), key=lambda p: p.slice_count)
    gi = admin.create_gpu_instance(gpu.uuid, profile.id, Placement(profile.placements[0].start, 1))
    ci_profile = next(p for p in admin.compute_instance_profiles(gpu.uuid, gi.id) if p.slice_count == 1)
    admin.create_compute_instance(gpu.uuid, gi.id, ci_profile.id)
    existing = admin.mig_devices(gpu.uuid)
    admin.shutdown()
    code, lines = run_smoke("--nvml", spec, "--cdi-root", str(tmp_path / "cdi"))
    text = "\n".join(lines)
    assert code == 0, text
    assert "has MIG devices already; using one of them (nothing created)" in text
    assert "MIG: created" not in text and "MIG: destroyed" not in text
    assert any(line.startswith("gpu-smoke: prepared gpu-3-mig-") for line in lines), text
    after = open_backend(spec)
    after.init()
    assert after.mig_devices(gpu.uuid) == existing
