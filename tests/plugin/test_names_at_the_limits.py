"""Hostile input: names Kubernetes accepts, at and past every limit of the files the plugins make from them.

A namespace is up to 63 bytes, a ResourceClaim or node name up to 253, a request name up to 63, a UID (as the
plugins accept it) up to 128, a driver name up to 63; one path component is up to 255 bytes (NAME_MAX) and a path
up to 4095 (PATH_MAX). Every file or directory name made from them goes through `fsutil.bounded_name`
(docs/kubelet-plugin.md "File names from API names"): the name itself where it fits, where it does not a prefix and
a hash of the whole. Checked here: the rule itself; each place that uses it (device metadata dir and spec, the GPU
and ComputeDomain plugins' claim specs and CDI ids, MPS daemon dirs) at the boundary byte and past it, with the
names earlier versions wrote kept wherever they could write them; the plugin end to end over gRPC (prepare,
restart, prepare again, unprepare, unprepare again) with the longest names; and that a claim that fails, even by
an exception the plugin did not expect, fails alone: the other claims of the kubelet's call get their devices and
their files.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
import structlog.testing

from dra_driver._gen import dra_v1_pb2 as v1
from dra_driver._gen import dra_v1_pb2_grpc as v1_grpc
from dra_driver.cdi.model import ContainerEdits
from dra_driver.cdi.names import parse_qualified_name
from dra_driver.computedomain.plugin.cdi import SpecFiles
from dra_driver.defaults import DRIVER_NAME
from dra_driver.fsutil import (
    ATOMIC_NAME_MAX,
    BOUNDED_NAME_MIN,
    HASH_CHARS,
    NAME_MAX,
    PATH_MAX,
    TEMP_NAME_EXTRA,
    bounded_name,
    explain_os_error,
)
from dra_driver.inventory.catalog import MigOffering, catalog
from dra_driver.inventory.discover import discover
from dra_driver.k8s.client import KubeRest
from dra_driver.kubeletplugin.driver import ClaimRef, DeviceMetadata, DeviceResult, PrepareResult
from dra_driver.kubeletplugin.metadata import DeviceMetadataWriter, MetadataError, MetadataFiles
from dra_driver.kubeletplugin.names import UID_MAX, claim_ref_problem
from dra_driver.kubeletplugin.pipeline import PreparePipeline
from dra_driver.nvml.factory import open_backend
from dra_driver.plugin.app import KubeletPlugin
from dra_driver.plugin.cdi import ClaimSpecWriter, DeviceForCdi, FakeCdiEdits
from dra_driver.plugin.devicemetadata import DeviceMetadataMode
from dra_driver.plugin.mps import MpsDaemons, claim_daemon_id
from dra_sandbox.apiserver import ApiServer
from tests.plugin.conftest import plugin_settings

LONG_DRIVER = "d" * 59 + ".com"  # 63: the longest driver name
NS_MAX = "n" * 63
NAME_253 = ("c" * 62 + ".") * 4 + "c"  # 253, a DNS subdomain (labels of 62)
REQUEST_63 = "r" * 63
UID_36 = "0b6f2a56-3c4e-4b8a-9a51-4f6f0c1d2e3f"
UID_128 = "u" * UID_MAX
NODE_253 = ("k" * 62 + ".") * 4 + "k"  # 253
LONGEST = ClaimRef(NS_MAX, NAME_253, UID_128)


def _components(path: Path) -> list[int]:
    return [len(part.encode()) for part in path.parts]


# --- the rule ----------------------------------------------------------------------------------------------------


def test_a_name_that_fits_is_kept_byte_for_byte_up_to_the_limit() -> None:
    assert bounded_name("default") == "default"
    assert bounded_name("a" * NAME_MAX) == "a" * NAME_MAX
    assert bounded_name("a" * 40, 40) == "a" * 40


@pytest.mark.parametrize("limit", [BOUNDED_NAME_MIN, 40, 232, ATOMIC_NAME_MAX, NAME_MAX])
def test_a_name_past_the_limit_keeps_its_prefix_and_gets_a_stable_hash(limit: int) -> None:
    name = "x" * (limit + 1)
    short = bounded_name(name, limit)
    assert len(short.encode()) == limit
    prefix, sep, digest = short.rpartition("_")
    assert sep and name.startswith(prefix) and len(digest) == HASH_CHARS and set(digest) <= set("0123456789abcdef")
    assert bounded_name(name, limit) == short  # the same in every call, process and version (no salt)
    # Names that share the kept prefix still differ; a shortened name is never a name kept whole (it has '_').
    assert bounded_name(name + "y", limit) != short
    assert bounded_name(short.replace("_", "-"), limit) != short


def test_the_hash_is_sha256_of_the_whole_name() -> None:
    name = NAME_253 + "." + NAME_253
    assert bounded_name(name).endswith("_" + hashlib.sha256(name.encode()).hexdigest()[:HASH_CHARS])


def test_a_multibyte_character_is_never_cut_in_half() -> None:
    name = "é" * 200  # 400 bytes
    short = bounded_name(name, 100)
    assert len(short.encode()) <= 100 and short.encode().decode() == short and short.startswith("é" * 41)


@pytest.mark.parametrize(("name", "limit", "match"), [("a_b", NAME_MAX, "contains '_'"),
                                                      ("a" * 300, BOUNDED_NAME_MIN - 1, "leave no room")])
def test_misuse_is_refused(name: str, limit: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        bounded_name(name, limit)


def test_the_identities_used_here_are_valid_kubernetes_names() -> None:
    assert len(NAME_253) == 253 and len(NODE_253) == 253 and len(LONG_DRIVER) == 63
    assert claim_ref_problem(LONGEST) is None
    assert claim_ref_problem(ClaimRef(NS_MAX, NAME_253, UID_36)) is None


def test_a_path_too_long_is_explained_with_its_sizes() -> None:
    path = Path("/x") / ("y" * 300)
    message = explain_os_error(OSError(errno.ENAMETOOLONG, "File name too long"), path, "creating", "the plugin dir")
    assert "File name too long" in message and f"{NAME_MAX}" in message and "300" in message
    assert "choose a shorter path for the plugin dir" in message


# --- device metadata ---------------------------------------------------------------------------------------------


def _gpu(request: str) -> DeviceResult:
    return DeviceResult(request_names=(request,), pool="node-a", device="gpu-0", cdi_device_ids=("k8s.x/claim=a",),
                        metadata=DeviceMetadata(attributes={"index": {"int": 0}}))  # fmt: skip


@pytest.fixture
def writer(tmp_path: Path) -> DeviceMetadataWriter:
    (tmp_path / "plugin").mkdir()
    (tmp_path / "cdi").mkdir()
    return DeviceMetadataWriter(driver_name=LONG_DRIVER, plugin_dir=tmp_path / "plugin", cdi_root=tmp_path / "cdi")


@pytest.mark.parametrize(
    ("namespace", "name"),
    [
        ("default", "c"),
        (NS_MAX, "c" * (NAME_MAX - 64)),  # `<namespace>_<name>` of exactly 255 bytes: upstream's name
        (NS_MAX, "c" * (NAME_MAX - 63)),  # 256
        ("ab", NAME_253),  # 256: the case the hostile run found
        (NS_MAX, NAME_253),  # 317
    ],
)
def test_the_metadata_dir_is_upstreams_name_where_it_fits(writer: DeviceMetadataWriter, namespace: str, name: str) -> None:
    legacy = f"{namespace}_{name}"
    directory = writer.claim_dir(ClaimRef(namespace, name, UID_36))
    assert (directory.name == legacy) is (len(legacy.encode()) <= NAME_MAX)
    assert len(directory.name.encode()) <= NAME_MAX and directory.name.startswith(f"{namespace}_")


def test_the_longest_names_prepare_unprepare_and_sweep(writer: DeviceMetadataWriter) -> None:
    stub = _Stub({LONGEST.uid: PrepareResult(devices=(_gpu(REQUEST_63),))})
    driver = _with_metadata(stub, writer)
    result = driver.prepare([LONGEST])[LONGEST.uid]
    assert result.error == ""
    cdi_id = f"{LONG_DRIVER}/metadata={UID_128}_{REQUEST_63}"  # the CDI id is upstream's, whole
    assert cdi_id in result.devices[0].cdi_device_ids
    parse_qualified_name(cdi_id)

    file = writer.metadata_file(LONGEST, REQUEST_63)
    assert json.JSONDecoder().raw_decode(file.read_text())[0]["metadata"] == {
        "name": NAME_253, "namespace": NS_MAX, "uid": UID_128, "generation": 1}  # fmt: skip
    (spec,) = list(writer.cdi_root.iterdir())
    assert spec == writer.spec_file(LONGEST, REQUEST_63)
    # Its temp file (`.<name>.<tag>.<random>.tmp`) must fit as well, or no write could ever have made it.
    assert len(spec.name.encode()) + len(f".{writer._tag}") + TEMP_NAME_EXTRA <= NAME_MAX
    assert spec.name.startswith(f"{LONG_DRIVER}_metadata_{UID_128}_rrrr")
    mount = json.loads(spec.read_text())["devices"][0]["containerEdits"]["mounts"][0]
    assert mount["hostPath"] == str(file)
    assert mount["containerPath"].endswith(f"/resourceclaims/{NAME_253}/{REQUEST_63}/{LONG_DRIVER}-metadata.json")
    assert max(_components(file)) <= NAME_MAX

    # A restarted plugin (a new writer) finds the same names; the sweep keeps what a held claim owns.
    again = DeviceMetadataWriter(driver_name=LONG_DRIVER, plugin_dir=writer.root.parent, cdi_root=writer.cdi_root)
    assert again.claim_dir(LONGEST) == writer.claim_dir(LONGEST) and again.spec_file(LONGEST, REQUEST_63) == spec
    assert again.sweep(lambda: [LONGEST], temp_files=True) == []
    assert _with_metadata(stub, again).unprepare([LONGEST]) == {LONGEST.uid: ""}
    assert list(writer.root.iterdir()) == [] and list(writer.cdi_root.iterdir()) == []
    assert _with_metadata(stub, again).unprepare([LONGEST]) == {LONGEST.uid: ""}  # a retry: nothing left


def test_an_orphan_with_the_longest_names_is_swept(writer: DeviceMetadataWriter) -> None:
    orphan = ClaimRef(NS_MAX, NAME_253.replace("c", "o"), "o" * UID_MAX)
    held = ClaimRef(NS_MAX, NAME_253, UID_128)
    results = {c.uid: PrepareResult(devices=(_gpu(REQUEST_63),)) for c in (orphan, held)}
    _with_metadata(_Stub(results), writer).prepare([orphan, held])
    removed = writer.sweep(lambda: [held])
    assert writer.spec_file(orphan, REQUEST_63) in removed
    assert not writer.claim_dir(orphan).exists() and writer.metadata_file(held, REQUEST_63).is_file()
    assert [p.name for p in writer.cdi_root.iterdir()] == [writer.spec_file(held, REQUEST_63).name]


def test_files_an_earlier_version_wrote_are_found_and_removed(writer: DeviceMetadataWriter) -> None:
    """Upgrade: wherever the old names (`<namespace>_<claim>`, `<driver>_metadata_<uid>_<request>.json`) could be
    written at all, they are the names now; such a claim's unprepare removes what the old version wrote."""
    claim = ClaimRef(NS_MAX, "c" * (NAME_MAX - 64), UID_36)  # a 255-byte directory name: the longest that worked
    request_dir = writer.root / f"{claim.namespace}_{claim.name}" / REQUEST_63
    request_dir.mkdir(parents=True)
    (request_dir / "metadata.json").write_text(json.dumps({"metadata": {"uid": UID_36}}) + "\n")
    old_spec = writer.cdi_root / f"{LONG_DRIVER}_metadata_{UID_36}_{REQUEST_63}.json"
    old_spec.write_text(json.dumps({"devices": [{"containerEdits": {"mounts": [{"hostPath": str(request_dir)}]}}]}))
    assert writer.claim_dir(claim) == request_dir.parent and writer.spec_file(claim, REQUEST_63) == old_spec
    assert _with_metadata(_Stub({}), writer).unprepare([claim]) == {claim.uid: ""}
    assert list(writer.root.iterdir()) == [] and list(writer.cdi_root.iterdir()) == []


