"""Spec -> plain data / JSON, leaving out empty fields like Go's ``omitempty``."""

from __future__ import annotations

import json
from collections.abc import Iterable
from json.encoder import encode_basestring_ascii
from typing import Any

import msgspec

from dra_driver.cdi.model import ContainerEdits, Device, DeviceNode, Hook, IntelRdt, Mount, NetDevice, Spec


def _drop_empty(pairs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in pairs.items() if v is not None and v != [] and v != {} and v is not False}


def _node(n: DeviceNode) -> dict[str, Any]:
    return _drop_empty(
        {
            "path": n.path,
            "hostPath": n.host_path,
            "type": n.type,
            "major": n.major,
            "minor": n.minor,
            "fileMode": n.file_mode,
            "permissions": n.permissions,
            "uid": n.uid,
            "gid": n.gid,
        }
    )


def _mount(m: Mount) -> dict[str, Any]:
    out = {"hostPath": m.host_path, "containerPath": m.container_path}
    return out | _drop_empty({"options": list(m.options), "type": m.type})


def _hook(h: Hook) -> dict[str, Any]:
    out = {"hookName": h.hook_name, "path": h.path}
    return out | _drop_empty({"args": list(h.args), "env": list(h.env), "timeout": h.timeout})


def _rdt(r: IntelRdt) -> dict[str, Any]:
    return _drop_empty(
        {
            "closID": r.clos_id,
            "l3CacheSchema": r.l3_cache_schema,
            "memBwSchema": r.mem_bw_schema,
            "schemata": list(r.schemata),
            "enableMonitoring": r.enable_monitoring,
        }
    )


def _net(d: NetDevice) -> dict[str, Any]:
    return {"hostInterfaceName": d.host_interface_name, "name": d.name}


def edits_to_dict(e: ContainerEdits) -> dict[str, Any]:
    out = _drop_empty(
        {
            "env": list(e.env),
            "deviceNodes": [_node(n) for n in e.device_nodes],
            "hooks": [_hook(h) for h in e.hooks],
            "mounts": [_mount(m) for m in e.mounts],
            "additionalGids": list(e.additional_gids),
            "netDevices": [_net(d) for d in e.net_devices],
        }
    )
    if e.intel_rdt is not None:
        # Kept even when empty: its presence alone is a feature (and raises the minimum cdiVersion).
        out["intelRdt"] = _rdt(e.intel_rdt)
    return out


def _device(d: Device) -> dict[str, Any]:
    out: dict[str, Any] = {"name": d.name}
    if d.annotations:
        out["annotations"] = dict(d.annotations)
    # The JSON schema requires containerEdits on a device, so always write it.
    out["containerEdits"] = edits_to_dict(d.container_edits)
    return out


def spec_to_dict(spec: Spec) -> dict[str, Any]:
    out: dict[str, Any] = {"cdiVersion": spec.cdi_version, "kind": spec.kind}
    if spec.annotations:
        out["annotations"] = dict(spec.annotations)
    out["devices"] = [_device(d) for d in spec.devices]
    edits = edits_to_dict(spec.container_edits)
    if edits:
        out["containerEdits"] = edits
    return out


def spec_to_json(spec: Spec, indent: int | None = 2) -> str:
    """The spec as JSON text: exactly `json.dumps(spec_to_dict(spec), indent=indent) + "\\n"`. With an indent,
    written by `indented_text` (the stdlib's indenting encoder is pure Python: 2.5-3x slower for a spec with the
    driver's mounts, on every prepare); without, by the stdlib's C encoder."""
    data = spec_to_dict(spec)
    if indent is None:
        return json.dumps(data) + "\n"
    return indented_text(data, indent) + "\n"


def indented_text(value: Any, indent: int) -> str:
    """`json.dumps(value, indent=indent)` for the JSON types spec_to_dict produces. msgspec's C encoder and formatter
    lay out the same text wherever no string needs an escape (no backslash in its output, pure ASCII without DEL:
    json's `ensure_ascii` escapes those, msgspec writes UTF-8 and DEL as they are); a spec's strings (paths, env,
    names) nearly always are, at ≈ 2x the speed of `_indented`, which writes every other value."""
    try:
        raw = msgspec.json.encode(value)
    except (TypeError, OverflowError, ValueError):  # an int past 64 bits, a type JSON cannot hold
        raw = b"\\"  # take the path below, which says what is wrong
    if raw.isascii() and b"\\" not in raw and b"\x7f" not in raw:
        return msgspec.json.format(raw, indent=indent).decode("ascii")
    parts: list[str] = []
    _indented(value, "", " " * indent, parts)
    return "".join(parts)


def _indented(value: Any, pad: str, step: str, parts: list[str]) -> None:
    """Append `value` (the JSON types spec_to_dict produces) as `json.dumps(..., indent=len(step))` writes it."""
    kind = type(value)
    if kind is str:
        parts.append(encode_basestring_ascii(value))
    elif kind is dict or kind is list:
        # One writer for both containers: an object's members carry their key, an array's items none.
        keyed = kind is dict
        if not value:
            parts.append("{}" if keyed else "[]")
            return
        inner = pad + step
        separator = ("{\n" if keyed else "[\n") + inner
        members: Iterable[tuple[Any, Any]] = value.items() if keyed else enumerate(value)
        for key, item in members:
            parts.append(separator + encode_basestring_ascii(key) + ": " if keyed else separator)
            separator = ",\n" + inner
            _indented(item, inner, step, parts)
        parts.append("\n" + pad + ("}" if keyed else "]"))
    elif value is True:
        parts.append("true")
    elif value is False:
        parts.append("false")
    elif value is None:
        parts.append("null")
    elif kind is int:
        parts.append(int.__repr__(value))
    else:
        raise TypeError(f"a CDI spec holds no {kind.__name__} values")
