"""Checkpoint: atomic, checksummed, lenient, reboot-aware, and never a reason to crash-loop."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from dra_driver import fsutil
from dra_driver.kubeletplugin.checkpoint import CheckpointIOError, CorruptCheckpointError, NewerCheckpointError
from dra_driver.kubeletplugin.claimrecord import FragmentCache, decode_checkpoint, encode_checkpoint
from dra_driver.kubeletplugin.claimrecord import checksum as _checksum
from dra_driver.plugin.checkpoint import (
    GPU_RECORDS,
    Checkpoint,
    CheckpointStore,
    ClaimRecord,
    ClaimState,
    MigRecord,
    PreparedDevice,
)
from tests.durability import DurabilityLog, durable_renames
from tests.polling import wait_for


def decode(raw: bytes) -> Checkpoint:
    return decode_checkpoint(raw, GPU_RECORDS)


def encode(checkpoint: Checkpoint, fragments: FragmentCache | None = None) -> bytes:
    return encode_checkpoint(checkpoint, GPU_RECORDS, fragments)


def _boot(tmp_path: Path, value: str = "boot-a") -> Path:
    p = tmp_path / "boot_id"
    p.write_text(value + "\n")
    return p


def _no_boot(tmp_path: Path) -> Path:
    """A boot id path that cannot be read: the store then makes every rename durable (a directory fsync)."""
    return tmp_path / "no-boot-id"


def _record(uid: str = "uid-1", state: ClaimState = ClaimState.PREPARE_COMPLETED) -> ClaimRecord:
    mig = MigRecord("GPU-1", 9, 4, 4, gpu_instance_id=2, compute_instance_id=0, uuid="MIG-x")
    dev = PreparedDevice(
        ("gpu",), "node-a", "gpu-0-mig-3g40gb-9-4", ("k8s.gpu.dra.dev/claim=uid-1-gpu",), None, "GPU-1", mig
    )
    return ClaimRecord(uid, "ns", "claim", state, (dev,), (dev,))


def _adding(record: ClaimRecord) -> Callable[[Checkpoint], Checkpoint]:
    """A checkpoint change that adds `record` (bound now, not when the store applies it)."""
    return lambda cp: cp.with_claim(record)


def test_roundtrip_preserves_every_field(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json", boot_id_path=_boot(tmp_path))
    store.update(lambda cp: cp.with_claim(_record()))
    loaded = CheckpointStore(tmp_path / "checkpoint.json", boot_id_path=_boot(tmp_path)).load()
    assert loaded.claims == {"uid-1": _record()}
    assert loaded.node_boot_id == "boot-a"


def test_file_is_private_and_no_temp_files_remain(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json", boot_id_path=_boot(tmp_path))
    for i in range(5):
        store.update(_adding(_record(f"u{i}")))
    assert stat.S_IMODE((tmp_path / "checkpoint.json").stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["boot_id", "checkpoint.json", "checkpoint.json.lock"]


def test_checksum_detects_tampering() -> None:
    raw = json.loads(encode(Checkpoint("b", {"u": _record("u")})))
    raw["payload"]["claims"]["u"]["name"] = "other"
    with pytest.raises(CorruptCheckpointError, match="checksum"):
        decode(json.dumps(raw).encode())


def test_corrupt_file_is_quarantined_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_bytes(b'{"version": 1, "payload": {"claims"')
    store = CheckpointStore(path, boot_id_path=_boot(tmp_path), clock_ns=lambda: 1234)
    assert store.load().claims == {}
    assert (tmp_path / f"checkpoint.json.corrupt-1234-{os.getpid()}").read_bytes().startswith(b'{"version"')
    assert not path.exists()
    store.update(lambda cp: cp.with_claim(_record()))
    assert set(store.load().claims) == {"uid-1"}


def test_every_quarantine_is_reported_with_the_file_and_a_failing_report_changes_nothing(tmp_path: Path) -> None:
    """The hook the plugins turn into a CheckpointQuarantined Node Event (kubeletplugin/nodeevents.py)."""
    path = tmp_path / "checkpoint.json"
    reported: list[tuple[Path, str]] = []
    store = CheckpointStore(path, boot_id_path=_boot(tmp_path), clock_ns=lambda: 99,
                            on_quarantine=lambda moved, reason: reported.append((moved, reason)))
    path.write_bytes(b"not json")
    assert store.load().claims == {}
    [(moved, reason)] = reported
    assert moved == tmp_path / f"checkpoint.json.corrupt-99-{os.getpid()}" and moved.read_bytes() == b"not json"
    assert reason

    def broken(moved: Path, reason: str) -> None:
        raise RuntimeError("the API is down")

    store.on_quarantine = broken
    path.write_bytes(b"garbage again")
    assert store.load().claims == {}  # still usable: the report is best effort
    assert len(list(tmp_path.glob("checkpoint.json.corrupt-*"))) == 2


def test_reboot_discards_prepared_claims(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    CheckpointStore(path, boot_id_path=_boot(tmp_path, "before")).update(lambda cp: cp.with_claim(_record()))
    assert CheckpointStore(path, boot_id_path=_boot(tmp_path, "after")).load().claims == {}


def test_lenient_decode_of_newer_and_older_files() -> None:
    payload = {
        "nodeBootId": "b",
        "futureTopLevel": {"x": 1},
        "claims": {
            "new": {"namespace": "ns", "name": "n", "state": "PrepareVerified", "devices": [], "newField": 3},
            "old": {
                "namespace": "ns",
                "name": "o",
                "state": "PrepareCompleted",
                "devices": [{"pool": "p", "device": "gpu-0", "unknownKey": True}],
            },
        },
    }

    # A newer plugin's additions within format version 1 (new fields, a new state) read leniently.
    raw = json.dumps({"version": 1, "checksum": _checksum(payload), "payload": payload}).encode()
    cp = decode(raw)
    assert cp.claims["new"].state is ClaimState.PREPARE_STARTED  # unknown state: roll back to be safe
    old = cp.claims["old"]
    assert old.state is ClaimState.PREPARE_COMPLETED
    assert old.devices[0] == PreparedDevice((), "p", "gpu-0")


def test_concurrent_updates_lose_nothing(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json", boot_id_path=_boot(tmp_path))

    def add(i: int) -> None:
        store.update(lambda cp: cp.with_claim(_record(f"u{i}")))

    threads = [threading.Thread(target=add, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(store.load().claims) == 32


def test_two_processes_serialise_on_the_lock_file(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    boot = _boot(tmp_path)
    script = f"""
