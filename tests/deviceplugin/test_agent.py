"""The agent alone (no gRPC, no plugin): what it lists, when it releases, what it adopts, and what it never does on a
guess (PodResources silent, IDs it does not offer, allocations younger than the grace)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from dra_driver.cdi.model import ContainerEdits
from dra_driver.deviceplugin.agent import AgentSources, AllocateRefused, DevicePluginAgent
from dra_driver.deviceplugin.cdispecs import AllocationSpecs
from dra_driver.deviceplugin.ownership import OwnershipFile
from dra_driver.inventory.catalog import AllocatableDevice, MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.kubeletplugin.driver import DeviceHealth, HealthSnapshot
from dra_driver.nvml.factory import open_backend


class Node:
    def __init__(self, tmp: Path) -> None:
        backend = open_backend("fake:dgx-h100")
        backend.init()
        self.catalog: Mapping[str, AllocatableDevice] = catalog(discover(backend), MigOffering.STATIC)
        self.dra: set[str] = set()
        self.unhealthy: set[str] = set()
        self.republished = 0
        self.now = 1000.0
        specs = AllocationSpecs(tmp / "cdi", "gpu.dra.dev", "n1",
                                lambda gpus: (tuple(ContainerEdits(env=(f"G={g.gpu.uuid}",)) for g in gpus),
                                              ContainerEdits()))  # fmt: skip
        self.agent = DevicePluginAgent(
            AgentSources(catalog=lambda: self.catalog, health=self.health, dra_gpus=lambda: set(self.dra),
                         republish=self.republish),
            OwnershipFile(tmp / "own.json"), specs, grace=10.0, clock=lambda: self.now,
        )  # fmt: skip

    def health(self) -> HealthSnapshot:
        return HealthSnapshot(1, tuple(DeviceHealth("n1", n, False, 0) for n in sorted(self.unhealthy)))

    def republish(self) -> None:
        self.republished += 1

    def uuid(self, name: str) -> str:
        return self.catalog[name].gpu.uuid


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def test_the_list_is_every_whole_gpu_unhealthy_where_the_board_says_or_dra_holds_it(node: Node) -> None:
    node.unhealthy = {"gpu-2"}
    node.dra = {node.uuid("gpu-5")}
    listed = {d.id: d.health for d in node.agent.devices()}
    assert len(listed) == 8
    assert {i for i, h in listed.items() if h == "Unhealthy"} == {node.uuid("gpu-2"), node.uuid("gpu-5")}


def test_allocate_writes_one_spec_per_container_and_answers_its_names(node: Node) -> None:
    a, b = node.uuid("gpu-0"), node.uuid("gpu-1")
    [names] = node.agent.allocate([[a, b]])
    assert [n.rsplit("-", 2)[-2:] for n in names] == [["gpu", "0"], ["gpu", "1"]]
    assert node.agent.withheld() == {a, b} and node.republished == 1
    [spec] = (node.agent.specs.cdi_root).iterdir()
    assert f"G={a}" in spec.read_text() and f"G={b}" in spec.read_text()
    assert node.agent.allocate([[b, a]]) == [names]  # the same GPUs again (a restarted pod): the same names


def test_allocate_refuses_what_dra_holds_and_ids_it_does_not_offer(node: Node) -> None:
    node.dra = {node.uuid("gpu-4")}
    with pytest.raises(AllocateRefused, match=r"gpu-4.*prepared for a ResourceClaim") as held:
        node.agent.allocate([[node.uuid("gpu-4")]])
    assert not held.value.invalid
    with pytest.raises(AllocateRefused, match=r"container_requests\[1\]\.devices_ids\[0\]") as unknown:
        node.agent.allocate([[node.uuid("gpu-0")], ["GPU-elsewhere"]])
    assert unknown.value.invalid
    assert node.agent.withheld() == frozenset()  # a refused call records nothing, not even its valid part


def test_reconcile_releases_only_what_pod_resources_stopped_listing_after_the_grace(node: Node) -> None:
    a, b = node.uuid("gpu-0"), node.uuid("gpu-1")
    node.agent.allocate([[a], [b]])
    node.now += 5.0
    node.agent.reconcile({})  # younger than the grace: the kubelet may not list it yet
    assert node.agent.withheld() == {a, b}
    node.now += 10.0
    node.agent.reconcile(None)  # PodResources did not answer: nothing on a guess
    assert node.agent.withheld() == {a, b}
    node.agent.reconcile({b: ()})
    assert node.agent.withheld() == {b}
    assert len(list(node.agent.specs.cdi_root.iterdir())) == 1  # a's spec went with it


def test_reconcile_adopts_what_pods_hold_but_only_gpus_it_offers(node: Node) -> None:
    held = node.uuid("gpu-7")
    node.agent.reconcile(dict.fromkeys({held, "GPU-not-on-this-node", "../../etc"}, ()))
    assert node.agent.withheld() == {held}
    assert node.agent.ownership.load().allocated[held].spec == ""  # no spec of ours: the old plugin's allocation


def test_what_a_crash_leaves_is_cleared_by_the_next_reconcile(node: Node) -> None:
    """Crash points: a spec written but no record (killed inside Allocate) is removed; a DRA reservation whose
    claim never reached the checkpoint (killed between the claim guard and the engine) goes after the grace, one
    the checkpoint names stays."""
    orphan = node.agent.specs.write("0123456789abcdef0123", [node.catalog["gpu-3"]])
    gone, kept = node.uuid("gpu-4"), node.uuid("gpu-5")
    with node.agent.ownership.change() as changing:
        changing.new = changing.old.with_reserved("claim-a", {gone}, node.now).with_reserved("claim-b", {kept},
                                                                                              node.now)  # fmt: skip
    node.dra = {kept}  # claim-b's record is in the checkpoint
    node.agent.reconcile(None)
    assert not list(node.agent.specs.cdi_root.iterdir()), orphan
    assert set(node.agent.ownership.load().dra) == {gone, kept}  # within the grace: the engine may still be writing
    node.now += 10.0
    node.agent.reconcile(None)
    assert set(node.agent.ownership.load().dra) == {kept}
