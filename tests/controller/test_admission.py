"""The webhook's checks (dra_driver.controller.admission) on plain objects: what is refused, with which path."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from dra_driver.cel.environment import DraCelEnvironment
from dra_driver.claimconfig.api import ConfigError
from dra_driver.claimconfig.decode import decode_config
from dra_driver.controller.admission import (
    KNOWN_ATTRIBUTES,
    KNOWN_CAPACITIES,
    check_device_class,
    check_resource_claim,
    check_resource_claim_template,
    denial_message,
)

DRIVER = "gpu.dra.dev"
CEL = DraCelEnvironment()
REPO = Path(__file__).resolve().parents[2]


def mps(pct: Any) -> dict[str, Any]:
    return {"opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": "gpu.dra.dev/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": pct}}}}}


def claim(configs: list[Any], selectors: tuple[str, ...] | list[str] = ()) -> dict[str, Any]:
    return {"spec": {"devices": {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.dra.dev",
                                                 "selectors": [{"cel": {"expression": e}} for e in selectors]}}],
        "config": configs}}}


def test_valid_claim_passes() -> None:
    ok = claim([mps(50)], ['device.attributes["gpu.dra.dev"].productName == "H100"'])
    assert check_resource_claim(ok, driver=DRIVER, cel=CEL) == []


def test_bad_opaque_config_names_the_field_like_prepare() -> None:
    problems = check_resource_claim(claim([mps(50), mps(101)]), driver=DRIVER, cel=CEL)
    at = "spec.devices.config[1].opaque.parameters"
    with pytest.raises(ConfigError) as prepare:
        decode_config(mps(101)["opaque"]["parameters"], path=at)
    assert [str(p) for p in problems] == [str(prepare.value)]
    assert denial_message(problems) == (
        "spec.devices.config[1].opaque.parameters.sharing.mpsConfig.defaultActiveThreadPercentage: "
        "must be a whole number between 1 and 100, got 101")


def mig_time_slicing(**block: Any) -> dict[str, Any]:
    sharing: dict[str, Any] = {"strategy": "TimeSlicing", **({"timeSlicingConfig": block} if block else {})}
    return {"opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": "gpu.dra.dev/v1beta1", "kind": "MigDeviceConfig", "sharing": sharing}}}


def test_time_slicing_on_mig_is_judged_as_at_prepare() -> None:
    """NVIDIA's `simple-mig-ts` is admitted; an interval is refused naming the field, as prepare refuses it."""
    assert check_resource_claim(claim([mig_time_slicing()]), driver=DRIVER, cel=CEL) == []
    problems = check_resource_claim(claim([mig_time_slicing(interval="Long")]), driver=DRIVER, cel=CEL)
    at = "spec.devices.config[0].opaque.parameters"
    with pytest.raises(ConfigError) as prepare:
        decode_config(mig_time_slicing(interval="Long")["opaque"]["parameters"], path=at)
    assert [str(p) for p in problems] == [str(prepare.value)]
    assert denial_message(problems).startswith(f"{at}.sharing.timeSlicingConfig.interval: a MIG device takes no")


def test_other_drivers_config_is_not_ours_to_judge() -> None:
    other = {"opaque": {"driver": "other.example.com", "parameters": {"anything": True}}}
    assert check_resource_claim(claim([other]), driver=DRIVER, cel=CEL) == []


def test_unknown_kind_and_field_are_refused() -> None:
    bad = {"opaque": {"driver": DRIVER, "parameters": {"apiVersion": "gpu.dra.dev/v1beta1", "kind": "GpuConfig",
                                                       "sharing": {"strategy": "MPS", "mpsConfg": {}}}}}
    problems = check_resource_claim(claim([bad]), driver=DRIVER, cel=CEL)
    assert [p.path for p in problems] == ["spec.devices.config[0].opaque.parameters.sharing.mpsConfg"]


def test_template_paths_are_under_spec_spec() -> None:
    template = {"spec": claim([mps(0)])}
    problems = check_resource_claim_template(template, driver=DRIVER, cel=CEL)
    assert [p.path for p in problems] == [
        "spec.spec.devices.config[0].opaque.parameters.sharing.mpsConfig.defaultActiveThreadPercentage"]


def test_selector_syntax_error_and_unknown_attribute() -> None:
    obj = claim([], ['device.attributes["gpu.dra.dev"].productName ==',
                     "device.attributes['gpu.dra.dev'].prodcutName == 'x'",
                     'device.attributes["gpu.dra.dev"]["index"] < 4 && device.capacity["gpu.dra.dev"].memery.isGreaterThan(quantity("1"))',
                     'device.attributes["other.io"].whatever == 1'])
    problems = check_resource_claim(obj, driver=DRIVER, cel=CEL)
    base = "spec.devices.requests[0].exactly.selectors"
    assert [p.path for p in problems] == [f"{base}[0].cel.expression", f"{base}[1].cel.expression",
                                          f"{base}[2].cel.expression"]
    assert problems[0].message.startswith("compilation failed")
    assert 'no attribute "prodcutName"' in problems[1].message
    assert 'no capacity "memery"' in problems[2].message


