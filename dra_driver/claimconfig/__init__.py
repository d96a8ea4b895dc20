"""The opaque configuration API (`gpu.dra.dev/v1beta1`): strict decoding, validation and resolution.

The package exports the decoded types only: decoding (`decode.decode_config`, pydantic models) and resolution
(`resolve.configs_for`) are imported from their modules, so that importing the types (the kubelet plugin
does at start) does not build the pydantic models; they load with the first claim that carries opaque config.
"""

from dra_driver.claimconfig.api import (
    API_VERSION,
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

__all__ = [
    "API_VERSION",
    "ConfigError",
    "DeviceConfig",
    "GpuConfig",
    "IommuBackendPolicy",
    "MigDeviceConfig",
    "MpsConfig",
    "Sharing",
    "SharingStrategy",
    "TimeSliceInterval",
    "VfioDeviceConfig",
]
