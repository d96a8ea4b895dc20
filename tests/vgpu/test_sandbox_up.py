"""`dra-sandbox up --vgpu sriov|mdev`: the sandbox's nodes become fake vGPU hosts whose plugins offer vGPUs
(the cluster configuration it starts, without starting it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver.commands.flags import FlagParser
from dra_sandbox.statedir import StateDir
from dra_sandbox.up import _cluster_config, add_arguments


def _config(tmp_path: Path, *argv: str) -> list[tuple[str, str, dict[str, str]]]:
    parser = FlagParser()
    add_arguments(parser)
    args = parser.parse_args(list(argv))
    config = _cluster_config(args, StateDir(tmp_path))
    return [(n.name, n.nvml, dict(n.plugin_env)) for n in config.nodes]


@pytest.mark.parametrize(("mode", "knobs"), [("sriov", ",vgpu=true"), ("mdev", ",vgpu=true,vgpu_mdev=true")])
def test_up_with_vgpu_makes_every_node_a_vgpu_host(tmp_path: Path, mode: str, knobs: str) -> None:
    for _, nvml, env in _config(tmp_path, "--vgpu", mode):
        assert nvml.endswith(knobs) and env["DRA_DRIVER_VGPU"] == "all"
    [(name, nvml, env)] = _config(tmp_path, "--vgpu", mode, "--nodes", "node-x=dgx-a100")
    assert (name, nvml, env) == ("node-x", f"fake:dgx-a100{knobs}", {"DRA_DRIVER_VGPU": "all"})


def test_up_without_vgpu_changes_nothing(tmp_path: Path) -> None:
    assert all("vgpu" not in nvml and "DRA_DRIVER_VGPU" not in env for _, nvml, env in _config(tmp_path))
