"""The GPU plugin's CDI specs are durable before the kubelet's answer, with one fsync of the CDI dir per prepare.

The engine's claim spec is renamed into the CDI dir without the directory's fsync (`ClaimSpecWriter(defer_sync=
True)`); with device metadata on, the metadata spec written after it fsyncs the dir once for both; with it off, the
pipeline's `DurableSpecs` does. An unprepare's removals fsync no directory, nor does a checkpoint write where the
boot id is known (docs/architecture.md "Durable files").
Recorded with a fake of the primitives (tests/durability.py) in a whole plugin against the sandbox API server."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from dra_driver import fsutil
from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering
from dra_driver.k8s.client import KubeRest
from dra_driver.kubeletplugin.driver import ClaimRef, PrepareResult
from dra_driver.kubeletplugin.pipeline import PrepareOutcome, UnprepareOutcome
from dra_driver.nvml.factory import open_backend
from dra_driver.plugin.app import KubeletPlugin
from dra_driver.plugin.cdi import DurableSpecs
from dra_driver.plugin.devicemetadata import DeviceMetadataMode
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.objects import create_allocated_claim
from tests.durability import DurabilityLog, Op, durable_renames
from tests.plugin.conftest import plugin_settings

NODE = "n1"


@pytest.fixture(params=[DeviceMetadataMode.ON, DeviceMetadataMode.OFF], ids=["metadata-on", "metadata-off"])
def running(request: pytest.FixtureRequest, work: Path) -> Iterator[tuple[KubeletPlugin, ApiServer]]:
    backend = open_backend("fake:dgx-h100")
    backend.init()
    settings = replace(plugin_settings(work, NODE, MigOffering.STATIC), usage_interval=0,
                       device_metadata=request.param)  # fmt: skip
    with ApiServer(kube_version="1.36.0") as server:
        server.rest().request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node",
                                                              "metadata": {"name": NODE}})  # fmt: skip
        plugin = KubeletPlugin(settings, nvml=backend, rest=KubeRest(server.connection()))
        plugin.start()
        try:
            yield plugin, server
        finally:
            plugin.stop()


def _claim(server: ApiServer, name: str, device: str) -> ClaimRef:
    claim = create_allocated_claim(server.rest(), namespace="default", name=name, driver=DRIVER_NAME, pool=NODE,
                                   devices=[device])  # fmt: skip
    return ClaimRef("default", name, claim["metadata"]["uid"])


def test_a_prepare_answers_once_its_specs_are_durable_with_one_fsync_of_the_cdi_dir(
    running: tuple[KubeletPlugin, ApiServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin, server = running
    cdi_root = plugin.settings.cdi_root
    ref = _claim(server, "c1", "gpu-1")
    log = DurabilityLog(monkeypatch)
    result = plugin.claim_engine.prepare([ref])[ref.uid]  # the kubelet's answer: everything below came before it
    assert result.error == ""
    ops = log.since(0, cdi_root)
    claim_spec = next(cdi_root.glob(f"*claim*{ref.uid}.json"))
    specs = [claim_spec]
    if plugin.metadata.enabled:
        specs.append(plugin.metadata.writer.spec_file(ref, "r0"))
    # Each spec's content fsynced before its rename; one fsync of the CDI dir after the last rename covers them all.
    assert [op.kind for op in ops] == ["fsync-file", "rename"] * len(specs) + ["fsync-dir"]
    assert durable_renames(ops, cdi_root) == specs
    assert ops[-1] == Op("fsync-dir", Path(os.path.abspath(cdi_root)))
    # Nothing is left pending: a later barrier costs no fsync.
    mark = log.mark()
    fsutil.sync_deferred(cdi_root)
    assert log.since(mark) == []
    # A repeated prepare (the kubelet's retry) writes nothing and fsyncs nothing in the CDI dir.
    mark = log.mark()
    assert plugin.claim_engine.prepare([ref])[ref.uid] == result
    assert log.since(mark, cdi_root) == []


def test_an_unprepare_removes_the_specs_without_a_directory_fsync(
    running: tuple[KubeletPlugin, ApiServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin, server = running
    cdi_root = plugin.settings.cdi_root
    ref = _claim(server, "c1", "gpu-1")
    assert plugin.claim_engine.prepare([ref])[ref.uid].error == ""
    before = sorted(p.name for p in cdi_root.iterdir())
    log = DurabilityLog(monkeypatch)
    assert plugin.claim_engine.unprepare([ref]) == {ref.uid: ""}
    ops = log.since(0, cdi_root)
    assert {op.kind for op in ops} == {"unlink"} and len(ops) == (2 if plugin.metadata.enabled else 1)
    assert sorted(p.name for p in cdi_root.iterdir()) == [n for n in before if ref.uid not in n]
    # The checkpoint without the record is fsynced before its rename; with the boot id known the plugin dir is not
    # (after a machine crash the next boot discards the file: kubeletplugin/checkpoint.py `_sync_renames`).
    plugin_dir = Path(os.path.abspath(plugin.settings.plugin_dir))
    checkpoint_ops = [op for op in log.ops if op.path.parent == plugin_dir or op.path == plugin_dir]
    assert [op.kind for op in checkpoint_ops] == ["fsync-file", "rename"]


def test_a_failed_fsync_fails_the_answered_claims_and_the_retry_syncs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    durable = DurableSpecs(tmp_path)
    ok, failed, refused = (ClaimRef("ns", n, f"uid-{n}") for n in ("ok", "failed", "refused"))
    outcomes = [PrepareOutcome(ok, PrepareResult()), PrepareOutcome(failed, PrepareResult(error="no GPU")),
                PrepareOutcome(refused, PrepareResult(error="reloading"), refused=True)]  # fmt: skip
    (tmp_path / ".a.tmp").write_bytes(b"{}")
    os.replace(tmp_path / ".a.tmp", tmp_path / "a.json")
    fsutil.defer_dir_sync(tmp_path)

    def broken(directory: Path) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(fsutil, "_fsync_dir_now", broken)
    answers = durable.prepared(outcomes)
    assert list(answers) == [ok.uid]
    assert "Input/output error" in answers[ok.uid].error and f"--cdi-root) {tmp_path} failed" in answers[ok.uid].error
    monkeypatch.undo()
    log = DurabilityLog(monkeypatch)
    assert durable.prepared(outcomes) == {}
    assert log.ops == [Op("fsync-dir", tmp_path)]
    # Nothing answered (all failed or refused), nothing pending, or an unprepare: no fsync.
    assert durable.prepared(outcomes[1:]) == {} and durable.prepared(outcomes) == {}
    assert durable.unprepared([UnprepareOutcome(ok, "")]) == {}
    assert log.ops == [Op("fsync-dir", tmp_path)]