def test_first_available_selectors() -> None:
    obj = {"spec": {"devices": {"requests": [{"name": "r", "firstAvailable": [
        {"name": "a", "deviceClassName": "x"},
        {"name": "b", "deviceClassName": "x",
         "selectors": [{"cel": {"expression": 'device.attributes["gpu.dra.dev"].nope'}}]}]}]}}}
    problems = check_resource_claim(obj, driver=DRIVER, cel=CEL)
    assert [p.path for p in problems] == ["spec.devices.requests[0].firstAvailable[1].selectors[0].cel.expression"]


def test_device_class() -> None:
    cls = {"spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.dra.dev"'}},
                                  {"cel": {"expression": 'device.attributes["gpu.dra.dev"].typo == "gpu"'}}],
                    "config": [mps("50")]}}
    problems = check_device_class(cls, driver=DRIVER, cel=CEL)
    assert [p.path for p in problems] == [
        "spec.selectors[1].cel.expression",
        "spec.config[0].opaque.parameters.sharing.mpsConfig.defaultActiveThreadPercentage"]


def test_malformed_shapes_do_not_crash() -> None:
    for obj in ({}, {"spec": None}, {"spec": {"devices": {"config": "x", "requests": [None, 3]}}},
                {"spec": {"selectors": [{"cel": None}], "config": [{"opaque": None}]}}):
        assert check_resource_claim(obj, driver=DRIVER, cel=CEL) == []
        assert check_device_class(obj, driver=DRIVER, cel=CEL) == []


def test_known_names_are_what_the_plugin_publishes() -> None:
    source = "".join((REPO / "dra_driver/slices" / name).read_text() for name in ("attributes.py", "partitiontypes.py"))
    literals = set(re.findall(r'"([A-Za-z]+)"', source))
    assert literals >= KNOWN_ATTRIBUTES
    assert literals >= KNOWN_CAPACITIES


def test_compute_domain_configs_are_judged_as_the_compute_domain_plugin_judges_them() -> None:
    """ComputeDomainChannelConfig / ComputeDomainDaemonConfig of driver compute-domain.gpu.dra.dev: decoded with the
    compute-domain plugin's own decoder (dra_driver/computedomain/config.py), the field named."""
    cd = "compute-domain.gpu.dra.dev"

    def channel(**fields: Any) -> dict[str, Any]:
        return {"opaque": {"driver": cd, "parameters": {"apiVersion": "gpu.dra.dev/v1beta1",
                                                         "kind": "ComputeDomainChannelConfig", **fields}}}

    assert check_resource_claim(claim([channel(domainID="0b9f-11", allocationMode="All")]), driver=DRIVER,
                                cel=CEL) == []
    problems = check_resource_claim(claim([channel(allocationMode="Some")]), driver=DRIVER, cel=CEL)
    assert denial_message(problems) == (
        "spec.devices.config[0].opaque.parameters.domainID: required field is missing; "
        "spec.devices.config[0].opaque.parameters.allocationMode: must be one of Single, All; got 'Some'")


@pytest.mark.parametrize("knobs", ["fabric_partitions=true", "vgpu=true,fabric_partitions=true", "vgpu=true,vgpu_mdev=true"])
def test_every_attribute_the_slices_carry_is_known(tmp_path: Path, knobs: str) -> None:
    """The other way round, on real slices: every attribute of the driver's domain that the builder publishes for
    every kind (whole GPUs, dynamic MIG, passthrough, vGPU, Fabric Manager partitions, partition types) is one a
    selector may name; a missing one refuses claims that select it (passthrough's deviceID/vendorID/iommuFDEnabled
    once were)."""
    from dra_driver.inventory.catalog import MigOffering, catalog
    from dra_driver.inventory.discover import discover
    from dra_driver.inventory.fmpartitions import with_partitions
    from dra_driver.inventory.passthrough import passthrough_settings
    from dra_driver.inventory.sharing import EXCLUSIVE
    from dra_driver.inventory.vgpu import vgpu_settings
    from dra_driver.nvml.factory import open_backend
    from dra_driver.nvml.fake.backend import FakeNvml
    from dra_driver.slices.builder import SliceSettings, build_slices

    node = tmp_path / "node.yaml"
    node.write_text("name: n\ngpus:\n  - model: H100-SXM5-80GB\n    count: 4\n")
    nvml = open_backend(f"fake:{node},{knobs}")
    assert isinstance(nvml, FakeNvml)
    nvml.init()
    inventory = discover(nvml)
    devices = catalog(inventory, MigOffering.DYNAMIC, EXCLUSIVE, passthrough_settings("all"), vgpu_settings("all"))
    if "fabric_partitions" in knobs:
        devices = with_partitions(devices, inventory, nvml.fabric_manager().supported_partitions())
    settings = SliceSettings(driver_name=DRIVER, node_name="n", kube_version=(1, 37), partition_types_served=True)
    published = {
        name
        for s in build_slices(inventory.system, devices, settings, 1)
        for d in s["spec"].get("devices", [])
        for name in d.get("attributes", {})
        if "/" not in name or name.startswith(f"{DRIVER}/")
    }
    names = {n.split("/")[-1] for n in published}
    assert names <= KNOWN_ATTRIBUTES
    # Each kind was there: MIG partitions where the GPUs are no vGPU host, vGPU slots where they are.
    assert {"deviceID", "vgpuType" if "vgpu" in knobs else "profile"} <= names
