"""The plugin's gRPC endpoints over real unix sockets, called exactly as the kubelet calls them."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import structlog
import structlog.testing

from dra_driver._gen import dra_health_v1_pb2 as health_v1_pb
from dra_driver._gen import dra_health_v1_pb2_grpc as health_v1_grpc
from dra_driver._gen import dra_health_v1alpha1_pb2 as health_pb
from dra_driver._gen import dra_health_v1alpha1_pb2_grpc as health_grpc
from dra_driver._gen import dra_v1_pb2 as v1
from dra_driver._gen import dra_v1_pb2_grpc as v1_grpc
from dra_driver._gen import dra_v1beta1_pb2 as v1beta1
from dra_driver._gen import dra_v1beta1_pb2_grpc as v1beta1_grpc
from dra_driver._gen import pluginregistration_v1_pb2 as reg
from dra_driver._gen import pluginregistration_v1_pb2_grpc as reg_grpc
from dra_driver.errors import DraDriverError
from dra_driver.kubeletplugin.driver import DeviceResult, PrepareResult
from dra_driver.kubeletplugin.server import PluginServer, SocketPaths
from dra_driver.kubeletplugin.sockets import SocketInUseError
from dra_driver.observability.endpoint import HttpEndpoint
from dra_driver.plugin.app import stop_side_by_side
from dra_driver.plugin.health.board import DeviceHealthBoard
from tests.plugin.conftest import DRIVER, EngineRig


@pytest.fixture
def short_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(dir="/tmp", prefix="dra-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def served(tmp_path: Path, short_dir: Path) -> Iterator[tuple[PluginServer, EngineRig, DeviceHealthBoard]]:
    rig = EngineRig(tmp_path)
    board = DeviceHealthBoard(pool="node-a", clock=lambda: 1700000000.0)
    board.update(rig.devices)
    server = PluginServer(
        driver_name=DRIVER,
        plugin_dir=short_dir / "plugins" / DRIVER,
        registry_dir=short_dir / "plugins_registry",
        driver=rig.engine,
        health=board,
    )
    server.start()
    yield server, rig, board
    server.stop(grace=1)
    rig.engine.close()


def _claim(mod: Any, ref: Any) -> Any:
    return mod.Claim(namespace=ref.namespace, name=ref.name, uid=ref.uid)


def test_get_info_says_who_we_are(served: Any) -> None:
    server, _, _ = served
    with grpc.insecure_channel(f"unix://{server.registration_socket}") as ch:
        info = reg_grpc.RegistrationStub(ch).GetInfo(reg.InfoRequest(), timeout=5)
        assert info.type == "DRAPlugin"
        assert info.name == DRIVER
        assert info.endpoint == str(server.plugin_dir / "dra.sock") and os.path.isabs(info.endpoint)
        assert list(info.supported_versions) == [
            "v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth", "v1.DRAResourceHealth"
        ]
        reg_grpc.RegistrationStub(ch).NotifyRegistrationStatus(
            reg.RegistrationStatus(plugin_registered=True), timeout=5
        )
    assert server.registration.registered.is_set()
    assert server.registration_socket.name == f"{DRIVER}-reg.sock"


def test_sockets_and_plugin_dir_are_not_world_writable(served: Any) -> None:
    server, _, _ = served
    for path in (server.dra_socket, server.registration_socket):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert stat.S_ISSOCK(path.stat().st_mode) and mode & 0o002 == 0
    assert stat.S_IMODE(server.plugin_dir.stat().st_mode) & 0o022 == 0


@pytest.mark.parametrize(("pb", "stub"), [(v1, v1_grpc.DRAPluginStub), (v1beta1, v1beta1_grpc.DRAPluginStub)])
def test_prepare_and_unprepare_through_both_versions(served: Any, pb: Any, stub: Any) -> None:
    server, rig, _ = served
    good = rig.claims.add("good", ["gpu-0"])
    missing = rig.claims.add("missing", ["gpu-1"])
    del rig.claims.objects[("default", "missing")]
    with grpc.insecure_channel(f"unix://{server.dra_socket}") as ch:
        client = stub(ch)
        resp = client.NodePrepareResources(
            pb.NodePrepareResourcesRequest(claims=[_claim(pb, good), _claim(pb, missing)]), timeout=10
        )
        assert set(resp.claims) == {good.uid, missing.uid}
        assert resp.claims[good.uid].error == ""
        dev = resp.claims[good.uid].devices[0]
        assert (dev.pool_name, dev.device_name, list(dev.request_names)) == ("node-a", "gpu-0", ["r0"])
        assert list(dev.cdi_device_ids) == [f"k8s.{DRIVER}/claim={good.uid}-gpu-0"]
        assert "does not exist" in resp.claims[missing.uid].error
        un = client.NodeUnprepareResources(
            pb.NodeUnprepareResourcesRequest(claims=[_claim(pb, good), _claim(pb, missing)]), timeout=10
        )
        assert {k: v.error for k, v in un.claims.items()} == {good.uid: "", missing.uid: ""}
    assert not rig.spec_path(good.uid).exists()


class _ShareEngine:
    def prepare(self, claims: list[Any]) -> dict[str, PrepareResult]:
        return {
            c.uid: PrepareResult((DeviceResult(("r",), "p", "gpu-0", ("v/c=x",), share_id="share-1"),)) for c in claims
        }

    def unprepare(self, claims: list[Any]) -> dict[str, str]:
        return {c.uid: "" for c in claims}


def test_share_id_only_on_v1(short_dir: Path) -> None:
    board = DeviceHealthBoard("p")
    server = PluginServer(
        driver_name=DRIVER,
        plugin_dir=short_dir / "p",
        registry_dir=short_dir / "r",
        driver=_ShareEngine(),
        health=board,
    )
    server.start()
    try:
        with grpc.insecure_channel(f"unix://{server.dra_socket}") as ch:
            c = v1.Claim(namespace="n", name="c", uid="u")
            r1 = v1_grpc.DRAPluginStub(ch).NodePrepareResources(v1.NodePrepareResourcesRequest(claims=[c]), timeout=5)
            assert r1.claims["u"].devices[0].share_id == "share-1"
            assert r1.claims["u"].devices[0].HasField("share_id")
            cb = v1beta1.Claim(namespace="n", name="c", uid="u")
            rb = v1beta1_grpc.DRAPluginStub(ch).NodePrepareResources(
                v1beta1.NodePrepareResourcesRequest(claims=[cb]), timeout=5
            )
            assert rb.claims["u"].devices[0].device_name == "gpu-0"
    finally:
        server.stop(grace=1)


def test_health_stream_lists_every_device_and_follows_changes(served: Any) -> None:
    server, rig, board = served
    with grpc.insecure_channel(f"unix://{server.dra_socket}") as ch:
        stream = health_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
            health_pb.NodeWatchResourcesRequest(), timeout=10
        )
        first = next(stream)
        assert {d.device.device_name for d in first.devices} == set(rig.devices)
        assert all(d.health == health_pb.HEALTHY and d.last_updated_time == 1700000000 for d in first.devices)
        board.update(rig.devices, unhealthy={"gpu-3": "Xid 79: GPU has fallen off the bus"})
        second = next(stream)
        bad = [d for d in second.devices if d.health == health_pb.UNHEALTHY]
        assert [(d.device.device_name, d.message) for d in bad] == [("gpu-3", "Xid 79: GPU has fallen off the bus")]
        stream.cancel()


def test_health_v1_and_v1alpha1_stream_the_same_source(served: Any) -> None:
    """One HealthSource behind both services: a change shows on a v1 and a v1alpha1 stream alike."""
    server, rig, board = served
    with grpc.insecure_channel(f"unix://{server.dra_socket}") as ch:
        v1 = health_v1_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
            health_v1_pb.NodeWatchResourcesRequest(), timeout=10
        )
        alpha = health_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
            health_pb.NodeWatchResourcesRequest(), timeout=10
        )
        first_v1, first_alpha = next(v1), next(alpha)
        assert type(first_v1).DESCRIPTOR.full_name == "v1.NodeWatchResourcesResponse"
        assert first_v1.SerializeToString() == first_alpha.SerializeToString()
        board.update(rig.devices, unhealthy={"gpu-1": "Xid 48: double-bit ECC error"})
        for stream, pb in ((v1, health_v1_pb), (alpha, health_pb)):
            update = next(stream)
            bad = [(d.device.device_name, d.message) for d in update.devices if d.health == pb.UNHEALTHY]
            assert bad == [("gpu-1", "Xid 48: double-bit ECC error")]
            stream.cancel()


def test_probe_and_healthz_follow_the_sockets(served: Any) -> None:
    server, _, _ = served
    endpoint = HttpEndpoint(probe=server.probe, host="127.0.0.1")
    endpoint.start()
    try:
        url = f"http://127.0.0.1:{endpoint.port}/healthz"
        with urllib.request.urlopen(url, timeout=5) as resp:
            assert resp.status == 200
        server.stop(grace=1)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url, timeout=5)
        assert err.value.code == 503
    finally:
        endpoint.stop()


def test_an_endpoint_that_never_started_stops_at_once(served: Any) -> None:
    """A plugin that fails to start before its health endpoint runs still stops (shutdown() alone waits for a
    serve loop that never ran, forever)."""
    server, _, _ = served
    endpoint = HttpEndpoint(probe=server.probe, host="127.0.0.1")
    stopper = threading.Thread(target=endpoint.stop, daemon=True)
    stopper.start()
    stopper.join(timeout=10)
    assert not stopper.is_alive(), "stop() of a never-started endpoint hangs"


def test_plugin_components_stop_side_by_side_and_one_failure_stops_none_of_the_rest() -> None:
    both_waiting = threading.Barrier(2, timeout=10)  # passes only when two stops run at the same time
    stopped: list[str] = []

    def slow(name: str) -> Callable[[], None]:
        def stop() -> None:
            both_waiting.wait()
            stopped.append(name)

        return stop

    def broken() -> None:
        raise RuntimeError("stop failed")

    stop_side_by_side([slow("monitor"), broken, slow("metrics")])
    assert sorted(stopped) == ["metrics", "monitor"]


def test_stale_socket_is_replaced_but_a_live_one_is_not(short_dir: Path, tmp_path: Path) -> None:
    plugin_dir = short_dir / "p"
    plugin_dir.mkdir()
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(plugin_dir / "dra.sock"))
    stale.close()  # the file stays, nobody listens: a crashed previous instance
    rig = EngineRig(tmp_path)
    first = PluginServer(
        driver_name=DRIVER,
        plugin_dir=plugin_dir,
        registry_dir=short_dir / "r",
        driver=rig.engine,
        health=DeviceHealthBoard("p"),
    )
    first.start()
    try:
        assert first.probe()[0]
        second = PluginServer(
            driver_name=DRIVER,
            plugin_dir=plugin_dir,
            registry_dir=short_dir / "r",
            driver=rig.engine,
            health=DeviceHealthBoard("p"),
        )
        with pytest.raises(SocketInUseError, match="another process is serving"):
            second.start()
    finally:
        first.stop(grace=1)
        rig.engine.close()
    assert not (plugin_dir / "dra.sock").exists()


def test_stop_finishes_in_flight_calls(short_dir: Path) -> None:
    entered, release = threading.Event(), threading.Event()

    class Slow(_ShareEngine):
        def prepare(self, claims: list[Any]) -> dict[str, PrepareResult]:
            entered.set()
            release.wait(10)
            return super().prepare(claims)

    server = PluginServer(
        driver_name=DRIVER,
        plugin_dir=short_dir / "p",
        registry_dir=short_dir / "r",
        driver=Slow(),
        health=DeviceHealthBoard("p"),
    )
    server.start()
    results: list[Any] = []
    ch = grpc.insecure_channel(f"unix://{server.dra_socket}")
    call = threading.Thread(
        target=lambda: results.append(
            v1_grpc.DRAPluginStub(ch).NodePrepareResources(
                v1.NodePrepareResourcesRequest(claims=[v1.Claim(namespace="default", name="c", uid="u")]), timeout=10
            )
        )
    )
    call.start()
    assert entered.wait(5)
    stopper = threading.Thread(target=server.stop, kwargs={"grace": 5})
    stopper.start()
    release.set()
    call.join(10)
    stopper.join(10)
    ch.close()
    assert results and results[0].claims["u"].devices[0].device_name == "gpu-0"
    assert not server.dra_socket.exists() and not server.registration_socket.exists()


def test_metrics_count_claim_operations(served: Any) -> None:
    server, rig, _ = served
    ok, missing = rig.claims.add("m-ok", ["gpu-6"]), rig.claims.add("m-missing", ["gpu-7"])
    del rig.claims.objects[("default", "m-missing")]
    rig.engine.prepare([ok, missing])
    endpoint = HttpEndpoint(registry=rig.engine.metrics.registry, probe=server.probe, host="127.0.0.1")
    endpoint.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{endpoint.port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    finally:
        endpoint.stop()
    assert 'dra_driver_claim_operations_total{operation="prepare",outcome="success"} 1.0' in text
    assert 'dra_driver_claim_operations_total{operation="prepare",outcome="error"} 1.0' in text
    assert 'dra_driver_claim_operation_seconds_count{operation="prepare",outcome="success"} 1.0' in text
    assert "dra_driver_prepared_claims 1.0" in text


UID_OLD = "0b5d3c1e-1234-4a5b-9c8d-0123456789ab"
UID_NEW = "7f00aa11-2222-4bbb-8ccc-0123456789ab"


def test_per_pod_socket_names_and_their_hashed_fallback(tmp_path: Path) -> None:
    plugin_dir = Path("/var/lib/kubelet/plugins") / DRIVER
    paths = SocketPaths.for_instance(Path("/var/lib/kubelet/plugins_registry"), plugin_dir, DRIVER, UID_OLD)
    assert paths.registration.name == f"{DRIVER}-{UID_OLD}-reg.sock"
    assert paths.dra == plugin_dir / f"dra-{UID_OLD}.sock"
    fixed = SocketPaths.for_instance(Path("/r"), plugin_dir, DRIVER, None)
    assert (fixed.registration, fixed.dra) == (Path(f"/r/{DRIVER}-reg.sock"), plugin_dir / "dra.sock")
    registry = Path("/var/lib/kubelet/plugins_registry") / ("x" * 30)
    long_driver = "a" * 50 + ".example.com"
    # First fallback: a hash of the UID; with a long driver name, a hash of driver and UID.
    for driver, prefix in ((DRIVER, f"{DRIVER}-"), (long_driver, "dra-")):
        long = SocketPaths.for_instance(registry, plugin_dir, driver, UID_OLD)
        assert len(str(long.registration).encode()) <= 107 and long.registration.parent == registry
        assert long.registration.name.startswith(prefix) and long.registration.name.endswith("-reg.sock")
        assert UID_OLD not in long.registration.name
        other = SocketPaths.for_instance(registry, plugin_dir, driver, UID_NEW)
        assert other.registration != long.registration  # two pods never share a name
    with pytest.raises(DraDriverError, match=r"^--registry-dir /y+: even the shortest registration socket name would "
                                             r"make a 1[0-9]{2}-byte path, over the unix socket limit of 107 bytes"):
        SocketPaths.for_instance(Path("/") / ("y" * 90), plugin_dir, DRIVER, UID_OLD)
    # The DRA socket in a plugin dir named after the longest driver name (63): a hash of the UID in its name.
    long_plugin_dir = Path("/var/lib/kubelet/plugins") / ("d" * 59 + ".com")
    per_pod = [SocketPaths.for_instance(Path("/r"), long_plugin_dir, DRIVER, uid).dra for uid in (UID_OLD, UID_NEW)]
    assert all(len(str(p).encode()) <= 107 and p.parent == long_plugin_dir and UID_OLD not in p.name for p in per_pod)
    assert per_pod[0] != per_pod[1] and per_pod[0].name.startswith("dra-") and per_pod[0].name.endswith(".sock")
    with pytest.raises(DraDriverError, match=r"^--plugin-dir /z+: socket dra-\S+\.sock would make a"):
        SocketPaths.for_instance(Path("/r"), Path("/") / ("z" * 100), DRIVER, UID_OLD)


def test_two_instances_serve_side_by_side_and_each_removes_only_its_own(tmp_path: Path, short_dir: Path) -> None:
    """A rolling update with maxSurge: the new pod starts while the old one serves, then the old one stops."""
    rig = EngineRig(tmp_path)
    board = DeviceHealthBoard(pool="node-a", clock=lambda: 1700000000.0)
    plugin_dir, registry_dir = short_dir / "plugins" / DRIVER, short_dir / "plugins_registry"
    old = PluginServer(
        driver_name=DRIVER,
        driver=rig.engine,
        health=board,
        pod_uid=UID_OLD,
        plugin_dir=plugin_dir,
        registry_dir=registry_dir,
    )
    new = PluginServer(
        driver_name=DRIVER,
        driver=rig.engine,
        health=board,
        pod_uid=UID_NEW,
        plugin_dir=plugin_dir,
        registry_dir=registry_dir,
    )
    old.start()
    try:
        new.start()  # no SocketInUseError: the names differ
        for server in (old, new):
            with grpc.insecure_channel(f"unix://{server.registration_socket}") as ch:
                info = reg_grpc.RegistrationStub(ch).GetInfo(reg.InfoRequest(), timeout=5)
            assert info.endpoint == str(server.dra_socket)
            assert server.probe() == (True, "ok")
        old.stop(grace=1)
        assert not old.dra_socket.exists() and not old.registration_socket.exists()
        assert new.dra_socket.exists() and new.registration_socket.exists()
        assert new.probe() == (True, "ok")
    finally:
        new.stop(grace=1)
        rig.engine.close()


class _RecordingEngine:
    """Answers every claim and remembers exactly which claims reached it."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def prepare(self, claims: list[Any]) -> dict[str, PrepareResult]:
        self.seen.extend(claims)
        return {c.uid: PrepareResult((DeviceResult(("r",), "p", "gpu-0", ("v/c=x",)),)) for c in claims}

    def unprepare(self, claims: list[Any]) -> dict[str, str]:
        self.seen.extend(claims)
        return {c.uid: "" for c in claims}


