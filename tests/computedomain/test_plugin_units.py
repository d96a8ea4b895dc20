"""The compute-domain kubelet plugin's parts on their own: opaque configs, the checkpoint codec, the host device
numbers, the slices, and the effects' plans, refusals, CDI edits and the daemon directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dra_driver.cdi.model import DeviceNode, Mount
from dra_driver.computedomain.config import ChannelConfig, ConfigError, DaemonConfig, decode_domain_config
from dra_driver.computedomain.model import AllocationMode, ComputeDomain
from dra_driver.computedomain.plugin.checkpoint import (
    DOMAIN_RECORDS,
    Checkpoint,
    ClaimRecord,
    ClaimState,
    DomainClaim,
    DomainDevice,
    DomainDeviceKind,
)
from dra_driver.computedomain.plugin.domains import DomainReader, NodeLabels
from dra_driver.computedomain.plugin.effects.base import DomainPlan, DomainTools, PermanentError
from dra_driver.computedomain.plugin.effects.daemon_dir import TEMPLATE_NAME, DaemonDir
from dra_driver.computedomain.plugin.effects.imex_channel import ChannelRefused, ImexChannel
from dra_driver.computedomain.plugin.faults import CdFaultPoints
from dra_driver.computedomain.plugin.hostdevices import (
    FAKE_CAPS_MAJOR,
    FAKE_CHANNEL_MAJOR,
    HostDeviceError,
    HostDevices,
    write_fake_proc,
)
from dra_driver.computedomain.plugin.slices import CdSliceSettings, build_slices
from dra_driver.k8s.client import KubeRest
from dra_driver.kubeletplugin.checkpoint import CorruptCheckpointError, NewerCheckpointError
from dra_driver.kubeletplugin.claimrecord import decode_checkpoint, encode_checkpoint
from dra_driver.kubeletplugin.driver import ClaimRef
from dra_driver.kubeletplugin.effect import Made

GV = "gpu.dra.dev/v1beta1"
CLIQUE = "6c6f2d44-1b7a-4c1e-9a55-0f5e3c2d1a00.7"


# --- config -------------------------------------------------------------------------------------------------------

def test_configs_decode_with_defaults() -> None:
    assert decode_domain_config({"apiVersion": GV, "kind": "ComputeDomainChannelConfig", "domainID": "u-1"}) == (
        ChannelConfig("u-1", AllocationMode.SINGLE))
    assert decode_domain_config({"apiVersion": GV, "kind": "ComputeDomainDaemonConfig", "domainID": "u-1"}) == (
        DaemonConfig("u-1"))


@pytest.mark.parametrize(("parameters", "message"), [
    ({"apiVersion": GV, "kind": "ComputeDomainDaemonConfig"}, "p.domainID: required field is missing"),
    ({"apiVersion": GV, "kind": "ComputeDomainDaemonConfig", "domainID": "a/b"}, "p.domainID: 'a/b': a Kubernetes UID"),
    ({"apiVersion": GV, "kind": "ComputeDomainDaemonConfig", "domainID": "u", "allocationMode": "All"},
     "p.allocationMode: unknown field"),
    ({"apiVersion": GV, "kind": "ComputeDomainChannelConfig", "domainID": 5}, "p.domainID: must be a string"),
    ({"apiVersion": "gpu.dra.dev/v1", "kind": "ComputeDomainChannelConfig", "domainID": "u"}, "p.apiVersion"),
])
def test_bad_configs_name_the_field(parameters: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        decode_domain_config(parameters, path="p")
    assert message in str(err.value)


# --- checkpoint ---------------------------------------------------------------------------------------------------

def encode(checkpoint: Checkpoint) -> bytes:
    return encode_checkpoint(checkpoint, DOMAIN_RECORDS)


def decode(raw: bytes) -> Checkpoint:
    return decode_checkpoint(raw, DOMAIN_RECORDS)


def record(uid: str = "c-1", *, state: ClaimState = ClaimState.PREPARE_COMPLETED,
           kind: DomainDeviceKind = DomainDeviceKind.CHANNEL, channels: tuple[int, ...] = (0,), domain: str = "d-1",
           namespace: str = "team") -> ClaimRecord:
    channel = kind is DomainDeviceKind.CHANNEL
    device = DomainDevice(("channel",), "node-a", "channel-0" if channel else "daemon-0", kind,
                          (f"k8s.x/claim={uid}-channel-0",), channels if channel else ())
    return ClaimRecord(uid, namespace, f"claim-{uid}", state, details=DomainClaim(domain, namespace, "dom", CLIQUE),
                       allocation="sha256:ab", devices=(device,))


def test_checkpoint_round_trips_and_writes_all_mode_as_a_range() -> None:
    every = tuple(range(2048))
    value = Checkpoint("boot", {"c-1": record(channels=every),
                                "c-2": record("c-2", state=ClaimState.PREPARE_ABORTED, kind=DomainDeviceKind.DAEMON)})
    raw = encode(value)
    assert decode(raw) == value
    assert b'"channels":{"first":0,"last":2047}' in raw and len(raw) < 2000


def test_checkpoint_damage_and_newer_formats_are_told_apart() -> None:
    raw = encode(Checkpoint("boot", {"c-1": record()}))
    with pytest.raises(CorruptCheckpointError, match="checksum"):
        decode(raw.replace(b"claim-c-1", b"claim-c-9"))
    with pytest.raises(NewerCheckpointError, match="newer plugin"):
        decode(raw.replace(b'"version":1', b'"version":2'))
    with pytest.raises(CorruptCheckpointError):
        decode(b"{not json")


def test_an_unknown_state_is_read_as_prepare_started() -> None:
    raw = encode(Checkpoint("boot", {"c-1": record()})).replace(b'"PrepareCompleted"', b'"Frobnicated"')
    # The checksum covers the payload: recompute it as a newer plugin writing that state would have.
    import hashlib
    import json
    doc = json.loads(raw)
    doc["checksum"] = "sha256:" + hashlib.sha256(json.dumps(doc["payload"], sort_keys=True,
                                                             separators=(",", ":")).encode()).hexdigest()
    assert decode(json.dumps(doc).encode()).claims["c-1"].state is ClaimState.PREPARE_STARTED


# --- host devices -------------------------------------------------------------------------------------------------

def test_majors_and_the_capability_minor_come_from_proc(tmp_path: Path) -> None:
    host = HostDevices(write_fake_proc(tmp_path / "proc"))
    assert host.channel_major() == FAKE_CHANNEL_MAJOR and host.char_major("nvidia-caps") == FAKE_CAPS_MAJOR
    assert host.fabric_mgmt_minor() == 1
    with pytest.raises(HostDeviceError, match="no character device 'sd'"):
        host.char_major("sd")  # a block device of that name is not a char major
    with pytest.raises(HostDeviceError, match="--proc-root"):
        HostDevices(tmp_path / "nothing").channel_major()


# --- slices -------------------------------------------------------------------------------------------------------

def test_binding_conditions_only_from_1_36_and_never_on_the_daemon() -> None:
    old = build_slices(CdSliceSettings("compute-domain.gpu.dra.dev", "n", CLIQUE, (1, 35)), 1)[0]["spec"]["devices"]
    new = build_slices(CdSliceSettings("compute-domain.gpu.dra.dev", "n", CLIQUE, (1, 36)), 1)[0]["spec"]["devices"]
    off = build_slices(CdSliceSettings("compute-domain.gpu.dra.dev", "n", "", (1, 37), binding_conditions=False), 1)
    assert "bindingConditions" not in old[0] and "bindsToNode" not in old[0]
    assert new[0]["bindsToNode"] is True
    assert new[0]["bindingConditions"] == ["compute-domain.gpu.dra.dev/imex-ready"]
    assert new[0]["bindingFailureConditions"] == ["compute-domain.gpu.dra.dev/imex-failed"]
    assert "bindingConditions" not in new[1] and new[1]["attributes"]["cliqueID"] == {"string": CLIQUE}
    assert "bindingConditions" not in off[0]["spec"]["devices"][0]
    assert "cliqueID" not in off[0]["spec"]["devices"][0]["attributes"]


# --- effects ------------------------------------------------------------------------------------------------------

class Labels(NodeLabels):
    def __init__(self) -> None:
        self.labels: dict[str, str] = {}

    def value(self, key: str) -> str | None:
        return self.labels.get(key)

    def update(self, key: str, decide: Any) -> str | None:
        wanted = decide(self.labels.get(key))
        if wanted is None:
            self.labels.pop(key, None)
        else:
            self.labels[key] = wanted
        return wanted  # type: ignore[no-any-return]


def tools(tmp_path: Path) -> DomainTools:
    rest = KubeRest.__new__(KubeRest)  # never called by these tests
    return DomainTools(node_name="node-a", state_dir=tmp_path / "state", host=HostDevices(write_fake_proc(tmp_path / "p")),
                     labels=Labels(), domains=DomainReader(rest, driver_namespace="dra"), faults=CdFaultPoints())


def plan(config: ChannelConfig | DaemonConfig, *, namespace: str = "team", clique: str = CLIQUE) -> DomainPlan:
    domain = ComputeDomain("team", "dom", "d-1", 1, "imex", AllocationMode.SINGLE)
    kind = DomainDeviceKind.CHANNEL if isinstance(config, ChannelConfig) else DomainDeviceKind.DAEMON
    rec = record("c-1", state=ClaimState.PREPARE_STARTED, kind=kind, channels=(), namespace=namespace)
    return DomainPlan(ClaimRef(namespace, "claim-c-1", "c-1"), domain, config, (), clique, False, rec)


def test_the_channel_plan_is_channel_0_or_every_channel_and_none_without_a_clique(tmp_path: Path) -> None:
    effect = ImexChannel(tools(tmp_path))
    assert effect.plan(plan(ChannelConfig("d-1"))).record.devices[0].channels == (0,)
    assert effect.plan(plan(ChannelConfig("d-1", AllocationMode.ALL))).record.devices[0].channels == tuple(range(2048))
    assert effect.plan(plan(ChannelConfig("d-1"), clique="")).record.devices[0].channels == ()


def test_channel_edits_name_the_device_nodes_with_the_kernels_numbers(tmp_path: Path) -> None:
    effect = ImexChannel(tools(tmp_path))
    rec = effect.plan(plan(ChannelConfig("d-1"))).record
    edits = effect.edits(rec, rec.devices[0])
    assert edits.device_nodes == (DeviceNode(path="/dev/nvidia-caps-imex-channels/channel0", type="c",
                                             major=FAKE_CHANNEL_MAJOR, minor=0, file_mode=0o666),)
    assert "DRA_DEVICE_CHANNEL_0_IMEX_CHANNELS=0" in edits.env
    every = effect.plan(plan(ChannelConfig("d-1", AllocationMode.ALL))).record
    nodes = effect.edits(every, every.devices[0]).device_nodes
    assert len(nodes) == 2048 and nodes[-1].path.endswith("channel2047") and nodes[-1].minor == 2047


def _nothing_made(device_name: str, made: Made[DomainDevice]) -> None:
    raise AssertionError(f"no compute-domain effect makes anything to record ({device_name}: {made})")


def test_a_channel_claim_outside_its_domains_namespace_is_refused_for_good(tmp_path: Path) -> None:
    effect = ImexChannel(tools(tmp_path))
    with pytest.raises(PermanentError, match="in another namespace"):
        effect.refuse(plan(ChannelConfig("d-1"), namespace="other"), Checkpoint(), None)


def test_one_domain_per_node_by_the_node_label(tmp_path: Path) -> None:
    t = tools(tmp_path)
    effect = ImexChannel(t)
    p = plan(ChannelConfig("d-1"), clique="")  # no clique: the per-clique rule asks the API nothing
    other = record("c-9", domain="d-9")
    labels = t.labels
    assert isinstance(labels, Labels)
    labels.labels["gpu.dra.dev/computeDomain"] = "d-9"
    with pytest.raises(ChannelRefused, match="serves one ComputeDomain at a time"):
        effect.apply(p, p.record.devices, Checkpoint(claims={"c-9": other}), _nothing_made)
    effect.apply(p, p.record.devices, Checkpoint(), _nothing_made)  # a label no record holds is taken over
    assert labels.labels["gpu.dra.dev/computeDomain"] == "d-1"
    # Unprepare removes it only when no other claim of the domain holds a channel here.
    effect.undo(p.record, p.record.devices, Checkpoint(claims={"c-1": p.record, "c-2": record("c-2", domain="d-1")}),
                rollback=False)
    assert labels.labels["gpu.dra.dev/computeDomain"] == "d-1"
    effect.undo(p.record, p.record.devices, Checkpoint(claims={"c-1": p.record}), rollback=False)
    assert "gpu.dra.dev/computeDomain" not in labels.labels


def test_the_daemon_dir_env_mount_and_capability(tmp_path: Path) -> None:
    t = tools(tmp_path)
    effect = DaemonDir(t)
    p = plan(DaemonConfig("d-1"))
    effect.apply(p, p.record.devices, Checkpoint(), _nothing_made)
    directory = t.state_dir / "domains" / "d-1"
    assert (directory / TEMPLATE_NAME).is_file() and oct(directory.stat().st_mode & 0o777) == "0o755"
    edits = effect.edits(p.record, p.record.devices[0])
    assert set(edits.env) == {f"CLIQUE_ID={CLIQUE}", "COMPUTE_DOMAIN_UUID=d-1", "COMPUTE_DOMAIN_NAME=dom",
                              "COMPUTE_DOMAIN_NAMESPACE=team"}
    assert edits.mounts == (Mount(str(directory), "/imexd", ("rw", "nosuid", "nodev", "bind")),)
    assert edits.device_nodes == (DeviceNode(path="/dev/nvidia-caps/nvidia-cap1", type="c", major=FAKE_CAPS_MAJOR,
                                             minor=1),)
    done = ClaimRecord(**{**p.record.__dict__, "state": ClaimState.PREPARE_COMPLETED})
    (directory / TEMPLATE_NAME).unlink()
    prepared = Checkpoint(claims={"c-1": done})
    assert effect.verify(done, done.devices, prepared, None)
    assert effect.repair(done, done.devices, prepared, None, _nothing_made) == done.devices
    assert effect.verify(done, done.devices, prepared, None) == []
    stray = t.state_dir / "domains" / "d-old"
    stray.mkdir()
    assert effect.sweep(prepared, None, None) == (str(stray),) and directory.is_dir()
    effect.undo(done, done.devices, prepared, rollback=False)
    assert not directory.exists()


@pytest.mark.parametrize("namespace", ["other", "team"])  # a stranger's namespace, and the domain's own
def test_a_daemon_claim_outside_the_drivers_namespace_is_refused_for_good(tmp_path: Path, namespace: str) -> None:
    t = tools(tmp_path)
    with pytest.raises(PermanentError) as err:
        DaemonDir(t).refuse(plan(DaemonConfig("d-1"), namespace=namespace), Checkpoint(), None)
    message = str(err.value)
    assert f"ResourceClaim {namespace}/claim-c-1" in message and "ComputeDomain team/dom" in message
    assert f"must be in the driver's namespace dra, not {namespace}" in message
    assert "claim template dra/computedomain-daemon-d-1" in message and "channel claim in team" in message
    assert not (t.state_dir / "domains").exists()
    DaemonDir(t).refuse(plan(DaemonConfig("d-1"), namespace="dra"), Checkpoint(), None)  # the controller's daemon claim
