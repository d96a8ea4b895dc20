"""CDI naming rules: kinds (``vendor/class``), device names and qualified names (``vendor/class=name``).

The rules are the CDI parser's (pkg/parser): vendor and class start with a letter, end with a letter
or digit and contain only ``[A-Za-z0-9_.-]``; device names start and end with a letter or digit and
may also contain ``:``. Whether a name needs a newer cdiVersion (a dot in the class, a device name
starting with a digit) is decided in `dra_driver.cdi.version`, not here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from dra_driver.cdi.errors import CdiError
from dra_driver.k8s.names import QUALIFIED_NAME_MAX, QUALIFIED_NAME_PART_RE, is_dns_subdomain

VENDOR_MAX = 253  # a DNS subdomain
CLASS_MAX = 63
DEVICE_NAME_MAX = 253  # not fixed by the spec; keeps file names and env values sane
_VENDOR_CLASS_RE = re.compile(r"^[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_DEVICE_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
ANNOTATIONS_MAX_BYTES = 256 * 1024


@dataclass(frozen=True)
class QualifiedName:
    vendor: str
    device_class: str
    name: str

    @property
    def kind(self) -> str:
        return f"{self.vendor}/{self.device_class}"

    def __str__(self) -> str:
        return f"{self.vendor}/{self.device_class}={self.name}"


def validate_vendor(vendor: str, field: str = "kind") -> None:
    if not vendor:
        raise CdiError(field, "vendor is empty; write the kind as 'vendor.example.com/class'")
    if len(vendor) > VENDOR_MAX:
        raise CdiError(field, f"vendor {vendor!r} is longer than {VENDOR_MAX} characters")
    if not _VENDOR_CLASS_RE.match(vendor):
        raise CdiError(
            field,
            f"invalid vendor {vendor!r}: it must start with a letter, end with a letter or digit and "
            "contain only letters, digits, '-', '_' and '.'",
        )


def validate_class(device_class: str, field: str = "kind") -> None:
    if not device_class:
        raise CdiError(field, "class is empty; write the kind as 'vendor.example.com/class'")
    if len(device_class) > CLASS_MAX:
        raise CdiError(field, f"class {device_class!r} is longer than {CLASS_MAX} characters")
    if not _VENDOR_CLASS_RE.match(device_class):
        raise CdiError(
            field,
            f"invalid class {device_class!r}: it must start with a letter, end with a letter or digit and "
            "contain only letters, digits, '-', '_' and '.'",
        )


def parse_kind(kind: str, field: str = "kind") -> tuple[str, str]:
    """``vendor/class`` -> (vendor, class), validated."""
    if not isinstance(kind, str) or kind.count("/") != 1:
        raise CdiError(field, f"invalid kind {kind!r}: expected exactly one '/', as in 'vendor.example.com/gpu'")
    vendor, _, device_class = kind.partition("/")
    validate_vendor(vendor, field)
    validate_class(device_class, field)
    return vendor, device_class


def validate_device_name(name: str, field: str = "name") -> None:
    if not name:
        raise CdiError(field, "device name is empty")
    if len(name) > DEVICE_NAME_MAX:
        raise CdiError(field, f"device name {name!r} is longer than {DEVICE_NAME_MAX} characters")
    if not _DEVICE_RE.match(name):
        raise CdiError(
            field,
            f"invalid device name {name!r}: it must start and end with a letter or digit and contain only "
            "letters, digits, '-', '_', '.' and ':'",
        )


def parse_qualified_name(text: str, field: str = "device") -> QualifiedName:
    """``vendor/class=name`` -> QualifiedName; every part validated."""
    if not isinstance(text, str) or "=" not in text:
        raise CdiError(field, f"{text!r} is not a qualified CDI device name; expected 'vendor.example.com/class=name'")
    kind, _, name = text.partition("=")
    vendor, device_class = parse_kind(kind, field)
    validate_device_name(name, field)
    return QualifiedName(vendor, device_class, name)


def is_qualified_name(text: str) -> bool:
    try:
        parse_qualified_name(text)
    except CdiError:
        return False
    return True


def qualified_name(vendor: str, device_class: str, name: str) -> str:
    """Build ``vendor/class=name`` after validating each part."""
    validate_vendor(vendor, "vendor")
    validate_class(device_class, "class")
    validate_device_name(name, "name")
    return f"{vendor}/{device_class}={name}"


def validate_annotation_key(key: str, field: str) -> None:
    """Annotation keys follow the Kubernetes qualified-name rule: `[prefix/]name`."""
    prefix, slash, name = key.rpartition("/")
    if slash and not is_dns_subdomain(prefix):
        raise CdiError(field, f"annotation key {key!r}: the prefix before '/' must be a lower-case DNS subdomain")
    if not name or len(name) > QUALIFIED_NAME_MAX or not QUALIFIED_NAME_PART_RE.fullmatch(name):
        raise CdiError(
            field,
            f"annotation key {key!r}: the name must be 1-63 characters, start and end with a letter or digit, "
            "and contain only letters, digits, '-', '_' and '.'",
        )


def validate_annotations(annotations: Mapping[str, str], field: str) -> None:
    total = 0
    for key, value in annotations.items():
        validate_annotation_key(key, f"{field}[{key!r}]")
        total += len(key.encode()) + len(str(value).encode())
    if total > ANNOTATIONS_MAX_BYTES:
        raise CdiError(field, f"annotations total {total} bytes; the limit is {ANNOTATIONS_MAX_BYTES}")
