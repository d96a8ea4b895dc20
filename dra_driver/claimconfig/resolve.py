"""Which opaque config applies to which allocated device.

Rules (as users of DRA drivers expect): entries from the DeviceClass (`FromClass`) come before entries
from the claim (`FromClaim`); within a source, later entries win; entries for other drivers are ignored;
an entry with `requests` applies only to those requests (a subrequest `req/sub` matches `req`).

One deliberate refinement: an entry that names no requests is a broad default, so a GpuConfig in it is
simply not applied to MIG devices (and vice versa) instead of failing the claim. An entry that names a
request explicitly must fit the device type, otherwise prepare fails with an error saying so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.claimconfig.api import ConfigError, DeviceConfig, GpuConfig, MigDeviceConfig

_SOURCE_ORDER = {"FromClass": 0, "FromClaim": 1}


@dataclass(frozen=True)
class _Entry:
    requests: tuple[str, ...]
    config: DeviceConfig
    path: str


def configs_for_results(
    allocation: Mapping[str, Any],
    driver: str,
    results: Sequence[Mapping[str, Any]],
    device_type: Callable[[Mapping[str, Any]], str],
) -> list[DeviceConfig]:
    """The config for each of `results` (allocation results of our driver), defaults where none applies.

    Raises ConfigError naming the offending entry (e.g. `status.allocation.devices.config[2].opaque.parameters.
    sharing.strategy`)."""
    entries = _decode_entries(allocation, driver)
    chosen: list[DeviceConfig] = []
    for result in results:
        request = str(result.get("request", ""))
        kind = device_type(result)
        config: DeviceConfig = GpuConfig() if kind == "gpu" else MigDeviceConfig()
        for entry in entries:
            if entry.requests and not _matches(request, entry.requests):
                continue
            if entry.config.device_type != kind:
                if entry.requests:
                    raise ConfigError(
                        entry.path,
                        f"cannot apply {entry.config.kind} to device {result.get('device')!r} of type {kind} "
                        f"(request {request!r}); use {'GpuConfig' if kind == 'gpu' else 'MigDeviceConfig'}",
                    )
                continue
            config = entry.config
        chosen.append(config)
    return chosen


def _decode_entries(allocation: Mapping[str, Any], driver: str) -> list[_Entry]:
    raw_entries = ((allocation.get("devices") or {}).get("config")) or []
    indexed = []
    for i, raw in enumerate(raw_entries):
        path = f"status.allocation.devices.config[{i}]"
        opaque = raw.get("opaque")
        if opaque is None:
            raise ConfigError(path, "only opaque configuration is supported")
        if opaque.get("driver") != driver:
            continue
        source = raw.get("source", "FromClaim")
        if source not in _SOURCE_ORDER:
            raise ConfigError(f"{path}.source", f"must be FromClass or FromClaim, got {source!r}")
        # Imported here: the pydantic models load with the first claim that has config for this driver, not
        # when the kubelet plugin starts (about 0.1 s of its start-up; docs/benchmarks.md).
        from dra_driver.claimconfig.decode import decode_config

        config = decode_config(opaque.get("parameters"), path=f"{path}.opaque.parameters")
        indexed.append((_SOURCE_ORDER[source], i, _Entry(tuple(raw.get("requests") or ()), config, path)))
    return [entry for _, _, entry in sorted(indexed, key=lambda t: (t[0], t[1]))]


def _matches(request: str, requests: tuple[str, ...]) -> bool:
    return request in requests or request.split("/", 1)[0] in requests
