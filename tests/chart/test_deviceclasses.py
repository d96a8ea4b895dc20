"""One definition of the DeviceClasses: the chart renders what dra_sandbox.deviceclasses returns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dra_driver import cli
from dra_driver.cel import DeviceInput, DraCelEnvironment
from dra_driver.defaults import DRIVER_NAME, EXTENDED_RESOURCE_NAME
from dra_driver.k8s.semver import parse_semver
from dra_sandbox.apiserver.validation import validate_device_class
from dra_sandbox.deviceclasses import (
    DeviceClassFileError,
    check_driver_name,
    device_classes,
    load_definition,
    render_device_classes,
)
from tests.chart.helm import CHART, Helm, by_kind

DEFINITION = CHART / "files" / "deviceclasses.yaml"


def without_chart_labels(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for obj in objects:
        metadata = {k: v for k, v in obj["metadata"].items() if k != "labels"}
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        out.append({**obj, "metadata": metadata})
    return out


@pytest.mark.parametrize("driver", [DRIVER_NAME, "gpu.example.com"])
@pytest.mark.parametrize("extended", [False, True])
def test_chart_renders_exactly_device_classes(helm: Helm, driver: str, extended: bool) -> None:
    sets = [f"driverName={driver}", f"deviceClasses.extendedResource={str(extended).lower()}",
            "deviceClasses.extendedResourceName="]  # fmt: skip
    if driver != DRIVER_NAME:
        sets.append("computeDomains.enabled=false")  # their classes keep their fixed names: refused otherwise
    rendered = without_chart_labels([c for c in by_kind(helm.render(sets), "DeviceClass")
                                     if not c["metadata"]["name"].startswith("compute-domain-")])
    expected = device_classes(driver, extended_resource=extended)
    key = lambda o: o["metadata"]["name"]  # noqa: E731
    assert sorted(rendered, key=key) == sorted(expected, key=key)
    names = sorted(o["metadata"]["name"] for o in expected)
    assert names == sorted([driver, f"mig.{driver}", f"gpu-share.{driver}", f"vfio.{driver}", f"vgpu.{driver}",
                           f"fm-partition.{driver}"])


@pytest.mark.parametrize(("sets", "expected"), [
    (("deviceClasses.extendedResourceName=nvidia.com/gpu",), "nvidia.com/gpu"),
    # The name wins over the older boolean; the boolean alone still means <driver>/gpu.
    (("deviceClasses.extendedResourceName=nvidia.com/gpu", "deviceClasses.extendedResource=true"), "nvidia.com/gpu"),
    # The chart's default is NVIDIA's: nvidia.com/gpu (the boolean then changes nothing); "" disables it.
    ((), EXTENDED_RESOURCE_NAME),
    (("deviceClasses.extendedResource=true",), EXTENDED_RESOURCE_NAME),
    (("deviceClasses.extendedResource=true", "deviceClasses.extendedResourceName="), f"{DRIVER_NAME}/gpu"),
    (("deviceClasses.extendedResourceName=",), None),
    (("deviceClasses.extendedResourceName=example.com/h100",), "example.com/h100"),
])
def test_extended_resource_name_is_a_value(helm: Helm, sets: tuple[str, ...], expected: str | None) -> None:
    rendered = {c["metadata"]["name"]: c for c in without_chart_labels(by_kind(helm.render(sets), "DeviceClass"))
                if not c["metadata"]["name"].startswith("compute-domain-")}  # test_compute_domains.py
    assert rendered[DRIVER_NAME]["spec"].get("extendedResourceName") == expected
    others = [c for n, c in rendered.items() if n != DRIVER_NAME]
    assert all("extendedResourceName" not in c["spec"] for c in others)
    named = [s.split("=", 1)[1] for s in sets if s.startswith("deviceClasses.extendedResourceName=")]
    mirror = {c["metadata"]["name"]: c for c in device_classes(
        DRIVER_NAME, "deviceClasses.extendedResource=true" in sets,
        extended_resource_name=named[0] if named else EXTENDED_RESOURCE_NAME)}
    assert mirror == rendered


def test_the_sandbox_installs_the_main_class_without_the_mapping_unless_asked() -> None:
    """`dra-sandbox up` (and the e2e sandbox) install the chart's classes with no extendedResourceName by default,
    so a plain nvidia.com/gpu pod stays Pending there; `--extended-resource-name` gives the chart's default."""
    assert all("extendedResourceName" not in c["spec"] for c in device_classes(DRIVER_NAME))
    [main] = [c for c in device_classes(DRIVER_NAME, extended_resource_name=EXTENDED_RESOURCE_NAME)
              if c["metadata"]["name"] == DRIVER_NAME]  # fmt: skip
    assert main["spec"]["extendedResourceName"] == "nvidia.com/gpu"


def test_extended_resource_name_must_be_a_domain_prefixed_name(helm: Helm) -> None:
    assert "extendedResourceName" in helm.fail(["deviceClasses.extendedResourceName=gpu"])


def test_classes_select_by_driver_and_type() -> None:
    by_name = {c["metadata"]["name"]: c for c in device_classes("gpu.example.com", extended_resource=True)}
    gpu, mig, share = by_name["gpu.example.com"], by_name["mig.gpu.example.com"], by_name["gpu-share.gpu.example.com"]
    assert share["spec"]["selectors"] == [
        {
            "cel": {
                "expression": "device.driver == 'gpu.example.com' "
                "&& device.attributes['gpu.example.com'].type == 'gpu-share'"
            }
        }
    ]
    assert "extendedResourceName" not in share["spec"]
    assert gpu["spec"]["selectors"] == [
        {
            "cel": {
                "expression": "device.driver == 'gpu.example.com' && device.attributes['gpu.example.com'].type == 'gpu'"
            }
        }
    ]
    assert gpu["spec"]["extendedResourceName"] == "gpu.example.com/gpu"
    assert "extendedResourceName" not in mig["spec"]
    assert "extendedResourceName" not in device_classes("gpu.example.com")[0]["spec"]


