"""KEP-5304 device metadata in the kubelet-plugin layer (dra_driver/kubeletplugin/metadata.py): the bytes of the
file and of its CDI spec (upstream's layout and Go's JSON), paths for direct and template claims, subrequests, the
Prepare response, removal on unprepare, the sweep of orphans and a crash between the driver's record and the files.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dra_driver.fsutil import defer_dir_sync, sync_deferred
from dra_driver.kubeletplugin.driver import (
    ClaimRef,
    DeviceMetadata,
    DeviceResult,
    NetworkDeviceData,
    PrepareResult,
)
from dra_driver.kubeletplugin.metadata import (
    DeviceMetadataWriter,
    MetadataFiles,
    _file_uid,
    container_path,
    go_json,
)
from dra_driver.kubeletplugin.pipeline import PreparePipeline
from tests.durability import DurabilityLog, Op, durable_renames

DRIVER = "gpu.example.com"
CLAIM = ClaimRef("default", "my-claim", "claim-uid-1234")
PCI = "resource.kubernetes.io/pciBusID"


def _gpu(name: str = "gpu-0", requests: tuple[str, ...] = ("gpu",), refs: tuple[str, ...] = ()) -> DeviceResult:
    return DeviceResult(
        request_names=requests,
        pool="node-a",
        device=name,
        cdi_device_ids=(f"k8s.{DRIVER}/claim={name}",),
        metadata=DeviceMetadata(
            attributes={PCI: {"string": "0000:65:00.0"}, "index": {"int": 0}, "driverVersion": {"version": "580.1.2"}},
            request_refs=refs,
        ),
    )


class StubDriver:
    """A Driver whose answers the test sets; records the claims it unprepared."""

    def __init__(self) -> None:
        self.results: dict[str, PrepareResult] = {}
        self.unprepare_errors: dict[str, str] = {}
        self.held: list[ClaimRef] = []

    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        self.held.extend(c for c in claims if c not in self.held and not self.results[c.uid].error)
        return {c.uid: self.results[c.uid] for c in claims}

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str]:
        errors = {c.uid: self.unprepare_errors.get(c.uid, "") for c in claims}
        self.held = [c for c in self.held if c not in claims or errors[c.uid]]
        return errors


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "plugin", tmp_path / "cdi"


@pytest.fixture
def writer(dirs: tuple[Path, Path]) -> DeviceMetadataWriter:
    plugin, cdi = dirs
    plugin.mkdir(mode=0o750)
    cdi.mkdir()
    return DeviceMetadataWriter(driver_name=DRIVER, plugin_dir=plugin, cdi_root=cdi)


def _wrapped(writer: DeviceMetadataWriter, result: PrepareResult, claim: ClaimRef = CLAIM) -> tuple[
        PreparePipeline, StubDriver]:  # fmt: skip
    """The stub driver with the device-metadata observer on a prepare pipeline (as a plugin registers it)."""
    stub = StubDriver()
    stub.results[claim.uid] = result
    return PreparePipeline(stub, observers=[MetadataFiles(writer)]), stub


def test_the_metadata_file_is_upstreams_json_stream_byte_for_byte(writer: DeviceMetadataWriter) -> None:
    driver, _ = _wrapped(writer, PrepareResult(devices=(_gpu(),)))
    assert driver.prepare([CLAIM])[CLAIM.uid].error == ""
    path = writer.root / "default_my-claim" / "gpu" / "metadata.json"
    # What k8s.io/dynamic-resource-allocation's writer produces (PrettySerializer: MarshalIndent, then "\n"):
    # TypeMeta's kind before apiVersion, ObjectMeta without creationTimestamp, attributes sorted by name.
    assert path.read_bytes() == (
        b'{\n'
        b'  "kind": "DeviceMetadata",\n'
        b'  "apiVersion": "metadata.resource.k8s.io/v1alpha1",\n'
        b'  "metadata": {\n'
        b'    "name": "my-claim",\n'
        b'    "namespace": "default",\n'
        b'    "uid": "claim-uid-1234",\n'
        b'    "generation": 1\n'
        b'  },\n'
        b'  "requests": [\n'
        b'    {\n'
        b'      "name": "gpu",\n'
        b'      "devices": [\n'
        b'        {\n'
        b'          "driver": "gpu.example.com",\n'
        b'          "pool": "node-a",\n'
        b'          "name": "gpu-0",\n'
        b'          "attributes": {\n'
        b'            "driverVersion": {\n'
        b'              "version": "580.1.2"\n'
        b'            },\n'
        b'            "index": {\n'
        b'              "int": 0\n'
        b'            },\n'
        b'            "resource.kubernetes.io/pciBusID": {\n'
        b'              "string": "0000:65:00.0"\n'
        b'            }\n'
        b'          }\n'
        b'        }\n'
        b'      ]\n'
        b'    }\n'
        b'  ]\n'
        b'}\n'
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o755
    assert stat.S_IMODE((writer.root / "default_my-claim").stat().st_mode) == 0o755


def test_the_cdi_spec_bind_mounts_the_file_read_only(writer: DeviceMetadataWriter) -> None:
    driver, _ = _wrapped(writer, PrepareResult(devices=(_gpu(),)))
    driver.prepare([CLAIM])
    spec = writer.cdi_root / "gpu.example.com_metadata_claim-uid-1234_gpu.json"
    host = writer.root / "default_my-claim" / "gpu" / "metadata.json"
    assert spec.read_bytes() == (
        '{\n'
        '  "cdiVersion": "0.5.0",\n'
        '  "kind": "gpu.example.com/metadata",\n'
        '  "devices": [\n'
        '    {\n'
        '      "name": "claim-uid-1234_gpu",\n'
        '      "containerEdits": {\n'
        '        "mounts": [\n'
        '          {\n'
        f'            "hostPath": "{host}",\n'
        '            "containerPath": "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/my-claim/gpu/'
        'gpu.example.com-metadata.json",\n'
        '            "options": [\n'
        '              "ro",\n'
        '              "bind"\n'
        '            ]\n'
        '          }\n'
        '        ]\n'
        '      }\n'
        '    }\n'
        '  ]\n'
        '}'
    ).encode()
    assert stat.S_IMODE(spec.stat().st_mode) == 0o644


def test_the_cdi_id_goes_on_the_first_device_of_each_request(writer: DeviceMetadataWriter) -> None:
    devices = (_gpu("gpu-0", ("a",)), _gpu("gpu-1", ("a",)), _gpu("gpu-2", ("b",)))
    driver, _ = _wrapped(writer, PrepareResult(devices=devices))
    out = driver.prepare([CLAIM])[CLAIM.uid]
    assert [d.cdi_device_ids for d in out.devices] == [
        (f"k8s.{DRIVER}/claim=gpu-0", f"{DRIVER}/metadata=claim-uid-1234_a"),
        (f"k8s.{DRIVER}/claim=gpu-1",),
        (f"k8s.{DRIVER}/claim=gpu-2", f"{DRIVER}/metadata=claim-uid-1234_b"),
    ]
    a = _stream(writer.root / "default_my-claim" / "a" / "metadata.json")
    assert [d["name"] for d in a[0]["requests"][0]["devices"]] == ["gpu-0", "gpu-1"]


def test_a_template_claim_appears_under_its_pod_claim_name(writer: DeviceMetadataWriter) -> None:
    claim = ClaimRef("ns1", "pod-gpu-x7k2p", "uid-2")
    driver, _ = _wrapped(writer, PrepareResult(devices=(_gpu(),), pod_claim_name="gpu"), claim)
    driver.prepare([claim])
    doc = _stream(writer.root / "ns1_pod-gpu-x7k2p" / "gpu" / "metadata.json")[0]
    assert doc["podClaimName"] == "gpu"
    mount = _mount(writer.cdi_root / f"{DRIVER}_metadata_uid-2_gpu.json")
    assert mount["containerPath"] == (
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpu/gpu/gpu.example.com-metadata.json"
    )
    assert container_path(DRIVER, "c", None, "r") == (
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/c/r/gpu.example.com-metadata.json"
    )


def test_a_subrequest_is_named_in_the_file_but_not_in_any_path(writer: DeviceMetadataWriter) -> None:
    driver, _ = _wrapped(writer, PrepareResult(devices=(_gpu(refs=("gpu/high-memory",)),)))
    out = driver.prepare([CLAIM])[CLAIM.uid]
    doc = _stream(writer.root / "default_my-claim" / "gpu" / "metadata.json")[0]
    assert doc["requests"][0]["name"] == "gpu/high-memory"
    assert f"{DRIVER}/metadata=claim-uid-1234_gpu" in out.devices[0].cdi_device_ids
    assert _mount(writer.cdi_root / f"{DRIVER}_metadata_claim-uid-1234_gpu.json")["containerPath"].endswith(
        "/resourceclaims/my-claim/gpu/gpu.example.com-metadata.json"
    )


def test_network_data_and_devices_without_metadata(writer: DeviceMetadataWriter) -> None:
    nic = DeviceResult(("net",), "node-a", "nic-0", (), metadata=DeviceMetadata(
        network_data=NetworkDeviceData("eth1", ("10.0.0.2/24",), "aa:bb:cc:dd:ee:ff")))  # fmt: skip
    bare = DeviceResult(("net",), "node-a", "nic-1", ())
    driver, _ = _wrapped(writer, PrepareResult(devices=(nic, bare)))
    driver.prepare([CLAIM])
    devices = _stream(writer.root / "default_my-claim" / "net" / "metadata.json")[0]["requests"][0]["devices"]
    assert devices == [
        {"driver": DRIVER, "pool": "node-a", "name": "nic-0",
         "networkData": {"interfaceName": "eth1", "ips": ["10.0.0.2/24"], "hardwareAddress": "aa:bb:cc:dd:ee:ff"}},
        {"driver": DRIVER, "pool": "node-a", "name": "nic-1"},
    ]  # fmt: skip


def test_go_json_escapes_what_go_escapes() -> None:
    assert go_json({"a": "<b>&\u2028é"}) == '{\n  "a": "\\u003cb\\u003e\\u0026\\u2028é"\n}'


_JSON_TEXT = st.text(st.characters(codec="utf-8"), max_size=12)
_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | _JSON_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_JSON_TEXT, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(_JSON_VALUES)
def test_go_json_is_the_stdlibs_indented_text_go_escaped(value: Any) -> None:
    expected = json.dumps(value, indent=2, ensure_ascii=False)
    for plain, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                           ("\u2029", "\\u2029")):  # fmt: skip
        expected = expected.replace(plain, escaped)
    assert go_json(value) == expected


def test_a_bad_pod_claim_name_fails_the_claim_naming_the_annotation(writer: DeviceMetadataWriter) -> None:
    driver, _ = _wrapped(writer, PrepareResult(devices=(_gpu(),), pod_claim_name="../../etc"))
    error = driver.prepare([CLAIM])[CLAIM.uid].error
    assert "resource.kubernetes.io/pod-claim-name" in error and "'../../etc'" in error
    assert not (writer.root / "default_my-claim").exists()
    assert list(writer.cdi_root.iterdir()) == []


def test_a_failed_write_fails_the_claim_and_a_retry_succeeds(writer: DeviceMetadataWriter) -> None:
    driver, _ = _wrapped(writer, PrepareResult(devices=(_gpu(),)))
    spec = writer.cdi_root / f"{DRIVER}_metadata_claim-uid-1234_gpu.json"
    spec.mkdir()  # something in the way (root can write anywhere, so no permission trick)
    (spec / "x").write_text("")
    error = driver.prepare([CLAIM])[CLAIM.uid].error
    assert "device metadata" in error and str(spec) in error and "is a directory" in error
    (spec / "x").unlink()
    spec.rmdir()
    assert driver.prepare([CLAIM])[CLAIM.uid].error == ""
    assert spec.is_file()
    assert [p.name for p in writer.cdi_root.iterdir()] == [spec.name]  # no temp file left by the failed write


def test_unprepare_removes_the_files_and_spares_a_recreated_claim_of_that_name(writer: DeviceMetadataWriter) -> None:
    driver, stub = _wrapped(writer, PrepareResult(devices=(_gpu("gpu-0", ("a",)), _gpu("gpu-1", ("b",)))))
    driver.prepare([CLAIM])
    assert driver.unprepare([CLAIM]) == {CLAIM.uid: ""}
    assert not (writer.root / "default_my-claim").exists()
    assert list(writer.cdi_root.iterdir()) == []

    # Deleted and re-created under the same name; the old claim is unprepared only after the new one's prepare.
    newer = ClaimRef(CLAIM.namespace, CLAIM.name, "uid-new")
    stub.results[newer.uid] = PrepareResult(devices=(_gpu("gpu-2", ("a",)),))
    driver.prepare([CLAIM, newer])
    stub.results[newer.uid] = PrepareResult(devices=(_gpu("gpu-2", ("a",)),))
    assert driver.unprepare([CLAIM]) == {CLAIM.uid: ""}
    assert _stream(writer.root / "default_my-claim" / "a" / "metadata.json")[0]["metadata"]["uid"] == "uid-new"
    assert not (writer.root / "default_my-claim" / "b").exists()
    assert sorted(p.name for p in writer.cdi_root.iterdir()) == [f"{DRIVER}_metadata_uid-new_a.json"]


@pytest.mark.parametrize(
    ("content", "uid"),
    [
        (b'{\n  "kind": "DeviceMetadata",\n  "metadata": {\n    "name": "c",\n    "uid": "u-1"\n  }\n}\n', "u-1"),
        # A stream of one object per version (newest first): the first one's UID.
        (b'{"metadata": {"uid": "u-2"}, "requests": []}\n{"metadata": {"uid": "u-old"}}\n', "u-2"),
        (b'{"metadata": {"uid": 7}}\n', None),
        (b'{"metadata": "u-3"}\n', None),
        (b'{"kind": "DeviceMetadata"}\n', None),
        (b'[{"metadata": {"uid": "u-4"}}]', None),
        (b'{"metadata": {"uid": "u-5"', None),  # a torn file
        (b"", None),
        (b"\xff\xfe not json", None),
    ],
)
def test_the_uid_an_unprepare_checks_is_the_first_objects_or_none(tmp_path: Path, content: bytes, uid: str | None) -> None:
    path = tmp_path / "metadata.json"
    path.write_bytes(content)
    assert _file_uid(path) == uid
    assert _file_uid(tmp_path / "missing.json") is None


def test_unprepare_takes_only_its_claims_specs_and_an_interrupted_writes_temp_file(
    writer: DeviceMetadataWriter,
) -> None:
    driver, stub = _wrapped(writer, PrepareResult(devices=(_gpu("gpu-0", ("a",)),)))
    other = ClaimRef("default", "other", "uid-other")
    stub.results[other.uid] = PrepareResult(devices=(_gpu("gpu-1", ("a",)),))
    driver.prepare([CLAIM, other])
    request_dir = writer.root / "default_my-claim" / "a"
    (request_dir / ".metadata.json.abcd1234.tmp").write_bytes(b"{")  # a crash mid-write left it
    unrelated = writer.cdi_root / "someone-else_metadata_uid-old_a.json"
    unrelated.write_text("{}")
    assert driver.unprepare([CLAIM]) == {CLAIM.uid: ""}
    assert not (writer.root / "default_my-claim").exists()
    assert sorted(p.name for p in writer.cdi_root.iterdir()) == [f"{DRIVER}_metadata_uid-other_a.json", unrelated.name]
    assert (writer.root / "default_other" / "a" / "metadata.json").is_file()


def test_the_dirs_are_0755_whatever_the_umask(writer: DeviceMetadataWriter) -> None:
    driver, _ = _wrapped(writer, PrepareResult(devices=(_gpu("gpu-0", ("a",)),)))
    old = os.umask(0o077)
    try:
        driver.prepare([CLAIM])
    finally:
        os.umask(old)
    for directory in (writer.root, writer.root / "default_my-claim", writer.root / "default_my-claim" / "a"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o755, directory


def test_a_failed_unprepare_keeps_the_files(writer: DeviceMetadataWriter) -> None:
    driver, stub = _wrapped(writer, PrepareResult(devices=(_gpu(),)))
    driver.prepare([CLAIM])
    stub.unprepare_errors[CLAIM.uid] = "GPU busy"
    assert driver.unprepare([CLAIM]) == {CLAIM.uid: "GPU busy"}
    assert (writer.root / "default_my-claim" / "gpu" / "metadata.json").is_file()


def test_while_disabled_nothing_is_written_but_unprepare_still_removes(writer: DeviceMetadataWriter) -> None:
    driver, stub = _wrapped(writer, PrepareResult(devices=(_gpu(),)))
    driver.prepare([CLAIM])  # written while on
    (files,) = driver.observers
    assert isinstance(files, MetadataFiles)
    files.enabled = False
    other = ClaimRef("default", "other", "uid-o")
    stub.results[other.uid] = PrepareResult(devices=(_gpu(),))
    out = driver.prepare([other])[other.uid]
    assert out.devices[0].cdi_device_ids == (f"k8s.{DRIVER}/claim=gpu-0",)
    assert not (writer.root / "default_other").exists()
    driver.unprepare([CLAIM])
    assert not writer.root.joinpath("default_my-claim").exists() and list(writer.cdi_root.iterdir()) == []


def test_the_sweep_removes_what_no_held_claim_owns(writer: DeviceMetadataWriter, dirs: tuple[Path, Path]) -> None:
    driver, stub = _wrapped(writer, PrepareResult(devices=(_gpu(),)))
    orphan = ClaimRef("default", "gone", "uid-gone")
    stub.results[orphan.uid] = PrepareResult(devices=(_gpu(),))
    driver.prepare([CLAIM, orphan])
    stub.held = [CLAIM]  # the driver forgot `orphan` without the kubelet (its stale-claim cleanup)
    # Another node's spec in a shared CDI dir (its mount points at its own plugin dir): never ours to remove.
    theirs = DeviceMetadataWriter(driver_name=DRIVER, plugin_dir=dirs[0].parent / "other-node", cdi_root=dirs[1])
    theirs.write(ClaimRef("default", "far", "uid-far"), None, (_gpu(),))
    # Temp files of interrupted writes: ours of the orphan, and one in a held claim's request dir.
    spec_temp = writer.cdi_root / f".{DRIVER}_metadata_uid-gone_gpu.json.{writer._tag}.abcd1234.tmp"
    spec_temp.write_text("{")
    file_temp = writer.root / "default_my-claim" / "gpu" / ".metadata.json.abcd1234.tmp"
    file_temp.write_text("{")

    removed = writer.sweep(lambda: stub.held)

    assert set(removed) == {
        writer.cdi_root / f"{DRIVER}_metadata_uid-gone_gpu.json", writer.root / "default_gone" / "gpu", spec_temp,
    }  # fmt: skip
    assert not (writer.root / "default_gone").exists()
    assert (writer.root / "default_my-claim" / "gpu" / "metadata.json").is_file()
    assert sorted(p.name for p in writer.cdi_root.iterdir()) == [
        f"{DRIVER}_metadata_claim-uid-1234_gpu.json", f"{DRIVER}_metadata_uid-far_gpu.json",
    ]  # fmt: skip
    # While prepares may be in flight a held claim's temp file may be a write in progress; at start it is a crash's.
    assert file_temp.exists()
    assert writer.sweep(lambda: stub.held, temp_files=True) == [file_temp]
    assert writer.sweep(lambda: stub.held) == []


def test_the_sweep_asks_for_held_claims_after_listing(writer: DeviceMetadataWriter) -> None:
    """A prepare that completes while the sweep runs: its record was durable before its files, so the answer the
    sweep gets after listing keeps them."""
    driver, stub = _wrapped(writer, PrepareResult(devices=(_gpu(),)))

    def held_after_a_prepare_finished() -> list[ClaimRef]:
        driver.prepare([CLAIM])
        return stub.held

    writer.sweep(held_after_a_prepare_finished)
    assert (writer.root / "default_my-claim" / "gpu" / "metadata.json").is_file()
    assert (writer.cdi_root / f"{DRIVER}_metadata_claim-uid-1234_gpu.json").is_file()


class Crash(BaseException):
    """A SIGKILL at a crash point, as seen from the code above it: nothing catches it (a plain Exception would be
    answered as the claim's error)."""


@pytest.mark.parametrize("point", ["metadata:after-file", "metadata:after-spec"])
def test_a_crash_after_the_drivers_record_leaves_nothing_recovery_keeps_wrongly(
    dirs: tuple[Path, Path], point: str
) -> None:
    plugin, cdi = dirs
    plugin.mkdir()
    cdi.mkdir()

    def crash(reached: str) -> None:
        if reached == point:
            raise Crash(reached)

    crashing = DeviceMetadataWriter(driver_name=DRIVER, plugin_dir=plugin, cdi_root=cdi, faults=crash)
    driver, stub = _wrapped(crashing, PrepareResult(devices=(_gpu(),)))
    with pytest.raises(Crash):
        driver.prepare([CLAIM])
    assert (crashing.root / "default_my-claim" / "gpu" / "metadata.json").is_file()

    restarted = DeviceMetadataWriter(driver_name=DRIVER, plugin_dir=plugin, cdi_root=cdi)
    # The driver still holds the claim (its record was durable): the sweep keeps it, the kubelet's retry completes.
    assert restarted.sweep(lambda: stub.held) == []
    again = PreparePipeline(stub, observers=[MetadataFiles(restarted)]).prepare([CLAIM])[CLAIM.uid]
    assert f"{DRIVER}/metadata=claim-uid-1234_gpu" in again.devices[0].cdi_device_ids
    assert (cdi / f"{DRIVER}_metadata_claim-uid-1234_gpu.json").is_file()
    # The claim goes while the plugin is down (the driver's cleanup forgets it): the next sweep removes everything.
    stub.held = []
    restarted.sweep(lambda: stub.held)
    assert list(cdi.iterdir()) == [] and list((plugin / "dra-device-metadata").iterdir()) == []


def _stream(path: Path) -> list[Any]:
    text, decoder = path.read_text(), json.JSONDecoder()
    out: list[Any] = []
    pos = 0
    while pos < len(text):
        obj, end = decoder.raw_decode(text, pos)
        out.append(obj)
        pos = end
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return out


def _mount(spec: Path) -> dict[str, str]:
    mount: dict[str, str] = json.loads(spec.read_text())["devices"][0]["containerEdits"]["mounts"][0]
    return mount


# --- what is made durable, and with how many syscalls --------------------------------------------------------------


def test_a_new_claims_specs_are_durable_and_its_files_whole_with_one_mkdir_per_dir_and_none_failing(
    writer: DeviceMetadataWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver, _ = _wrapped(writer, PrepareResult(devices=(_gpu("gpu-0", ("a",)), _gpu("gpu-1", ("b",)))))
    assert driver.prepare([CLAIM])[CLAIM.uid].error == ""  # the root dir exists from now on
    driver.unprepare([CLAIM])
    log = DurabilityLog(monkeypatch)
    assert driver.prepare([CLAIM])[CLAIM.uid].error == ""
    claim_dir = writer.root / "default_my-claim"
    # The claim's dir once, then each request's; no mkdir answers EEXIST or ENOENT.
    assert [(op.path, op.ok) for op in log.ops if op.kind == "mkdir"] == [
        (claim_dir, True), (claim_dir / "a", True), (claim_dir / "b", True)]  # fmt: skip
    for request in ("a", "b"):
        file, spec = claim_dir / request / "metadata.json", writer.spec_file(CLAIM, request)
        # Each file: renamed into place whole, no fsync (a prepare mends it: the test below); each spec durable.
        ops = log.since(0, file.parent)
        assert [op.kind for op in ops] == ["mkdir", "rename"]
        assert spec in durable_renames(log.ops, writer.cdi_root)
    assert not [op for op in log.ops if op.kind.startswith("fsync") and writer.root in op.path.parents]


@pytest.mark.parametrize("loss", ["file emptied", "file lost", "request dir lost", "claim dir lost"])
def test_a_prepare_mends_a_metadata_file_a_machine_crash_lost_or_emptied(
    writer: DeviceMetadataWriter, loss: str
) -> None:
    """What a crash of the machine can leave of a file that was not fsynced. The kubelet prepares every claim again
    after it restarts (it restores no claim as prepared from its checkpoint), before any container reads the file."""
    driver, _ = _wrapped(writer, PrepareResult(devices=(_gpu(),)))
    assert driver.prepare([CLAIM])[CLAIM.uid].error == ""
    file = writer.metadata_file(CLAIM, "gpu")
    written = file.read_bytes()
    if loss == "file emptied":
        file.write_bytes(b"")
    elif loss == "file lost":
        file.unlink()
    else:
        shutil.rmtree(file.parent if loss == "request dir lost" else file.parent.parent)
    again = driver.prepare([CLAIM])[CLAIM.uid]
    assert again.error == "" and f"{DRIVER}/metadata=claim-uid-1234_gpu" in again.devices[0].cdi_device_ids
    assert file.read_bytes() == written


def test_the_metadata_specs_dir_fsync_covers_a_claim_spec_renamed_there_before(
    writer: DeviceMetadataWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU plugin's claim spec is renamed into the CDI dir without a directory fsync (`defer_sync`); the
    metadata spec written after it fsyncs that dir once for both, and nothing is left for `sync_deferred`."""
    log = DurabilityLog(monkeypatch)
    claim_spec = writer.cdi_root / "k8s.gpu.example.com-claim_node_claim-uid-1234.json"
    claim_spec.with_name(".pending.tmp").write_bytes(b"{}")
    os.replace(claim_spec.with_name(".pending.tmp"), claim_spec)
    defer_dir_sync(writer.cdi_root)
    driver, _ = _wrapped(writer, PrepareResult(devices=(_gpu(),)))
    assert driver.prepare([CLAIM])[CLAIM.uid].error == ""
    cdi_syncs = [op for op in log.ops if op == Op("fsync-dir", writer.cdi_root)]
    assert len(cdi_syncs) == 1
    assert durable_renames(log.ops, writer.cdi_root) == [claim_spec, writer.spec_file(CLAIM, "gpu")]
    sync_deferred(writer.cdi_root)
    assert [op for op in log.ops if op.kind == "fsync-dir" and op.path == writer.cdi_root] == cdi_syncs


def test_a_removal_fsyncs_no_directory(writer: DeviceMetadataWriter, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unprepare's removals need not be durable before its answer: what a machine crash brings back is a file of a
    claim no longer held, which the sweep at start removes (below, and docs/architecture.md "Durable files")."""
    driver, stub = _wrapped(writer, PrepareResult(devices=(_gpu(),)))
    driver.prepare([CLAIM])
    spec, file = writer.spec_file(CLAIM, "gpu"), writer.metadata_file(CLAIM, "gpu")
    saved = spec.read_bytes(), file.read_bytes()
    log = DurabilityLog(monkeypatch)
    assert driver.unprepare([CLAIM]) == {CLAIM.uid: ""}
    assert {op.kind for op in log.ops} == {"unlink"}
    assert not spec.exists() and not file.exists()
    # What a crash could bring back: both files, the claim no longer held. The sweep at start removes them.
    file.parent.mkdir(parents=True)
    spec.write_bytes(saved[0])
    file.write_bytes(saved[1])
    removed = writer.sweep(lambda: stub.held, temp_files=True)
    assert spec in removed and file.parent in removed
    assert not spec.exists() and not file.exists()


def test_claims_leave_no_directory_state_behind(writer: DeviceMetadataWriter) -> None:
    """A request dir is only its claim's: its fsync keeps no group-commit state (one per claim ever prepared grew
    the plugin's memory with every claim)."""
    from dra_driver import fsutil

    claims = [ClaimRef("default", f"claim-{i}", f"uid-{i}") for i in range(20)]
    driver, stub = _wrapped(writer, PrepareResult(devices=(_gpu(),)), claims[0])
    driver.prepare(claims[:1])
    driver.unprepare(claims[:1])
    before = len(fsutil._dir_syncs)
    for claim in claims[1:]:
        stub.results[claim.uid] = PrepareResult(devices=(_gpu(),))
        assert driver.prepare([claim])[claim.uid].error == ""
        assert writer.metadata_file(claim, "gpu").is_file()
        assert driver.unprepare([claim]) == {claim.uid: ""}
    assert len(fsutil._dir_syncs) == before


def test_a_removal_unlinks_the_specs_it_wrote_without_listing_the_cdi_dir(
    writer: DeviceMetadataWriter, dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CDI dir holds every prepared claim's specs: an unprepare that listed it was O(claims held). The names
    this process wrote are removed by name; a claim prepared before a restart (a new writer) by the listing."""
    from dra_driver.kubeletplugin import metadata

    listed: list[str] = []
    real = metadata._names

    def counting(directory: str | Path) -> list[str]:
        listed.append(str(directory))
        return real(directory)

    monkeypatch.setattr(metadata, "_names", counting)
    claims = [ClaimRef("default", f"claim-{i}", f"uid-{i}") for i in range(3)]
    driver, stub = _wrapped(writer, PrepareResult(devices=(_gpu("gpu-0", ("a",)), _gpu("gpu-1", ("b",)))), claims[0])
    for claim in claims[1:]:
        stub.results[claim.uid] = PrepareResult(devices=(_gpu("gpu-0", ("a",)),))
    driver.prepare(claims)
    assert driver.unprepare(claims[:1]) == {claims[0].uid: ""}
    assert str(writer.cdi_root) not in listed
    assert sorted(p.name for p in writer.cdi_root.iterdir()) == [
        f"{DRIVER}_metadata_uid-1_a.json",
        f"{DRIVER}_metadata_uid-2_a.json",
    ]
    assert list(writer._written) == ["uid-1", "uid-2"]

    plugin, cdi = dirs
    restarted = DeviceMetadataWriter(driver_name=DRIVER, plugin_dir=plugin, cdi_root=cdi)
    restarted.remove(claims[1])
    assert str(writer.cdi_root) in listed  # written by the process before: found by the listing
    assert sorted(p.name for p in writer.cdi_root.iterdir()) == [f"{DRIVER}_metadata_uid-2_a.json"]

    writer.sweep(lambda: [claims[2]])  # the writer forgets a claim it no longer holds (never unprepared here)
    assert list(writer._written) == ["uid-2"]
    writer.sweep(lambda: [])
    assert writer._written == {}