def test_a_plugin_dir_too_long_for_any_metadata_path_is_refused_at_start(tmp_path: Path) -> None:
    deep = Path("/") / "/".join(["p" * 200] * 19)  # 3819 bytes: the longest metadata path would pass PATH_MAX
    with pytest.raises(MetadataError, match=r"--plugin-dir: .* over the 4095-byte limit on a path"):
        DeviceMetadataWriter(driver_name=DRIVER_NAME, plugin_dir=deep, cdi_root=tmp_path)
    fits = Path("/") / "/".join(["p" * 200] * 17)
    assert len(str(fits / "dra-device-metadata").encode()) + 1 + NAME_MAX + 1 + 63 + 28 < PATH_MAX
    DeviceMetadataWriter(driver_name=DRIVER_NAME, plugin_dir=fits, cdi_root=tmp_path)


def _with_metadata(stub: _Stub, writer: DeviceMetadataWriter) -> PreparePipeline:
    """The stub driver with the device-metadata observer on a prepare pipeline (as a plugin registers it)."""
    return PreparePipeline(stub, observers=[MetadataFiles(writer)])


class _Stub:
    def __init__(self, results: dict[str, PrepareResult]) -> None:
        self.results = results

    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        return {c.uid: self.results[c.uid] for c in claims}

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str]:
        return {c.uid: "" for c in claims}


