"""Atomic writer: bytes on disk, 0644, no temp files left, validation before any write; what is fsynced, in which
order, and what is left to the caller (`defer_sync`, `durable=False`)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from dra_driver import fsutil
from dra_driver.cdi import CdiError, ContainerEdits, Device, Mount, Spec, minimum_version
from dra_driver.cdi.writer import remove_spec, spec_file_name, write_spec
from dra_sandbox.runtime.cdi import load_registry, load_spec_file
from tests.durability import DurabilityLog, Op, durable_renames


def make_spec(version: str = "0.5.0") -> Spec:
    edits = ContainerEdits(env=("GPU=0",), mounts=(Mount("/opt/lib", "/usr/lib/gpu", ("ro", "bind")),))
    return Spec(cdi_version=version, kind="k8s.gpu.dra.dev/gpu", devices=(Device("claim-1-gpu0", edits),))


def test_spec_file_name_convention() -> None:
    assert spec_file_name("k8s.gpu.dra.dev", "gpu") == "k8s.gpu.dra.dev-gpu.json"
    assert spec_file_name("k8s.gpu.dra.dev", "gpu", "ns/claim uid") == "k8s.gpu.dra.dev-gpu_ns_claim_uid.json"
    with pytest.raises(CdiError):
        spec_file_name("k8s.gpu.dra.dev", "gpu", "")
    with pytest.raises(CdiError):
        spec_file_name("bad vendor", "gpu")


def test_write_is_atomic_0644_and_readable(tmp_path: Path) -> None:
    old_umask = os.umask(0o077)  # the mode must not depend on the caller's umask
    try:
        path = write_spec(tmp_path / "cdi", spec_file_name("k8s.gpu.dra.dev", "gpu", "uid-1"), make_spec())
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left behind
    on_disk = json.loads(path.read_bytes())
    assert on_disk["cdiVersion"] == "0.5.0" and on_disk["devices"][0]["name"] == "claim-1-gpu0"
    assert load_spec_file(path) == make_spec()
    assert load_registry([path.parent]).resolve(["k8s.gpu.dra.dev/gpu=claim-1-gpu0"]).env == ("GPU=0",)


def test_overwrite_replaces_content(tmp_path: Path) -> None:
    write_spec(tmp_path, "a.json", make_spec())
    newer = Spec("0.5.0", "k8s.gpu.dra.dev/gpu", (Device("claim-1-gpu0", ContainerEdits(env=("GPU=1",))),))
    write_spec(tmp_path, "a.json", newer)
    assert load_spec_file(tmp_path / "a.json") == newer


def test_invalid_spec_is_not_written(tmp_path: Path) -> None:
    bad = Spec("0.3.0", "k8s.gpu.dra.dev/gpu", (Device("0", ContainerEdits(env=("A=1",))),))
    with pytest.raises(CdiError, match=r"needs cdiVersion >= 0\.5\.0"):
        write_spec(tmp_path, "a.json", bad)
    assert list(tmp_path.iterdir()) == []
    # minimum_version tells the writer what to use instead.
    fixed = Spec(minimum_version(bad), bad.kind, bad.devices)
    assert load_spec_file(write_spec(tmp_path, "a.json", fixed)).cdi_version == "0.5.0"


def test_bad_file_name_rejected(tmp_path: Path) -> None:
    with pytest.raises(CdiError):
        write_spec(tmp_path, "../x.json", make_spec())
    with pytest.raises(CdiError):
        write_spec(tmp_path, "x.txt", make_spec())


def test_remove_is_idempotent(tmp_path: Path) -> None:
    write_spec(tmp_path, "a.json", make_spec())
    assert remove_spec(tmp_path, "a.json") is True
    assert remove_spec(tmp_path, "a.json") is False
    assert list(tmp_path.iterdir()) == []


def test_an_existing_dir_costs_no_mkdir_and_a_missing_one_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = DurabilityLog(monkeypatch)
    write_spec(tmp_path, "a.json", make_spec())
    assert [op for op in log.ops if op.kind == "mkdir"] == []
    nested = tmp_path / "new" / "cdi"
    write_spec(nested, "a.json", make_spec())
    assert [op.path for op in log.ops if op.kind == "mkdir" and op.ok] == [tmp_path / "new", nested]
    assert load_spec_file(nested / "a.json") == make_spec()


def test_a_deferred_write_is_durable_but_its_dir_entry_waits_for_sync_deferred(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = DurabilityLog(monkeypatch)
    path = write_spec(tmp_path, "a.json", make_spec(), defer_sync=True)
    assert load_spec_file(path) == make_spec()
    kinds = [op.kind for op in log.ops]
    assert kinds == ["fsync-file", "rename"]  # the file's content is durable before it is renamed into place
    fsutil.sync_deferred(tmp_path)
    assert log.ops[-1] == Op("fsync-dir", tmp_path)
    assert durable_renames(log.ops, tmp_path) == [path]


def test_a_removal_is_durable_unless_the_caller_says_it_need_not_be(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_spec(tmp_path, "a.json", make_spec())
    write_spec(tmp_path, "b.json", make_spec())
    log = DurabilityLog(monkeypatch)
    assert remove_spec(tmp_path, "a.json", durable=False)
    assert [op.kind for op in log.ops] == ["unlink"]
    assert remove_spec(tmp_path, "b.json")
    assert [op.kind for op in log.ops] == ["unlink", "unlink", "fsync-dir"]
    assert not remove_spec(tmp_path, "b.json", durable=False)