@pytest.mark.parametrize("extended", [False, True])
def test_classes_pass_api_server_validation(extended: bool) -> None:
    for obj in device_classes("gpu.example.com", extended_resource=extended):
        assert validate_device_class(obj) == [], obj["metadata"]["name"]


def _cel_value(attribute: dict[str, Any]) -> Any:
    [(kind, value)] = attribute.items()
    return parse_semver(value) if kind == "version" else value


@pytest.mark.parametrize(
    ("preset", "mig_mode", "sharing", "types"),
    [
        ("dgx-h100", "dynamic", "passthrough", {"gpu", "mig", "vfio"}),  # `--passthrough all`: a VFIO device per GPU
        ("l4x2", "none", "passthrough", {"gpu", "vfio"}),
        ("dgx-h100", "dynamic", "exclusive", {"gpu", "mig"}),  # whole GPUs and every MIG placement
        ("dgx-a100", "dynamic", "exclusive", {"mig"}),  # Ampere with MIG enabled: MIG only
        ("l4x2", "none", "exclusive", {"gpu"}),  # no MIG at all
        ("dgx-h100", "dynamic", "shares", {"gpu", "gpu-share", "mig"}),  # whole, shares and placements
        ("l4x2", "none", "shares", {"gpu", "gpu-share"}),
    ],
)
def test_each_published_device_falls_in_exactly_one_class(
    capsys: pytest.CaptureFixture[str], preset: str, mig_mode: str, sharing: str, types: set[str]
) -> None:
    """The selectors agree with what the slice builder publishes (attribute `type`: gpu | gpu-share | mig)."""
    driver = "gpu.example.com"
    argv = ["inventory", "--nvml", f"fake:{preset}", "--slices", "--mig-mode", mig_mode, "--driver-name", driver]
    more = ["--passthrough", "all"] if sharing == "passthrough" else ["--sharing-mode", sharing]
    assert cli.main([*argv, *more, "--node-name", "n1", "-o", "json"]) == 0
    slices = json.loads(capsys.readouterr().out)["items"]
    devices = [d for s in slices for d in s["spec"].get("devices", [])]
    assert devices
    env = DraCelEnvironment()
    classes = {c["metadata"]["name"]: c["spec"]["selectors"] for c in device_classes(driver)}
    matched: dict[str, list[str]] = {name: [] for name in classes}
    for device in devices:
        cel_device = DeviceInput(
            driver=driver, attributes={k: _cel_value(v) for k, v in device.get("attributes", {}).items()}
        )
        hits = [n for n, sel in classes.items() if all(env.matches(s["cel"]["expression"], cel_device) for s in sel)]
        assert len(hits) == 1, f"{device['name']} matches {hits}"
        matched[hits[0]].append(device["attributes"]["type"]["string"])
    assert set(matched[driver]) == ({"gpu"} & types)
    assert set(matched[f"mig.{driver}"]) == ({"mig"} & types)
    assert set(matched[f"gpu-share.{driver}"]) == ({"gpu-share"} & types)
    assert set(matched[f"vfio.{driver}"]) == ({"vfio"} & types)
    # A foreign driver's device matches neither class.
    foreign = DeviceInput(driver="other.example.com", attributes={"type": "gpu"})
    assert not any(env.matches(s[0]["cel"]["expression"], foreign) for s in classes.values())


@pytest.mark.parametrize("bad", ["", "GPU.dra.dev", "gpu_dra", "-gpu", "gpu-", "gpu..dev", "a" * 64, "gpu.dra.dev/x"])
def test_bad_driver_name_is_refused_naming_the_field(bad: str) -> None:
    with pytest.raises(ValueError, match="driver_name"):
        device_classes(bad)


@pytest.mark.parametrize("good", ["a", "gpu.dra.dev", "a" * 59 + ".dev"])
def test_driver_names_up_to_63_characters_are_accepted(good: str) -> None:
    check_driver_name(good)


def test_malformed_definition_names_file_and_entry() -> None:
    with pytest.raises(DeviceClassFileError, match=r"defs\.yaml: expected a mapping with a list 'deviceClasses'"):
        render_device_classes("- 1\n", DRIVER_NAME, source="defs.yaml")
    with pytest.raises(DeviceClassFileError, match=r"defs\.yaml: deviceClasses\[0\]: expected .*kind: DeviceClass"):
        render_device_classes("deviceClasses: [{kind: Pod}]\n", DRIVER_NAME, source="defs.yaml")
    with pytest.raises(DeviceClassFileError, match=r"deviceClasses\[0\]\.metadata\.name: required"):
        render_device_classes("deviceClasses: [{kind: DeviceClass, spec: {}}]\n", DRIVER_NAME, source="d")
    with pytest.raises(DeviceClassFileError, match="not valid YAML"):
        render_device_classes("deviceClasses: [\n", DRIVER_NAME)


def test_the_bench_reads_the_chart_file_of_the_checkout(tmp_path: Path) -> None:
    text, source = load_definition()
    assert text == DEFINITION.read_text()
    assert Path(source).resolve() == DEFINITION.resolve()
    with pytest.raises(DeviceClassFileError) as err:
        load_definition(repo_root=tmp_path / "nowhere")
    assert str(tmp_path / "nowhere" / "charts/dra-driver/files/deviceclasses.yaml") in str(err.value)