def test_an_unexpected_exception_in_the_metadata_layer_fails_only_its_claim(writer: DeviceMetadataWriter) -> None:
    good, bad = ClaimRef("default", "good", UID_36), ClaimRef("default", "bad", "bad-uid")
    driver = _with_metadata(_Stub({c.uid: PrepareResult(devices=(_gpu("gpu"),)) for c in (good, bad)}), writer)
    real_write = writer.write

    def write(claim: ClaimRef, pod_claim_name: str | None, devices: Any) -> dict[str, str]:
        if claim == bad:
            raise RuntimeError("a bug")
        return real_write(claim, pod_claim_name, devices)

    writer.write = write  # type: ignore[method-assign]
    with structlog.testing.capture_logs() as logs:
        results = driver.prepare([bad, good])
    assert [(e["claim"], e["claim_uid"]) for e in logs if e["log_level"] == "error"] == [("default/bad", "bad-uid")]
    assert results[bad.uid].error == "prepare default/bad: device metadata: internal error: a bug"
    assert results[good.uid].error == "" and writer.metadata_file(good, "gpu").is_file()


# --- CDI claim specs of both plugins -----------------------------------------------------------------------------


def _legacy_claim_spec(driver: str, node: str, uid: str) -> str:
    return f"k8s.{driver}-claim_{node}_{uid}.json"


