"""The Kubernetes DRA CEL environment (selectors over devices) and its value types."""

from dra_driver.cel.environment import (
    MAX_EXPRESSION_LENGTH,
    AttributeValue,
    CelCompileError,
    CelError,
    CelRuntimeError,
    CompiledDerived,
    CompiledSelector,
    DerivedValue,
    DeviceActivation,
    DeviceInput,
    DeviceView,
    DraCelEnvironment,
    split_qualified_name,
    values_key,
)

__all__ = [
    "MAX_EXPRESSION_LENGTH",
    "AttributeValue",
    "CelCompileError",
    "CelError",
    "CelRuntimeError",
    "CompiledDerived",
    "CompiledSelector",
    "DerivedValue",
    "DeviceActivation",
    "DeviceInput",
    "DeviceView",
    "DraCelEnvironment",
    "split_qualified_name",
    "values_key",
]
