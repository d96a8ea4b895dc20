"""The one claim record and checkpoint format of both drivers: files written before it (the ComputeDomain driver's,
whose checkpoint class spelt the boot id `boot_id`, and the GPU driver's, indented, from 0.1.0) read unchanged, and
what each driver writes now reads back equal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dra_driver.computedomain.plugin.checkpoint import (
    DOMAIN_RECORDS,
    DomainClaim,
    DomainDevice,
    DomainDeviceKind,
    domain_of,
)
from dra_driver.kubeletplugin.checkpoint import CheckpointStore, CorruptCheckpointError
from dra_driver.kubeletplugin.claimrecord import (
    ClaimCodec,
    ClaimState,
    checksum,
    decode_checkpoint,
    encode_checkpoint,
)
from dra_driver.plugin.checkpoint import GPU_RECORDS

HERE = Path(__file__).parent
# Written by the ComputeDomain driver's own encoder as of a9d8fe7 (before the one claim record).
OLD_CD_FILE = HERE / "data" / "cd-checkpoint-v1-before-claimrecord.json"
OLD_GPU_FILE = HERE.parent / "plugin" / "data" / "checkpoint-v1-from-0.1.0.json"


def test_an_old_compute_domain_checkpoint_loads_with_every_field(tmp_path: Path) -> None:
    (tmp_path / "boot_id").write_text("boot-1\n")
    path = tmp_path / "checkpoint.json"
    path.write_bytes(OLD_CD_FILE.read_bytes())
    checkpoint = CheckpointStore(path, ClaimCodec(DOMAIN_RECORDS), boot_id_path=tmp_path / "boot_id").load()
    assert checkpoint.node_boot_id == "boot-1"  # the old class's `boot_id`, the file's `nodeBootId`
    completed, aborted = checkpoint.claims["c-1"], checkpoint.claims["c-2"]
    assert (completed.namespace, completed.name, completed.state) == ("team", "claim-1", ClaimState.PREPARE_COMPLETED)
    assert domain_of(completed) == DomainClaim("d-1", "team", "dom", "cl.7")
    assert completed.allocation == "sha256:ab" and completed.aborted_at == 0.0
    assert completed.devices == (DomainDevice(("channel",), "node-a", "channel-0", DomainDeviceKind.CHANNEL,
                                              ("k8s.compute-domain.gpu.dra.dev/claim=c-1-channel-0",),
                                              tuple(range(2048))),)
    assert aborted.state is ClaimState.PREPARE_ABORTED and aborted.aborted_at == 1700000000.5
    assert domain_of(aborted).clique_id == "" and aborted.devices[0].kind is DomainDeviceKind.DAEMON
    assert not aborted.live and completed.live


def test_an_old_gpu_checkpoint_loads_and_round_trips() -> None:
    checkpoint = decode_checkpoint(OLD_GPU_FILE.read_bytes(), GPU_RECORDS)
    assert checkpoint.claims and all(r.details is None for r in checkpoint.claims.values())
    assert decode_checkpoint(encode_checkpoint(checkpoint, GPU_RECORDS), GPU_RECORDS) == checkpoint


def test_what_the_compute_domain_driver_writes_now_keeps_the_old_members() -> None:
    """An older plugin (a rollback) reads the members it knew: domain, cliqueID, allocation, abortedAt."""
    old = decode_checkpoint(OLD_CD_FILE.read_bytes(), DOMAIN_RECORDS)
    raw = encode_checkpoint(old, DOMAIN_RECORDS)
    claim = json.loads(raw)["payload"]["claims"]["c-2"]
    assert claim["domain"] == {"uid": "d-1", "namespace": "team", "name": "dom"} and claim["cliqueID"] == ""
    assert claim["allocation"] == "sha256:cd" and claim["abortedAt"] == 1700000000.5
    assert decode_checkpoint(raw, DOMAIN_RECORDS) == old


def _with_state(raw: bytes, state: str) -> bytes:
    document = json.loads(raw)
    document["payload"]["claims"]["c-1"]["state"] = state
    document["checksum"] = checksum(document["payload"])
    return json.dumps(document).encode()


def test_a_state_the_driver_does_not_use_is_read_as_prepare_started() -> None:
    """PrepareAborted is the ComputeDomain driver's; in the GPU driver's file (hand-edited, or a newer plugin's) it
    reads as PrepareStarted, which is rolled back."""
    old = OLD_CD_FILE.read_bytes()
    assert decode_checkpoint(_with_state(old, "PrepareAborted"), DOMAIN_RECORDS).claims["c-1"].state is (
        ClaimState.PREPARE_ABORTED)
    assert decode_checkpoint(_with_state(old, "Frobnicated"), DOMAIN_RECORDS).claims["c-1"].state is (
        ClaimState.PREPARE_STARTED)
    gpu = json.loads(OLD_GPU_FILE.read_bytes())
    uid = next(iter(gpu["payload"]["claims"]))
    gpu["payload"]["claims"][uid]["state"] = "PrepareAborted"
    gpu["checksum"] = checksum(gpu["payload"])
    assert decode_checkpoint(json.dumps(gpu).encode(), GPU_RECORDS).claims[uid].state is ClaimState.PREPARE_STARTED


@pytest.mark.parametrize("damage", [
    lambda c: c.update(devices=["not an object"]),
    lambda c: c["devices"][0].update(kind="no-such-kind"),
    lambda c: c.update(abortedAt="soon"),
])
def test_a_wrong_shape_is_corrupt_not_a_crash(damage: object) -> None:
    document = json.loads(OLD_CD_FILE.read_bytes())
    damage(document["payload"]["claims"]["c-1"])  # type: ignore[operator]
    document["checksum"] = checksum(document["payload"])
    with pytest.raises(CorruptCheckpointError):
        decode_checkpoint(json.dumps(document).encode(), DOMAIN_RECORDS)


def test_a_gpu_device_missing_its_pool_is_corrupt() -> None:
    document = json.loads(OLD_GPU_FILE.read_bytes())
    claim = next(iter(document["payload"]["claims"].values()))
    claim["devices"] = [{"device": "gpu-0"}]
    document["checksum"] = checksum(document["payload"])
    with pytest.raises(CorruptCheckpointError):
        decode_checkpoint(json.dumps(document).encode(), GPU_RECORDS)
