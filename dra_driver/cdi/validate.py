"""Semantic validation of a decoded CDI spec: names, versions, devices and container edits."""

from __future__ import annotations

import posixpath
import re

from dra_driver.cdi.errors import CdiError
from dra_driver.cdi.model import ContainerEdits, DeviceNode, Hook, IntelRdt, Mount, NetDevice, Spec
from dra_driver.cdi.names import parse_kind, validate_annotations, validate_device_name
from dra_driver.cdi.version import check_version

HOOK_NAMES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
DEVICE_TYPES = ("b", "c", "u", "p")
_ENV_KEY_RE = re.compile(r"^[^=\x00]+$")
_IFNAME_MAX = 15  # IFNAMSIZ - 1


def validate_env(env: tuple[str, ...], at: str) -> None:
    for i, entry in enumerate(env):
        key, eq, _ = entry.partition("=")
        if not eq or not _ENV_KEY_RE.match(key):
            raise CdiError(f"{at}[{i}]", f"invalid environment variable {entry!r}; write it as 'NAME=value'")


def _device_node(node: DeviceNode, at: str) -> None:
    if not node.path:
        raise CdiError(f"{at}.path", "is empty; set the device path inside the container, e.g. /dev/nvidia0")
    if not node.path.startswith("/"):
        raise CdiError(f"{at}.path", f"{node.path!r} must be an absolute path")
    if node.host_path is not None and not node.host_path.startswith("/"):
        raise CdiError(f"{at}.hostPath", f"{node.host_path!r} must be an absolute path")
    if node.type is not None and node.type not in DEVICE_TYPES:
        raise CdiError(f"{at}.type", f"invalid device type {node.type!r}; use one of {', '.join(DEVICE_TYPES)}")
    if node.permissions is not None and node.permissions != "none":
        bad = set(node.permissions) - set("rwm")
        if bad or len(set(node.permissions)) != len(node.permissions):
            raise CdiError(
                f"{at}.permissions",
                f"invalid permissions {node.permissions!r}; use a subset of 'rwm' (each at most once) or 'none'",
            )


def _mount(mount: Mount, at: str) -> None:
    if not mount.host_path:
        raise CdiError(f"{at}.hostPath", "is empty; set the host path to mount")
    if not mount.container_path:
        raise CdiError(f"{at}.containerPath", "is empty; set where the mount appears in the container")


def _hook(hook: Hook, at: str) -> None:
    if hook.hook_name not in HOOK_NAMES:
        raise CdiError(f"{at}.hookName", f"invalid hook name {hook.hook_name!r}; use one of {', '.join(HOOK_NAMES)}")
    if not posixpath.isabs(hook.path):
        raise CdiError(f"{at}.path", f"{hook.path!r} must be an absolute path to the hook executable")
    validate_env(hook.env, f"{at}.env")
    if hook.timeout is not None and hook.timeout <= 0:
        raise CdiError(f"{at}.timeout", f"{hook.timeout} must be a positive number of seconds")


def _intel_rdt(rdt: IntelRdt, at: str) -> None:
    if rdt.clos_id is not None and (rdt.clos_id in (".", "..") or "/" in rdt.clos_id or len(rdt.clos_id) > 4096):
        raise CdiError(f"{at}.closID", f"invalid closID {rdt.clos_id!r}; it must be a plain file name")


def _net_devices(devices: tuple[NetDevice, ...], at: str) -> None:
    seen_host: set[str] = set()
    seen_name: set[str] = set()
    for i, dev in enumerate(devices):
        for field, value in (("hostInterfaceName", dev.host_interface_name), ("name", dev.name)):
            if not value or len(value) > _IFNAME_MAX or value in (".", "..") or any(c in value for c in "/: \t\n"):
                raise CdiError(
                    f"{at}[{i}].{field}",
                    f"invalid interface name {value!r}; use 1-{_IFNAME_MAX} characters without '/', ':' or spaces",
                )
        if dev.host_interface_name in seen_host:
            raise CdiError(f"{at}[{i}].hostInterfaceName", f"duplicate host interface {dev.host_interface_name!r}")
        if dev.name in seen_name:
            raise CdiError(f"{at}[{i}].name", f"duplicate container interface name {dev.name!r}")
        seen_host.add(dev.host_interface_name)
        seen_name.add(dev.name)


def validate_edits(edits: ContainerEdits, at: str = "containerEdits") -> None:
    validate_env(edits.env, f"{at}.env")
    for i, node in enumerate(edits.device_nodes):
        _device_node(node, f"{at}.deviceNodes[{i}]")
    for i, mount in enumerate(edits.mounts):
        _mount(mount, f"{at}.mounts[{i}]")
    for i, hook in enumerate(edits.hooks):
        _hook(hook, f"{at}.hooks[{i}]")
    if edits.intel_rdt is not None:
        _intel_rdt(edits.intel_rdt, f"{at}.intelRdt")
    _net_devices(edits.net_devices, f"{at}.netDevices")


def validate_spec(spec: Spec) -> None:
    """Raise CdiError (naming the field) unless `spec` follows the CDI rules for its cdiVersion."""
    check_version(spec)
    parse_kind(spec.kind)
    validate_annotations(spec.annotations, "annotations")
    validate_edits(spec.container_edits)
    if not spec.devices:
        raise CdiError("devices", "is empty; a spec must define at least one device")
    seen: dict[str, int] = {}
    for i, device in enumerate(spec.devices):
        at = f"devices[{i}]"
        validate_device_name(device.name, f"{at}.name")
        if device.name in seen:
            raise CdiError(f"{at}.name", f"duplicate device name {device.name!r} (also devices[{seen[device.name]}])")
        seen[device.name] = i
        validate_annotations(device.annotations, f"{at}.annotations")
        if device.container_edits.is_empty():
            raise CdiError(f"{at}.containerEdits", "is empty; a device must have at least one container edit")
        validate_edits(device.container_edits, f"{at}.containerEdits")
