"""Kubernetes name formats: DNS-1123 labels and subdomains, qualified names, label values, C identifiers.

These are the generic checks every Kubernetes API object leans on (object names, label keys and values,
annotation keys, driver names, attribute names), with the apiserver's own wording, so a message built
from them reads like the one a real cluster would give. Pure: strings in, problems (or a bool) out.

The `*_problems` functions return every problem with `value` as a list of messages (empty: valid); the
`is_*` functions answer yes or no. The compiled patterns are public for callers that apply their own
length limit (a DRA driver name is a DNS subdomain of at most 63 characters, not 253).
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "C_IDENTIFIER_MSG",
    "C_IDENTIFIER_RE",
    "DNS_LABEL_MAX",
    "DNS_LABEL_MSG",
    "DNS_LABEL_RE",
    "DNS_SUBDOMAIN_MAX",
    "DNS_SUBDOMAIN_MSG",
    "DNS_SUBDOMAIN_RE",
    "LABEL_VALUE_MAX",
    "LABEL_VALUE_MSG",
    "QUALIFIED_NAME_MAX",
    "QUALIFIED_NAME_MSG",
    "QUALIFIED_NAME_PART_RE",
    "dns_label_problems",
    "dns_subdomain_problems",
    "is_c_identifier",
    "is_dns_label",
    "is_dns_subdomain",
    "is_label_value",
    "is_qualified_name",
    "label_value_problems",
    "path_segment_name_problems",
    "qualified_name_problems",
]

DNS_LABEL_MAX: Final = 63
DNS_SUBDOMAIN_MAX: Final = 253
QUALIFIED_NAME_MAX: Final = 63  # the name part after an optional `prefix/`
LABEL_VALUE_MAX: Final = 63

_DNS_LABEL_FMT: Final = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_LABEL_RE: Final = re.compile(_DNS_LABEL_FMT)
DNS_SUBDOMAIN_RE: Final = re.compile(rf"{_DNS_LABEL_FMT}(\.{_DNS_LABEL_FMT})*")
C_IDENTIFIER_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The name part of a qualified name; a non-empty label value has the same shape.
QUALIFIED_NAME_PART_RE: Final = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")

DNS_LABEL_MSG: Final = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start "
    "and end with an alphanumeric character (e.g. 'my-name', or '123-abc')"
)
DNS_SUBDOMAIN_MSG: Final = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and "
    "must start and end with an alphanumeric character (e.g. 'example.com')"
)
C_IDENTIFIER_MSG: Final = (
    "a valid C identifier must start with alphabetic character or '_', followed by a string of "
    "alphanumeric characters or '_' (e.g. 'my_name', or 'MY_NAME', or 'MyName')"
)
QUALIFIED_NAME_MSG: Final = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName', or 'my.name', or '123-abc'), with an optional DNS subdomain "
    "prefix and '/' (e.g. 'example.com/MyName')"
)
LABEL_VALUE_MSG: Final = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character"
)


def _length_and_shape(value: str, max_len: int, shape: re.Pattern[str], shape_msg: str) -> list[str]:
    """Kubernetes' two checks of a name, both reported: at most `max_len` characters, and all of it `shape`."""
    out = []
    if len(value) > max_len:
        out.append(f"must be no more than {max_len} characters")
    if not shape.fullmatch(value):
        out.append(shape_msg)
    return out


def dns_label_problems(value: str) -> list[str]:
    """Problems with `value` as a DNS-1123 label (namespaces, device names): ≤63, `[a-z0-9-]`, no '-' at the ends."""
    return _length_and_shape(value, DNS_LABEL_MAX, DNS_LABEL_RE, DNS_LABEL_MSG)


def dns_subdomain_problems(value: str, max_len: int = DNS_SUBDOMAIN_MAX) -> list[str]:
    """Problems with `value` as a DNS-1123 subdomain (most object names): dot-separated labels, ≤`max_len`."""
    return _length_and_shape(value, max_len, DNS_SUBDOMAIN_RE, DNS_SUBDOMAIN_MSG)


def is_dns_label(value: str) -> bool:
    return not dns_label_problems(value)


def is_dns_subdomain(value: str, max_len: int = DNS_SUBDOMAIN_MAX) -> bool:
    return not dns_subdomain_problems(value, max_len)


def qualified_name_problems(value: str) -> list[str]:
    """Label-key style names (`[prefix/]name`, name ≤63, prefix a DNS subdomain)."""
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            return ["prefix part must be non-empty"]
        out = [f"prefix part {p}" for p in dns_subdomain_problems(prefix)]
        if out:
            return out
    else:
        return [QUALIFIED_NAME_MSG]
    if not name:
        return ["name part must be non-empty"]
    if len(name) > QUALIFIED_NAME_MAX:
        return [f"name part must be no more than {QUALIFIED_NAME_MAX} characters"]
    if not QUALIFIED_NAME_PART_RE.fullmatch(name):
        return [QUALIFIED_NAME_MSG]
    return []


def is_qualified_name(value: str) -> bool:
    return not qualified_name_problems(value)


def label_value_problems(value: str) -> list[str]:
    """Problems with `value` as a label value: empty, or ≤63 characters shaped like a qualified name part."""
    if value == "":
        return []
    return _length_and_shape(value, LABEL_VALUE_MAX, QUALIFIED_NAME_PART_RE, LABEL_VALUE_MSG)


def is_label_value(value: str) -> bool:
    return not label_value_problems(value)


def is_c_identifier(value: str) -> bool:
    """`[A-Za-z_][A-Za-z0-9_]*`, the shape of a DRA attribute or capacity name (without its domain)."""
    return C_IDENTIFIER_RE.fullmatch(value) is not None


def path_segment_name_problems(value: str) -> list[str]:
    """Names that only need to be usable as one URL path segment (custom resources)."""
    if value in (".", ".."):
        return [f"may not be '{value}'"]
    for bad in ("/", "%"):
        if bad in value:
            return [f"may not contain '{bad}'"]
    return []
