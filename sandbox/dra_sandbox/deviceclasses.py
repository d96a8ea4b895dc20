"""The DeviceClasses the chart installs, for the sandbox, the demo and the tests.

The definition lives in the chart, `charts/dra-driver/files/deviceclasses.yaml`, so that `helm install`
and the sandbox/demo install byte-for-byte the same classes. The bench runs from a checkout, so it reads the
chart file there; the product does not need it (on a cluster the chart installs the classes).

The file is plain YAML with one placeholder, `__DRIVER_NAME__`, replaced as text (exactly what the
chart's `replace` does), and `spec.extendedResourceName` is dropped unless asked for.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from dra_driver.errors import DraDriverError
from dra_driver.k8s.names import is_dns_subdomain

PLACEHOLDER = "__DRIVER_NAME__"
# Relative to the repository root (sandbox/dra_sandbox/ is two levels below it).
CHART_FILE = Path("charts/dra-driver/files/deviceclasses.yaml")
REPO_ROOT = Path(__file__).resolve().parents[2]

# A DRA driver name is a DNS subdomain of at most 63 characters (ResourceSlice.spec.driver).
_DRIVER_NAME_MAX = 63


class DeviceClassFileError(DraDriverError, ValueError):
    """The definition file is missing or malformed."""


def device_classes(
    driver_name: str, extended_resource: bool = False, *, extended_resource_name: str = ""
) -> list[dict[str, Any]]:
    """The DeviceClass objects (resource.k8s.io/v1, wire-form dicts) for `driver_name`.

    `extended_resource_name` (chart value deviceClasses.extendedResourceName, e.g. `nvidia.com/gpu`) becomes the
    whole-GPU class's `spec.extendedResourceName`; `extended_resource` (the older boolean) means `<driver>/gpu`.
    Both need the DRAExtendedResource feature gate.
    """
    text, source = load_definition()
    return render_device_classes(
        text, driver_name, extended_resource=extended_resource, extended_resource_name=extended_resource_name,
        source=source,
    )


def render_device_classes(
    text: str,
    driver_name: str,
    *,
    extended_resource: bool = False,
    extended_resource_name: str = "",
    source: str = "deviceclasses.yaml",
) -> list[dict[str, Any]]:
    """Pure core: definition text -> DeviceClass dicts. Mirrors templates/deviceclasses.yaml."""
    check_driver_name(driver_name)
    extended = extended_resource_name or (f"{driver_name}/gpu" if extended_resource else "")
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
        if not extended:
            obj["spec"].pop("extendedResourceName", None)
        elif "extendedResourceName" in obj["spec"]:
            obj["spec"]["extendedResourceName"] = extended
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


def load_definition(repo_root: Path = REPO_ROOT) -> tuple[str, str]:
    """(text, where it came from): the chart's definition file in the checkout."""
    chart_file = repo_root / CHART_FILE
    try:
        return chart_file.read_text(encoding="utf-8"), str(chart_file)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise DeviceClassFileError(
            f"DeviceClass definitions not found at {chart_file}: the test bench runs from a checkout of the "
            "repository, which has charts/dra-driver/files/deviceclasses.yaml"
        ) from exc


# --- the compute-domain driver's classes (issue 24) ------------------------------------------------------------

COMPUTE_DOMAIN_CHART_FILE = Path("charts/dra-driver/files/computedomain-deviceclasses.yaml")


def compute_domain_device_classes(repo_root: Path = REPO_ROOT) -> list[dict[str, Any]]:
    """The DeviceClasses `compute-domain-daemon.gpu.dra.dev` and `compute-domain-default-channel.gpu.dra.dev`, as
    the chart installs them with computeDomains.enabled (fixed names: no placeholder to replace)."""
    chart_file = repo_root / COMPUTE_DOMAIN_CHART_FILE
    try:
        text = chart_file.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise DeviceClassFileError(
            f"DeviceClass definitions not found at {chart_file}: the test bench runs from a checkout of the "
            f"repository, which has {COMPUTE_DOMAIN_CHART_FILE}"
        ) from exc
    return render_device_classes(text, "compute-domain.gpu.dra.dev", source=str(chart_file))


def compute_domain_crds(repo_root: Path = REPO_ROOT) -> list[dict[str, Any]]:
    """The ComputeDomain and ComputeDomainClique CRDs as the chart ships them (charts/dra-driver/crds/), for a
    sandbox that runs the controller with compute domains."""
    out = []
    for name in ("computedomains.yaml", "computedomaincliques.yaml"):
        path = repo_root / "charts/dra-driver/crds" / name
        try:
            obj = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise DeviceClassFileError(f"CRD not found at {path}: run from a checkout of the repository") from exc
        out.append(obj)
    return out
