"""Opaque config: strict decoding with field-named errors, and class-then-claim resolution."""

from __future__ import annotations

from typing import Any, Literal, get_args, get_origin

import pytest

from dra_driver.claimconfig.api import (
    ConfigError,
    GpuConfig,
    MigDeviceConfig,
    MpsConfig,
    Sharing,
    SharingStrategy,
    TimeSliceInterval,
)
from dra_driver.claimconfig.decode import decode_config
from dra_driver.claimconfig.resolve import configs_for
from dra_driver.defaults import DRIVER_NAME
from dra_driver.resourceapi import parse_resource_claim

V = "gpu.dra.dev/v1beta1"


def test_minimal_gpu_config_is_exclusive() -> None:
    assert decode_config({"apiVersion": V, "kind": "GpuConfig"}) == GpuConfig()


def test_time_slicing_with_interval() -> None:
    cfg = decode_config(
        {
            "apiVersion": V,
            "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
        }
    )
    assert cfg.sharing == Sharing(SharingStrategy.TIME_SLICING, TimeSliceInterval.LONG)
    assert TimeSliceInterval.LONG.nvidia_smi_value == 3


@pytest.mark.parametrize("field", ["defaultPinnedDeviceMemoryLimit", "defaultPerDevicePinnedMemoryLimit"])
def test_a_limit_above_the_largest_quantity_is_refused_naming_the_field(field: str) -> None:
    huge = "9" * 900 + "Ei"
    value: Any = huge if field == "defaultPinnedDeviceMemoryLimit" else {"0": huge}
    with pytest.raises(ConfigError) as err:
        decode_config({"apiVersion": V, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {field: value}}})
    message = str(err.value)
    assert f"parameters.sharing.mpsConfig.{field}" in message and "at most 2^63-1 bytes" in message
    assert len(message) < 600  # the 900 digits are not echoed back
    ok = decode_config({"apiVersion": V, "kind": "GpuConfig",
                        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": 2**63 - 1}}})
    assert ok.sharing.mps is not None and ok.sharing.mps.default_pinned_device_memory_limit == 2**63 - 1


def test_time_slicing_alone_on_a_mig_device_decodes() -> None:
    """NVIDIA's `simple-mig-ts` (renamed): accepted, with no interval (nothing is applied on a MIG device)."""
    cfg = decode_config({"apiVersion": V, "kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing"}})
    assert isinstance(cfg, MigDeviceConfig)
    assert cfg.sharing == Sharing(SharingStrategy.TIME_SLICING)


def test_time_slicing_defaults_its_interval() -> None:
    cfg = decode_config({"apiVersion": V, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}})
    assert cfg.sharing.time_slice_interval is TimeSliceInterval.DEFAULT


def test_mps_parameters_are_parsed_to_bytes() -> None:
    cfg = decode_config(
        {
            "apiVersion": V,
            "kind": "MigDeviceConfig",
            "sharing": {
                "strategy": "MPS",
                "mpsConfig": {
                    "defaultActiveThreadPercentage": 50,
                    "defaultPinnedDeviceMemoryLimit": "10Gi",
                    "defaultPerDevicePinnedMemoryLimit": {"0": "512Mi", "MIG-abc": "1G"},
                },
            },
        }
    )
    assert isinstance(cfg, MigDeviceConfig)
    assert cfg.sharing.mps == MpsConfig(50, 10 * 2**30, {"0": 512 * 2**20, "MIG-abc": 10**9})


