"""Registration against the TEST plugin over real unix sockets: version choice, failures, GetInfo
polling, the health stream, and the whole watcher -> registration path."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver._gen import pluginregistration_v1_pb2
from dra_driver._gen.dra_health_v1alpha1_pb2 import HEALTHY, UNHEALTHY
from dra_sandbox.kubelet.clock import Backoff, RealClock
from dra_sandbox.kubelet.health import HealthStore
from dra_sandbox.kubelet.registration import PluginManager, PluginSession, PluginStore, RegistrationConfig
from dra_sandbox.kubelet.versions import (
    KubeletGates,
    RegistrationError,
    choose_service,
    pick_health_service,
    validate_plugin_info,
)
from dra_sandbox.kubelet.watcher import PluginWatcher
from tests.polling import wait_for
from tests.sandbox.test_kubelet_fakeplugin import BREAK_STREAM, FakePlugin, short_tmpdir

FAST = RegistrationConfig(
    poll_interval_s=0.05,
    get_info_timeout_s=2.0,
    dial_timeout_s=2.0,
    backoff=Backoff(initial=0.02, factor=2.0, maximum=0.1),
    health_reopen_s=0.05,
    call_timeout_s=5.0,
)


# ---- pure rules ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("advertised", "chosen"),
    [
        (["v1.DRAPlugin", "v1beta1.DRAPlugin"], "v1.DRAPlugin"),
        (["v1beta1.DRAPlugin", "v1.DRAPlugin"], "v1beta1.DRAPlugin"),  # the plugin's order decides
        (["v1beta1.DRAPlugin"], "v1beta1.DRAPlugin"),
        (["1.0.0", "v1alpha3.NodeService", "v1.DRAPlugin"], "v1.DRAPlugin"),  # unknown strings ignored
    ],
)
def test_choose_service(advertised: list[str], chosen: str) -> None:
    assert choose_service(advertised) == chosen


@pytest.mark.parametrize("advertised", [[], ["1.0.0"], ["v1alpha3.NodeService", "v1alpha1.DRAResourceHealth"]])
def test_no_supported_service_fails_like_the_kubelet(advertised: list[str]) -> None:
    with pytest.raises(RegistrationError, match="Legacy behavior of picking v1alpha4 is no longer supported"):
        choose_service(advertised)


def _info(kind: str, name: str, endpoint: str, *versions: str) -> pluginregistration_v1_pb2.PluginInfo:
    """A GetInfo answer as a plugin sends it."""
    return pluginregistration_v1_pb2.PluginInfo(type=kind, name=name, endpoint=endpoint, supported_versions=versions)


@pytest.mark.parametrize(
    ("info", "needle"),
    [
        (_info("CSIPlugin", "d", "/x.sock", "v1.DRAPlugin"), "type 'CSIPlugin'"),
        (_info("DRAPlugin", "", "/x.sock", "v1.DRAPlugin"), "name is empty"),
        (_info("DRAPlugin", "d", "x.sock", "v1.DRAPlugin"), "absolute path"),
        (_info("DRAPlugin", "d", "", "v1.DRAPlugin"), "absolute path"),
    ],
)
def test_validate_plugin_info_rejects(info: pluginregistration_v1_pb2.PluginInfo, needle: str) -> None:
    with pytest.raises(RegistrationError, match=needle):
        validate_plugin_info(info)


def test_validate_plugin_info_health_flag() -> None:
    reg = validate_plugin_info(_info("DRAPlugin", "d", "/x", "v1.DRAPlugin", "v1alpha1.DRAResourceHealth"))
    assert reg.health_service == "v1alpha1.DRAResourceHealth"
    assert (reg.driver, reg.service, reg.health) == ("d", "v1.DRAPlugin", True)
    assert validate_plugin_info(_info("DRAPlugin", "d", "/x", "v1.DRAPlugin")).health is False


A1, V1H = "v1alpha1.DRAResourceHealth", "v1.DRAResourceHealth"


@pytest.mark.parametrize(
    ("minor", "advertised", "picked"),
    [
        # The cases of TestPickHealthService (pkg/kubelet/cm/dra/plugin) on a 1.37 kubelet.
        (37, ["v1beta1.DRAPlugin"], ""),
        (37, [], ""),
        (37, ["v1beta1.DRAPlugin", A1], A1),
        (37, ["v1beta1.DRAPlugin", V1H], V1H),
        (37, [A1, V1H], V1H),
        # 1.36 kubelets have only the v1alpha1 client.
        (36, [A1, V1H], A1),
        (36, [V1H], ""),
        # 1.34/1.35: ResourceHealthStatus is alpha, off by default: no stream at all.
        (35, [A1, V1H], ""),
        (34, [A1], ""),
    ],
)
def test_pick_health_service_like_the_kubelet(minor: int, advertised: list[str], picked: str) -> None:
    assert pick_health_service(advertised, KubeletGates(minor=minor)) == picked


def test_health_gate_can_be_turned_on_before_136() -> None:
    gates = KubeletGates(minor=35, resource_health_status=True)
    assert pick_health_service([A1, V1H], gates) == A1
    assert gates.health_message is False  # the field is new in 1.36
    assert KubeletGates(minor=36).health_message is True
    assert KubeletGates(minor=37, resource_health_status_message=False).health_message is False


# ---- sessions against the test plugin -----------------------------------------------------------------


class Env:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.registry = base / "reg"
        self.plugins_dir = base / "plugins"
        self.store = PluginStore()
        self.clock = RealClock()
        self.health = HealthStore(self.clock)
        self.sessions: list[PluginSession] = []
        self.plugins: list[FakePlugin] = []

    def plugin(self, **kwargs: Any) -> FakePlugin:
        plugin = FakePlugin(self.registry, self.plugins_dir, **kwargs)
        self.plugins.append(plugin)
        return plugin

    def session(self, plugin: FakePlugin, config: RegistrationConfig = FAST) -> PluginSession:
        session = PluginSession(str(plugin.reg_socket), self.store, self.health, self.clock, config)
        self.sessions.append(session)
        session.start()
        return session


@pytest.fixture
def env() -> Iterator[Env]:
    base = short_tmpdir()
    e = Env(base)
    yield e
    for s in e.sessions:
        s.stop()
    for p in e.plugins:
        p.stop()
    shutil.rmtree(base, ignore_errors=True)


def test_registers_with_v1_first_and_notifies(env: Env) -> None:
    plugin = env.plugin().start()
    env.session(plugin)
    registered = wait_for(lambda: env.store.get(plugin.driver), what="registration")
    assert registered.service == "v1.DRAPlugin" and registered.health_service == "v1alpha1.DRAResourceHealth"
    assert registered.endpoint == str(plugin.dra_socket)
    wait_for(lambda: plugin.calls.notifications == [(True, "")], what="NotifyRegistrationStatus(true)")
    # The chosen client really talks v1.
    from dra_sandbox.kubelet.draclient import ClaimRef

    result = registered.client.prepare([ClaimRef("ns", "c", "uid-1")])
    assert result["uid-1"].devices[0].cdi_device_ids == (plugin.cdi_id("uid-1"),)
    assert plugin.calls.prepare == [("v1", ["uid-1"])]


def test_only_v1beta1_is_used_when_that_is_all(env: Env) -> None:
    plugin = env.plugin(versions=("v1beta1.DRAPlugin",)).start()
    env.session(plugin)
    registered = wait_for(lambda: env.store.get(plugin.driver), what="registration")
    assert registered.service == "v1beta1.DRAPlugin" and registered.health_service == ""
    from dra_sandbox.kubelet.draclient import ClaimRef

    registered.client.unprepare([ClaimRef("ns", "c", "uid-9")])
    assert plugin.calls.unprepare == [("v1beta1", ["uid-9"])]


def test_unknown_versions_fail_with_notify_false_and_retry(env: Env) -> None:
    plugin = env.plugin(versions=("v1alpha3.NodeService", "1.0.0")).start()
    session = env.session(plugin)
    wait_for(lambda: len(plugin.calls.notifications) >= 2, what="two failed attempts (retry)")
    registered, error = plugin.calls.notifications[0]
    assert registered is False and "Legacy behavior of picking v1alpha4 is no longer supported" in error
    assert all(not ok for ok, _ in plugin.calls.notifications)
    assert env.store.get(plugin.driver) is None
    assert session.state in ("failed", "registering") and session.failures >= 2


def test_unreachable_endpoint_fails_registration(env: Env) -> None:
    plugin = env.plugin()
    plugin.start_registration()  # the DRA socket never comes up
    env.session(plugin, RegistrationConfig(poll_interval_s=0.05, dial_timeout_s=0.2,
                                           backoff=Backoff(0.02, 2.0, 0.05)))
    wait_for(lambda: plugin.calls.notifications, what="a failure notification")
    ok, error = plugin.calls.notifications[0]
    assert ok is False and "cannot connect to the DRA endpoint" in error
    # When the DRA server starts, the retry succeeds.
    plugin.start_dra()
    wait_for(lambda: env.store.get(plugin.driver), what="registration after the endpoint came up")
    assert plugin.calls.notifications[-1] == (True, "")


def test_get_info_polling_deregisters_after_two_failures_and_reregisters(env: Env) -> None:
    plugin = env.plugin().start()
    session = env.session(plugin)
    wait_for(lambda: env.store.get(plugin.driver), what="registration")
    plugin.get_info_fails = True
    wait_for(lambda: env.store.get(plugin.driver) is None, what="deregistration")
    assert session.registrations == 1
    calls_at_deregistration = plugin.calls.get_info
    plugin.get_info_fails = False
    wait_for(lambda: env.store.get(plugin.driver), what="re-registration")
    assert session.registrations == 2
    assert plugin.calls.get_info > calls_at_deregistration


def test_one_failed_poll_is_not_enough(env: Env) -> None:
    plugin = env.plugin().start()
    session = env.session(plugin, RegistrationConfig(poll_interval_s=0.05, failures_to_deregister=1000))
    wait_for(lambda: env.store.get(plugin.driver), what="registration")
    plugin.get_info_fails = True
    start = plugin.calls.get_info
    wait_for(lambda: plugin.calls.get_info >= start + 3, what="several failed polls")
    assert env.store.get(plugin.driver) is not None and session.registrations == 1


def test_health_stream_latest_per_device_and_reopen(env: Env) -> None:
    plugin = env.plugin().start()
    env.session(plugin)
    wait_for(lambda: plugin.health_streams_opened == 1, what="health stream opened")
    plugin.push_health(("node-1", "gpu-0", HEALTHY), ("node-1", "gpu-1", HEALTHY))
    wait_for(lambda: env.health.status(plugin.driver, "node-1", "gpu-1") == "Healthy", what="first report")
    plugin.push_health(("node-1", "gpu-1", UNHEALTHY), message="XID 79")
    wait_for(lambda: env.health.status(plugin.driver, "node-1", "gpu-1") == "Unhealthy", what="update")
    record = env.health.get(plugin.driver, "node-1", "gpu-1")
    assert record is not None and record.message == "XID 79"
    assert env.health.status(plugin.driver, "node-1", "gpu-0") == "Healthy"  # latest of each device kept
    # Break the stream: the simulator re-opens it and keeps receiving.
    plugin.health_updates.put(BREAK_STREAM)
    wait_for(lambda: plugin.health_streams_opened == 2, what="health stream re-opened")
    plugin.push_health(("node-1", "gpu-0", UNHEALTHY))
    wait_for(lambda: env.health.status(plugin.driver, "node-1", "gpu-0") == "Unhealthy", what="after reopen")


def test_an_unimplemented_health_service_is_not_asked_again(env: Env) -> None:
    """The plugin advertises v1.DRAResourceHealth but serves only v1alpha1: the 1.37 kubelet picks v1, gets
    Unimplemented and stops (healthStreamTerminated), instead of re-opening every 5 s."""
    plugin = env.plugin(versions=("v1.DRAPlugin", "v1.DRAResourceHealth")).start()
    session = env.session(plugin)
    registered = wait_for(lambda: env.store.get(plugin.driver), what="registration")
    assert registered.health_service == "v1.DRAResourceHealth"
    stream = session.health_stream
    assert stream is not None
    wait_for(lambda: stream.unimplemented, what="the Unimplemented answer")
    assert stream.opened == 1 and plugin.health_streams_opened == 0


def test_no_health_stream_without_advertisement(env: Env) -> None:
    plugin = env.plugin(versions=("v1.DRAPlugin",)).start()
    env.session(plugin)
    wait_for(lambda: env.store.get(plugin.driver), what="registration")
    assert plugin.health_streams_opened == 0


def test_watcher_drives_registration_and_socket_removal_deregisters(env: Env) -> None:
    manager = PluginManager(env.store, env.health, env.clock, FAST)
    watcher = PluginWatcher(env.registry, manager.socket_added, manager.socket_removed)
    watcher.start()
    try:
        plugin = env.plugin().start()
        wait_for(lambda: env.store.get(plugin.driver), what="registration via the watcher")
        plugin.stop_registration()  # removes the -reg.sock
        wait_for(lambda: env.store.get(plugin.driver) is None, what="deregistration on socket removal")
        assert manager.session(str(plugin.reg_socket)) is None
    finally:
        watcher.stop()
        manager.stop()


def test_newest_plugin_of_a_driver_wins(env: Env) -> None:
    first = env.plugin().start()
    env.session(first)
    wait_for(lambda: env.store.get(first.driver), what="first registration")
    # A second instance of the same driver (rolling update) on other sockets.
    second = FakePlugin(env.base / "reg2", env.base / "plugins2", driver=first.driver)
    env.plugins.append(second)
    second.start()
    env.session(second)
    wait_for(lambda: len(env.store.all()) == 2, what="both registered")
    newest = env.store.get(first.driver)
    assert newest is not None and newest.endpoint == str(second.dra_socket)
