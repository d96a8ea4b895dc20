"""The sandbox's clean-up of a stopped node's CDI specs (`remove_node_specs`, run by the cluster's stop, `down` and
the upstream simulator): claims' specs and the device plugin's (`--device-plugin`), with their half-written temp files;
another node's and another driver's files are kept. A device-plugin spec left behind in /var/run/cdi once failed the
one-sandbox e2e test of a later run."""

from __future__ import annotations

from pathlib import Path

from dra_driver.deviceplugin.cdispecs import AllocationSpecs
from dra_sandbox.cluster import remove_node_specs

DRIVER = "gpu.dra.dev"
KEY = "d209dcda12539259f156"
UID = "11111111-2222-3333-4444-555555555555"


def _names(node: str) -> tuple[str, str]:
    specs = AllocationSpecs(Path("/unused"), DRIVER, node, lambda gpus: ((), None))  # type: ignore[arg-type,return-value]
    return f"k8s.{DRIVER}-claim_{node}_{UID}.json", specs.file_name(KEY)


def test_a_nodes_claim_and_device_plugin_specs_go_and_anothers_stay(tmp_path: Path) -> None:
    claim_n1, plugin_n1 = _names("n1")
    claim_n2, plugin_n2 = _names("n2")
    other_driver = f"k8s.other.example.com-deviceplugin_n1_{KEY}.json"
    temp_n1 = f".{plugin_n1}.a1b2c3d4.tmp"
    for name in (claim_n1, plugin_n1, claim_n2, plugin_n2, other_driver, temp_n1):
        (tmp_path / name).write_text("{}")

    removed = remove_node_specs(tmp_path, DRIVER, ["n1"])

    assert sorted(removed) == sorted([UID, KEY])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([claim_n2, plugin_n2, other_driver])
