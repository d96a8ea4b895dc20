"""`fsutil.write_temp`, the first half of every durable write: all of the data even when the kernel takes it in
pieces, the mode asked for, fsynced before it is renamed, and nothing left behind when a write fails."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from dra_driver import fsutil


def test_a_write_the_kernel_takes_in_pieces_is_whole_fsynced_and_has_its_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write, real_fsync = os.write, os.fsync
    pieces: list[int] = []
    synced: list[bytes] = []

    def short_write(fd: int, data: bytes | memoryview) -> int:
        written = real_write(fd, bytes(data[:7]))  # as a pipe or a full disk might: fewer bytes than asked
        pieces.append(written)
        return written

    def recording_fsync(fd: int) -> None:
        synced.append(Path(f"/proc/self/fd/{fd}").read_bytes())  # what is on disk when it is made durable
        real_fsync(fd)

    monkeypatch.setattr(os, "write", short_write)
    monkeypatch.setattr(os, "fsync", recording_fsync)
    data = bytes(range(256)) * 3
    target = tmp_path / "spec.json"
    tmp = fsutil.write_temp(target, data, mode=0o644)
    assert tmp.read_bytes() == data and len(pieces) == -(-len(data) // 7)
    assert synced == [data]
    assert stat.S_IMODE(tmp.stat().st_mode) == 0o644
    fsutil.rename_into_place(tmp, target)
    assert target.read_bytes() == data and list(tmp_path.iterdir()) == [target]


def test_a_temp_file_asked_not_to_be_durable_is_whole_with_its_mode_and_never_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For a file its writer mends on every use (device metadata, kubeletplugin/metadata.py)."""
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    data = b"{}" * 5000
    tmp = fsutil.write_temp_file(str(tmp_path / "metadata.json"), data, 0o644, durable=False)
    assert Path(tmp).read_bytes() == data and stat.S_IMODE(os.stat(tmp).st_mode) == 0o644
    assert synced == []


def test_a_failed_write_closes_and_removes_its_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[int] = []
    real_open = os.open

    def recording_open(path: str | os.PathLike[str], flags: int, mode: int = 0o777) -> int:
        fd = real_open(path, flags, mode)
        opened.append(fd)
        return fd

    def no_space(fd: int, data: bytes | memoryview) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "open", recording_open)
    monkeypatch.setattr(os, "write", no_space)
    with pytest.raises(OSError, match="No space"):
        fsutil.atomic_write(tmp_path / "checkpoint.json", b"{}")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(OSError):
        os.fstat(opened[0])  # closed, not leaked
