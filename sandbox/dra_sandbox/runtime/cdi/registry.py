"""A CDI registry: the devices defined by the spec files of a list of directories.

Directories are given lowest priority first; a device defined in a later directory wins over an
earlier one (so /var/run/cdi overrides /etc/cdi). The same qualified device defined twice at its
highest priority is a conflict and the device is dropped, as the CDI library does; both files get an
issue. Invalid files are skipped and reported as issues, never fatal for the other files.
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dra_driver.cdi.errors import CdiError
from dra_driver.cdi.model import ContainerEdits, Device, Spec
from dra_driver.cdi.names import parse_qualified_name
from dra_sandbox.runtime.cdi.load import SPEC_EXTENSIONS, load_spec_file

DEFAULT_SPEC_DIRS: tuple[str, ...] = ("/etc/cdi", "/var/run/cdi")


@dataclass(frozen=True)
class SpecFile:
    path: str
    priority: int
    spec: Spec


@dataclass(frozen=True)
class LoadIssue:
    path: str
    message: str


@dataclass(frozen=True)
class RegisteredDevice:
    qualified_name: str
    source: SpecFile
    device: Device


class UnresolvableDevicesError(CdiError):
    """Some requested CDI devices are not defined (or were dropped because of a conflict)."""

    def __init__(self, missing: Sequence[str], hints: Mapping[str, str]) -> None:
        self.missing = tuple(missing)
        details = "; ".join(f"{m}: {hints[m]}" if m in hints else m for m in missing)
        super().__init__("devices", f"unresolvable CDI devices: {details}")


@dataclass(frozen=True)
class Registry:
    devices: Mapping[str, RegisteredDevice]
    issues: tuple[LoadIssue, ...] = ()
    conflicts: frozenset[str] = field(default_factory=frozenset)

    def resolve(self, ids: Iterable[str]) -> ContainerEdits:
        """The merged edits for `ids`: each spec's own edits once (at its first device), then device edits."""
        edits = ContainerEdits()
        seen_specs: set[str] = set()
        missing: list[str] = []
        hints: dict[str, str] = {}
        for qualified in ids:
            try:
                parse_qualified_name(qualified)
            except CdiError as exc:
                missing.append(qualified)
                hints[qualified] = exc.message
                continue
            entry = self.devices.get(qualified)
            if entry is None:
                missing.append(qualified)
                if qualified in self.conflicts:
                    hints[qualified] = "defined in more than one spec file at the same priority"
                continue
            if entry.source.path not in seen_specs:
                seen_specs.add(entry.source.path)
                edits = edits.append(entry.source.spec.container_edits)
            edits = edits.append(entry.device.container_edits)
        if missing:
            raise UnresolvableDevicesError(missing, hints)
        return edits

    def spec_for(self, qualified: str) -> SpecFile | None:
        entry = self.devices.get(qualified)
        return None if entry is None else entry.source


def build_registry(files: Iterable[SpecFile], issues: Iterable[LoadIssue] = ()) -> Registry:
    """Pure core: pick the winning definition of every qualified device name."""
    by_name: dict[str, list[RegisteredDevice]] = {}
    for spec_file in files:
        for device in spec_file.spec.devices:
            name = f"{spec_file.spec.kind}={device.name}"
            by_name.setdefault(name, []).append(RegisteredDevice(name, spec_file, device))
    devices: dict[str, RegisteredDevice] = {}
    conflicts: set[str] = set()
    all_issues = list(issues)
    for name, candidates in by_name.items():
        top = max(c.source.priority for c in candidates)
        winners = [c for c in candidates if c.source.priority == top]
        if len(winners) == 1:
            devices[name] = winners[0]
            continue
        conflicts.add(name)
        paths = sorted({w.source.path for w in winners})
        for path in paths:
            others = ", ".join(p for p in paths if p != path)
            all_issues.append(LoadIssue(path, f"device {name} conflicts with {others} (same priority); dropped"))
    return Registry(types.MappingProxyType(devices), tuple(all_issues), frozenset(conflicts))


def read_spec_dirs(dirs: Sequence[str | Path]) -> tuple[list[SpecFile], list[LoadIssue]]:
    """I/O edge: load every *.json / *.yaml file directly inside each dir (no recursion); missing dirs are fine."""
    files: list[SpecFile] = []
    issues: list[LoadIssue] = []
    for priority, directory in enumerate(dirs):
        root = Path(directory)
        try:
            entries = sorted(root.iterdir())
        except FileNotFoundError:
            continue
        except OSError as exc:
            issues.append(LoadIssue(str(root), f"cannot list directory: {exc.strerror or exc}"))
            continue
        for path in entries:
            if path.suffix not in SPEC_EXTENSIONS or not path.is_file():
                continue
            try:
                files.append(SpecFile(str(path), priority, load_spec_file(path)))
            except CdiError as exc:
                issues.append(LoadIssue(str(path), str(exc)))
    return files, issues


def load_registry(dirs: Sequence[str | Path] = DEFAULT_SPEC_DIRS) -> Registry:
    files, issues = read_spec_dirs(dirs)
    return build_registry(files, issues)
