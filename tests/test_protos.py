"""The committed gRPC stubs are fresh and carry exactly the upstream wire names."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver._gen import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from dra_sandbox import protogen as gen_protos

ROOT = Path(__file__).resolve().parents[1]


def test_committed_stubs_are_not_stale(tmp_path: Path) -> None:
    gen_protos.generate(ROOT / "protos", tmp_path)
    assert gen_protos.compare(tmp_path / gen_protos.GEN_PACKAGE, ROOT / gen_protos.GEN_PACKAGE) == []


def test_stale_stub_is_detected(tmp_path: Path) -> None:
    gen_protos.generate(ROOT / "protos", tmp_path)
    fresh = tmp_path / gen_protos.GEN_PACKAGE
    other = tmp_path / "other"
    gen_protos.generate(ROOT / "protos", other)
    (other / gen_protos.GEN_PACKAGE / "dra_v1_pb2.py").write_text("# edited by hand\n")
    assert gen_protos.compare(fresh, other / gen_protos.GEN_PACKAGE) == ["dra_v1_pb2.py"]


def test_a_proto_without_a_service_gets_no_grpc_module(tmp_path: Path) -> None:
    """Messages only (the ResourceSlice wire subset): `_pb2` and `.pyi`, and no `_pb2_grpc` guarding nothing."""
    gen_protos.generate(ROOT / "protos", tmp_path)
    made = {p.name for p in (tmp_path / gen_protos.GEN_PACKAGE).iterdir()}
    assert {"resourceslice_wire_pb2.py", "resourceslice_wire_pb2.pyi"} <= made
    assert "resourceslice_wire_pb2_grpc.py" not in made
    assert "dra_v1_pb2_grpc.py" in made


def _method_names(module: object, service: str) -> set[str]:
    desc = getattr(module, "DESCRIPTOR").services_by_name[service]  # noqa: B009
    return {f"/{desc.full_name}/{m.name}" for m in desc.methods}


@pytest.mark.parametrize(
    ("module", "service", "expected"),
    [
        (
            dra_v1_pb2,
            "DRAPlugin",
            {
                "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
                "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
            },
        ),
        (
            dra_v1beta1_pb2,
            "DRAPlugin",
            {
                "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
                "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
            },
        ),
        (
            pluginregistration_v1_pb2,
            "Registration",
            {
                "/pluginregistration.Registration/GetInfo",
                "/pluginregistration.Registration/NotifyRegistrationStatus",
            },
        ),
        (dra_health_v1alpha1_pb2, "DRAResourceHealth", {"/v1alpha1.DRAResourceHealth/NodeWatchResources"}),
        (dra_health_v1_pb2, "DRAResourceHealth", {"/v1.DRAResourceHealth/NodeWatchResources"}),
    ],
)
def test_full_method_names(module: object, service: str, expected: set[str]) -> None:
    assert _method_names(module, service) == expected


def test_generated_stubs_use_the_same_paths() -> None:
    """The client stubs dial exactly these paths (what the kubelet sends on the wire)."""

    class Recorder:
        def __init__(self) -> None:
            self.paths: list[str] = []

        def unary_unary(self, path: str, **_: object) -> None:
            self.paths.append(path)

        def unary_stream(self, path: str, **_: object) -> None:
            self.paths.append(path)

    rec = Recorder()
    dra_v1_pb2_grpc.DRAPluginStub(rec)
    dra_v1beta1_pb2_grpc.DRAPluginStub(rec)
    pluginregistration_v1_pb2_grpc.RegistrationStub(rec)
    dra_health_v1alpha1_pb2_grpc.DRAResourceHealthStub(rec)
    dra_health_v1_pb2_grpc.DRAResourceHealthStub(rec)
    assert "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources" in rec.paths
    assert "/pluginregistration.Registration/GetInfo" in rec.paths
    assert "/v1alpha1.DRAResourceHealth/NodeWatchResources" in rec.paths
    assert "/v1.DRAResourceHealth/NodeWatchResources" in rec.paths
    assert len(rec.paths) == 8


def _fields(message: object) -> dict[str, tuple[int, int, bool]]:
    desc = getattr(message, "DESCRIPTOR")  # noqa: B009
    return {f.name: (f.number, f.type, f.has_presence) for f in desc.fields}


def test_field_numbers_match_upstream() -> None:
    # (number, protobuf type code, explicit presence); 9 = string, 11 = message, 8 = bool, 3 = int64, 14 = enum
    assert _fields(dra_v1_pb2.Device) == {
        "request_names": (1, 9, False),
        "pool_name": (2, 9, False),
        "device_name": (3, 9, False),
        "cdi_device_ids": (4, 9, False),
        "share_id": (5, 9, True),
    }
    assert "share_id" not in _fields(dra_v1beta1_pb2.Device)
    for mod in (dra_v1_pb2, dra_v1beta1_pb2):
        assert _fields(mod.Claim) == {"namespace": (1, 9, False), "uid": (2, 9, False), "name": (3, 9, False)}
        assert _fields(mod.NodePrepareResourceResponse)["error"][0] == 2
        assert _fields(mod.NodeUnprepareResourceResponse) == {"error": (1, 9, False)}
        assert _fields(mod.NodePrepareResourcesResponse)["claims"][0] == 1
    assert _fields(pluginregistration_v1_pb2.PluginInfo) == {
        "type": (1, 9, False),
        "name": (2, 9, False),
        "endpoint": (3, 9, False),
        "supported_versions": (4, 9, False),
    }
    assert _fields(pluginregistration_v1_pb2.RegistrationStatus) == {
        "plugin_registered": (1, 8, False),
        "error": (2, 9, False),
    }
    for health in (dra_health_v1alpha1_pb2, dra_health_v1_pb2):  # v1 has the same messages and numbers
        assert _fields(health.DeviceHealth) == {
            "device": (1, 11, True),
            "health": (2, 14, False),
            "last_updated_time": (3, 3, False),
            "health_check_timeout_seconds": (4, 3, False),
            "message": (5, 9, False),
        }
        assert _fields(health.DeviceIdentifier) == {"pool_name": (1, 9, False), "device_name": (2, 9, False)}
        assert _fields(health.NodeWatchResourcesResponse) == {"devices": (1, 11, False)}
        assert dict(health.HealthStatus.items()) == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}
    assert dra_health_v1_pb2.DESCRIPTOR.package == "v1"
    assert dra_health_v1alpha1_pb2.DESCRIPTOR.package == "v1alpha1"


def test_wire_bytes_of_a_prepare_response() -> None:
    """Hand-computed encoding: proves map keys, nested numbers and optional share_id on the wire."""
    resp = dra_v1_pb2.NodePrepareResourcesResponse()
    dev = resp.claims["u"].devices.add()
    dev.pool_name = "p"
    dev.share_id = ""
    # claims(1): entry{key(1)="u", value(2)=NodePrepareResourceResponse{devices(1)=Device{pool(2)="p", share_id(5)=""}}}
    assert resp.SerializeToString() == bytes.fromhex("0a0c0a01751207" + "0a05" + "1201702a00")
