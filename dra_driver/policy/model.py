"""The `GpuSharingPolicy` custom resource (`gpu.dra.dev/v1beta1`, cluster-scoped): its spec and status as
pydantic models, and the strict decoder of the spec.

A policy names a set of devices and how they are shared; the controller turns it into one DeviceClass
(`render.py`). The CRD's OpenAPI schema is generated from these models (`crd.py`), and the `sharing` block
reuses the opaque-config models of `claimconfig/decode.py`, so the schema, the controller's decoder and the
kubelet plugin's decoder cannot drift apart.

```yaml
apiVersion: gpu.dra.dev/v1beta1
kind: GpuSharingPolicy
metadata: {name: h100-timesliced}
spec:
  devices:
    type: gpu                      # gpu | mig | gpu-share
    productNames: [NVIDIA H100 80GB HBM3]
    migProfiles: [1g.10gb]         # type mig only
    selector: "device.attributes['gpu.dra.dev'].index < 4"   # raw CEL, ANDed with the rest
  sharing: {strategy: TimeSlicing, timeSlicingConfig: {interval: Short}}
  deviceClassName: h100-timesliced # default: the policy's name
  extendedResourceName: example.com/h100-shared
```
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Self

from pydantic import Field, model_validator

from dra_driver.claimconfig.api import API_GROUP, ConfigError
from dra_driver.claimconfig.decode import GpuSharing, MigSharing
from dra_driver.k8s.names import dns_subdomain_problems, qualified_name_problems
from dra_driver.strictdecode import CamelModel, Choice, Decoder, Items, invalid

GROUP = API_GROUP
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "GpuSharingPolicy"
PLURAL = "gpusharingpolicies"
SINGULAR = "gpusharingpolicy"
SHORT_NAMES = ("gsp",)
# The longest CEL expression a DeviceClass selector may hold (resource.k8s.io/v1 validation).
MAX_SELECTOR_LENGTH = 10 * 1024
MAX_LIST = 32


class DeviceType(enum.StrEnum):
    """The `type` attribute of the devices the driver publishes."""

    GPU = "gpu"
    MIG = "mig"
    GPU_SHARE = "gpu-share"


Name = Annotated[str, Field(min_length=1, max_length=256)]


class PolicyDevices(CamelModel):
    type: Choice[DeviceType] = Field(description="the devices' `type` attribute: gpu, mig or gpu-share")
    product_names: Annotated[Items[Name], Field(min_length=1, max_length=MAX_LIST)] | None = Field(
        default=None, description="only devices whose productName is one of these"
    )
    mig_profiles: Annotated[Items[Name], Field(min_length=1, max_length=MAX_LIST)] | None = Field(
        default=None, description="type mig only: only MIG devices of these profiles, e.g. 1g.10gb"
    )
    selector: Annotated[str, Field(min_length=1, max_length=MAX_SELECTOR_LENGTH)] | None = Field(
        default=None, description="a DRA CEL expression over `device`, ANDed with the rest"
    )

    @model_validator(mode="after")
    def _profiles_need_mig(self) -> Self:
        if self.mig_profiles is not None and self.type is not DeviceType.MIG:
            raise invalid(f"only allowed with type {DeviceType.MIG}, not {self.type}", "migProfiles")
        return self


class PolicySpec(CamelModel):
    devices: PolicyDevices = Field(description="which devices the DeviceClass selects")
    # The superset (GpuConfig's sharing); type mig is checked again against MigDeviceConfig's (`decode_spec`).
    sharing: GpuSharing | None = Field(
        default=None,
        description="how the devices are shared, as in GpuConfig/MigDeviceConfig (gpu.dra.dev/v1beta1); "
        "omitted: the driver's default (Exclusive)",
    )
    device_class_name: Annotated[str, Field(min_length=1, max_length=253)] | None = Field(
        default=None, description="name of the DeviceClass to manage; default: the policy's name"
    )
    extended_resource_name: Annotated[str, Field(min_length=1, max_length=316)] | None = Field(
        default=None, description="the class's extendedResourceName, e.g. example.com/gpu (DRAExtendedResource)"
    )

    @model_validator(mode="after")
    def _names(self) -> Self:
        if self.device_class_name is not None and (problems := dns_subdomain_problems(self.device_class_name)):
            raise invalid(f"not a valid DeviceClass name: {'; '.join(problems)}", "deviceClassName")
        if self.extended_resource_name is not None:
            problems = qualified_name_problems(self.extended_resource_name)
            if not problems and "/" not in self.extended_resource_name:
                problems = ["must have a domain prefix, e.g. example.com/gpu"]
            if problems:
                raise invalid(f"not a valid extended resource name: {'; '.join(problems)}", "extendedResourceName")
        return self


class Condition(CamelModel):
    type: str
    status: str = Field(description="True, False or Unknown")
    reason: str
    message: str
    last_transition_time: str
    observed_generation: int | None = None


class PolicyStatus(CamelModel):
    conditions: list[Condition] | None = None
    device_class_name: str | None = Field(default=None, description="the DeviceClass this policy manages")
    observed_generation: int | None = Field(default=None, description="the spec generation the status describes")
    devices: int | None = Field(default=None, description="published devices the class selects")
    nodes: int | None = Field(default=None, description="nodes with at least one such device")
    claims: int | None = Field(default=None, description="allocated ResourceClaims with devices from the class")


class PolicyError(ConfigError):
    """A policy the CRD schema accepted but the controller cannot act on; `path` starts with `spec`."""


_decode_spec = Decoder[PolicySpec](PolicySpec, error=PolicyError, quoted_keys=True)
_decode_mig_sharing = Decoder[MigSharing](MigSharing, error=PolicyError, quoted_keys=True)


@dataclass(frozen=True)
class Policy:
    """A decoded, valid policy: what rendering a DeviceClass needs."""

    name: str
    uid: str
    spec: PolicySpec
    raw_sharing: Mapping[str, Any] | None  # as the user wrote it: copied into the class's opaque config

    @property
    def device_class_name(self) -> str:
        return self.spec.device_class_name or self.name


def decode_spec(spec: object) -> PolicySpec:
    """Decode a policy's spec strictly; PolicyError names the field (`spec.sharing.mpsConfig...`)."""
    decoded = _decode_spec(spec, at="spec")
    if decoded.devices.type is not DeviceType.GPU and decoded.sharing is not None:
        assert isinstance(spec, Mapping)
        if decoded.devices.type is DeviceType.GPU_SHARE:
            raise PolicyError(
                "spec.sharing",
                "not allowed with type gpu-share: shares are already shared by the driver (one MPS daemon per GPU, "
                "sized by each claim's capacity requests); leave sharing out",
            )
        _decode_mig_sharing(spec["sharing"], at="spec.sharing")
    return decoded


def decode_policy(obj: Mapping[str, Any]) -> Policy:
    """A GpuSharingPolicy object as the API server returns it → Policy, or PolicyError."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec")
    if spec is None:
        raise PolicyError("spec", "required field is missing")
    decoded = decode_spec(spec)
    sharing = spec.get("sharing") if isinstance(spec, Mapping) else None
    return Policy(name=str(meta.get("name", "")), uid=str(meta.get("uid", "")), spec=decoded, raw_sharing=sharing)
