"""Pure registration rules: validate a plugin's GetInfo answer and pick the DRA service version.

The version choice is a 1.34+ kubelet's: walk the PLUGIN's `supported_versions` in order and take the
first entry the kubelet supports ([v1.DRAPlugin, v1beta1.DRAPlugin]); unknown strings are ignored; no
match is a registration failure (the legacy v1alpha4 fallback is gone since 1.34).
"""

from __future__ import annotations

import os.path
from collections.abc import Sequence
from dataclasses import dataclass

DRA_PLUGIN_TYPE = "DRAPlugin"
V1 = "v1.DRAPlugin"
V1BETA1 = "v1beta1.DRAPlugin"
HEALTH_V1ALPHA1 = "v1alpha1.DRAResourceHealth"
SERVICES_SUPPORTED_BY_KUBELET: tuple[str, ...] = (V1, V1BETA1)


class RegistrationError(Exception):
    """The plugin cannot be registered; the message is sent back in NotifyRegistrationStatus."""


@dataclass(frozen=True)
class PluginInfo:
    type: str
    name: str
    endpoint: str
    supported_versions: tuple[str, ...]


@dataclass(frozen=True)
class Registration:
    """What a successful validation decides: who, where, which DRA service, whether health is served."""

    driver: str
    endpoint: str
    service: str
    health: bool
    supported_versions: tuple[str, ...]


def choose_service(supported_versions: Sequence[str]) -> str:
    for version in supported_versions:
        if version in SERVICES_SUPPORTED_BY_KUBELET:
            return version
    raise RegistrationError(
        f"none of the versions supported by the plugin {list(supported_versions)} are supported by the kubelet "
        f"{list(SERVICES_SUPPORTED_BY_KUBELET)}; Legacy behavior of picking v1alpha4 is no longer supported"
    )


def validate_plugin_info(info: PluginInfo) -> Registration:
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
        health=HEALTH_V1ALPHA1 in info.supported_versions,
        supported_versions=info.supported_versions,
    )
