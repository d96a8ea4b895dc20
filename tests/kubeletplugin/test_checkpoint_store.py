"""The layer's checkpoint store with a codec that is not the GPU driver's (the toy's): what the store adds to any
format (quarantine of a corrupt file, the loss, the reboot rule, the boot id stamp) holds for it too. The GPU
format's own cases are in tests/plugin/test_checkpoint.py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from dra_driver.kubeletplugin.checkpoint import CheckpointStore
from tests.kubeletplugin.toydriver import ToyCodec, ToyRecords


def _store(tmp_path: Path, boot: str = "boot-a") -> CheckpointStore[ToyRecords]:
    (tmp_path / "boot_id").write_text(boot + "\n")
    return CheckpointStore(tmp_path / "toy.json", ToyCodec(), boot_id_path=tmp_path / "boot_id", clock_ns=lambda: 7)



def test_the_store_writes_the_codecs_bytes_stamped_with_the_boot_id(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.update(lambda r: replace(r, claims={"u1": ("toy/slot=u1",)}))
    assert json.loads((tmp_path / "toy.json").read_bytes()) == {"boot": "boot-a", "claims": {"u1": ["toy/slot=u1"]}}
    assert _store(tmp_path).load().claims == {"u1": ("toy/slot=u1",)}  # a second instance reads it back
    assert _store(tmp_path, "boot-b").load() == ToyRecords("boot-b")  # after a reboot: nothing survives


def test_a_corrupt_file_is_moved_aside_and_the_loss_reported(tmp_path: Path) -> None:
    (tmp_path / "toy.json").write_bytes(b"{not json")
    losses: list[str] = []
    (tmp_path / "boot_id").write_text("boot-a\n")
    store = CheckpointStore(tmp_path / "toy.json", ToyCodec(), boot_id_path=tmp_path / "boot_id",
                            clock_ns=lambda: 7, on_loss=losses.append)
    assert store.load() == ToyRecords("boot-a")
    aside = [p.name for p in tmp_path.iterdir() if p.name.startswith("toy.json.corrupt-7-")]
    assert len(aside) == 1 and (tmp_path / aside[0]).read_bytes() == b"{not json"
    assert not store.exists()
    reason = store.take_loss()
    assert reason is not None and "not a toy checkpoint" in reason and losses == [reason]
    assert store.take_loss() is None


def test_a_file_deleted_under_the_store_with_records_is_a_loss_and_without_none_is_not(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.update(lambda r: r)  # an empty checkpoint on disk
    (tmp_path / "toy.json").unlink()
    store.update(lambda r: r)
    assert store.take_loss() is None
    store.update(lambda r: replace(r, claims={"u1": ()}))
    (tmp_path / "toy.json").unlink()
    store.update(lambda r: r)
    assert store.take_loss() == f"{tmp_path / 'toy.json'} disappeared while 1 claim(s) were recorded"