GOOD_UID = "0b6f2a56-3c4e-4b8a-9a51-4f6f0c1d2e3f"


@pytest.fixture
def recording(short_dir: Path) -> Iterator[tuple[PluginServer, _RecordingEngine]]:
    """A served plugin whose engine only records which claims reached it."""
    engine = _RecordingEngine()
    server = PluginServer(
        driver_name=DRIVER,
        plugin_dir=short_dir / "p",
        registry_dir=short_dir / "r",
        driver=engine,
        health=DeviceHealthBoard("p"),
    )
    server.start()
    yield server, engine
    server.stop(grace=1)


@pytest.mark.parametrize(
    ("namespace", "name", "uid", "field"),
    [
        ("default", "c1?watch=true&fieldSelector=x", GOOD_UID, "claims[0].name"),
        ("default", "c1#frag", GOOD_UID, "claims[0].name"),
        ("default", "../../api/v1/secrets", GOOD_UID, "claims[0].name"),
        ("default", "C1", GOOD_UID, "claims[0].name"),
        ("default", "", GOOD_UID, "claims[0].name"),
        ("kube-system/resourceclaims/x", "c1", GOOD_UID, "claims[0].namespace"),
        ("a.b", "c1", GOOD_UID, "claims[0].namespace"),
        ("default", "c1", "../../etc/passwd", "claims[0].uid"),
        ("default", "c1", "", "claims[0].uid"),
        ("default", "c1", "u" * 200, "claims[0].uid"),
    ],
)
def test_malformed_claim_identities_never_reach_the_engine(
    recording: tuple[PluginServer, _RecordingEngine], namespace: str, name: str, uid: str, field: str
) -> None:
    """Issue 12 finding 4: a claim identity Kubernetes could not have produced is refused with an error naming
    the field; the other claims of the same request are still served."""
    server, engine = recording
    good = v1.Claim(namespace="default", name="fine", uid="1c2d3e4f-0000-4000-8000-000000000001")
    bad = v1.Claim(namespace=namespace, name=name, uid=uid)
    with grpc.insecure_channel(f"unix://{server.dra_socket}") as ch:
        stub = v1_grpc.DRAPluginStub(ch)
        prepared = stub.NodePrepareResources(v1.NodePrepareResourcesRequest(claims=[bad, good]), timeout=5)
        unprepared = stub.NodeUnprepareResources(v1.NodeUnprepareResourcesRequest(claims=[bad, good]), timeout=5)
    for response in (prepared, unprepared):
        error = response.claims[uid].error
        assert error.startswith(f"{field}: ") and "refusing this claim" in error
        assert response.claims[good.uid].error == ""
    assert [(c.namespace, c.name, c.uid) for c in engine.seen] == [("default", "fine", good.uid)] * 2


