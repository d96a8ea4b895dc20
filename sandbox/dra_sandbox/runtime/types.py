"""What a container runtime is asked to run and what it reports back."""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ContainerRequest:
    """One container to start. `name` is only for messages; `inspect_paths` are files the container should read
    back (up to 8 KiB, one trailing newline dropped), which proves that a bind mount really carried the host's
    content."""

    name: str
    cdi_devices: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    inspect_paths: tuple[str, ...] = ()


@dataclass(frozen=True)
class ObservedMount:
    target: str
    source: str
    fstype: str
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class ObservedDevice:
    path: str
    kind: str  # "c", "b" or "?" when unknown (not executed and the host has no such node)
    major: int | None = None
    minor: int | None = None


@dataclass(frozen=True)
class ContainerResult:
    runtime: str
    executed: bool
    exit_code: int
    cdi_devices: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[ObservedMount, ...] = ()
    device_nodes: tuple[ObservedDevice, ...] = ()
    additional_gids: tuple[int, ...] = ()
    files: Mapping[str, str | None] = field(default_factory=dict)
    error: str | None = None
    note: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", types.MappingProxyType(dict(self.env)))
        object.__setattr__(self, "files", types.MappingProxyType(dict(self.files)))

    @property
    def ok(self) -> bool:
        return self.error is None and self.exit_code == 0

    def mount_targets(self) -> tuple[str, ...]:
        return tuple(m.target for m in self.mounts)

    def to_json(self) -> dict[str, Any]:
        """A compact, JSON-ready record (what the kubelet simulator stores on the pod)."""
        return {
            "runtime": self.runtime,
            "executed": self.executed,
            "exitCode": self.exit_code,
            "cdiDevices": list(self.cdi_devices),
            "env": dict(self.env),
            "mounts": [{"target": m.target, "source": m.source, "type": m.fstype, "options": list(m.options)}
                       for m in self.mounts],
            "deviceNodes": [{"path": d.path, "type": d.kind, "major": d.major, "minor": d.minor}
                            for d in self.device_nodes],
            "additionalGids": list(self.additional_gids),
            "files": dict(self.files),
            **({"error": self.error} if self.error else {}),
            **({"note": self.note} if self.note else {}),
        }


class ContainerRuntime(Protocol):
    """Starts a container with CDI devices and reports what it saw. Implementations never raise for a
    container failure: they return a result with `error` set and a non-zero exit code."""

    @property
    def name(self) -> str: ...

    def run(self, request: ContainerRequest) -> ContainerResult: ...
