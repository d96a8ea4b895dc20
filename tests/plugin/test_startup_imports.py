"""What a kubelet plugin on the fake NVML loads at start (docs/benchmarks.md "Kubelet-plugin start-up"): the plugin's
RSS at rest and its CPU to registered are measured on the fake dgx-h100, so the fake must not bring pydantic or YAML
(its node and state files are read by hand, nvml/fake/docread.py), and the device plugin, off by default, is loaded
only where `--device-plugin on` asks for it; the slice publisher loads after the kubelet sockets are up. Nor does a
plugin process, up to the moment its kubelet sockets serve, load what the default configuration on the fake uses only
after them or never (docs/perf-findings.md "Start-up")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from dra_sandbox.apiserver import ApiServer

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

# Not loaded by a plugin process (fake dgx-h100, default flags) until its kubelet sockets serve: the host's driver layout
# (not checked on the fake), the NVML event monitor (built and started after the sockets), the device plugin's claim
# guard and published-GPU annotation (`--device-plugin on` only).
NOT_BEFORE_SOCKETS = (
    *NOT_AT_START,
    "dra_driver.plugin.driverlayout",
    "dra_driver.plugin.health.monitor",
    "dra_driver.deviceplugin.claimguard",
    "dra_driver.deviceplugin.gpus",
    "dra_driver.deviceplugin.ownership",
    "dra_driver.deviceplugin.published",
)

# The plugin's own entry point; the moment `PluginServer.start` returns (both sockets serving) the child prints which
# of NOT_BEFORE_SOCKETS it has loaded and exits.
_UP_TO_THE_SOCKETS = """
import json, os, sys
import dra_driver.kubeletplugin.server as server

start = server.PluginServer.start

def started(self):
    start(self)
    print(json.dumps(sorted(m for m in NAMES if m in sys.modules)), flush=True)
    os._exit(0)

server.PluginServer.start = started
from dra_driver.cli import main
sys.exit(main(["kubelet-plugin"]))
"""


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


def test_a_plugin_process_loads_none_of_the_after_the_sockets_modules_before_them(tmp_path: Path) -> None:
    (tmp_path / "boot_id").write_text("b\n")
    with ApiServer() as srv:
        yaml_config = tmp_path / "kubeconfig.yaml"
        srv.write_kubeconfig(yaml_config)
        # JSON, as the in-cluster configuration: a YAML kubeconfig would load PyYAML, itself on the list.
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(json.dumps(yaml.safe_load(yaml_config.read_text())))
        env = {k: v for k, v in os.environ.items() if not k.startswith("DRA_DRIVER_")}
        env.update(
            {
                "PYTHONPATH": str(ROOT),
                "DRA_DRIVER_NODE_NAME": "node-start",
                "DRA_DRIVER_KUBECONFIG": str(kubeconfig),
                "DRA_DRIVER_PLUGIN_DIR": str(tmp_path / "plugin"),
                "DRA_DRIVER_REGISTRY_DIR": str(tmp_path / "registry"),
                "DRA_DRIVER_CDI_ROOT": str(tmp_path / "cdi"),
                "DRA_DRIVER_NVML": f"fake:dgx-h100,state={tmp_path / 'state.json'}",
                "DRA_DRIVER_HEALTHZ_PORT": "-1",
                "DRA_DRIVER_BOOT_ID_PATH": str(tmp_path / "boot_id"),
                "DRA_DRIVER_LOG_LEVEL": "warning",
            }
        )
        code = f"NAMES = {NOT_BEFORE_SOCKETS!r}\n" + _UP_TO_THE_SOCKETS
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=tmp_path, env=env, timeout=120
        )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
