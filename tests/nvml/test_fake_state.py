"""The state file: MIG state survives restarts and is shared between processes, written atomically."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from dra_driver.nvml.fake.backend import FakeNvml, FakeSettings
from dra_driver.nvml.fake.state import FakeStateError, read_fake_state
from dra_driver.nvml.types import (
    ComputeMode,
    MigMode,
    NvmlError,
    NvmlReturn,
    NvmlUnavailableError,
    Placement,
    TimeSlice,
)

REPO = Path(__file__).resolve().parents[2]


def _fake(path: Path, preset: str = "dgx-h100", **kw: Any) -> FakeNvml:
    fake = FakeNvml.preset(preset, settings=FakeSettings(state_path=path), **kw)
    fake.init()
    return fake


def test_state_file_is_created_at_init_with_tight_permissions(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "state.json"
    fake = FakeNvml.preset("dgx-a100", settings=FakeSettings(state_path=path))
    assert not path.exists()  # nothing touched before init
    fake.init()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    doc = json.loads(path.read_text())
    assert doc["kind"] == "FakeNvmlState" and doc["node"] == "dgx-a100"
    assert [g["uuid"] for g in doc["gpus"]] == [g.uuid for g in fake.gpus()]
    assert all(g["mig"] == {"current": True, "pending": True} for g in doc["gpus"])


def test_mig_instances_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    first = _fake(path)
    gpu = first.gpus()[2].uuid
    first.set_mig_mode(gpu, True)
    gi = first.create_gpu_instance(gpu, 9, Placement(4, 4))
    first.create_compute_instance(gpu, gi.id, 2)
    first.set_compute_mode(first.gpus()[0].uuid, ComputeMode.EXCLUSIVE_PROCESS)
    devices = first.mig_devices(gpu)
    instances = first.gpu_instances(gpu)
    first.shutdown()

    second = _fake(path)  # a "restarted plugin"
    assert second.mig_mode(gpu) == MigMode(True, True)
    assert second.gpu_instances(gpu) == instances
    assert second.mig_devices(gpu) == devices
    assert second.compute_mode(second.gpus()[0].uuid) is ComputeMode.EXCLUSIVE_PROCESS

    on_disk = read_fake_state(path).gpu(gpu)
    assert [(g.id, g.profile_id, g.placement) for g in on_disk.gis] == [(gi.id, 9, Placement(4, 4))]
    assert [(c.id, c.profile_id, c.slice_count) for c in on_disk.gis[0].cis] == [(0, 2, 3)]


def test_time_slice_lives_in_the_state_file_and_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    first = _fake(path)
    gpu = first.gpus()[1].uuid
    assert first.time_slice(gpu) is TimeSlice.DEFAULT
    first.set_time_slice(gpu, TimeSlice.MEDIUM)
    doc = json.loads(path.read_bytes())
    assert [g["time_slice"] for g in doc["gpus"]][:3] == ["DEFAULT", "MEDIUM", "DEFAULT"]
    first.shutdown()
    second = _fake(path)  # a "restarted plugin"
    assert second.time_slice(gpu) is TimeSlice.MEDIUM
    assert read_fake_state(path).gpu(gpu).time_slice is TimeSlice.MEDIUM


def test_a_state_file_written_before_time_slices_existed_reads_as_default(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    _fake(path).shutdown()
    doc = json.loads(path.read_bytes())
    for gpu in doc["gpus"]:
        del gpu["time_slice"]
    path.write_text(json.dumps(doc))
    fake = _fake(path)
    assert {fake.time_slice(g.uuid) for g in fake.gpus()} == {TimeSlice.DEFAULT}


def test_a_gpu_can_be_made_to_report_time_slice_not_supported(tmp_path: Path) -> None:
    node = tmp_path / "node.yaml"
    node.write_text("gpus:\n  - model: L4\n    time_slice: unsupported\n  - model: L4\n")
    fake = FakeNvml.from_file(node, settings=FakeSettings(state_path=tmp_path / "state.json"))
    fake.init()
    p4, ok = (g.uuid for g in fake.gpus())
    for call in (lambda: fake.time_slice(p4), lambda: fake.set_time_slice(p4, TimeSlice.LONG)):
        with pytest.raises(NvmlError) as err:
            call()
        assert err.value.code is NvmlReturn.NOT_SUPPORTED
    fake.set_time_slice(ok, TimeSlice.SHORT)
    assert fake.time_slice(ok) is TimeSlice.SHORT


def test_two_live_instances_see_each_others_changes(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    plugin, observer = _fake(path), _fake(path)
    gpu = plugin.gpus()[0].uuid
    plugin.set_mig_mode(gpu, True)
    gi = plugin.create_gpu_instance(gpu, 19, Placement(0, 1))
    assert [g.id for g in observer.gpu_instances(gpu)] == [gi.id]
    # Busy processes are state too: a test can mark an instance busy for the plugin.
    observer.set_busy(gpu, [3131], gi=gi.id)
    with pytest.raises(NvmlError) as err:
        plugin.destroy_gpu_instance(gpu, gi.id)
    assert err.value.code is NvmlReturn.IN_USE
    observer.set_busy(gpu, [], gi=gi.id)
    plugin.destroy_gpu_instance(gpu, gi.id)
    assert observer.gpu_instances(gpu) == []


def test_the_state_file_wins_over_the_node_description(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    first = _fake(path, "dgx-a100")
    gpu = first.gpus()[0].uuid
    first.create_gpu_instance(gpu, 0, Placement(0, 8))
    # MIG mode persists like on hardware, even when the restart's node description says off.
    restarted = FakeNvml.preset("dgx-a100", mig=False, settings=FakeSettings(state_path=path))
    restarted.init()
    assert restarted.mig_mode(gpu) == MigMode(True, True)
    assert len(restarted.gpu_instances(gpu)) == 1


def test_a_subprocess_creates_a_gi_and_the_parent_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    script = textwrap.dedent(
        f"""
        from dra_driver.nvml.factory import open_backend
        from dra_driver.nvml.types import Placement
        b = open_backend("fake:dgx-h100,state={path}")
        b.init()
        uuid = b.gpus()[5].uuid
        b.set_mig_mode(uuid, True)
        gi = b.create_gpu_instance(uuid, 14, Placement(2, 2))
        ci = b.create_compute_instance(uuid, gi.id, 1)
        print(uuid, gi.id, b.mig_devices(uuid)[0].uuid)
        b.shutdown()
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    gpu, gi_id, mig_uuid = out.stdout.split()
    state = read_fake_state(path).gpu(gpu)
    assert state.mig_current and [(g.id, g.profile_id, g.placement) for g in state.gis] == [
        (int(gi_id), 14, Placement(2, 2))
    ]
    parent_view = _fake(path)
    assert [d.uuid for d in parent_view.mig_devices(gpu)] == [mig_uuid]


