"""`dra-driver status` on a node whose Fabric Manager offers partitions: a held partition is listed as the node's (it
spans GPUs) with its size and holders, and no bogus GPU is made of the partitions, which have no one GPU's uuid
(dra_driver/commands/statusview.py)."""

from __future__ import annotations

from typing import Any

from dra_driver.commands.statusview import build_status, readable_claims, render

D = "gpu.dra.dev"


def _gpu(minor: int) -> dict[str, Any]:
    attrs = {"type": {"string": "gpu"}, "productName": {"string": "NVIDIA H100"}, "minor": {"int": minor},
             "uuid": {"string": f"GPU-{minor}"}}  # fmt: skip
    return {"name": f"gpu-{minor}", "attributes": attrs}


def _partition(pid: int, *members: int) -> dict[str, Any]:
    """As the plugin publishes it: the members named only in its fabric counter consumption."""
    attrs = {"type": {"string": "fm-partition"}, "productName": {"string": "NVIDIA H100"},
             "partitionID": {"int": pid}, "gpuCount": {"int": len(members)}}  # fmt: skip
    counters = {f"gpu-{m}": {"value": "3"} for m in members}
    return {"name": f"fm-partition-{pid}", "attributes": attrs,
            "consumesCounters": [{"counterSet": "fabric-partitions-counter-set", "counters": counters}]}  # fmt: skip


def test_a_held_partition_is_listed_as_the_nodes() -> None:
    devices = [_gpu(0), _gpu(1), _gpu(2), _partition(0, 0, 1), _partition(1, 0), _partition(2, 1)]
    slices = [
        {
            "spec": {
                "driver": D,
                "nodeName": "n1",
                "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
                "devices": devices,
            }
        }
    ]
    result = {"driver": D, "pool": "n1", "device": "fm-partition-0", "request": "partition"}
    claim = {
        "metadata": {"namespace": "vms", "name": "vm1"},
        "status": {
            "allocation": {"devices": {"results": [result]}},
            "reservedFor": [{"resource": "pods", "name": "virt-launcher-vm1", "uid": "u"}],
        },
    }
    claims, problems = readable_claims([claim])
    assert problems == []
    pods = [{"metadata": {"namespace": "vms", "name": "virt-launcher-vm1"}, "status": {"phase": "Running"}}]
    [node] = build_status(slices, claims, pods, driver=D)
    assert [g.name for g in node.gpus] == ["gpu-0", "gpu-1", "gpu-2"]  # no GPU made of the partitions
    # The held partition's members are marked (named by its fabric counters), the others not.
    assert [(g.name, g.partition) for g in node.gpus] == [("gpu-0", "fm-partition-0"), ("gpu-1", "fm-partition-0"),
                                                          ("gpu-2", "")]  # fmt: skip
    assert [(p.name, p.type, p.profile, [h.claim for h in p.holders]) for p in node.partitions] == [
        ("fm-partition-0", "fm-partition", "2 GPUs", ["vms/vm1"])
    ]
    table = render([node], "", driver=D)
    [row] = [line for line in table.splitlines() if " fm-partition-0 " in line and "2 GPUs" in line]
    assert "2 GPUs" in row and "vms/vm1 <- vms/virt-launcher-vm1 (Running)" in row
    assert "fm-partition-1" not in table  # free partitions are not listed, as free vGPU slots are not
    rows = {w[w.index(name)]: w[-4:] for w in (line.split() for line in table.splitlines())
            for name in ("gpu-0", "gpu-1", "gpu-2") if name in w}  # fmt: skip
    assert rows == {"gpu-0": ["fm-partition", "-", "in", "fm-partition-0"],
                    "gpu-1": ["fm-partition", "-", "in", "fm-partition-0"], "gpu-2": ["Healthy", "exclusive", "-", "-"]}  # fmt: skip
    wide = render([node], "wide", driver=D)
    assert "fm-partition-0" in wide
    assert '"partitions"' in render([node], "json", driver=D)


def test_members_come_only_from_the_fabric_counters_and_hostile_shapes_are_ignored() -> None:
    from dra_driver.commands.statusview import partition_members

    assert partition_members(_partition(0, 10, 2, 1)) == ("gpu-1", "gpu-2", "gpu-10")
    other_set = {"consumesCounters": [{"counterSet": "gpu-0-counter-set", "counters": {"memory": {"value": "1"}}}]}
    assert partition_members(other_set) == ()
    for hostile in ({"consumesCounters": "x"}, {"consumesCounters": [None, 3]},
                    {"consumesCounters": [{"counterSet": "fabric-partitions-counter-set", "counters": ["gpu-0"]}]}):  # fmt: skip
        assert partition_members(hostile) == ()