from pathlib import Path
from dra_driver.plugin.checkpoint import CheckpointStore, ClaimRecord, ClaimState
s = CheckpointStore(Path({str(path)!r}), boot_id_path=Path({str(boot)!r}))
for i in range(20):
    s.update(lambda cp, i=i: cp.with_claim(ClaimRecord(f"child-{{i}}", "ns", "n", ClaimState.PREPARE_STARTED)))
"""
    child = subprocess.Popen([sys.executable, "-c", script])
    store = CheckpointStore(path, boot_id_path=boot)
    for i in range(20):
        store.update(_adding(_record(f"parent-{i}")))
    assert child.wait(timeout=60) == 0
    assert len(store.load().claims) == 40


def test_the_lock_file_is_opened_once_and_its_flock_released_after_each_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock file stays open for the store's life (an open + close per write was 2 syscalls per claim operation);
    the flock is still taken per write and released when it is done, so another process's store gets its turn."""
    import fcntl

    path = tmp_path / "checkpoint.json"
    store = CheckpointStore(path, boot_id_path=_boot(tmp_path))
    opened: list[str] = []
    real_open = os.open

    def counting_open(file: str | os.PathLike[str], flags: int, mode: int = 0o777, **kwargs: object) -> int:
        opened.append(os.fspath(file))
        return real_open(file, flags, mode)

    monkeypatch.setattr(os, "open", counting_open)
    for i in range(5):
        store.update(_adding(_record(f"u{i}")))
        # Between writes nobody holds the flock: another open file description takes it at once.
        other = real_open(str(path) + ".lock", os.O_RDWR)
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
    assert [p for p in opened if p.endswith(".lock")] == [str(path) + ".lock"]
    assert sorted(store.load().claims) == [f"u{i}" for i in range(5)]