@pytest.mark.parametrize("uid", [UID_36, UID_128])
@pytest.mark.parametrize("extra", [0, 1, 100])
def test_gpu_claim_spec_names_at_the_boundary(tmp_path: Path, uid: str, extra: int) -> None:
    fixed = len(_legacy_claim_spec(LONG_DRIVER, "", uid))
    node = "k" * (ATOMIC_NAME_MAX - fixed + extra)  # extra 0: exactly the longest name a write could make
    writer = ClaimSpecWriter(tmp_path, LONG_DRIVER, FakeCdiEdits(), node)
    name = writer.file_name(uid)
    assert (name == _legacy_claim_spec(LONG_DRIVER, node, uid)) is (extra == 0)
    assert len(name.encode()) <= ATOMIC_NAME_MAX and name.endswith(f"_{uid}.json")


class _GpuSpecs:
    """The GPU plugin's claim specs, as the ComputeDomain plugin's `SpecFiles` are used."""

    def __init__(self, cdi: Path, node: str) -> None:
        self.files = ClaimSpecWriter(cdi, LONG_DRIVER, FakeCdiEdits(), node)
        backend = open_backend("fake:dgx-h100")
        backend.init()
        gpu = catalog(discover(backend), MigOffering.STATIC)["gpu-0"]
        self._devices = [DeviceForCdi(allocatable=gpu, visible_uuid=gpu.gpu.uuid, sharing="None")]

    def write(self, uid: str) -> None:
        self.files.write(uid, self._devices)

    def path(self, uid: str) -> Path:
        return self.files.spec_path(uid)

    def on_disk(self) -> set[str]:
        return self.files.claim_uids_on_disk()


