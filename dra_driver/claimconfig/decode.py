"""Strict decoding of opaque parameters: unknown fields, wrong types and bad values are errors that
name the field. The same decoder serves the kubelet plugin and the admission webhook."""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from dra_driver.claimconfig.api import (
    API_VERSION,
    ConfigError,
    DeviceConfig,
    GpuConfig,
    MigDeviceConfig,
    MpsConfig,
    Sharing,
    SharingStrategy,
    TimeSliceInterval,
)
from dra_driver.k8s.quantity import parse_quantity

E = TypeVar("E", bound=enum.StrEnum)

ONE_MIB = 1024 * 1024
QuantityParser = Callable[[str], int]


def decode_config(
    parameters: Any, *, path: str = "parameters", parse_quantity: QuantityParser | None = None
) -> DeviceConfig:
    """Decode one opaque `parameters` object into a GpuConfig or MigDeviceConfig."""
    parse = parse_quantity or parse_byte_quantity
    obj = _object(parameters, path)
    api_version = obj.get("apiVersion")
    if api_version != API_VERSION:
        raise ConfigError(f"{path}.apiVersion", f"must be {API_VERSION!r}, got {api_version!r}")
    kind = obj.get("kind")
    if kind == "GpuConfig":
        _known(obj, {"apiVersion", "kind", "sharing"}, path)
        return GpuConfig(
            sharing=_sharing(obj.get("sharing"), f"{path}.sharing", allow_time_slicing_config=True, parse=parse)
        )
    if kind == "MigDeviceConfig":
        _known(obj, {"apiVersion", "kind", "sharing"}, path)
        return MigDeviceConfig(
            sharing=_sharing(obj.get("sharing"), f"{path}.sharing", allow_time_slicing_config=False, parse=parse)
        )
    raise ConfigError(f"{path}.kind", f"must be one of GpuConfig, MigDeviceConfig; got {kind!r}")


def _sharing(raw: Any, path: str, *, allow_time_slicing_config: bool, parse: QuantityParser) -> Sharing:
    if raw is None:
        return Sharing()
    obj = _object(raw, path)
    allowed = {"strategy", "mpsConfig"} | ({"timeSlicingConfig"} if allow_time_slicing_config else set())
    if not allow_time_slicing_config and "timeSlicingConfig" in obj:
        raise ConfigError(
            f"{path}.timeSlicingConfig",
            "MIG devices cannot be time-sliced with an interval; remove timeSlicingConfig (strategy TimeSlicing "
            "alone is allowed)",
        )
    _known(obj, allowed, path)
    strategy = _enum(obj.get("strategy", SharingStrategy.EXCLUSIVE.value), SharingStrategy, f"{path}.strategy")
    interval = None
    if "timeSlicingConfig" in obj:
        if strategy is not SharingStrategy.TIME_SLICING:
            raise ConfigError(f"{path}.timeSlicingConfig", f"only allowed with strategy TimeSlicing, not {strategy}")
        ts = _object(obj["timeSlicingConfig"], f"{path}.timeSlicingConfig")
        _known(ts, {"interval"}, f"{path}.timeSlicingConfig")
        interval = _enum(ts.get("interval", "Default"), TimeSliceInterval, f"{path}.timeSlicingConfig.interval")
    elif strategy is SharingStrategy.TIME_SLICING and allow_time_slicing_config:
        interval = TimeSliceInterval.DEFAULT
    mps = None
    if "mpsConfig" in obj:
        if strategy is not SharingStrategy.MPS:
            raise ConfigError(f"{path}.mpsConfig", f"only allowed with strategy MPS, not {strategy}")
        mps = _mps(obj["mpsConfig"], f"{path}.mpsConfig", parse)
    elif strategy is SharingStrategy.MPS:
        mps = MpsConfig()
    return Sharing(strategy=strategy, time_slice_interval=interval, mps=mps)


def _mps(raw: Any, path: str, parse: QuantityParser) -> MpsConfig:
    obj = _object(raw, path)
    _known(
        obj,
        {"defaultActiveThreadPercentage", "defaultPinnedDeviceMemoryLimit", "defaultPerDevicePinnedMemoryLimit"},
        path,
    )
    pct = obj.get("defaultActiveThreadPercentage")
    if pct is not None:
        if isinstance(pct, bool) or not isinstance(pct, int):
            raise ConfigError(f"{path}.defaultActiveThreadPercentage", f"must be an integer, got {pct!r}")
        if not 0 <= pct <= 100:
            raise ConfigError(f"{path}.defaultActiveThreadPercentage", f"must be between 0 and 100, got {pct}")
    limit = None
    if obj.get("defaultPinnedDeviceMemoryLimit") is not None:
        limit = _memory(obj["defaultPinnedDeviceMemoryLimit"], f"{path}.defaultPinnedDeviceMemoryLimit", parse)
    per_device: dict[str, int] = {}
    raw_map = obj.get("defaultPerDevicePinnedMemoryLimit")
    if raw_map is not None:
        for key, value in _object(raw_map, f"{path}.defaultPerDevicePinnedMemoryLimit").items():
            field_path = f"{path}.defaultPerDevicePinnedMemoryLimit[{key!r}]"
            if not (key.isdigit() or key.startswith(("GPU-", "MIG-"))):
                raise ConfigError(field_path, "key must be a device UUID (GPU-…/MIG-…) or a device index such as '0'")
            per_device[key] = _memory(value, field_path, parse)
    return MpsConfig(
        default_active_thread_percentage=pct,
        default_pinned_device_memory_limit=limit,
        default_per_device_pinned_memory_limit=per_device,
    )


def _memory(raw: Any, path: str, parse: QuantityParser) -> int:
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        raise ConfigError(path, f"must be a quantity such as '10Gi', got {raw!r}")
    try:
        value = parse(str(raw))
    except ValueError as exc:
        raise ConfigError(path, f"not a valid quantity {raw!r}: {exc}") from exc
    if value < ONE_MIB:
        raise ConfigError(path, f"must be at least 1Mi, got {raw!r}")
    return value


def _object(raw: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise ConfigError(path, f"must be an object, got {type(raw).__name__}")
    return raw


def _known(obj: Mapping[str, Any], allowed: set[str], path: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise ConfigError(f"{path}.{unknown[0]}", f"unknown field; allowed fields here: {', '.join(sorted(allowed))}")


def _enum(raw: Any, enum_type: type[E], path: str) -> E:
    for member in enum_type:
        if raw == member.value:
            return member
    choices = ", ".join(m.value for m in enum_type)
    raise ConfigError(path, f"must be one of {choices}; got {raw!r}")


def parse_byte_quantity(text: str) -> int:
    """A Kubernetes quantity as a whole number of bytes (a fraction of a byte rounds up)."""
    return math.ceil(parse_quantity(text).as_fraction())
