"""The opaque configs of the compute-domain driver (`compute-domain.gpu.dra.dev`), in `gpu.dra.dev/v1beta1`:

    apiVersion: gpu.dra.dev/v1beta1
    kind: ComputeDomainChannelConfig    # on the workload claim template's channel request
    domainID: <ComputeDomain UID>       # required
    allocationMode: Single              # Single (default: channel 0) | All (every channel)

    apiVersion: gpu.dra.dev/v1beta1
    kind: ComputeDomainDaemonConfig     # on the IMEX daemon's claim template
    domainID: <ComputeDomain UID>       # required

The controller writes them into the claim templates it makes for a ComputeDomain; a user rarely does. Decoding is
strict, as for the GPU driver's configs (dra_driver/claimconfig): unknown fields, wrong types and bad values are
errors naming the field. The same decoder serves the kubelet plugin (prepare) and the admission webhook.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from dra_driver.claimconfig.api import ConfigError
from dra_driver.computedomain.model import AllocationMode
from dra_driver.computedomain.names import CHANNEL_CONFIG_KIND, DAEMON_CONFIG_KIND, GROUP_VERSION
from dra_driver.kubeletplugin.names import uid_problem
from dra_driver.strictdecode import CamelModel, Choice, Decoder

__all__ = ["ChannelConfig", "ConfigError", "DaemonConfig", "DomainConfig", "decode_domain_config"]


def _domain_id(value: str) -> str:
    # A UID as the API server makes them (a UUID); anything that could not be a UID ends up in file names and
    # label values, so the shape is checked here rather than at prepare.
    if not value:
        raise ValueError("is required: the UID of the ComputeDomain (metadata.uid)")
    problem = uid_problem(value)
    if problem is not None:
        raise ValueError(f"{problem}; set the ComputeDomain's metadata.uid")
    if len(value) > 63:  # it becomes the value of the node label gpu.dra.dev/computeDomain
        raise ValueError(f"{value!r} is longer than 63 characters; set the ComputeDomain's metadata.uid")
    return value


DomainID = Annotated[str, AfterValidator(_domain_id)]


class _ChannelConfigSpec(CamelModel):
    api_version: Literal["gpu.dra.dev/v1beta1"]
    kind: Literal["ComputeDomainChannelConfig"]
    domain_id: DomainID = Field(alias="domainID")
    allocation_mode: Choice[AllocationMode] = AllocationMode.SINGLE


class _DaemonConfigSpec(CamelModel):
    api_version: Literal["gpu.dra.dev/v1beta1"]
    kind: Literal["ComputeDomainDaemonConfig"]
    domain_id: DomainID = Field(alias="domainID")


Parameters = Annotated[_ChannelConfigSpec | _DaemonConfigSpec, Field(discriminator="kind")]
_decode = Decoder[_ChannelConfigSpec | _DaemonConfigSpec](Parameters, error=ConfigError, quoted_keys=True)


@dataclass(frozen=True)
class ChannelConfig:
    domain_id: str
    allocation_mode: AllocationMode = AllocationMode.SINGLE
    kind: str = CHANNEL_CONFIG_KIND


@dataclass(frozen=True)
class DaemonConfig:
    domain_id: str
    kind: str = DAEMON_CONFIG_KIND


DomainConfig = ChannelConfig | DaemonConfig


def decode_domain_config(parameters: Any, *, path: str = "parameters") -> DomainConfig:
    """Decode one opaque `parameters` object of the compute-domain driver."""
    spec = _decode(parameters, at=path)
    if isinstance(spec, _ChannelConfigSpec):
        return ChannelConfig(domain_id=spec.domain_id, allocation_mode=spec.allocation_mode)
    return DaemonConfig(domain_id=spec.domain_id)


assert GROUP_VERSION == "gpu.dra.dev/v1beta1"  # the Literal above spells it out (pydantic needs a literal)
