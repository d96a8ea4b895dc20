"""`dra-driver status`'s pure part, on hand-made API objects."""

from __future__ import annotations

from typing import Any

from dra_driver.commands.statusview import build_status, render

D = "gpu.dra.dev"


def _device(name: str, type_: str, uuid: str, **extra: Any) -> dict[str, Any]:
    attrs = {"type": {"string": type_}, "productName": {"string": "NVIDIA L4"}, "minor": {"int": 0}}
    attrs["parentUUID" if type_ == "mig" else "uuid"] = {"string": uuid}
    return {"name": name, "attributes": attrs, **extra}


def _slice(node: str, generation: int, devices: list[dict[str, Any]]) -> dict[str, Any]:
    pool = {"name": node, "generation": generation, "resourceSliceCount": 1}
    return {"spec": {"driver": D, "nodeName": node, "pool": pool, "devices": devices}}


def test_shares_strategies_and_only_the_newest_generation() -> None:
    taint = {"key": f"{D}/ecc", "value": "double-bit", "effect": "NoSchedule"}
    slices = [
        _slice("n1", 1, [_device("gpu-0", "gpu", "GPU-A", taints=[taint])]),  # the old generation
        _slice("n1", 2, [_device("gpu-0", "gpu", "GPU-A"), _device("gpu-0-shared", "gpu-share", "GPU-A")]),
        {"spec": {"driver": "other.dev", "nodeName": "n1", "pool": {"name": "n1", "generation": 9}, "devices": []}},
    ]
    config = {"opaque": {"driver": D, "parameters": {"sharing": {"strategy": "MPS"}}}, "requests": []}
    def claim(i: int) -> dict[str, Any]:
        result = {"driver": D, "pool": "n1", "device": "gpu-0-shared", "request": "r0", "shareID": f"s{i}"}
        return {
            "metadata": {"namespace": "ml", "name": f"c{i}"},
            "status": {
                "allocation": {"devices": {"results": [result], "config": [config]}},
                "reservedFor": [{"resource": "pods", "name": f"p{i}", "uid": "u"}],
            },
        }

    claims = [claim(1), claim(2)]
    pods = [{"metadata": {"namespace": "ml", "name": "p1"}, "status": {"phase": "Running"}}]
    [node] = build_status(slices, claims, pods, driver=D)
    [gpu] = node.gpus
    assert (gpu.name, gpu.health, gpu.sharing, gpu.taints) == ("gpu-0", "Healthy", "shares", ())
    assert [(h.claim, h.pods, h.share, h.sharing) for h in gpu.holders] == [
        ("ml/c1", ("ml/p1 (Running)",), "s1", "MPS"),
        ("ml/c2", ("ml/p2",), "s2", "MPS"),
    ]
    table = render([node], "", driver=D)
    assert "ml/c1 [share s1, MPS] <- ml/p1 (Running); ml/c2 [share s2, MPS] <- ml/p2" in table
    assert build_status(slices, claims, pods, driver=D, nodes=["n2"]) == []
    assert "gpu-0-shared" in render([node], "yaml", driver=D)


def test_a_gpu_in_mig_mode_and_a_tainted_mig_device() -> None:
    taint = {"key": f"{D}/xid", "value": "94", "effect": "NoSchedule"}
    slices = [_slice("n1", 1, [_device("gpu-0-mig-1g", "mig", "GPU-A", taints=[taint]),
                               _device("gpu-0-mig-2g", "mig", "GPU-A")])]  # fmt: skip
    [node] = build_status(slices, [], [], driver=D)
    [gpu] = node.gpus
    assert (gpu.name, gpu.sharing, gpu.mig_devices, gpu.mig_allocated) == ("gpu-0", "mig", 2, 0)
    assert [(m.name, m.health, m.taints) for m in gpu.mig] == [
        ("gpu-0-mig-1g", "Unhealthy", (f"{D}/xid=94:NoSchedule",))
    ]
    assert "xid=94:NoSchedule" in render([node], "wide", driver=D)
