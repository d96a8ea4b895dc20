"""cdiVersion handling: the known versions and the minimum version each feature needs.

Runtimes vendor older CDI libraries that reject versions they do not know, so a writer should use the
LOWEST version that covers the features a spec uses (`minimum_version`). A reader rejects a spec whose
cdiVersion is lower than what its features need (`version_requirements`).
"""

from __future__ import annotations

from dataclasses import dataclass

from dra_driver.cdi.errors import CdiError
from dra_driver.cdi.model import ContainerEdits, Spec

KNOWN_VERSIONS: tuple[str, ...] = (
    "0.1.0",
    "0.2.0",
    "0.3.0",
    "0.4.0",
    "0.5.0",
    "0.6.0",
    "0.7.0",
    "0.8.0",
    "1.0.0",
    "1.1.0",
)
EARLIEST_SUPPORTED = "0.3.0"
CURRENT_VERSION = "1.1.0"

Version = tuple[int, int, int]


def parse_version(text: str, field: str = "cdiVersion") -> Version:
    """A known, supported cdiVersion -> comparable tuple. Anything else is an error that lists the choices."""
    if not isinstance(text, str):
        raise CdiError(field, f'must be a string such as "0.5.0", got {type(text).__name__}')
    if text not in KNOWN_VERSIONS:
        raise CdiError(
            field,
            f"unknown cdiVersion {text!r}; use one of {', '.join(KNOWN_VERSIONS[2:])} "
            "(the lowest one that covers the features the spec uses)",
        )
    version = _as_tuple(text)
    if version < _as_tuple(EARLIEST_SUPPORTED):
        raise CdiError(field, f"cdiVersion {text} is no longer supported; use {EARLIEST_SUPPORTED} or newer")
    return version


def _as_tuple(text: str) -> Version:
    major, minor, patch = (int(p) for p in text.split("."))
    return (major, minor, patch)


def version_at_least(version: str, minimum: str) -> bool:
    return _as_tuple(version) >= _as_tuple(minimum)


@dataclass(frozen=True)
class Requirement:
    """`field` uses `feature`, which needs cdiVersion >= `version`."""

    version: str
    field: str
    feature: str


def _edits_requirements(edits: ContainerEdits, at: str) -> list[Requirement]:
    found: list[Requirement] = []
    for i, mount in enumerate(edits.mounts):
        if mount.type is not None:
            found.append(Requirement("0.4.0", f"{at}.mounts[{i}].type", "mount type"))
    for i, node in enumerate(edits.device_nodes):
        if node.host_path is not None:
            found.append(Requirement("0.5.0", f"{at}.deviceNodes[{i}].hostPath", "deviceNode hostPath"))
    if edits.intel_rdt is not None:
        found.append(Requirement("0.7.0", f"{at}.intelRdt", "intelRdt"))
        if edits.intel_rdt.schemata:
            found.append(Requirement("1.1.0", f"{at}.intelRdt.schemata", "intelRdt.schemata"))
        if edits.intel_rdt.enable_monitoring:
            found.append(Requirement("1.1.0", f"{at}.intelRdt.enableMonitoring", "intelRdt.enableMonitoring"))
    if edits.additional_gids:
        found.append(Requirement("0.7.0", f"{at}.additionalGids", "additionalGids"))
    if edits.net_devices:
        found.append(Requirement("1.1.0", f"{at}.netDevices", "netDevices"))
    return found


def version_requirements(spec: Spec) -> list[Requirement]:
    """Every feature in `spec` that needs more than the earliest supported cdiVersion."""
    found: list[Requirement] = []
    if "." in spec.device_class:
        found.append(Requirement("0.6.0", "kind", "a '.' in the class name"))
    if spec.annotations:
        found.append(Requirement("0.6.0", "annotations", "spec annotations"))
    found += _edits_requirements(spec.container_edits, "containerEdits")
    for i, device in enumerate(spec.devices):
        at = f"devices[{i}]"
        if device.name[:1].isdigit():
            found.append(Requirement("0.5.0", f"{at}.name", "a device name starting with a digit"))
        if device.annotations:
            found.append(Requirement("0.6.0", f"{at}.annotations", "device annotations"))
        found += _edits_requirements(device.container_edits, f"{at}.containerEdits")
    return found


def minimum_version(spec: Spec) -> str:
    """The lowest cdiVersion that covers every feature `spec` uses (at least the earliest supported)."""
    best = EARLIEST_SUPPORTED
    for req in version_requirements(spec):
        if _as_tuple(req.version) > _as_tuple(best):
            best = req.version
    return best


def check_version(spec: Spec) -> None:
    """Raise if the spec's cdiVersion is unknown, unsupported, or too low for a feature it uses."""
    parse_version(spec.cdi_version)
    for req in sorted(version_requirements(spec), key=lambda r: _as_tuple(r.version), reverse=True):
        if not version_at_least(spec.cdi_version, req.version):
            raise CdiError(
                req.field,
                f"{req.feature} needs cdiVersion >= {req.version} but the spec says {spec.cdi_version}; "
                f"raise cdiVersion to {minimum_version(spec)} or drop the feature",
            )
