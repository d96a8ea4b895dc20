"""Strict decoding of CDI spec text (JSON or YAML) into the frozen model.

Strict means: unknown fields, duplicate keys and wrong types are errors naming the field, just as the
Go library's strict unmarshal rejects them. Semantic rules (names, versions, edits) live in
`dra_driver.cdi.validate`; `load_spec` runs both.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import yaml

from dra_driver.cdi.errors import CdiError
from dra_driver.cdi.model import ContainerEdits, Device, DeviceNode, Hook, IntelRdt, Mount, NetDevice, Spec

T = TypeVar("T")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UINT32_MAX = 2**32 - 1


class _StrictYamlLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (PyYAML silently keeps the last one)."""


def _construct_mapping(loader: _StrictYamlLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise CdiError("", f"duplicate key {key!r} (line {key_node.start_mark.line + 1})")
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictYamlLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


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
            return yaml.load(text, Loader=_StrictYamlLoader)  # noqa: S506 - a SafeLoader subclass
        except yaml.YAMLError as exc:
            raise CdiError("", f"invalid YAML: {exc}") from None
    raise ValueError(f"fmt must be 'json', 'yaml' or None, not {fmt!r}")


# ---- typed field readers -------------------------------------------------------------------------


def _obj(value: Any, at: str, known: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise CdiError(at, f"must be an object, got {_type_name(value)}")
    unknown = sorted(k for k in value if k not in known)
    if unknown:
        raise CdiError(at, f"unknown field(s) {', '.join(map(repr, unknown))}; known fields: {', '.join(known)}")
    return value


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def _str(value: Any, at: str) -> str:
    if not isinstance(value, str):
        raise CdiError(at, f"must be a string, got {_type_name(value)}")
    return value


def _opt_str(obj: Mapping[str, Any], key: str, at: str) -> str | None:
    return None if obj.get(key) is None else _str(obj[key], f"{at}.{key}")


def _int(value: Any, at: str, lo: int, hi: int) -> int:
    # bool is an int subclass in Python; JSON true is not a number.
    if isinstance(value, bool) or not isinstance(value, int):
        raise CdiError(at, f"must be an integer, got {_type_name(value)}")
    if not lo <= value <= hi:
        raise CdiError(at, f"{value} is out of range [{lo}, {hi}]")
    return value


def _opt_int(obj: Mapping[str, Any], key: str, at: str, lo: int, hi: int) -> int | None:
    return None if obj.get(key) is None else _int(obj[key], f"{at}.{key}", lo, hi)


def _list(obj: Mapping[str, Any], key: str, at: str, item: Callable[[Any, str], T]) -> tuple[T, ...]:
    value = obj.get(key)
    if value is None:
        return ()
    if not isinstance(value, list):
        raise CdiError(f"{at}.{key}", f"must be a list, got {_type_name(value)}")
    return tuple(item(v, f"{at}.{key}[{i}]") for i, v in enumerate(value))


def _str_map(value: Any, at: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise CdiError(at, f"must be an object of strings, got {_type_name(value)}")
    return {_str(k, at): _str(v, f"{at}[{k!r}]") for k, v in value.items()}


# ---- model decoders ------------------------------------------------------------------------------

_NODE_FIELDS = ("path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid", "gid")


def _device_node(value: Any, at: str) -> DeviceNode:
    obj = _obj(value, at, _NODE_FIELDS)
    if "path" not in obj:
        raise CdiError(f"{at}.path", "is required (the device path inside the container, e.g. /dev/nvidia0)")
    return DeviceNode(
        path=_str(obj["path"], f"{at}.path"),
        host_path=_opt_str(obj, "hostPath", at),
        type=_opt_str(obj, "type", at),
        major=_opt_int(obj, "major", at, INT64_MIN, INT64_MAX),
        minor=_opt_int(obj, "minor", at, INT64_MIN, INT64_MAX),
        file_mode=_opt_int(obj, "fileMode", at, 0, UINT32_MAX),
        permissions=_opt_str(obj, "permissions", at),
        uid=_opt_int(obj, "uid", at, 0, UINT32_MAX),
        gid=_opt_int(obj, "gid", at, 0, UINT32_MAX),
    )


def _mount(value: Any, at: str) -> Mount:
    obj = _obj(value, at, ("hostPath", "containerPath", "options", "type"))
    for key in ("hostPath", "containerPath"):
        if key not in obj:
            raise CdiError(f"{at}.{key}", "is required")
    return Mount(
        host_path=_str(obj["hostPath"], f"{at}.hostPath"),
        container_path=_str(obj["containerPath"], f"{at}.containerPath"),
        options=_list(obj, "options", at, _str),
        type=_opt_str(obj, "type", at),
    )


def _hook(value: Any, at: str) -> Hook:
    obj = _obj(value, at, ("hookName", "path", "args", "env", "timeout"))
    for key in ("hookName", "path"):
        if key not in obj:
            raise CdiError(f"{at}.{key}", "is required")
    return Hook(
        hook_name=_str(obj["hookName"], f"{at}.hookName"),
        path=_str(obj["path"], f"{at}.path"),
        args=_list(obj, "args", at, _str),
        env=_list(obj, "env", at, _str),
        timeout=_opt_int(obj, "timeout", at, INT64_MIN, INT64_MAX),
    )


def _intel_rdt(value: Any, at: str) -> IntelRdt:
    obj = _obj(value, at, ("closID", "l3CacheSchema", "memBwSchema", "schemata", "enableMonitoring"))
    monitoring = obj.get("enableMonitoring", False)
    if not isinstance(monitoring, bool):
        raise CdiError(f"{at}.enableMonitoring", f"must be a boolean, got {_type_name(monitoring)}")
    return IntelRdt(
        clos_id=_opt_str(obj, "closID", at),
        l3_cache_schema=_opt_str(obj, "l3CacheSchema", at),
        mem_bw_schema=_opt_str(obj, "memBwSchema", at),
        schemata=_list(obj, "schemata", at, _str),
        enable_monitoring=monitoring,
    )


def _net_device(value: Any, at: str) -> NetDevice:
    obj = _obj(value, at, ("hostInterfaceName", "name"))
    for key in ("hostInterfaceName", "name"):
        if key not in obj:
            raise CdiError(f"{at}.{key}", "is required")
    return NetDevice(_str(obj["hostInterfaceName"], f"{at}.hostInterfaceName"), _str(obj["name"], f"{at}.name"))


def _gid(value: Any, at: str) -> int:
    return _int(value, at, 0, UINT32_MAX)


_EDIT_FIELDS = ("env", "deviceNodes", "hooks", "mounts", "intelRdt", "additionalGids", "netDevices")


def decode_edits(value: Any, at: str = "containerEdits") -> ContainerEdits:
    if value is None:
        return ContainerEdits()
    obj = _obj(value, at, _EDIT_FIELDS)
    rdt = obj.get("intelRdt")
    return ContainerEdits(
        env=_list(obj, "env", at, _str),
        device_nodes=_list(obj, "deviceNodes", at, _device_node),
        hooks=_list(obj, "hooks", at, _hook),
        mounts=_list(obj, "mounts", at, _mount),
        intel_rdt=None if rdt is None else _intel_rdt(rdt, f"{at}.intelRdt"),
        additional_gids=_list(obj, "additionalGids", at, _gid),
        net_devices=_list(obj, "netDevices", at, _net_device),
    )


def _device(value: Any, at: str) -> Device:
    obj = _obj(value, at, ("name", "annotations", "containerEdits"))
    if "name" not in obj:
        raise CdiError(f"{at}.name", "is required")
    return Device(
        name=_str(obj["name"], f"{at}.name"),
        annotations=_str_map(obj.get("annotations"), f"{at}.annotations"),
        container_edits=decode_edits(obj.get("containerEdits"), f"{at}.containerEdits"),
    )


def decode_spec(data: Any) -> Spec:
    """Plain data (from JSON/YAML) -> Spec. Checks shape and types only."""
    obj = _obj(data, "spec", ("cdiVersion", "kind", "annotations", "devices", "containerEdits"))
    for key in ("cdiVersion", "kind", "devices"):
        if key not in obj:
            raise CdiError(key, "is required")
    devices = obj["devices"]
    if not isinstance(devices, list):
        raise CdiError("devices", f"must be a list, got {_type_name(devices)}")
    return Spec(
        cdi_version=_str(obj["cdiVersion"], "cdiVersion"),
        kind=_str(obj["kind"], "kind"),
        annotations=_str_map(obj.get("annotations"), "annotations"),
        devices=tuple(_device(d, f"devices[{i}]") for i, d in enumerate(devices)),
        container_edits=decode_edits(obj.get("containerEdits")),
    )
