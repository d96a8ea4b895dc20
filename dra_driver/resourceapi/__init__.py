"""The resource.k8s.io objects as the product reads them: frozen values, one strict parser per kind naming the
field path of bad input. Pure: no CEL, no I/O (docs/architecture.md, layer contracts).

Every walk of a ResourceClaim's allocation goes through `parse_resource_claim` (the kubelet plugin's prepare and
ownership rebuild, the allocator's existing allocations, the controller's policy counts, `dra-driver status`).
"""

from dra_driver.resourceapi.claim import (
    FROM_CLAIM,
    FROM_CLASS,
    MODE_ALL,
    MODE_EXACT,
    AllocatedDeviceStatus,
    Allocation,
    Constraint,
    ConsumerReference,
    DeviceCondition,
    DeviceConfiguration,
    DeviceId,
    DeviceResult,
    DriverAllocation,
    ExactRequest,
    NetworkData,
    OpaqueParameters,
    Request,
    ResourceClaim,
    Toleration,
    parse_resource_claim,
    parse_selectors,
)
from dra_driver.resourceapi.fields import JSON, FieldReader, InvalidObjectError, object_name, read_object

__all__ = [
    "FROM_CLAIM",
    "FROM_CLASS",
    "JSON",
    "MODE_ALL",
    "MODE_EXACT",
    "AllocatedDeviceStatus",
    "Allocation",
    "Constraint",
    "ConsumerReference",
    "DeviceCondition",
    "DeviceConfiguration",
    "DeviceId",
    "DeviceResult",
    "DriverAllocation",
    "ExactRequest",
    "FieldReader",
    "InvalidObjectError",
    "NetworkData",
    "OpaqueParameters",
    "Request",
    "ResourceClaim",
    "Toleration",
    "object_name",
    "parse_resource_claim",
    "parse_selectors",
    "read_object",
]
