"""The opaque configuration API (`gpu.dra.dev/v1beta1`): strict decoding, validation and resolution."""

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
from dra_driver.claimconfig.decode import decode_config
from dra_driver.claimconfig.resolve import configs_for_results

__all__ = [
    "API_VERSION",
    "ConfigError",
    "DeviceConfig",
    "GpuConfig",
    "MigDeviceConfig",
    "MpsConfig",
    "Sharing",
    "SharingStrategy",
    "TimeSliceInterval",
    "configs_for_results",
    "decode_config",
]
