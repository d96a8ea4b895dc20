"""Which opaque config applies to which allocated device.

Rules (as users of DRA drivers expect): entries from the DeviceClass (`FromClass`) come before entries
from the claim (`FromClaim`); within a source, later entries win; entries for other drivers are ignored;
an entry with `requests` applies only to those requests (a subrequest `req/sub` matches `req`).

One deliberate refinement: an entry that names no requests is a broad default, so a GpuConfig in it is
simply not applied to MIG devices (and vice versa) instead of failing the claim. An entry that names a
request explicitly must fit the device type, otherwise prepare fails with an error saying so. "Names" means as
the user wrote it: a claim entry whose `requests` Kubernetes 1.37's allocator emptied because they cover every
request gets them back from the claim's spec (`ResourceClaim.allocation_configs`), so `requests: [gpu]` with a
MigDeviceConfig on a whole GPU fails on every release instead of silently becoming a default.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dra_driver.claimconfig.api import (
    CONFIG_KINDS,
    ConfigError,
    DeviceConfig,
    GpuConfig,
    MigDeviceConfig,
    VfioDeviceConfig,
)
from dra_driver.resourceapi import FROM_CLASS, DeviceConfiguration, DeviceResult


@dataclass(frozen=True)
class _Entry:
    """One of the claim's configs that applies to a device, with the config entry it was decoded from."""

    source: DeviceConfiguration
    config: DeviceConfig


def configs_for(
    configs: Sequence[DeviceConfiguration],
    results: Sequence[DeviceResult],
    device_type: Callable[[DeviceResult], str],
) -> list[DeviceConfig]:
    """The config for each of `results`, defaults where none applies. `configs`: the allocation's entries for our
    driver (`ResourceClaim.for_driver(...).configs`); `device_type`: `gpu`, `mig` or `vfio`, the config kind a
    result's device takes. At most one VfioDeviceConfig per claim (as NVIDIA's driver).

    Raises ConfigError naming the offending entry (e.g. `status.allocation.devices.config[2].opaque.parameters.
    sharing.strategy`)."""
    entries = _decode_entries(configs)
    vfio = [e for e in entries if isinstance(e.config, VfioDeviceConfig)]
    if len(vfio) > 1:
        raise ConfigError(
            vfio[1].source.path,
            f"a claim takes at most one VfioDeviceConfig; {vfio[0].source.path} is one already: merge them into one",
        )
    return [_choose(entries, result.request, result.device, device_type(result)) for result in results]


def _choose(entries: Sequence[_Entry], request: str, device: str, kind: str) -> DeviceConfig:
    config: DeviceConfig = (
        GpuConfig() if kind == "gpu" else VfioDeviceConfig() if kind == "vfio" else MigDeviceConfig()
    )
    for entry in entries:
        if not entry.source.applies_to(request):
            continue
        if entry.config.device_type != kind:
            if entry.source.requests:
                raise ConfigError(
                    entry.source.path,
                    f"cannot apply {entry.config.kind} to device {device!r} of type {kind} "
                    f"(request {request!r}); use {CONFIG_KINDS.get(kind, 'GpuConfig')}",
                )
            continue
        config = entry.config
    return config


def _decode_entries(configs: Sequence[DeviceConfiguration]) -> list[_Entry]:
    """Class entries before claim entries, each in list order (the order they were given in)."""
    decoded = []
    for configuration in configs:
        if configuration.opaque is None:
            raise ConfigError(configuration.path, "only opaque configuration is supported")
        # Imported here: the pydantic models load with the first claim that has config for this driver, not
        # when the kubelet plugin starts (about 0.1 s of its start-up; docs/benchmarks.md).
        from dra_driver.claimconfig.decode import decode_config

        config = decode_config(configuration.opaque.parameters, path=f"{configuration.path}.opaque.parameters")
        decoded.append((configuration.source != FROM_CLASS, _Entry(configuration, config)))
    return [entry for _, entry in sorted(decoded, key=lambda t: t[0])]  # stable: list order within a source

