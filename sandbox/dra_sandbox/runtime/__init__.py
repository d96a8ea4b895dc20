"""Sandbox container runtime: start containers with CDI devices and report what they saw.

`select_runtime("auto")` gives `PodmanRuntime` (real containers, CDI injected by podman) when podman can
run containers here, else `CdiCheckedRuntime` (specs resolved with dra_driver.cdi, clearly marked as not
executed).
"""

from dra_sandbox.runtime.cdicheck import CdiCheckedRuntime
from dra_sandbox.runtime.choose import RUNTIME_MODES, select_runtime
from dra_sandbox.runtime.podman import PodmanAvailability, PodmanRuntime
from dra_sandbox.runtime.types import (
    ContainerRequest,
    ContainerResult,
    ContainerRuntime,
    ObservedDevice,
    ObservedMount,
)

__all__ = [
    "RUNTIME_MODES",
    "CdiCheckedRuntime",
    "ContainerRequest",
    "ContainerResult",
    "ContainerRuntime",
    "ObservedDevice",
    "ObservedMount",
    "PodmanAvailability",
    "PodmanRuntime",
    "select_runtime",
]