@pytest.mark.parametrize(
    ("params", "path", "fragment"),
    [
        ({"apiVersion": "gpu.dra.dev/v1", "kind": "GpuConfig"}, "parameters.apiVersion", "gpu.dra.dev/v1beta1"),
        ({"apiVersion": V, "kind": "TpuConfig"}, "parameters.kind", "GpuConfig, MigDeviceConfig"),
        ({"apiVersion": V, "kind": "GpuConfig", "shareing": {}}, "parameters.shareing", "unknown field"),
        (
            {"apiVersion": V, "kind": "GpuConfig", "sharing": {"strategy": "Spatial"}},
            "parameters.sharing.strategy",
            "Exclusive",
        ),
        (
            {"apiVersion": V, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "extra": 1}},
            "parameters.sharing.extra",
            "unknown",
        ),
        (
            {
                "apiVersion": V,
                "kind": "GpuConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Fast"}},
            },
            "parameters.sharing.timeSlicingConfig.interval",
            "Default, Short, Medium, Long",
        ),
        (
            {"apiVersion": V, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "timeSlicingConfig": {}}},
            "parameters.sharing.timeSlicingConfig",
            "only allowed with strategy TimeSlicing",
        ),
        (
            {
                "apiVersion": V,
                "kind": "MigDeviceConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {}},
            },
            "parameters.sharing.timeSlicingConfig",
            "a MIG device takes no time-slice interval",
        ),
        (
            {
                "apiVersion": V,
                "kind": "MigDeviceConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}},
            },
            "parameters.sharing.timeSlicingConfig.interval",
            "remove sharing.timeSlicingConfig and keep strategy TimeSlicing alone",
        ),
        (
            {
                "apiVersion": V,
                "kind": "GpuConfig",
                "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}},
            },
            "parameters.sharing.mpsConfig.defaultActiveThreadPercentage",
            "between 1 and 100",
        ),
        (
            {
                "apiVersion": V,
                "kind": "GpuConfig",
                "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 0}},
            },
            "parameters.sharing.mpsConfig.defaultActiveThreadPercentage",
            "between 1 and 100",
        ),
        (
            {
                "apiVersion": V,
                "kind": "GpuConfig",
                "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "10Zi"}},
            },
            "parameters.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
            "not a valid quantity",
        ),
        (
            {
                "apiVersion": V,
                "kind": "GpuConfig",
                "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "100Ki"}},
            },
            "parameters.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
            "at least 1Mi",
        ),
        (
            {
                "apiVersion": V,
                "kind": "GpuConfig",
                "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"gpu0": "1Gi"}}},
            },
            "parameters.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit['gpu0']",
            "device UUID",
        ),
        ("not-an-object", "parameters", "must be an object"),
    ],
)
def test_bad_configs_name_the_field(params: Any, path: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        decode_config(params)
    assert err.value.path == path
    assert fragment in str(err.value)


def _entry(
    source: str, params: dict[str, Any], requests: list[str] | None = None, driver: str = DRIVER_NAME
) -> dict[str, Any]:
    entry: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": params}}
    if requests is not None:
        entry["requests"] = requests
    return entry


TS = {"apiVersion": V, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}
MPS = {"apiVersion": V, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
MIG_MPS = {"apiVersion": V, "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}}


def _kind(result: Any) -> str:
    return "mig" if "-mig-" in result.device else "gpu"


def configs_for_results(
    allocation: dict[str, Any], driver: str, results: list[dict[str, Any]], kind: Any
) -> list[Any]:
    """configs_for as the engine calls it: the claim read by the one parser, this driver's results and configs."""
    full = [{"driver": driver, "pool": "p", **r} for r in results]
    alloc = {"devices": {**allocation.get("devices", {}), "results": full}}
    claim = parse_resource_claim({"metadata": {"namespace": "ns", "name": "c", "uid": "u"}, "status": {"allocation": alloc}})
    ours = claim.for_driver(driver, "p")
    return configs_for(ours.configs, ours.results, kind)


def test_claim_config_beats_class_config_regardless_of_list_order() -> None:
    allocation = {"devices": {"config": [_entry("FromClaim", MPS), _entry("FromClass", TS)]}}
    [cfg] = configs_for_results(allocation, DRIVER_NAME, [{"request": "gpu", "device": "gpu-0"}], _kind)
    assert cfg.sharing.strategy is SharingStrategy.MPS


def test_later_entries_win_and_request_filters_apply() -> None:
    allocation = {
        "devices": {
            "config": [
                _entry("FromClaim", TS),
                _entry("FromClaim", MPS, ["b"]),
                _entry("FromClaim", MIG_MPS, driver="other.example.com"),
            ]
        }
    }
    results = [{"request": "a", "device": "gpu-0"}, {"request": "b/first", "device": "gpu-1"}]
    a, b = configs_for_results(allocation, DRIVER_NAME, results, _kind)
    assert a.sharing.strategy is SharingStrategy.TIME_SLICING
    assert b.sharing.strategy is SharingStrategy.MPS


def test_broad_config_of_other_type_is_skipped_but_explicit_mismatch_fails() -> None:
    mig_result = [{"request": "slice", "device": "gpu-0-mig-1g10gb-19-0"}]
    broad = {"devices": {"config": [_entry("FromClass", TS)]}}
    assert configs_for_results(broad, DRIVER_NAME, mig_result, _kind) == [MigDeviceConfig()]
    explicit = {"devices": {"config": [_entry("FromClaim", TS, ["slice"])]}}
    with pytest.raises(
        ConfigError, match="cannot apply GpuConfig to device 'gpu-0-mig-1g10gb-19-0' of type mig"
    ) as err:
        configs_for_results(explicit, DRIVER_NAME, mig_result, _kind)
    assert err.value.path == "status.allocation.devices.config[0]"


def _claim_with_spec(requests: list[dict[str, Any]], spec_config: list[dict[str, Any]],
                     allocated_config: list[dict[str, Any]], results: list[dict[str, Any]]) -> Any:
    full = [{"driver": DRIVER_NAME, "pool": "p", **r} for r in results]
    return parse_resource_claim({
        "metadata": {"namespace": "ns", "name": "c", "uid": "u"},
        "spec": {"devices": {"requests": requests, "config": spec_config}},
        "status": {"allocation": {"devices": {"results": full, "config": allocated_config}}}})


WHOLE = [{"name": "gpu", "exactly": {"deviceClassName": DRIVER_NAME}}]


def test_a_config_scoped_to_a_request_is_no_default_even_where_the_allocator_emptied_its_requests() -> None:
    """Issue 32 (1): `requests: [gpu]`, a MigDeviceConfig with MPS, a whole GPU. Kubernetes 1.37's allocator writes
    the entry without `requests` (they cover every request); 1.34-1.36 copy them. Either way prepare fails."""
    spec = [{"requests": ["gpu"], "opaque": {"driver": DRIVER_NAME, "parameters": MIG_MPS}}]
    gpu = [{"request": "gpu", "device": "gpu-0"}]
    for allocated in ([_entry("FromClaim", MIG_MPS)], [_entry("FromClaim", MIG_MPS, ["gpu"])]):
        ours = _claim_with_spec(WHOLE, spec, allocated, gpu).for_driver(DRIVER_NAME, "p")
        assert ours.configs[0].requests == ("gpu",)
        with pytest.raises(ConfigError, match="cannot apply MigDeviceConfig to device 'gpu-0' of type gpu "
                                              r"\(request 'gpu'\); use GpuConfig") as err:
            configs_for(ours.configs, ours.results, _kind)
        assert err.value.path == "status.allocation.devices.config[0]"
    # Written without `requests`, the same entry is a default: not applied to the whole GPU.
    broad = [{"opaque": {"driver": DRIVER_NAME, "parameters": MIG_MPS}}]
    ours = _claim_with_spec(WHOLE, broad, [_entry("FromClaim", MIG_MPS)], gpu).for_driver(DRIVER_NAME, "p")
    assert configs_for(ours.configs, ours.results, _kind) == [GpuConfig()]


def test_requests_as_written_follow_spec_order_subrequests_and_repeated_entries() -> None:
    requests: list[dict[str, Any]] = [{"name": "gpu", "firstAvailable": [{"name": "whole", "deviceClassName": DRIVER_NAME},
                                                   {"name": "mig", "deviceClassName": f"mig.{DRIVER_NAME}"}]},
                {"name": "other", "exactly": {"deviceClassName": DRIVER_NAME}}]
    spec = [{"requests": ["gpu/whole", "other"], "opaque": {"driver": DRIVER_NAME, "parameters": MPS}},
            {"requests": ["gpu/mig"], "opaque": {"driver": DRIVER_NAME, "parameters": MIG_MPS}},
            {"requests": ["other"], "opaque": {"driver": DRIVER_NAME, "parameters": TS}}]
    results = [{"request": "gpu/whole", "device": "gpu-0"}, {"request": "other", "device": "gpu-1"}]
    # 1.37: the first entry covers every request (emptied), the MIG one matched nothing (left out), the last kept.
    v137 = [_entry("FromClaim", MPS), _entry("FromClaim", TS, ["other"])]
    ours = _claim_with_spec(requests, spec, v137, results).for_driver(DRIVER_NAME, "p")
    assert [c.requests for c in ours.configs] == [("gpu/whole", "other"), ("other",)]
    whole, other = configs_for(ours.configs, ours.results, _kind)
    assert whole.sharing.strategy is SharingStrategy.MPS and other.sharing.strategy is SharingStrategy.TIME_SLICING
    # 1.34-1.36: the first entry once per request it matches, all with their requests.
    v136 = [_entry("FromClaim", MPS, ["gpu/whole", "other"]), _entry("FromClaim", MPS, ["gpu/whole", "other"]),
            _entry("FromClaim", TS, ["other"])]
    ours = _claim_with_spec(requests, spec, v136, results).for_driver(DRIVER_NAME, "p")
    assert [c.requests for c in ours.configs] == [("gpu/whole", "other"), ("gpu/whole", "other"), ("other",)]
    # A class entry is the allocator's, not the user's: left as the allocation has it.
    with_class = [_entry("FromClass", TS), *v137]
    ours = _claim_with_spec(requests, spec, with_class, results).for_driver(DRIVER_NAME, "p")
    assert ours.configs[0].requests == ()


def test_decode_errors_carry_the_allocation_path() -> None:
    allocation = {
        "devices": {
            "config": [_entry("FromClaim", TS), _entry("FromClaim", {"apiVersion": V, "kind": "GpuConfig", "x": 1})]
        }
    }
    with pytest.raises(ConfigError) as err:
        configs_for_results(allocation, DRIVER_NAME, [{"request": "a", "device": "gpu-0"}], _kind)
    assert err.value.path == "status.allocation.devices.config[1].opaque.parameters.x"


def test_every_problem_is_reported_each_with_its_path() -> None:
    with pytest.raises(ConfigError) as err:
        decode_config(
            {
                "apiVersion": "v1",
                "kind": "GpuConfig",
                "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": "5"}},
                "x": 1,
            }
        )
    assert err.value.path == "parameters.apiVersion"
    assert [str(p) for p in err.value.problems] == [
        "parameters.apiVersion: must be 'gpu.dra.dev/v1beta1', got 'v1'",
        "parameters.sharing.mpsConfig.defaultActiveThreadPercentage: must be an integer, got a string '5'",
        "parameters.x: unknown field; allowed fields: apiVersion, kind, sharing",
    ]
    assert str(err.value) == "; ".join(str(p) for p in err.value.problems)


@pytest.mark.parametrize(
    ("params", "path", "message"),
    [
        ({"kind": "GpuConfig"}, "parameters.apiVersion", "required field is missing; must be 'gpu.dra.dev/v1beta1'"),
        ({"apiVersion": V}, "parameters.kind", "required field is missing; must be one of GpuConfig, MigDeviceConfig, VfioDeviceConfig"),
        (
            {"apiVersion": V, "kind": "GpuConfig", "sharing": {"mpsConfig": {}}},
            "parameters.sharing.mpsConfig",
            "only allowed with strategy MPS, not Exclusive",
        ),
        (
            {"apiVersion": V, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": None}},
            "parameters.sharing.mpsConfig",
            "must be an object, got null",
        ),
        (
            {
                "apiVersion": V,
                "kind": "GpuConfig",
                "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"0": "512Ki"}}},
            },
            "parameters.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit['0']",
            "must be at least 1Mi, got '512Ki'",
        ),
    ],
)
def test_more_field_errors(params: Any, path: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        decode_config(params)
    assert (err.value.path, err.value.message) == (path, message)


def test_null_sharing_means_the_default() -> None:
    assert decode_config({"apiVersion": V, "kind": "MigDeviceConfig", "sharing": None}) == MigDeviceConfig()


def test_the_models_give_the_json_schema_of_the_api() -> None:
    from pydantic import TypeAdapter

    from dra_driver.claimconfig.api import API_VERSION
    from dra_driver.claimconfig.decode import GpuConfigSpec, Parameters

    annotation = GpuConfigSpec.model_fields["api_version"].annotation
    assert get_origin(annotation) is Literal and get_args(annotation) == (API_VERSION,)
    schema = TypeAdapter(Parameters).json_schema(by_alias=True)
    defs = schema["$defs"]
    assert set(schema["discriminator"]["mapping"]) == {"GpuConfig", "MigDeviceConfig", "VfioDeviceConfig"}
    assert set(defs["IommuSpec"]["properties"]) == {"backendPolicy", "enableAPIDevice"}
    assert all(d.get("additionalProperties") is False for d in defs.values() if d.get("type") == "object")
    assert defs["SharingStrategy"]["enum"] == ["Exclusive", "TimeSlicing", "MPS"]
    assert "timeSlicingConfig" in defs["GpuSharing"]["properties"]
    assert "timeSlicingConfig" not in defs["MigSharing"]["properties"]
    limit = defs["MpsConfigSpec"]["properties"]["defaultPinnedDeviceMemoryLimit"]["anyOf"][0]
    assert limit["x-kubernetes-int-or-string"] is True


def test_vfio_device_config_decodes_strictly_with_nvidias_field_names() -> None:
    from dra_driver.claimconfig.api import IommuBackendPolicy, VfioDeviceConfig
    from dra_driver.claimconfig.decode import decode_config

    base = {"apiVersion": "gpu.dra.dev/v1beta1", "kind": "VfioDeviceConfig"}
    assert decode_config(base) == VfioDeviceConfig()
    full = decode_config({**base, "iommu": {"backendPolicy": "PreferIommuFD", "enableAPIDevice": True}})
    assert full == VfioDeviceConfig(IommuBackendPolicy.PREFER_IOMMU_FD, enable_api_device=True)
    with pytest.raises(ConfigError) as err:
        decode_config({**base, "iommu": {"backendPolicy": "Legacy", "enableApiDevice": "yes"}})
    assert str(err.value) == (
        "parameters.iommu.backendPolicy: must be one of LegacyOnly, PreferIommuFD; got 'Legacy'; "
        "parameters.iommu.enableApiDevice: unknown field; allowed fields: backendPolicy, enableAPIDevice"
    )
    with pytest.raises(ConfigError, match="enableAPIDevice: "):
        decode_config({**base, "iommu": {"enableAPIDevice": "true"}})