class _CdSpecs:
    def __init__(self, cdi: Path, node: str) -> None:
        self.files = SpecFiles(cdi, LONG_DRIVER, node)

    def write(self, uid: str) -> None:
        self.files.write(uid, {"channel-2047": ContainerEdits(env=("A=1",))})

    def path(self, uid: str) -> Path:
        return self.files.spec_path(uid)

    def on_disk(self) -> set[str]:
        return self.files.claim_uids_on_disk()


@pytest.mark.parametrize("specs", [_GpuSpecs, _CdSpecs], ids=["gpu", "compute-domain"])
def test_claim_specs_with_the_longest_node_and_uid_are_written_found_swept_and_removed(
    tmp_path: Path, specs: type[_GpuSpecs] | type[_CdSpecs]
) -> None:
    cdi = tmp_path / "cdi"
    # Another node sharing the CDI dir, whose name differs only past the kept prefix: its files are never ours.
    ours, other = specs(cdi, NODE_253), specs(cdi, NODE_253[:-1] + "z")
    for uid in (UID_36, UID_128):
        ours.write(uid)
        other.write(uid)
        assert ours.path(uid).is_file() and ours.path(uid) != other.path(uid)
    assert ours.on_disk() == {UID_36, UID_128} == other.on_disk()
    assert len(list(cdi.iterdir())) == 4 and all(len(p.name.encode()) <= ATOMIC_NAME_MAX for p in cdi.iterdir())
    # Crash leftovers: ours are swept, the other node's stay.
    mine = cdi / f".{ours.path(UID_128).name}.abcd1234.tmp"
    theirs = cdi / f".{other.path(UID_128).name}.abcd1234.tmp"
    mine.write_text("{")
    theirs.write_text("{")
    assert ours.files.sweep_temp_files() == [mine] and theirs.exists()
    # A restart (a new writer) finds the same files; removal takes ours only, and a repeated removal is a no-op.
    again = specs(cdi, NODE_253)
    assert again.on_disk() == {UID_36, UID_128}
    assert again.files.remove(UID_128) and again.files.remove(UID_36) and not again.files.remove(UID_36)
    assert again.on_disk() == set() and other.on_disk() == {UID_36, UID_128}


def test_cdi_ids_of_the_longest_names_are_valid() -> None:
    uid, device = UID_128, "g" * 63
    for qualified in (ClaimSpecWriter(Path("/x"), LONG_DRIVER, FakeCdiEdits(), NODE_253).cdi_id(uid, device),
                      SpecFiles(Path("/x"), LONG_DRIVER, NODE_253).cdi_id(uid, device)):  # fmt: skip
        assert parse_qualified_name(qualified).name == f"{uid}-{device}"


# --- MPS daemon dirs ---------------------------------------------------------------------------------------------


def test_mps_claim_daemon_ids_are_bounded_and_distinct(tmp_path: Path) -> None:
    assert claim_daemon_id(UID_36) == f"claim-{UID_36}"  # what earlier versions named it
    long_id = claim_daemon_id(UID_128)
    # No longer than a real UID's: the daemon's pipe path (its control socket) is no longer either.
    assert len(long_id) == len(claim_daemon_id(UID_36)) and long_id.startswith("claim-uuu")
    assert claim_daemon_id("AB-c") != claim_daemon_id("ab-c")
    daemons = MpsDaemons(tmp_path, control=None, nvml=None)  # type: ignore[arg-type]
    for daemon in (long_id, claim_daemon_id("AB-c")):
        (tmp_path / daemon).mkdir()
    assert daemons.on_disk() == sorted([long_id, "claim-AB-c"])  # the sweep after a lost checkpoint sees them


# --- the GPU plugin end to end, over gRPC --------------------------------------------------------------------------


def _plugin(server: ApiServer, work: Path, node: str) -> KubeletPlugin:
    backend = open_backend("fake:dgx-h100")
    backend.init()
    settings = replace(plugin_settings(work, node, MigOffering.STATIC), usage_interval=0, events=False,
                       device_metadata=DeviceMetadataMode.ON)
    return KubeletPlugin(settings, nvml=backend, rest=KubeRest(server.connection()))


