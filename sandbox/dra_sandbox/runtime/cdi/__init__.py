"""CDI, read side, as a container runtime does it: strict decode + validate (`load_spec`,
`load_spec_file`), spec directories with priority (`load_registry`), `Registry.resolve` (ids -> merged
edits) and `apply_edits` (edits -> container config). The model and the rules are the product's
(`dra_driver.cdi`); only reading lives here.
"""

from dra_sandbox.runtime.cdi.edits import ContainerConfig, apply_edits
from dra_sandbox.runtime.cdi.load import load_spec, load_spec_file
from dra_sandbox.runtime.cdi.registry import (
    DEFAULT_SPEC_DIRS,
    Registry,
    UnresolvableDevicesError,
    build_registry,
    load_registry,
)

__all__ = [
    "DEFAULT_SPEC_DIRS",
    "ContainerConfig",
    "Registry",
    "UnresolvableDevicesError",
    "apply_edits",
    "build_registry",
    "load_registry",
    "load_spec",
    "load_spec_file",
]
