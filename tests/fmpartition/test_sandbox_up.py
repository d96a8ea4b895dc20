"""`dra-sandbox up --fabric-partitions`: the sandbox's nodes' fake Fabric Manager offers partitions and their plugins
offer them (the cluster configuration it starts, without starting it)."""

from __future__ import annotations

from pathlib import Path

from dra_driver.commands.flags import FlagParser
from dra_sandbox.statedir import StateDir
from dra_sandbox.up import _cluster_config, add_arguments


def _config(tmp_path: Path, *argv: str) -> list[tuple[str, str, dict[str, str]]]:
    parser = FlagParser()
    add_arguments(parser)
    config = _cluster_config(parser.parse_args(list(argv)), StateDir(tmp_path))
    return [(n.name, n.nvml, dict(n.plugin_env)) for n in config.nodes]


def test_up_with_fabric_partitions_makes_every_node_offer_them(tmp_path: Path) -> None:
    nodes = _config(tmp_path, "--fabric-partitions")
    assert nodes and all(
        nvml.endswith(",fabric_partitions=true") and env["DRA_DRIVER_FABRIC_PARTITIONS"] == "on" for _, nvml, env in nodes
    )
    [(name, nvml, env)] = _config(tmp_path, "--fabric-partitions", "--nodes", "node-x=dgx-h100")
    assert (name, nvml, env) == ("node-x", "fake:dgx-h100,fabric_partitions=true", {"DRA_DRIVER_FABRIC_PARTITIONS": "on"})


def test_up_without_fabric_partitions_changes_nothing(tmp_path: Path) -> None:
    assert all("fabric" not in nvml and "DRA_DRIVER_FABRIC_PARTITIONS" not in env for _, nvml, env in _config(tmp_path))
