"""Validation options and the limits that change between Kubernetes minor versions."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Final

CelCheck = Callable[[str], "str | None"]


@dataclass(frozen=True)
class Limits:
    """The resource.k8s.io/v1 limits one Kubernetes minor version enforces (docs/reference/kubernetes-dra.md §3.6)."""

    max_devices: int = 128
    max_devices_advanced: int = 64  # when any device has taints or consumesCounters (1.35+)
    max_attributes_and_capacities: int = 32
    max_attribute_values: int = 48  # scalars + list items per device (1.36 list attributes)
    max_counter_sets: int = 8
    max_counters_per_set: int = 32
    max_counters_total_1_34: int = 32  # 1.34: across all sets in a slice
    max_consumes_counters: int = 2
    max_counters_per_consumption: int = 32
    max_taints: int = 16
    max_binding_conditions: int = 4
    max_string_attribute: int = 64
    max_driver_name: int = 63
    max_attribute_id: int = 32
    max_pool_name: int = 253
    max_cel_expression: int = 10 * 1024
    max_opaque_parameters: int = 10 * 1024
    max_requests: int = 32
    max_constraints: int = 32
    max_config: int = 32
    max_selectors: int = 32
    max_subrequests: int = 8
    max_tolerations: int = 16
    max_allocation_results: int = 32
    max_allocation_config: int = 64
    max_reserved_for: int = 256
    max_device_conditions: int = 8
    max_network_ips: int = 16
    max_interface_name: int = 256
    max_hardware_address: int = 128
    max_valid_values: int = 10
    # Behaviour switches by version.
    devices_xor_shared_counters: bool = True  # 1.35+
    advanced_device_cap: bool = True  # 1.35+: the 64-device rule
    taint_effect_none: bool = True  # 1.35+
    list_attributes: bool = False  # 1.36+
    per_set_counter_limits: bool = True  # 1.35+ (1.34 used one slice-wide total)


def limits_for(kube_version: tuple[int, int]) -> Limits:
    """The rule set a given Kubernetes minor version applies (1.34 is the first with resource.k8s.io/v1)."""
    minor = kube_version[1] if kube_version[0] == 1 else 99
    if minor <= 34:
        return Limits(
            max_taints=4,
            max_consumes_counters=32,
            devices_xor_shared_counters=False,
            advanced_device_cap=False,
            taint_effect_none=False,
            per_set_counter_limits=False,
        )
    if minor == 35:
        return Limits()
    return Limits(list_attributes=True)


def parse_kube_version(text: str) -> tuple[int, int]:
    """`"1.35.0"`, `"v1.35.2"` or `"1.36"` -> (1, 35)."""
    m = re.match(r"v?(\d+)\.(\d+)", text.strip())
    if not m:
        raise ValueError(f"kube version {text!r} is not of the form 1.35.0")
    return int(m.group(1)), int(m.group(2))


@dataclass(frozen=True)
class ValidationOptions:
    """`kube_version` picks the rule set; `cel_check` (optional) compiles a CEL selector and returns
    an error message or None, so a CEL engine can be plugged in without this module importing one."""

    kube_version: tuple[int, int] = (1, 35)
    cel_check: CelCheck | None = None
    # DRAListTypeAttributes (KEP-5491): alpha in 1.36 and 1.37, off by default; list values need it on.
    list_type_attributes: bool = False
    # The feature gates that are on beyond the release's defaults (--feature-gates): a field behind a gate that is
    # off is dropped as the API server's strategy drops it (schema.Struct.gates).
    enabled_gates: frozenset[str] = frozenset()
    # Compiles a KEP-6080 derived attribute's expression: an error message or None.
    derived_check: CelCheck | None = None

    @property
    def limits(self) -> Limits:
        limits = limits_for(self.kube_version)
        return replace(limits, list_attributes=limits.list_attributes and self.list_type_attributes)


DEFAULT_OPTIONS: Final = ValidationOptions()