def test_one_uid_under_two_names_is_refused(recording: tuple[PluginServer, _RecordingEngine]) -> None:
    server, engine = recording
    with grpc.insecure_channel(f"unix://{server.dra_socket}") as ch:
        claims = [v1.Claim(namespace="default", name=n, uid=GOOD_UID) for n in ("a", "b")]
        response = v1_grpc.DRAPluginStub(ch).NodePrepareResources(
            v1.NodePrepareResourcesRequest(claims=claims), timeout=5
        )
    assert "listed twice" in response.claims[GOOD_UID].error and engine.seen == []


class _RaisingDriver:
    """Breaks the Driver contract: raises for any call that includes `bad`, answers every other claim."""

    def __init__(self, bad: str) -> None:
        self.bad = bad
        self.calls: list[list[str]] = []

    def _check(self, claims: list[Any]) -> None:
        self.calls.append([c.uid for c in claims])
        if any(c.uid == self.bad for c in claims):
            raise RuntimeError("boom")

    def prepare(self, claims: list[Any]) -> dict[str, PrepareResult]:
        self._check(claims)
        return {c.uid: PrepareResult((DeviceResult(("r",), "p", f"gpu-{c.name}", ("v/c=x",)),)) for c in claims}

    def unprepare(self, claims: list[Any]) -> dict[str, str]:
        self._check(claims)
        return {c.uid: "" for c in claims}


