"""What a kubelet plugin on the fake NVML loads at start (docs/benchmarks.md "Kubelet-plugin start-up"): the plugin's
RSS at rest and its CPU to registered are measured on the fake dgx-h100, so the fake must not bring pydantic or YAML
(its node and state files are read by hand, nvml/fake/docread.py), and the device plugin, off by default, is loaded
only where `--device-plugin on` asks for it; the slice publisher loads after the kubelet sockets are up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

NOT_AT_START = (
    "pydantic",
    "pydantic_core",
    "yaml",
    "dra_driver.plugin.devicepluginparts",
    "dra_driver.deviceplugin.server",
    "dra_driver._gen.deviceplugin_v1beta1_pb2",
    "dra_driver._gen.podresources_v1_pb2",
    # Imported when publishing starts, after the kubelet sockets are up.
    "dra_driver.slices.publisher",
    "dra_driver.kubeletplugin.publishlease",
)


def test_a_plugin_on_a_fake_preset_loads_neither_pydantic_nor_yaml_nor_the_device_plugin(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "import dra_driver.cli, dra_driver.commands.kubelet_plugin, dra_driver.plugin.app\n"
        "from dra_driver.nvml.factory import open_backend\n"
        "from dra_driver.inventory.discover import discover\n"
        "nvml = open_backend('fake:dgx-h100,state=state.json')\n"
        "nvml.init()\n"
        "assert len(discover(nvml).gpus) == 8\n"
        f"print(sorted(m for m in {NOT_AT_START!r} if m in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
