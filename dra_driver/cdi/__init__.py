"""Container Device Interface (CDI), write side: the pure spec model and the spec's own validation rules.

`minimum_version` picks the lowest cdiVersion for the features a spec uses. The atomic writer the
kubelet plugin uses for per-claim specs is `dra_driver.cdi.writer` (file I/O, so not re-exported here:
importing the model must not import the writer). Reading and resolving specs (what a container runtime
does) is the test bench's job: `dra_sandbox.runtime.cdi`.
"""

from dra_driver.cdi.encode import spec_to_dict, spec_to_json
from dra_driver.cdi.errors import CdiError
from dra_driver.cdi.model import ContainerEdits, Device, DeviceNode, Hook, IntelRdt, Mount, NetDevice, Spec
from dra_driver.cdi.names import QualifiedName, parse_kind, parse_qualified_name, qualified_name
from dra_driver.cdi.validate import validate_spec
from dra_driver.cdi.version import CURRENT_VERSION, KNOWN_VERSIONS, minimum_version

__all__ = [
    "CURRENT_VERSION",
    "KNOWN_VERSIONS",
    "CdiError",
    "ContainerEdits",
    "Device",
    "DeviceNode",
    "Hook",
    "IntelRdt",
    "Mount",
    "NetDevice",
    "QualifiedName",
    "Spec",
    "minimum_version",
    "parse_kind",
    "parse_qualified_name",
    "qualified_name",
    "spec_to_dict",
    "spec_to_json",
    "validate_spec",
]
