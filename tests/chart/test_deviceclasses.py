"""One definition of the DeviceClasses: the chart renders what dra_driver.deviceclasses returns."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from dra_driver import cli
from dra_driver.cel import DeviceInput, DraCelEnvironment
from dra_driver.defaults import DRIVER_NAME
from dra_driver.deviceclasses import (
    DeviceClassFileError,
    check_driver_name,
    device_classes,
    load_definition,
    render_device_classes,
)
from dra_driver.k8s.semver import parse_semver
from dra_sandbox.apiserver.validation import validate_device_class
from tests.chart.helm import CHART, REPO, Helm, by_kind

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
    sets = [f"driverName={driver}", f"deviceClasses.extendedResource={str(extended).lower()}"]
    rendered = without_chart_labels(by_kind(helm.render(sets), "DeviceClass"))
    expected = device_classes(driver, extended_resource=extended)
    key = lambda o: o["metadata"]["name"]  # noqa: E731
    assert sorted(rendered, key=key) == sorted(expected, key=key)
    names = sorted(o["metadata"]["name"] for o in expected)
    assert names == sorted([driver, f"mig.{driver}"])


def test_classes_select_by_driver_and_type() -> None:
    by_name = {c["metadata"]["name"]: c for c in device_classes("gpu.example.com", extended_resource=True)}
    gpu, mig = by_name["gpu.example.com"], by_name["mig.gpu.example.com"]
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
    ("preset", "mig_mode", "types"),
    [
        ("dgx-h100", "dynamic", {"gpu", "mig"}),  # whole GPUs and every MIG placement
        ("dgx-a100", "dynamic", {"mig"}),  # Ampere with MIG enabled: MIG only
        ("l4x2", "none", {"gpu"}),  # no MIG at all
    ],
)
def test_each_published_device_falls_in_exactly_one_class(
    capsys: pytest.CaptureFixture[str], preset: str, mig_mode: str, types: set[str]
) -> None:
    """The selectors agree with what the slice builder publishes (attribute `type`: gpu | mig)."""
    driver = "gpu.example.com"
    argv = ["inventory", "--nvml", f"fake:{preset}", "--slices", "--mig-mode", mig_mode, "--driver-name", driver]
    assert cli.main([*argv, "--node-name", "n1", "-o", "json"]) == 0
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


def test_checkout_reads_the_chart_file_through_the_package() -> None:
    text, source = load_definition()
    assert text == DEFINITION.read_text()
    assert Path(source).resolve() == DEFINITION.resolve()


def test_falls_back_to_the_checkout_then_explains(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty_package = tmp_path / "pkg"
    empty_package.mkdir()
    monkeypatch.setattr("dra_driver.deviceclasses.resources.files", lambda _name: empty_package)
    text, source = load_definition()
    assert text == DEFINITION.read_text() and Path(source) == REPO / "charts/dra-driver/files/deviceclasses.yaml"
    with pytest.raises(DeviceClassFileError) as err:
        load_definition(repo_root=tmp_path / "nowhere")
    assert str(empty_package / "deviceclasses.yaml") in str(err.value)
    assert str(tmp_path / "nowhere" / "charts/dra-driver/files/deviceclasses.yaml") in str(err.value)


def test_wheel_ships_the_definition(tmp_path: Path) -> None:
    """Build the real wheel from a copy of the sources; the installed package must work without the chart."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(
        REPO / "dra_driver", src / "dra_driver", symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
    )
    (src / "charts/dra-driver/files").mkdir(parents=True)
    shutil.copy2(DEFINITION, src / "charts/dra-driver/files/deviceclasses.yaml")
    assert (src / "dra_driver/deviceclasses.yaml").is_symlink()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "w"),
            ".",
        ],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    [wheel] = (tmp_path / "w").glob("dra_driver-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        info = archive.getinfo("dra_driver/deviceclasses.yaml")
        assert (info.external_attr >> 16) & 0o170000 != 0o120000, "shipped as a symlink, not the file"
        assert archive.read(info).decode() == DEFINITION.read_text()
        site = tmp_path / "site"
        archive.extractall(site)
    # Import the unpacked wheel (a pure-Python wheel unpacked is its installed layout), far from any checkout.
    code = (
        "import json, dra_driver.deviceclasses as d; "
        "print(json.dumps([d.__file__, d.load_definition()[1], d.device_classes('gpu.example.com', True)]))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    module_file, source, classes = json.loads(io.StringIO(run.stdout).read())
    assert module_file.startswith(str(site)) and source == str(site / "dra_driver/deviceclasses.yaml")
    assert classes == device_classes("gpu.example.com", extended_resource=True)
