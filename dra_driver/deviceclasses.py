"""The DeviceClasses this driver installs, from the one definition the Helm chart also renders.

The definition lives in the chart, `charts/dra-driver/files/deviceclasses.yaml`, so that `helm install`
and the sandbox/demo install byte-for-byte the same classes. The package reaches it as
`dra_driver/deviceclasses.yaml`: in a checkout that is a symlink into the chart, in a wheel it is the
file itself (package data), so one lookup serves both.

The file is plain YAML with one placeholder, `__DRIVER_NAME__`, replaced as text (exactly what the
chart's `replace` does), and `spec.extendedResourceName` is dropped unless asked for.
"""

from __future__ import annotations

import copy
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from dra_driver.errors import DraDriverError
from dra_driver.k8s.names import is_dns_subdomain

PLACEHOLDER = "__DRIVER_NAME__"
PACKAGE_FILE = "deviceclasses.yaml"
# Relative to the repository root; used when the package file is missing (e.g. a copy without symlinks).
CHART_FILE = Path("charts/dra-driver/files/deviceclasses.yaml")

# A DRA driver name is a DNS subdomain of at most 63 characters (ResourceSlice.spec.driver).
_DRIVER_NAME_MAX = 63


class DeviceClassFileError(DraDriverError, ValueError):
    """The definition file is missing or malformed."""


def device_classes(driver_name: str, extended_resource: bool = False) -> list[dict[str, Any]]:
    """The DeviceClass objects (resource.k8s.io/v1, wire-form dicts) for `driver_name`.

    `extended_resource` keeps `spec.extendedResourceName` (`<driver>/gpu` on the whole-GPU class), for
    clusters with the DRAExtendedResource feature gate.
    """
    text, source = load_definition()
    return render_device_classes(text, driver_name, extended_resource=extended_resource, source=source)


def render_device_classes(
    text: str, driver_name: str, *, extended_resource: bool = False, source: str = "deviceclasses.yaml"
) -> list[dict[str, Any]]:
    """Pure core: definition text -> DeviceClass dicts. Mirrors templates/deviceclasses.yaml."""
    check_driver_name(driver_name)
    try:
        document = yaml.safe_load(text.replace(PLACEHOLDER, driver_name))
    except yaml.YAMLError as exc:
        raise DeviceClassFileError(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("deviceClasses"), list):
        raise DeviceClassFileError(f"{source}: expected a mapping with a list 'deviceClasses'")
    classes: list[dict[str, Any]] = []
    for i, item in enumerate(document["deviceClasses"]):
        where = f"{source}: deviceClasses[{i}]"
        if not isinstance(item, dict) or item.get("kind") != "DeviceClass":
            raise DeviceClassFileError(f"{where}: expected an object with kind: DeviceClass")
        spec = item.get("spec")
        if not isinstance(spec, dict):
            raise DeviceClassFileError(f"{where}.spec: expected a mapping")
        name = (item.get("metadata") or {}).get("name")
        if not isinstance(name, str) or not name:
            raise DeviceClassFileError(f"{where}.metadata.name: required")
        obj = copy.deepcopy(item)
        if not extended_resource:
            obj["spec"].pop("extendedResourceName", None)
        classes.append(obj)
    return classes


def check_driver_name(driver_name: str) -> None:
    """Raise ValueError naming `driver_name` unless it is a valid DRA driver name."""
    if not isinstance(driver_name, str) or not driver_name:
        raise ValueError("driver_name: required, e.g. 'gpu.dra.dev'")
    if not is_dns_subdomain(driver_name, max_len=_DRIVER_NAME_MAX):
        raise ValueError(
            f"driver_name {driver_name!r}: must be a lower-case DNS subdomain of at most {_DRIVER_NAME_MAX} "
            "characters (letters, digits, '-' and '.'), e.g. 'gpu.dra.dev'"
        )


def load_definition(repo_root: Path | None = None) -> tuple[str, str]:
    """(text, where it came from): the package file first, then the chart file of a checkout."""
    candidates: list[str] = []
    packaged = resources.files("dra_driver").joinpath(PACKAGE_FILE)
    candidates.append(str(packaged))
    try:
        return packaged.read_text(encoding="utf-8"), str(packaged)
    except (FileNotFoundError, NotADirectoryError):
        pass  # a broken symlink or a package built without its data; try the checkout layout
    root = repo_root if repo_root is not None else Path(__file__).resolve().parent.parent
    chart_file = root / CHART_FILE
    candidates.append(str(chart_file))
    try:
        return chart_file.read_text(encoding="utf-8"), str(chart_file)
    except (FileNotFoundError, NotADirectoryError):
        pass
    raise DeviceClassFileError(
        "DeviceClass definitions not found; looked at: "
        + ", ".join(candidates)
        + ". Reinstall the dra-driver package (the wheel ships dra_driver/deviceclasses.yaml) or run from a "
        "checkout that has charts/dra-driver/files/deviceclasses.yaml."
    )
