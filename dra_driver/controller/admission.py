"""What the controller's validating webhook checks, as pure functions of the submitted object.

Two kinds of mistakes pass the Kubernetes API server and only surface later, when a pod is already
waiting: an opaque config of this driver that the kubelet plugin refuses at prepare, and a CEL selector
that names an attribute this driver never publishes (evaluation fails at allocation). Both are checked here:

* every `config[].opaque` whose `driver` is ours is decoded with the plugin's own strict decoder
  (`decode_config`), so the message is the one prepare would give, prefixed with where the entry sits; so is
  every one of the compute-domain driver (`compute-domain.gpu.dra.dev`, `computedomain/config.py`);
* every CEL selector that mentions our driver name is compiled with the project's CEL environment, and
  each `device.attributes["<driver>"].<name>` / `device.capacity["<driver>"].<name>` it reads must be a
  name the driver publishes.

Paths follow the API server's style: `spec.devices.config[0].opaque.parameters.sharing...`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from dra_driver.cel.environment import CelCompileError, DraCelEnvironment
from dra_driver.claimconfig.api import ConfigError
from dra_driver.claimconfig.decode import decode_config
from dra_driver.computedomain.config import decode_domain_config
from dra_driver.computedomain.names import DRIVER_NAME as COMPUTE_DOMAIN_DRIVER

__all__ = [
    "KNOWN_ATTRIBUTES",
    "KNOWN_CAPACITIES",
    "Problem",
    "check_device_class",
    "check_resource_claim",
    "check_resource_claim_template",
    "denial_message",
]

# What the kubelet plugin publishes in its ResourceSlices (dra_driver/slices/attributes.py), unqualified
# names in the driver's domain. Optional ones (numaNode, nvlinkDomain, uuid of an unmaterialised MIG device)
# are listed too: a selector may test them with has().
KNOWN_ATTRIBUTES: Final = frozenset({
    "type", "productName", "brand", "architecture", "cudaComputeCapability", "driverVersion",
    "cudaDriverVersion", "index", "minor", "numaNode", "nvlinkDomain", "uuid", "migCapable", "parentUUID",
    "profile",
    "deviceID", "vendorID", "iommuFDEnabled",  # a passthrough device's (docs/passthrough.md)
    "vgpuType", "vgpuTypeId", "vgpuClass", "parentPciBusID",  # a vGPU slot's (docs/vgpu.md)
    "partitionID", "gpuCount",  # a Fabric Manager partition's (docs/passthrough.md)
    "partitionType",  # KEP-5677, where the API server keeps partitionTypeAttribute (docs/reference/dra-in-flight.md)
})
KNOWN_CAPACITIES: Final = frozenset({
    "memory", "multiprocessors", "copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines", "compute",
})


@dataclass(frozen=True)
class Problem:
    """One refused field: `path` in the submitted object, `message` why."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def denial_message(problems: Sequence[Problem]) -> str:
    """The webhook's message: every problem, one per `; `."""
    return "; ".join(str(p) for p in problems)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _check_configs(configs: Any, path: str, driver: str) -> list[Problem]:
    problems: list[Problem] = []
    for i, entry in enumerate(_list(configs)):
        opaque = _map(_map(entry).get("opaque"))
        # The compute-domain driver's configs (ComputeDomainChannelConfig / ComputeDomainDaemonConfig) are this
        # webhook's too: the same chart serves both drivers.
        decode = {driver: decode_config, COMPUTE_DOMAIN_DRIVER: decode_domain_config}.get(str(opaque.get("driver")))
        if decode is None:
            continue
        at = f"{path}[{i}].opaque.parameters"
        try:
            decode(opaque.get("parameters"), path=at)
        except ConfigError as exc:
            problems.extend(Problem(p.path or at, p.message) for p in exc.problems)
    return problems


def _lookups(expression: str, driver: str, root: str) -> list[str]:
    """Names read as `device.<root>["driver"].name` or `device.<root>["driver"]["name"]`."""
    quoted = re.escape(driver)
    domain = rf"device\s*\.\s*{root}\s*\[\s*(?:\"{quoted}\"|'{quoted}')\s*\]"
    field = r"\s*(?:\.\s*([A-Za-z_][A-Za-z0-9_]*)|\[\s*(?:\"([^\"]*)\"|'([^']*)')\s*\])"
    return [next(g for g in m.groups() if g is not None) for m in re.finditer(domain + field, expression)]


def _check_selectors(selectors: Any, path: str, driver: str, cel: DraCelEnvironment) -> list[Problem]:
    problems: list[Problem] = []
    for i, selector in enumerate(_list(selectors)):
        expression = _map(_map(selector).get("cel")).get("expression")
        if not isinstance(expression, str) or driver not in expression:
            continue  # not about this driver: the API server's own checks are enough
        at = f"{path}[{i}].cel.expression"
        try:
            cel.compile(expression)
        except CelCompileError as exc:
            problems.append(Problem(at, f"compilation failed: {exc.reason}"))
            continue
        for root, known, what in (("attributes", KNOWN_ATTRIBUTES, "attribute"),
                                  ("capacity", KNOWN_CAPACITIES, "capacity")):
            for name in _lookups(expression, driver, root):
                if name not in known:
                    problems.append(Problem(at, f'driver {driver} publishes no {what} "{name}" (known: '
                                                f'{", ".join(sorted(known))})'))
    return problems


def _check_requests(requests: Any, path: str, driver: str, cel: DraCelEnvironment) -> list[Problem]:
    problems: list[Problem] = []
    for i, request in enumerate(_list(requests)):
        request = _map(request)
        here = f"{path}[{i}]"
        problems += _check_selectors(_map(request.get("exactly")).get("selectors"), f"{here}.exactly.selectors",
                                     driver, cel)
        for j, sub in enumerate(_list(request.get("firstAvailable"))):
            problems += _check_selectors(_map(sub).get("selectors"), f"{here}.firstAvailable[{j}].selectors",
                                         driver, cel)
    return problems


def _check_claim_spec(spec: Any, path: str, driver: str, cel: DraCelEnvironment) -> list[Problem]:
    devices = _map(_map(spec).get("devices"))
    return (_check_requests(devices.get("requests"), f"{path}.devices.requests", driver, cel)
            + _check_configs(devices.get("config"), f"{path}.devices.config", driver))


def check_resource_claim(obj: Mapping[str, Any], *, driver: str, cel: DraCelEnvironment) -> list[Problem]:
    """A ResourceClaim (resource.k8s.io/v1): its requests' selectors and its opaque configs."""
    return _check_claim_spec(obj.get("spec"), "spec", driver, cel)


def check_resource_claim_template(obj: Mapping[str, Any], *, driver: str,
                                  cel: DraCelEnvironment) -> list[Problem]:
    """A ResourceClaimTemplate: the claim spec it stamps out, at `spec.spec`."""
    return _check_claim_spec(_map(obj.get("spec")).get("spec"), "spec.spec", driver, cel)


def check_device_class(obj: Mapping[str, Any], *, driver: str, cel: DraCelEnvironment) -> list[Problem]:
    """A DeviceClass: `spec.selectors` and `spec.config`."""
    spec = _map(obj.get("spec"))
    return (_check_selectors(spec.get("selectors"), "spec.selectors", driver, cel)
            + _check_configs(spec.get("config"), "spec.config", driver))