def test_writes_are_atomic_and_leave_no_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    fake = _fake(path)
    gpu = fake.gpus()[0].uuid
    fake.set_mig_mode(gpu, True)
    for start in range(7):
        fake.create_gpu_instance(gpu, 19, Placement(start, 1))
    for gi in fake.gpu_instances(gpu):
        fake.destroy_gpu_instance(gpu, gi.id)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json", "state.json.lock"]
    assert read_fake_state(path).gpu(gpu).gis == ()


def test_each_write_fsyncs_the_file_and_then_its_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "state.json"
    fake = _fake(path)
    synced: list[str] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    fake.set_compute_mode(fake.gpus()[0].uuid, ComputeMode.PROHIBITED)
    assert synced == ["file", "dir"]
    fake.compute_mode(fake.gpus()[0].uuid)  # reads never write
    fake.set_compute_mode(fake.gpus()[0].uuid, ComputeMode.PROHIBITED)  # no change, no write
    assert synced == ["file", "dir"]
    assert stat.S_IMODE((tmp_path / "state.json.lock").stat().st_mode) == 0o600


def test_a_failed_write_keeps_the_old_file_and_removes_the_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.json"
    fake = _fake(path)
    gpu = fake.gpus()[0].uuid
    before = path.read_bytes()

    def broken_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(FakeStateError, match="cannot write"):
        fake.set_mig_mode(gpu, True)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json", "state.json.lock"]
    assert fake.mig_mode(gpu) == MigMode(False, False)  # the failed change is not half-applied


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "is corrupt"),
        (b'{"kind": "Other", "version": 1, "node": "x", "gpus": []}', "kind"),
        (b'{"kind": "FakeNvmlState", "version": 7, "node": "x", "gpus": []}', "version"),
        (
            b'{"kind": "FakeNvmlState", "version": 1, "node": "x", "gpus": [{"uuid": "GPU-1", "mig": {},'
            b' "compute_mode": "DEFAULT", "gpu_instances": [], "busy": []}]}',
            "gpus[0].mig.current",
        ),
    ],
)
def test_a_corrupt_state_file_is_a_clear_error_naming_the_path(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(content)
    fake = FakeNvml.preset("dgx-h100", settings=FakeSettings(state_path=path))
    with pytest.raises(FakeStateError) as err:
        fake.init()
    assert str(path) in str(err.value) and message in str(err.value)
    assert isinstance(err.value, NvmlUnavailableError)  # the CLI reports it as one line
    with pytest.raises(FakeStateError, match=str(path)):
        read_fake_state(path)


def test_a_state_file_of_another_node_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    _fake(path, "dgx-h100")
    other = FakeNvml.preset("dgx-h100", seed="node-b", settings=FakeSettings(state_path=path))
    with pytest.raises(FakeStateError, match="another node"):
        other.init()


def test_state_written_by_another_process_mid_session_is_reread(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    fake = _fake(path)
    gpu = fake.gpus()[1].uuid
    doc = json.loads(path.read_text())
    doc["gpus"][1]["mig"] = {"current": True, "pending": True}
    doc["gpus"][1]["compute_mode"] = "PROHIBITED"
    path.write_text(json.dumps(doc))
    assert fake.mig_mode(gpu) == MigMode(True, True)
    assert fake.compute_mode(gpu) is ComputeMode.PROHIBITED
    path.write_text("garbage")
    with pytest.raises(FakeStateError, match=str(path)):
        fake.mig_mode(gpu)


def test_concurrent_creates_on_one_file_never_double_book(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    fakes = [_fake(path) for _ in range(4)]  # separate instances: only the file lock protects them
    gpu = fakes[0].gpus()[0].uuid
    fakes[0].set_mig_mode(gpu, True)
    wins: list[int] = []
    codes: list[NvmlReturn] = []
    lock = threading.Lock()

    def worker(fake: FakeNvml) -> None:
        for start in range(7):
            try:
                gi = fake.create_gpu_instance(gpu, 19, Placement(start, 1))
            except NvmlError as exc:
                with lock:
                    codes.append(exc.code)
            else:
                with lock:
                    wins.append(gi.id)

    threads = [threading.Thread(target=worker, args=(f,)) for f in fakes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(wins) == list(range(7, 14))  # each slot exactly once
    assert codes == [NvmlReturn.INSUFFICIENT_RESOURCES] * (4 * 7 - 7)
    assert len(read_fake_state(path).gpu(gpu).gis) == 7


def test_read_fake_state_of_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FakeStateError, match="does not exist"):
        read_fake_state(tmp_path / "nope.json")


def test_memory_and_file_state_agree(tmp_path: Path) -> None:
    """Same operations, with and without a state file, give the same state."""
    results = []
    for settings in (FakeSettings(), FakeSettings(state_path=tmp_path / "s.json")):
        fake = FakeNvml.preset("a30x4", settings=settings)
        fake.init()
        gpu = fake.gpus()[3].uuid
        fake.set_mig_mode(gpu, True)
        fake.reset_gpu(gpu)
        gi = fake.create_gpu_instance(gpu, 5, Placement(0, 2))
        fake.create_compute_instance(gpu, gi.id, 0)
        results.append(fake.state())
    assert results[0] == results[1]
    assert os.path.exists(tmp_path / "s.json")