def test_a_driver_that_raises_fails_only_its_own_claim(short_dir: Path) -> None:
    """Issue 36 finding 3: an exception that reached the servicer failed the whole call (gRPC UNKNOWN), so the
    other claims of the kubelet's call got no answer. Now a batch that raised is asked again claim by claim: the
    claim that raises gets its own error, the others their answers, over both API versions."""
    bad, good = "0b6f2a56-0000-4000-8000-00000000000b", GOOD_UID
    driver = _RaisingDriver(bad)
    server = PluginServer(driver_name=DRIVER, plugin_dir=short_dir / "p", registry_dir=short_dir / "r", driver=driver)
    server.start()
    try:
        with structlog.testing.capture_logs() as logs:
            _call_both_versions(server, driver, bad, good)
        failures = [e for e in logs if e["event"] == "the driver raised instead of answering for a claim"]
        assert len(failures) == 6 and all(e["claim"] == "default/b" and e["claim_uid"] == bad for e in failures)
        assert all(isinstance(e["exc_info"], RuntimeError) for e in failures)
    finally:
        server.stop(grace=1)


def _call_both_versions(server: PluginServer, driver: _RaisingDriver, bad: str, good: str) -> None:
    for mod, grpc_mod in ((v1, v1_grpc), (v1beta1, v1beta1_grpc)):
        claims = [mod.Claim(namespace="default", name=n, uid=u) for n, u in (("b", bad), ("g", good))]
        with grpc.insecure_channel(f"unix://{server.dra_socket}") as ch:
            stub = grpc_mod.DRAPluginStub(ch)
            prepared = stub.NodePrepareResources(mod.NodePrepareResourcesRequest(claims=claims), timeout=5)
            unprepared = stub.NodeUnprepareResources(mod.NodeUnprepareResourcesRequest(claims=claims), timeout=5)
            alone = stub.NodePrepareResources(mod.NodePrepareResourcesRequest(claims=claims[:1]), timeout=5)
        for response, operation in ((prepared, "prepare"), (unprepared, "unprepare"), (alone, "prepare")):
            assert response.claims[bad].error == (
                f"{operation} default/b: internal error in the plugin: RuntimeError: boom (its log has the "
                "details); the kubelet retries"
            )
            assert list(response.claims[bad].devices if operation == "prepare" else []) == []
        assert prepared.claims[good].error == "" and [d.device_name for d in prepared.claims[good].devices] == [
            "gpu-g"]  # fmt: skip
        assert unprepared.claims[good].error == "" and good in unprepared.claims
    # The batch, then each claim alone; a single claim is not asked twice.
    assert driver.calls[:3] == [[bad, good], [bad], [good]] and driver.calls[6:7] == [[bad]]


