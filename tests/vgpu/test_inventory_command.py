"""`dra-driver inventory --slices --vgpu`: a vGPU host's slices, as the plugin would publish them, are what a real API
server's schema accepts (1.35 layout), with the vGPU slots after each GPU's own devices; a bad --vgpu names the flag."""

from __future__ import annotations

import json
import subprocess
import sys

from tests import kubeschema


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dra_driver.cli", "inventory", *args], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip


def test_vgpu_slices_are_what_a_real_api_server_accepts() -> None:
    out = _run("--nvml", "fake:l4x2,vgpu=true", "--vgpu", "all", "--slices", "--node-name", "n", "-o", "json")
    assert out.returncode == 0, out.stderr
    items = json.loads(out.stdout)["items"]
    for item in items:
        kubeschema.validate(item, "1.35.0")
    devices = [d for item in items for d in item["spec"].get("devices", [])]
    names = [d["name"] for d in devices if d["name"].startswith("gpu-0")]
    assert names[0] == "gpu-0" and names[1:] == [f"gpu-0-vgpu-l4-{size}c-{slot}" for size, count in
                                                 (("24", 1), ("12", 2), ("6", 4), ("3", 8)) for slot in range(count)]
    sets = {s["name"]: s for item in items for s in item["spec"].get("sharedCounters", [])}
    assert set(sets) == {"gpu-0-counter-set", "gpu-1-counter-set"}
    plain = _run("--nvml", "fake:l4x2,vgpu=true", "--slices", "--node-name", "n", "-o", "json")
    assert not any("vgpu" in d["name"] for item in json.loads(plain.stdout)["items"]
                   for d in item["spec"].get("devices", []))  # fmt: skip  # --vgpu none: nothing changes


def test_a_bad_vgpu_flag_names_it() -> None:
    out = _run("--nvml", "fake:l4x2,vgpu=true", "--vgpu", "MIG-1", "--slices")
    assert out.returncode == 2 and "--vgpu 'MIG-1'" in out.stderr
