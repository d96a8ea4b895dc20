"""Container Device Interface (CDI): a pure spec model with the spec's own validation rules.

Read side: `load_spec` / `load_spec_file` (strict decode + validate), `load_registry` (directories with
priority) and `Registry.resolve` (ids -> merged edits), `apply_edits` (edits -> container config).
Write side: `minimum_version` (lowest cdiVersion for the features used), `spec_file_name` and the
atomic `write_spec`.
"""

from dra_driver.cdi.edits import ContainerConfig, apply_edits
from dra_driver.cdi.encode import spec_to_dict, spec_to_json
from dra_driver.cdi.errors import CdiError
from dra_driver.cdi.load import load_spec, load_spec_file
from dra_driver.cdi.model import ContainerEdits, Device, DeviceNode, Hook, IntelRdt, Mount, NetDevice, Spec
from dra_driver.cdi.names import QualifiedName, parse_kind, parse_qualified_name, qualified_name
from dra_driver.cdi.registry import (
    DEFAULT_SPEC_DIRS,
    Registry,
    UnresolvableDevicesError,
    build_registry,
    load_registry,
)
from dra_driver.cdi.validate import validate_spec
from dra_driver.cdi.version import CURRENT_VERSION, KNOWN_VERSIONS, minimum_version
from dra_driver.cdi.writer import remove_spec, spec_file_name, write_spec

__all__ = [
    "CURRENT_VERSION",
    "DEFAULT_SPEC_DIRS",
    "KNOWN_VERSIONS",
    "CdiError",
    "ContainerConfig",
    "ContainerEdits",
    "Device",
    "DeviceNode",
    "Hook",
    "IntelRdt",
    "Mount",
    "NetDevice",
    "QualifiedName",
    "Registry",
    "Spec",
    "UnresolvableDevicesError",
    "apply_edits",
    "build_registry",
    "load_registry",
    "load_spec",
    "load_spec_file",
    "minimum_version",
    "parse_kind",
    "parse_qualified_name",
    "qualified_name",
    "remove_spec",
    "spec_file_name",
    "spec_to_dict",
    "spec_to_json",
    "validate_spec",
    "write_spec",
]
