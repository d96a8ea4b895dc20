"""A hundred claims prepared by a hundred concurrent NodePrepareResources calls on one node (104 GPUs), as
the kubelet does when many pods land at once; then all unprepared concurrently."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from dra_sandbox.cluster import NodeSpec, SandboxCluster
from tests.integration.conftest import NODE, allocated_claim, checkpoint, dra_client, sandbox, spec_files


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxCluster]:
    node_file = tmp_path_factory.mktemp("wide") / "wide-node.yaml"
    node_file.write_text(
        'name: wide\ndriver_version: "580.105.08"\ncuda_driver_version: 13000\nnuma_nodes:\n  0: "0-63"\n'
        "nvlink: none\nfabric: none\ngpus:\n  - model: L4\n    count: 104\n"
    )
    with sandbox("dra-100-", [NodeSpec(NODE, f"fake:{node_file}", mig_mode="none")]) as c:
        yield c


def test_a_hundred_concurrent_prepares(cluster: SandboxCluster) -> None:
    refs = [allocated_claim(cluster, [f"gpu-{i}"]) for i in range(100)]
    channel, client = dra_client(cluster)
    with ThreadPoolExecutor(100) as pool:
        prepared = list(pool.map(lambda r: client.prepare([r])[r.uid], refs))
    assert all(p.ok for p in prepared), [p.error for p in prepared if not p.ok][:3]
    assert sorted(p.devices[0].device for p in prepared) == sorted(f"gpu-{i}" for i in range(100))
    cp = checkpoint(cluster)
    assert len(cp.claims) == 100 and all(len(spec_files(cluster, r.uid)) == 1 for r in refs)
    with ThreadPoolExecutor(100) as pool:
        released = list(pool.map(lambda r: client.unprepare([r])[r.uid], refs))
    assert released == [None] * 100
    assert checkpoint(cluster).claims == {}
    assert not any(spec_files(cluster, r.uid) for r in refs)
    channel.close()
