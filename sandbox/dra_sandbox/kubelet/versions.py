"""Pure registration rules: validate a plugin's GetInfo answer and pick the DRA service version.

The version choice is a 1.34+ kubelet's: walk the PLUGIN's `supported_versions` in order and take the
first entry the kubelet supports ([v1.DRAPlugin, v1beta1.DRAPlugin]); unknown strings are ignored; no
match is a registration failure (the legacy v1alpha4 fallback is gone since 1.34).

The health service is picked apart from the DRA service (`pick_health_service`, after the kubelet's
pickHealthService in pkg/kubelet/cm/dra/plugin, kubernetes/kubernetes PR 139477): a 1.37 kubelet takes
v1.DRAResourceHealth when the plugin lists it, wherever it stands, else v1alpha1 (kept for three releases of
transition); 1.34-1.36 kubelets know only v1alpha1. The kubelet opens no stream at all while its
ResourceHealthStatus gate is off (alpha, off by default, in 1.34 and 1.35; beta, on, from 1.36).
"""

from __future__ import annotations

import os.path
from collections.abc import Sequence
from dataclasses import dataclass

from dra_driver._gen import pluginregistration_v1_pb2

DRA_PLUGIN_TYPE = "DRAPlugin"
V1 = "v1.DRAPlugin"
V1BETA1 = "v1beta1.DRAPlugin"
HEALTH_V1ALPHA1 = "v1alpha1.DRAResourceHealth"
HEALTH_V1 = "v1.DRAResourceHealth"
SERVICES_SUPPORTED_BY_KUBELET: tuple[str, ...] = (V1, V1BETA1)
DEFAULT_KUBELET_MINOR = 37


@dataclass(frozen=True)
class KubeletGates:
    """The kubelet feature gates this simulator honours, at their defaults for one minor version unless set."""

    minor: int = DEFAULT_KUBELET_MINOR
    resource_health_status: bool | None = None  # ResourceHealthStatus: alpha 1.31 (DRA 1.34), beta on 1.36
    resource_health_status_message: bool | None = None  # ResourceHealthStatusMessage: beta on 1.36 (new in 1.36)

    @property
    def health_status(self) -> bool:
        return self.minor >= 36 if self.resource_health_status is None else self.resource_health_status

    @property
    def health_message(self) -> bool:
        if self.minor < 36:  # the field does not exist before 1.36 (k8s.io/api v0.36.0)
            return False
        return True if self.resource_health_status_message is None else self.resource_health_status_message

    def health_services(self) -> tuple[str, ...]:
        """healthServicesSupportedByKubelet, most preferred first."""
        if not self.health_status:
            return ()
        return (HEALTH_V1, HEALTH_V1ALPHA1) if self.minor >= 37 else (HEALTH_V1ALPHA1,)


class RegistrationError(Exception):
    """The plugin cannot be registered; the message is sent back in NotifyRegistrationStatus."""


@dataclass(frozen=True)
class Registration:
    """What a successful validation decides: who, where, which DRA service, whether health is served."""

    driver: str
    endpoint: str
    service: str
    health_service: str  # "" when the kubelet opens no health stream
    supported_versions: tuple[str, ...]

    @property
    def health(self) -> bool:
        return bool(self.health_service)


def pick_health_service(supported_versions: Sequence[str], gates: KubeletGates) -> str:
    """The kubelet's preferred health service that the plugin lists, or "" (no stream)."""
    for service in gates.health_services():
        if service in supported_versions:
            return service
    return ""


def choose_service(supported_versions: Sequence[str]) -> str:
    for version in supported_versions:
        if version in SERVICES_SUPPORTED_BY_KUBELET:
            return version
    raise RegistrationError(
        f"none of the versions supported by the plugin {list(supported_versions)} are supported by the kubelet "
        f"{list(SERVICES_SUPPORTED_BY_KUBELET)}; Legacy behavior of picking v1alpha4 is no longer supported"
    )


def validate_plugin_info(info: pluginregistration_v1_pb2.PluginInfo, gates: KubeletGates | None = None) -> Registration:
    """The plugin's GetInfo answer, as received, checked as the kubelet's plugin watcher and DRA handler do."""
    if info.type != DRA_PLUGIN_TYPE:
        raise RegistrationError(f"plugin type {info.type!r} is not supported; a DRA driver must report "
                                f"type {DRA_PLUGIN_TYPE!r}")
    if not info.name:
        raise RegistrationError("plugin name is empty; report the DRA driver name (e.g. gpu.dra.dev)")
    if not info.endpoint or not os.path.isabs(info.endpoint):
        raise RegistrationError(f"plugin endpoint {info.endpoint!r} must be the absolute path of the DRA socket")
    service = choose_service(info.supported_versions)
    return Registration(
        driver=info.name,
        endpoint=info.endpoint,
        service=service,
        health_service=pick_health_service(info.supported_versions, gates or KubeletGates()),
        supported_versions=tuple(info.supported_versions),
    )
