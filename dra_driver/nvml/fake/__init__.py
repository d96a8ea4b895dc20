"""A simulated node behind the NVML protocol: presets or node YAML, real MIG rules, a state file."""

from dra_driver.nvml.fake.backend import FakeNvml, FakeSettings, ProfileQueryMode

__all__ = ["FakeNvml", "FakeSettings", "ProfileQueryMode"]
