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


_VENDOR_CLASS_SHAPE = (
    "it must start with a letter, end with a letter or digit and contain only letters, digits, '-', '_' and '.'"
)
_KIND_HINT = "write the kind as 'vendor.example.com/class'"


def _check_part(value: str, field: str, what: str, max_len: int, pattern: re.Pattern[str], shape: str,
                empty: str) -> None:
    """One part of a qualified device name: present (else `empty`), at most `max_len` characters, `pattern`."""
    if not value:
        raise CdiError(field, empty)
    if len(value) > max_len:
        raise CdiError(field, f"{what} {value!r} is longer than {max_len} characters")
    if not pattern.match(value):
        raise CdiError(field, f"invalid {what} {value!r}: {shape}")


def validate_vendor(vendor: str, field: str = "kind") -> None:
    _check_part(vendor, field, "vendor", VENDOR_MAX, _VENDOR_CLASS_RE, _VENDOR_CLASS_SHAPE,
                f"vendor is empty; {_KIND_HINT}")


def validate_class(device_class: str, field: str = "kind") -> None:
    _check_part(device_class, field, "class", CLASS_MAX, _VENDOR_CLASS_RE, _VENDOR_CLASS_SHAPE,
                f"class is empty; {_KIND_HINT}")


def parse_kind(kind: str, field: str = "kind") -> tuple[str, str]:
    """``vendor/class`` -> (vendor, class), validated."""
    if not isinstance(kind, str) or kind.count("/") != 1:
        raise CdiError(field, f"invalid kind {kind!r}: expected exactly one '/', as in 'vendor.example.com/gpu'")
    vendor, _, device_class = kind.partition("/")
    validate_vendor(vendor, field)
    validate_class(device_class, field)
    return vendor, device_class


def validate_device_name(name: str, field: str = "name") -> None:
    _check_part(name, field, "device name", DEVICE_NAME_MAX, _DEVICE_RE,
                "it must start and end with a letter or digit and contain only letters, digits, '-', '_', '.' and ':'",
                "device name is empty")


def parse_qualified_name(text: str, field: str = "device") -> QualifiedName:
    """``vendor/class=name`` -> QualifiedName; every part validated."""
    if not isinstance(text, str) or "=" not in text:
        raise CdiError(field, f"{text!r} is not a qualified CDI device name; expected 'vendor.example.com/class=name'")
    kind, _, name = text.partition("=")
    vendor, device_class = parse_kind(kind, field)
    validate_device_name(name, field)
    return QualifiedName(vendor, device_class, name)


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