class _UnencodableDriver:
    def prepare(self, claims: list[Any]) -> dict[str, PrepareResult]:
        return {c.uid: PrepareResult((DeviceResult(("r",), "p", 7 if c.name == "b" else "gpu-0", ()),))  # type: ignore[arg-type]
                for c in claims}  # fmt: skip

    def unprepare(self, claims: list[Any]) -> dict[str, str]:
        return {c.uid: "" for c in claims}


def test_a_result_the_message_cannot_carry_fails_only_its_claim(short_dir: Path) -> None:
    bad, good = "0b6f2a56-0000-4000-8000-00000000000b", GOOD_UID
    server = PluginServer(driver_name=DRIVER, plugin_dir=short_dir / "p", registry_dir=short_dir / "r",
                          driver=_UnencodableDriver())  # fmt: skip
    server.start()
    try:
        claims = [v1.Claim(namespace="default", name="b", uid=bad), v1.Claim(namespace="default", name="g", uid=good)]
        with grpc.insecure_channel(f"unix://{server.dra_socket}") as ch, structlog.testing.capture_logs() as logs:
            response = v1_grpc.DRAPluginStub(ch).NodePrepareResources(
                v1.NodePrepareResourcesRequest(claims=claims), timeout=5
            )
        assert [e["claim"] for e in logs if e["log_level"] == "error"] == ["default/b"]
        assert "internal error in the plugin: TypeError" in response.claims[bad].error
        assert list(response.claims[bad].devices) == []
        assert response.claims[good].error == "" and [d.device_name for d in response.claims[good].devices] == [
            "gpu-0"]  # fmt: skip
    finally:
        server.stop(grace=1)