def _allocated(rest: KubeRest, namespace: str, name: str, node: str, devices: dict[str, str]) -> ClaimRef:
    """A ResourceClaim allocated on `node`, one request per entry of `devices` (request name -> device)."""
    if rest.get(f"/api/v1/namespaces/{namespace}") is None:
        rest.request("POST", "/api/v1/namespaces",
                     body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})  # fmt: skip
    base = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    requests = [{"name": r, "exactly": {"deviceClassName": DRIVER_NAME}} for r in devices]
    claim = rest.request("POST", base, body={"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                             "metadata": {"name": name, "namespace": namespace},
                                             "spec": {"devices": {"requests": requests}}})  # fmt: skip
    claim["status"] = {"allocation": {
        "devices": {"results": [{"request": r, "driver": DRIVER_NAME, "pool": node, "device": d}
                                for r, d in devices.items()]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
    }}  # fmt: skip
    stored = rest.request("PUT", f"{base}/{name}/status", body=claim)
    return ClaimRef(namespace, name, stored["metadata"]["uid"])


def _call(plugin: KubeletPlugin, method: str, refs: list[ClaimRef]) -> Any:
    claims = [v1.Claim(namespace=r.namespace, name=r.name, uid=r.uid) for r in refs]
    with grpc.insecure_channel(f"unix://{plugin.server.dra_socket}") as channel:
        stub = v1_grpc.DRAPluginStub(channel)
        if method == "prepare":
            return stub.NodePrepareResources(v1.NodePrepareResourcesRequest(claims=claims), timeout=30)
        return stub.NodeUnprepareResources(v1.NodeUnprepareResourcesRequest(claims=claims), timeout=30)


def _metadata_files(work: Path) -> list[Path]:
    return sorted(p for p in (work / "p" / "dra-device-metadata").rglob("metadata.json"))


@pytest.fixture
def cluster() -> Iterator[ApiServer]:
    server = ApiServer(kube_version="1.36.0")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_the_longest_names_prepare_restart_and_unprepare_over_grpc(cluster: ApiServer, work: Path) -> None:
    rest = cluster.rest()
    rest.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE_253}})
    longest = _allocated(rest, NS_MAX, NAME_253, NODE_253, {REQUEST_63: "gpu-0", "r" * 62 + "s": "gpu-1"})
    plain = _allocated(rest, "default", "plain", NODE_253, {"gpu": "gpu-2"})

    first = _plugin(cluster, work, NODE_253)
    first.start()
    try:
        response = _call(first, "prepare", [longest, plain])
        for ref in (longest, plain):
            assert response.claims[ref.uid].error == ""
        ids = {d.device_name: list(d.cdi_device_ids) for d in response.claims[longest.uid].devices}
        assert f"{DRIVER_NAME}/metadata={longest.uid}_{REQUEST_63}" in ids["gpu-0"]
        assert ids["gpu-0"][0] == f"k8s.{DRIVER_NAME}/claim={longest.uid}-gpu-0"
        files = _metadata_files(work)
        assert len(files) == 3 and all(max(_components(f)) <= NAME_MAX for f in files)
        written = {f: f.read_bytes() for f in files}
        assert {json.JSONDecoder().raw_decode(b.decode())[0]["metadata"]["name"] for b in written.values()} == {
            NAME_253, "plain"}  # fmt: skip
        specs = sorted(p.name for p in (work / "cdi").iterdir())
        assert len(specs) == 2 + 3 and all(len(n) <= ATOMIC_NAME_MAX for n in specs)
    finally:
        first.stop()

    second = _plugin(cluster, work, NODE_253)  # a restart: the same names, the same answers
    second.start()
    try:
        again = _call(second, "prepare", [longest, plain])
        assert again == response
        assert {f: f.read_bytes() for f in _metadata_files(work)} == written
        assert sorted(p.name for p in (work / "cdi").iterdir()) == specs

        gone = _call(second, "unprepare", [longest, plain])
        assert {uid: c.error for uid, c in gone.claims.items()} == {longest.uid: "", plain.uid: ""}
        assert _metadata_files(work) == [] and list((work / "cdi").iterdir()) == []
        retry = _call(second, "unprepare", [longest, plain])  # the kubelet's retry: still a success
        assert {uid: c.error for uid, c in retry.claims.items()} == {longest.uid: "", plain.uid: ""}
    finally:
        second.stop()


