"""Strict decoding of CDI spec text (JSON or YAML) into the frozen model.

Strict means: unknown fields, duplicate keys and wrong types are errors naming the field, just as the
Go library's strict unmarshal rejects them; null leaves an optional field empty, as it does in Go.
Semantic rules (names, versions, edits) live in `dra_driver.cdi.validate`; `load_spec` runs both.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import BeforeValidator, Field

from dra_driver.cdi.errors import CdiError
from dra_driver.cdi.model import ContainerEdits, Device, DeviceNode, Hook, IntelRdt, Mount, NetDevice, Spec
from dra_driver.strictdecode import CamelModel, Decoder, Items, load_yaml

T = TypeVar("T")


def _json_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise CdiError("", f"duplicate key {key!r}")
        out[key] = value
    return out


def parse_text(text: str | bytes, fmt: str | None = None) -> Any:
    """JSON or YAML text -> plain Python data. `fmt` is "json", "yaml" or None (guess from the text)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CdiError("", f"spec is not UTF-8 text: {exc}") from None
    if fmt is None:
        fmt = "json" if text.lstrip().startswith("{") else "yaml"
    if fmt == "json":
        try:
            return json.loads(text, object_pairs_hook=_json_pairs)
        except json.JSONDecodeError as exc:
            raise CdiError("", f"invalid JSON: {exc}") from None
    if fmt == "yaml":
        try:
            return load_yaml(text)
        except yaml.YAMLError as exc:
            raise CdiError("", f"invalid YAML: {exc}") from None
    raise ValueError(f"fmt must be 'json', 'yaml' or None, not {fmt!r}")


# ---- the spec as JSON ----------------------------------------------------------------------------


def _null_is_empty(value: object) -> object:
    return () if value is None else value


def _null_is_no_map(value: object) -> object:
    return {} if value is None else value


Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
Uint32 = Annotated[int, Field(ge=0, le=2**32 - 1)]
Many = Annotated[Items[T], BeforeValidator(_null_is_empty)]
Strings = Annotated[dict[str, str], BeforeValidator(_null_is_no_map)]


class _Json(CamelModel):
    """One object of the spec; its attributes are those of the model class it decodes into."""

    def fields(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in type(self).model_fields}


class _DeviceNode(_Json):
    path: Annotated[str, Field(description="the device path inside the container, e.g. /dev/nvidia0")]
    host_path: str | None = None
    type: str | None = None
    major: Int64 | None = None
    minor: Int64 | None = None
    file_mode: Uint32 | None = None
    permissions: str | None = None
    uid: Uint32 | None = None
    gid: Uint32 | None = None


class _Mount(_Json):
    host_path: str
    container_path: str
    options: Many[str] = ()
    type: str | None = None


class _Hook(_Json):
    hook_name: str
    path: str
    args: Many[str] = ()
    env: Many[str] = ()
    timeout: Int64 | None = None


class _IntelRdt(_Json):
    clos_id: Annotated[str | None, Field(alias="closID")] = None
    l3_cache_schema: str | None = None
    mem_bw_schema: str | None = None
    schemata: Many[str] = ()
    enable_monitoring: bool = False


class _NetDevice(_Json):
    host_interface_name: str
    name: str


class _ContainerEdits(_Json):
    env: Many[str] = ()
    device_nodes: Many[_DeviceNode] = ()
    hooks: Many[_Hook] = ()
    mounts: Many[_Mount] = ()
    intel_rdt: _IntelRdt | None = None
    additional_gids: Many[Uint32] = ()
    net_devices: Many[_NetDevice] = ()

    def value(self) -> ContainerEdits:
        return ContainerEdits(
            env=self.env,
            device_nodes=tuple(DeviceNode(**n.fields()) for n in self.device_nodes),
            hooks=tuple(Hook(**h.fields()) for h in self.hooks),
            mounts=tuple(Mount(**m.fields()) for m in self.mounts),
            intel_rdt=None if self.intel_rdt is None else IntelRdt(**self.intel_rdt.fields()),
            additional_gids=self.additional_gids,
            net_devices=tuple(NetDevice(**n.fields()) for n in self.net_devices),
        )


class _Device(_Json):
    name: str
    annotations: Strings = Field(default_factory=dict)
    container_edits: _ContainerEdits | None = None


class _Spec(_Json):
    cdi_version: str
    kind: str
    annotations: Strings = Field(default_factory=dict)
    devices: Items[_Device]
    container_edits: _ContainerEdits | None = None


def _edits(edits: _ContainerEdits | None) -> ContainerEdits:
    return ContainerEdits() if edits is None else edits.value()


_decode = Decoder[_Spec](_Spec, error=CdiError, quoted_keys=True)


def decode_spec(data: Any) -> Spec:
    """Plain data (from JSON/YAML) -> Spec. Checks shape and types only."""
    spec = _decode(data)
    return Spec(
        cdi_version=spec.cdi_version,
        kind=spec.kind,
        annotations=spec.annotations,
        devices=tuple(Device(d.name, _edits(d.container_edits), d.annotations) for d in spec.devices),
        container_edits=_edits(spec.container_edits),
    )
