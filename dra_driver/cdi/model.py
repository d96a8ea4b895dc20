"""Frozen value model of a CDI spec (cncf-tags/container-device-interface, spec 1.1.0).

Field names follow the JSON names of the spec in snake_case. Optional scalars are ``None`` when the
file leaves them out, so that encoding a parsed spec gives back the same JSON (Go's ``omitempty``).
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass, field

EMPTY_MAP: Mapping[str, str] = types.MappingProxyType({})


def frozen_map(values: Mapping[str, str] | None) -> Mapping[str, str]:
    """A read-only copy, so a frozen dataclass really is immutable."""
    return types.MappingProxyType(dict(values)) if values else EMPTY_MAP


@dataclass(frozen=True)
class DeviceNode:
    """A device node a CDI edit creates in the container (`deviceNodes`)."""

    path: str
    host_path: str | None = None
    type: str | None = None
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = None
    permissions: str | None = None
    uid: int | None = None
    gid: int | None = None


@dataclass(frozen=True)
class Mount:
    """A mount a CDI edit adds to the container (`mounts`)."""

    host_path: str
    container_path: str
    options: tuple[str, ...] = ()
    type: str | None = None


@dataclass(frozen=True)
class Hook:
    """An OCI hook a CDI edit runs for the container (`hooks`), e.g. the toolkit's `nvidia-cdi-hook`."""

    hook_name: str
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    timeout: int | None = None


@dataclass(frozen=True)
class IntelRdt:
    """The container's Intel RDT class of service (`intelRdt`), a CDI field this driver carries but never sets."""

    clos_id: str | None = None
    l3_cache_schema: str | None = None
    mem_bw_schema: str | None = None
    schemata: tuple[str, ...] = ()
    enable_monitoring: bool = False


@dataclass(frozen=True)
class NetDevice:
    """A host network interface a CDI edit moves into the container (`netDevices`)."""

    host_interface_name: str
    name: str


@dataclass(frozen=True)
class ContainerEdits:
    """What a CDI spec or device changes in the container: environment, device nodes, hooks, mounts, groups."""

    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    hooks: tuple[Hook, ...] = ()
    mounts: tuple[Mount, ...] = ()
    intel_rdt: IntelRdt | None = None
    additional_gids: tuple[int, ...] = ()
    net_devices: tuple[NetDevice, ...] = ()

    def is_empty(self) -> bool:
        return not (
            self.env
            or self.device_nodes
            or self.hooks
            or self.mounts
            or self.intel_rdt is not None
            or self.additional_gids
            or self.net_devices
        )

    def append(self, other: ContainerEdits) -> ContainerEdits:
        """Concatenate two edit sets the way the CDI library merges them (intelRdt: last one wins)."""
        return ContainerEdits(
            env=self.env + other.env,
            device_nodes=self.device_nodes + other.device_nodes,
            hooks=self.hooks + other.hooks,
            mounts=self.mounts + other.mounts,
            intel_rdt=other.intel_rdt if other.intel_rdt is not None else self.intel_rdt,
            additional_gids=self.additional_gids + other.additional_gids,
            net_devices=self.net_devices + other.net_devices,
        )


@dataclass(frozen=True)
class Device:
    """A device of a CDI spec: the name a CDI id ends with, and its container edits."""

    name: str
    container_edits: ContainerEdits = field(default_factory=ContainerEdits)
    annotations: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "annotations", frozen_map(self.annotations))


@dataclass(frozen=True)
class Spec:
    """A CDI spec file: its version, the `vendor/class` kind, its devices and the edits common to them."""

    cdi_version: str
    kind: str
    devices: tuple[Device, ...]
    container_edits: ContainerEdits = field(default_factory=ContainerEdits)
    annotations: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "annotations", frozen_map(self.annotations))

    @property
    def vendor(self) -> str:
        return self.kind.partition("/")[0]

    @property
    def device_class(self) -> str:
        return self.kind.partition("/")[2]

    def qualified_names(self) -> tuple[str, ...]:
        return tuple(f"{self.kind}={d.name}" for d in self.devices)

    def device(self, name: str) -> Device | None:
        return next((d for d in self.devices if d.name == name), None)