def test_one_claim_failing_in_a_batch_leaves_the_others_answered_and_on_disk(
    cluster: ApiServer, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure the plugin did not expect (a bug, here injected into the metadata writer) in one claim of the
    kubelet's call: that claim's own error, logged with it; the other claims' devices and files as usual. The
    failed unprepare of a claim is answered alone too, and the kubelet's retry then succeeds."""
    rest = cluster.rest()
    rest.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    longest = _allocated(rest, NS_MAX, NAME_253, "n1", {REQUEST_63: "gpu-0"})
    broken = _allocated(rest, "default", "broken", "n1", {"gpu": "gpu-1"})
    plugin = _plugin(cluster, work, "n1")
    plugin.start()
    try:
        writer = plugin.metadata.writer
        real_write, real_remove = writer.write, writer.remove

        def write(claim: ClaimRef, pod_claim_name: str | None, devices: Any) -> dict[str, str]:
            if claim.uid == broken.uid:
                raise KeyError("injected")
            return real_write(claim, pod_claim_name, devices)

        monkeypatch.setattr(writer, "write", write)
        with structlog.testing.capture_logs() as logs:
            response = _call(plugin, "prepare", [broken, longest])
        assert [e["claim_uid"] for e in logs if e["log_level"] == "error"] == [broken.uid]
        assert response.claims[broken.uid].error == (
            "prepare default/broken: device metadata: internal error: 'injected'")
        assert list(response.claims[broken.uid].devices) == []
        ok = response.claims[longest.uid]
        assert ok.error == "" and [d.device_name for d in ok.devices] == ["gpu-0"]
        (file,) = _metadata_files(work)
        assert file == writer.metadata_file(longest, REQUEST_63)
        assert json.JSONDecoder().raw_decode(file.read_text())[0]["metadata"]["uid"] == longest.uid
        monkeypatch.setattr(writer, "write", real_write)
        assert _call(plugin, "prepare", [broken]).claims[broken.uid].error == ""  # the kubelet's retry

        def remove(claim: ClaimRef) -> None:
            if claim.uid == longest.uid:
                raise OSError(errno.EIO, "injected")
            real_remove(claim)

        monkeypatch.setattr(writer, "remove", remove)
        with structlog.testing.capture_logs():
            gone = _call(plugin, "unprepare", [longest, broken])
        assert "internal error" in gone.claims[longest.uid].error and gone.claims[broken.uid].error == ""
        assert _metadata_files(work) == [writer.metadata_file(longest, REQUEST_63)]
        monkeypatch.setattr(writer, "remove", real_remove)
        retry = _call(plugin, "unprepare", [longest, broken])
        assert {uid: c.error for uid, c in retry.claims.items()} == {longest.uid: "", broken.uid: ""}
        assert _metadata_files(work) == [] and list((work / "cdi").iterdir()) == []
    finally:
        plugin.stop()


def test_namespace_and_name_over_the_limits_are_still_refused(cluster: ApiServer, work: Path) -> None:
    """Past the Kubernetes limits (a 64-byte namespace, a 254-byte name, a UID past 128) a claim is refused by
    name, as before: nothing is made for it, and the claim beside it is served."""
    rest = cluster.rest()
    rest.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    good = _allocated(rest, "default", "good", "n1", {"gpu": "gpu-0"})
    plugin = _plugin(cluster, work, "n1")
    plugin.start()
    try:
        bad = [ClaimRef("n" * 64, "c", UID_36), ClaimRef("default", NAME_253 + "c", UID_36.replace("0", "1")),
               ClaimRef("default", "c", "u" * (UID_MAX + 1))]  # fmt: skip
        for ref in bad:
            response = _call(plugin, "prepare", [ref, good])
            assert "refusing this claim" in response.claims[ref.uid].error
            assert response.claims[good.uid].error == ""
        assert len(_metadata_files(work)) == 1
        assert all(os.path.basename(p).startswith("default_") for p in os.listdir(work / "p" / "dra-device-metadata"))
    finally:
        plugin.stop()