def test_group_commit_gives_every_caller_its_own_outcome(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json", boot_id_path=_boot(tmp_path))
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def add(i: int) -> None:
        barrier.wait()
        try:
            if i == 3:
                store.update(lambda cp: (_ for _ in ()).throw(ValueError("bad change")))
            else:
                store.update(lambda cp: cp.with_claim(_record(f"u{i}")))
        except ValueError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [str(e) for e in errors] == ["bad change"]
    assert sorted(CheckpointStore(tmp_path / "checkpoint.json", boot_id_path=_boot(tmp_path)).load().claims) == sorted(
        f"u{i}" for i in range(8) if i != 3
    )

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("dra_driver.kubeletplugin.checkpoint.write_temp_file", disk_full)
    with pytest.raises(OSError, match="No space"):
        store.update(lambda cp: cp.with_claim(_record("lost")))
    monkeypatch.undo()
    assert "lost" not in store.load().claims


def test_quarantine_names_never_collide(tmp_path: Path) -> None:
    """Issue 12 finding 3: two corrupt files found in the same second (or nanosecond) are both kept."""
    path = tmp_path / "checkpoint.json"
    store = CheckpointStore(path, boot_id_path=_boot(tmp_path), clock_ns=lambda: 1_700_000_000_000_000_000)
    for content in (b"first garbage", b"second garbage"):
        path.write_bytes(content)
        assert store.load().claims == {}
        assert store.take_loss() is not None
    kept = sorted(p.read_bytes() for p in tmp_path.glob("checkpoint.json.corrupt-*"))
    assert kept == [b"first garbage", b"second garbage"]
    assert store.take_loss() is None


def test_a_directory_at_the_checkpoint_path_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.mkdir()
    store = CheckpointStore(path, boot_id_path=_boot(tmp_path))
    with pytest.raises(CheckpointIOError, match="it is a directory, not a file; move it out of the way"):
        store.load()
    assert path.is_dir()  # never deleted


DATA = Path(__file__).parent / "data"


def test_a_checkpoint_written_by_release_0_1_0_reads_back_exactly() -> None:
    """Bytes written by the 0.1.0 plugin (tests/plugin/data): what an upgrade finds on the node."""
    cp = decode((DATA / "checkpoint-v1-from-0.1.0.json").read_bytes())
    assert cp.node_boot_id == "boot-1"
    whole = cp.claims["11111111-1111-4111-8111-111111111111"]
    assert (whole.namespace, whole.name, whole.state) == ("team-a", "train", ClaimState.PREPARE_COMPLETED)
    assert [d.device for d in whole.devices] == ["gpu-3"] and whole.devices[0].sharing == "Exclusive"
    assert whole.devices[0].cdi_device_ids == ("k8s.gpu.dra.dev/claim=11111111-1111-4111-8111-111111111111-gpu-3",)
    mig = cp.claims["22222222-2222-4222-8222-222222222222"].devices[0].mig
    assert mig == MigRecord(
        "GPU-0a0a0a0a-0000-4000-8000-000000000000", 9, 4, 4, 2, 0, "MIG-5a5a5a5a-0000-4000-8000-000000000005"
    )
    assert cp.claims["33333333-3333-4333-8333-333333333333"].state is ClaimState.PREPARE_STARTED
    # And what this plugin writes back stays readable by the same rules (same format version).
    assert decode(encode(cp)) == cp
    assert json.loads(encode(cp))["version"] == 1


def test_a_newer_format_version_is_refused_and_left_in_place(tmp_path: Path) -> None:

    payload = {"nodeBootId": "boot-a", "claims": {}}
    raw = json.dumps({"version": 2, "checksum": _checksum(payload), "payload": payload}).encode()
    with pytest.raises(NewerCheckpointError, match="format version 2 was written by a newer plugin"):
        decode(raw)
    path = tmp_path / "checkpoint.json"
    path.write_bytes(raw)
    store = CheckpointStore(path, boot_id_path=_boot(tmp_path))
    with pytest.raises(NewerCheckpointError):
        store.load()
    assert path.read_bytes() == raw  # not quarantined: the newer plugin needs it back
    assert [p.name for p in tmp_path.iterdir() if "corrupt" in p.name] == []


@pytest.mark.parametrize("version", [0, -1, "1", None, True])
def test_a_nonsense_version_is_corrupt(version: object) -> None:

    payload = {"nodeBootId": "b", "claims": {}}
    raw = json.dumps({"version": version, "checksum": _checksum(payload), "payload": payload}).encode()
    with pytest.raises(CorruptCheckpointError, match="'version' must be a positive integer"):
        decode(raw)


def test_encoding_is_the_canonical_document_and_reuses_unchanged_claims() -> None:

    cp = Checkpoint("boot", {u: _record(u) for u in ("u-2", "u-1", "ü-3")})
    fragments: dict[str, tuple[ClaimRecord, str]] = {}
    raw = encode(cp, fragments)
    document = json.loads(raw)
    payload = document["payload"]
    # The checksum covers the payload's canonical form, and decoding (which re-canonicalises) accepts it.
    assert document["checksum"] == _checksum(payload)
    assert raw == (json.dumps(document, sort_keys=True, separators=(",", ":")) + "\n").encode()
    assert decode(raw) == cp
    assert set(fragments) == {"u-1", "u-2", "ü-3"}
    # An unchanged record is not serialised again; a changed or removed one is.
    kept = fragments["u-1"][1]
    changed = cp.with_claim(replace(cp.claims["u-2"], state=ClaimState.UNPREPARE_STARTED)).without_claim("ü-3")
    again = encode(changed, fragments)
    assert fragments["u-1"][1] is kept and set(fragments) == {"u-1", "u-2"}
    assert again == encode(changed) and decode(again) == changed


class HeldFlush:
    """The checkpoint's directory fsyncs, the first one held until released."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.in_first = threading.Event()
        self.release = threading.Event()
        self.count = 0
        lock = threading.Lock()
        real = fsutil.fsync_dir

        def held(directory: Path) -> None:
            with lock:
                self.count += 1
                first = self.count == 1
            if first:
                self.in_first.set()
                assert self.release.wait(10)
            real(directory)

        monkeypatch.setattr("dra_driver.kubeletplugin.checkpoint.fsync_dir", held)


def test_readers_see_the_renamed_file_while_its_directory_flush_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that arrives between the writer's rename and its directory fsync gets the new state at once
    (it used to wait behind the lock for the flush), while the writer itself returns only after the flush."""
    store = CheckpointStore(tmp_path / "checkpoint.json", boot_id_path=_no_boot(tmp_path))
    store.update(_adding(_record("uid-0")))
    flush = HeldFlush(monkeypatch)
    writer = threading.Thread(target=store.update, args=(_adding(_record("uid-1")),))
    writer.start()
    try:
        assert flush.in_first.wait(10)
        read: list[Checkpoint] = []
        reader = threading.Thread(target=lambda: read.append(store.load()))
        reader.start()
        reader.join(10)  # a reader waiting for the lock would still be blocked here: the flush is held
        assert read and set(read[0].claims) == {"uid-0", "uid-1"}
        assert writer.is_alive()  # the change is not reported done before it is durable
    finally:
        flush.release.set()
        writer.join(10)
    assert not writer.is_alive()


def test_the_next_batch_is_written_while_the_previous_one_flushes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The directory fsync runs after the lock: a second change is written (renamed into place) while the first
    one's flush is still in flight, and neither caller returns before a flush that covers its rename."""
    store = CheckpointStore(tmp_path / "checkpoint.json", boot_id_path=_no_boot(tmp_path))
    flush = HeldFlush(monkeypatch)
    first = threading.Thread(target=store.update, args=(_adding(_record("uid-1")),))
    first.start()
    second = threading.Thread(target=store.update, args=(_adding(_record("uid-2")),))
    try:
        assert flush.in_first.wait(10)
        second.start()
        # Its rename lands although the first flush is held (the lock is free), and its own flush follows.
        wait_for(lambda: flush.count == 2, what="the second batch to reach its own directory flush")
        assert set(decode((tmp_path / "checkpoint.json").read_bytes()).claims) == {"uid-1", "uid-2"}
        second.join(10)
        assert not second.is_alive()
        assert first.is_alive()  # still waiting for the flush that covers its own rename
    finally:
        flush.release.set()
        first.join(10)
        second.join(10)
    assert not first.is_alive()


def test_a_failed_directory_flush_fails_every_change_of_its_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json", boot_id_path=_no_boot(tmp_path))

    def failing(directory: Path) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr("dra_driver.kubeletplugin.checkpoint.fsync_dir", failing)
    with pytest.raises(CheckpointIOError, match="Input/output error"):
        store.update(_adding(_record("uid-1")))


def test_with_the_boot_id_known_a_write_fsyncs_its_file_but_not_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A machine crash is a reboot, after which the file is discarded (another boot id) whichever version the
    directory holds: the rename need not be durable, but each version's content is, so none is torn."""
    path = tmp_path / "checkpoint.json"
    store = CheckpointStore(path, boot_id_path=_boot(tmp_path, "before"))
    log = DurabilityLog(monkeypatch)
    store.update(_adding(_record("uid-1")))
    store.update(lambda cp: cp.without_claim("uid-1"))
    ops = log.since(0, tmp_path)
    assert [op.kind for op in ops] == ["fsync-file", "rename"] * 2
    assert {op.path for op in ops if op.kind == "rename"} == {path}
    # Either version the directory may hold after a machine crash is whole, and the next boot discards it.
    store.update(_adding(_record("uid-2")))
    assert decode(path.read_bytes()).claims.keys() == {"uid-2"}
    assert CheckpointStore(path, boot_id_path=_boot(tmp_path, "after")).load().claims == {}


def test_without_a_boot_id_every_write_is_durable_before_its_caller_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the boot id cannot be read an old file would be believed after a reboot: each rename is followed by
    a fsync of the directory before `update` returns."""
    path = tmp_path / "checkpoint.json"
    store = CheckpointStore(path, boot_id_path=_no_boot(tmp_path))
    log = DurabilityLog(monkeypatch)
    store.update(_adding(_record("uid-1")))
    store.update(lambda cp: cp.without_claim("uid-1"))
    ops = log.since(0, tmp_path)
    assert [op.kind for op in ops] == ["fsync-file", "rename", "fsync-dir"] * 2
    assert durable_renames(ops, tmp_path) == [path, path]
