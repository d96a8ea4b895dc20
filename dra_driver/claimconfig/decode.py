"""Strict decoding of opaque parameters: unknown fields, wrong types and bad values are errors that
name the field. The same decoder serves the kubelet plugin and the admission webhook.

The models below are the `gpu.dra.dev/v1beta1` document exactly as users write it, so they also give
its JSON schema (`TypeAdapter(Parameters).json_schema(by_alias=True)`) for a CRD; `decode_config`
turns a valid document into the plain values of `api.py`.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Self

from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema, model_validator

from dra_driver.claimconfig.api import (
    ConfigError,
    DeviceConfig,
    GpuConfig,
    IommuBackendPolicy,
    MigDeviceConfig,
    MpsConfig,
    Sharing,
    SharingStrategy,
    TimeSliceInterval,
    VfioDeviceConfig,
)
from dra_driver.k8s.quantity import parse_quantity
from dra_driver.strictdecode import CamelModel, Choice, Decoder, invalid

ONE_MIB = 1024 * 1024
# Kubernetes' largest quantity (resource.Quantity caps values at 2^63-1); a limit beyond it can only be a mistake,
# and must never reach nvidia-cuda-mps-control as a number hundreds of digits long.
MAX_BYTES = 2**63 - 1


def parse_byte_quantity(text: str) -> int:
    """A Kubernetes quantity as a whole number of bytes (a fraction of a byte rounds up)."""
    return math.ceil(parse_quantity(text).as_fraction())


def _bytes(raw: object) -> int:
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        raise ValueError(f"must be a quantity such as '10Gi', got {raw!r}")
    shown = raw if len(str(raw)) <= 40 else f"{str(raw)[:20]}…({len(str(raw))} characters)"
    try:
        value = parse_byte_quantity(str(raw))
    except ValueError as exc:
        raise ValueError(f"not a valid quantity {shown!r}: {exc}") from None
    if value > MAX_BYTES:
        raise ValueError(
            f"must be at most 2^63-1 bytes (the largest Kubernetes quantity, about 8Ei), got {shown!r}; "
            "use a limit no larger than the device's memory, e.g. '10Gi'"
        )
    if value < ONE_MIB:
        raise ValueError(f"must be at least 1Mi, got {raw!r}")
    return value


def _device_key(key: str) -> str:
    if not (key.isdigit() or key.startswith(("GPU-", "MIG-"))):
        raise ValueError("key must be a device UUID (GPU-…/MIG-…) or a device index such as '0'")
    return key


# A quantity such as "10Gi" (or a number of bytes); a whole number of bytes once decoded.
Bytes = Annotated[
    int,
    BeforeValidator(_bytes),
    WithJsonSchema({"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}),
]


class TimeSlicingConfig(CamelModel):
    interval: Choice[TimeSliceInterval] = TimeSliceInterval.DEFAULT


class MpsConfigSpec(CamelModel):
    default_active_thread_percentage: Annotated[int, Field(ge=1, le=100)] | None = None
    default_pinned_device_memory_limit: Bytes | None = None
    default_per_device_pinned_memory_limit: dict[Annotated[str, AfterValidator(_device_key)], Bytes] | None = None
    multi_user: bool | None = None


class _SharingSpec(CamelModel):
    strategy: Choice[SharingStrategy] = SharingStrategy.EXCLUSIVE
    # Factories, not instances: a default in the schema would be written into every stored object.
    mps_config: MpsConfigSpec = Field(default_factory=MpsConfigSpec)

    @model_validator(mode="after")
    def _config_fits_strategy(self) -> Self:
        self._only_with("mps_config", SharingStrategy.MPS)
        return self

    def _only_with(self, name: str, strategy: SharingStrategy) -> None:
        # Presence decides, not value: a block for another strategy is a mistake even when empty.
        if name in self.model_fields_set and self.strategy is not strategy:
            alias = type(self).model_fields[name].alias or name
            raise invalid(f"only allowed with strategy {strategy}, not {self.strategy}", alias)

    def _interval(self) -> TimeSliceInterval | None:
        return None

    def value(self) -> Sharing:
        m = self.mps_config
        per_device = m.default_per_device_pinned_memory_limit or {}
        mps = MpsConfig(
            m.default_active_thread_percentage, m.default_pinned_device_memory_limit, per_device, bool(m.multi_user)
        )
        return Sharing(self.strategy, self._interval(), mps if self.strategy is SharingStrategy.MPS else None)


class GpuSharing(_SharingSpec):
    time_slicing_config: TimeSlicingConfig = Field(default_factory=TimeSlicingConfig)

    @model_validator(mode="after")
    def _interval_fits_strategy(self) -> Self:
        self._only_with("time_slicing_config", SharingStrategy.TIME_SLICING)
        return self

    def _interval(self) -> TimeSliceInterval | None:
        sliced = self.strategy is SharingStrategy.TIME_SLICING
        return self.time_slicing_config.interval if sliced else None


class MigSharing(_SharingSpec):
    """`strategy: TimeSlicing` alone is accepted on a MIG device (NVIDIA's `simple-mig-ts`): there is nothing to
    apply, since the device is shared by the claim's containers anyway. An interval is refused: the time-slice is a
    setting of the whole physical GPU and cannot be set per MIG partition."""

    @model_validator(mode="before")
    @classmethod
    def _no_interval(cls, data: Any) -> Any:
        if isinstance(data, dict) and "timeSlicingConfig" in data:
            block = data["timeSlicingConfig"]
            loc = ("timeSlicingConfig", "interval") if isinstance(block, dict) and "interval" in block else (
                "timeSlicingConfig",
            )
            raise invalid(
                "a MIG device takes no time-slice interval (the time-slice is a setting of the whole physical GPU); "
                "remove sharing.timeSlicingConfig and keep strategy TimeSlicing alone (accepted: the claim's "
                "containers share the MIG device), or use a GpuConfig on a whole GPU to set an interval",
                *loc,
            )
        return data


class GpuConfigSpec(CamelModel):
    api_version: Literal["gpu.dra.dev/v1beta1"]
    kind: Literal["GpuConfig"]
    sharing: GpuSharing | None = None


class MigDeviceConfigSpec(CamelModel):
    api_version: Literal["gpu.dra.dev/v1beta1"]
    kind: Literal["MigDeviceConfig"]
    sharing: MigSharing | None = None


class IommuSpec(CamelModel):
    backend_policy: Choice[IommuBackendPolicy] = IommuBackendPolicy.LEGACY_ONLY
    # NVIDIA's spelling, not camelCase of the attribute name.
    enable_api_device: bool = Field(default=False, alias="enableAPIDevice")


class VfioDeviceConfigSpec(CamelModel):
    """A GPU passed through to a VM (NVIDIA's `VfioDeviceConfig`, same fields)."""

    api_version: Literal["gpu.dra.dev/v1beta1"]
    kind: Literal["VfioDeviceConfig"]
    iommu: IommuSpec | None = None


Specs = GpuConfigSpec | MigDeviceConfigSpec | VfioDeviceConfigSpec
Parameters = Annotated[Specs, Field(discriminator="kind")]
_decode = Decoder[Specs](Parameters, error=ConfigError, quoted_keys=True)


def decode_config(parameters: Any, *, path: str = "parameters") -> DeviceConfig:
    """Decode one opaque `parameters` object into a GpuConfig, MigDeviceConfig or VfioDeviceConfig."""
    spec = _decode(parameters, at=path)
    if isinstance(spec, GpuConfigSpec):
        return GpuConfig(sharing=(spec.sharing or GpuSharing()).value())
    if isinstance(spec, VfioDeviceConfigSpec):
        iommu = spec.iommu or IommuSpec()
        return VfioDeviceConfig(backend_policy=iommu.backend_policy, enable_api_device=iommu.enable_api_device)
    return MigDeviceConfig(sharing=(spec.sharing or MigSharing()).value())
