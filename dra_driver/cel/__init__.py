"""The Kubernetes DRA CEL environment (selectors over devices) and its value types."""

from dra_driver.cel.environment import (
    MAX_EXPRESSION_LENGTH,
    AttributeValue,
    CelCompileError,
    CelError,
    CelRuntimeError,
    CompiledSelector,
    DeviceInput,
    DraCelEnvironment,
    PreparedDevice,
    split_qualified_name,
)
from dra_driver.cel.quantity import Quantity, QuantityError, QuantityFormat, parse_quantity
from dra_driver.cel.semver import Semver, SemverError, is_semver, parse_semver

__all__ = [
    "MAX_EXPRESSION_LENGTH",
    "AttributeValue",
    "CelCompileError",
    "CelError",
    "CelRuntimeError",
    "CompiledSelector",
    "DeviceInput",
    "DraCelEnvironment",
    "PreparedDevice",
    "Quantity",
    "QuantityError",
    "QuantityFormat",
    "Semver",
    "SemverError",
    "is_semver",
    "parse_quantity",
    "parse_semver",
    "split_qualified_name",
]
