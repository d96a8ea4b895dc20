"""What the runner needs from a cluster, and the views it reads back.

Two implementations: `SandboxBackend` (dra_sandbox.e2e.sandbox, the in-process cluster) and
`KubectlBackend` (dra_sandbox.e2e.kubectl, any real cluster through kubectl). The protocol stays small on
purpose: anything more a scenario needs is derived from these calls by the runner.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from dra_sandbox.e2e.scenario import VISIBLE_DEVICES_ENV, JsonObject, ObjectRef
from dra_sandbox.nvidiadriver import DriverAction, DriverView, change_driver, driver_of


class BackendError(Exception):
    """A cluster operation failed (the message says which and why)."""


@dataclass(frozen=True)
class ContainerView:
    """What one container saw."""

    env: Mapping[str, str]
    runtime: str  # "podman", "cdi-check" (sandbox) or "cluster" (real cluster: read from the container's log)
    executed: bool  # False: the sandbox only checked the CDI edits, nothing ran
    cdi_devices: tuple[str, ...] = ()  # known in the sandbox only
    note: str = ""
    # Device node paths and mount targets the container got; None: not known (a real cluster's log holds only env).
    device_nodes: tuple[str, ...] | None = None
    mounts: tuple[str, ...] | None = None

    @property
    def visible_devices(self) -> tuple[str, ...]:
        """The device UUIDs the container got: one `DRA_DEVICE_<NAME>_UUID` per injected device (exact even
        when a container references only some requests of a claim), else NVIDIA_VISIBLE_DEVICES."""
        per_device = sorted(
            v for k, v in self.env.items() if k.startswith(DEVICE_ENV_PREFIX) and k.endswith("_UUID")
            and not k.endswith("_PARENT_UUID")
        )
        if per_device:
            return tuple(per_device)
        return parse_visible_devices(self.env.get(VISIBLE_DEVICES_ENV, ""))


DEVICE_ENV_PREFIX = "DRA_DEVICE_"


def parse_visible_devices(value: str) -> tuple[str, ...]:
    """`GPU-a,GPU-b` -> ("GPU-a", "GPU-b"); unset, empty, "void" and "none" mean no device."""
    value = value.strip()
    if value in ("", "void", "none"):
        return ()
    return tuple(part.strip() for part in value.split(",") if part.strip())


class Backend(Protocol):
    """A cluster the runner can drive."""

    @property
    def name(self) -> str: ...

    @property
    def poll_interval(self) -> float: ...

    def apply(self, obj: JsonObject) -> None:
        """Create the object, or update it when it exists."""

    def delete(self, ref: ObjectRef) -> None:
        """Ask for deletion without waiting; a missing object is not an error."""

    def get(self, ref: ObjectRef) -> JsonObject | None:
        """The object as the API server returns it, or None when it does not exist."""

    def nodes(self) -> list[JsonObject]:
        """Every Node object."""

    def resource_slices(self) -> list[JsonObject]:
        """Every ResourceSlice object (resource.k8s.io/v1)."""

    def container(self, pod: JsonObject, container: str) -> ContainerView | None:
        """What the container saw, or None while that is not known (yet)."""

    def scheduling_message(self, pod: JsonObject) -> str:
        """Why the pod is not running yet, in the cluster's words ("" when nothing was said)."""

    def events(self, about: ObjectRef) -> list[JsonObject]:
        """The core/v1 Events whose involvedObject is `about` (a Node's live in namespace default)."""

    def plugin_ready(self, node: str) -> tuple[bool, str] | None:
        """The node's kubelet plugin's readiness (/healthz) and what it said; None: not observable here."""

    def driver_control(self) -> str:
        """Why this cluster's NVIDIA drivers cannot be changed by the runner ("" when they can: the sandbox)."""

    def driver_of(self, node: str) -> DriverView:
        """The node's NVIDIA driver now (only where driver_control() is "")."""

    def change_driver(self, node: str, action: DriverAction, version: str | None) -> tuple[DriverView, DriverView]:
        """Unload, load or reload the node's NVIDIA driver; (before, after)."""


class FakeNvmlNodes(ABC):
    """The node side of a backend whose kubelet plugins run on fake NVML (the sandbox and upstream backends): the
    runner reads each plugin's /healthz and changes a node's NVIDIA driver in its fake node state. A backend says
    where a node's NVML spec and health answer are."""

    @abstractmethod
    def nvml_spec(self, node: str) -> str:
        """The fake NVML spec the node's plugin runs on; BackendError where the node runs no plugin."""

    @abstractmethod
    def healthz(self, node: str) -> tuple[int, str] | None:
        """(HTTP status, body) of the node's plugin's /healthz; None: not reachable (yet)."""

    def plugin_ready(self, node: str) -> tuple[bool, str] | None:
        answer = self.healthz(node)
        if answer is None:
            return None
        status, body = answer
        return status == 200, f"HTTP {status}: {body}"

    def driver_control(self) -> str:
        return ""

    def driver_of(self, node: str) -> DriverView:
        return driver_of(self.nvml_spec(node))

    def change_driver(self, node: str, action: DriverAction, version: str | None) -> tuple[DriverView, DriverView]:
        try:
            return change_driver(self.nvml_spec(node), action, version)
        except (OSError, ValueError) as exc:
            raise BackendError(f"nvidia-driver {action} on {node}: {exc}") from exc


def condition_message(pod: Mapping[str, Any]) -> str:
    """The first explanation the pod's conditions hold: scheduling first, then the node's side."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    for wanted in ("PodScheduled", "PodReadyToStartContainers"):
        for condition in conditions:
            if condition.get("type") == wanted and condition.get("status") == "False" and condition.get("message"):
                return str(condition["message"])
    return ""


@dataclass(frozen=True)
class PodView:
    """A pod as one observation saw it."""

    name: str
    exists: bool
    phase: str | None = None
    node: str | None = None
    node_alias: str | None = None
    message: str = ""
    containers: Mapping[str, ContainerView] = field(default_factory=dict)
