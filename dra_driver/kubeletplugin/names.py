"""Validation of the identities the kubelet sends (claim namespace, name, UID) and of the plugin's own names.

These strings come off a unix socket and end up in API URLs, file names, CDI device names and the checkpoint,
so each is checked against what Kubernetes itself allows before anything uses it: a namespace is a DNS-1123
label, a ResourceClaim name a DNS-1123 subdomain, and a UID (the API server generates UUIDs) letters, digits and
'-'. A bad value is reported naming the field, the value and the rule.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from dra_driver.errors import DraDriverError
from dra_driver.k8s.names import DNS_SUBDOMAIN_MAX, dns_label_problems, dns_subdomain_problems
from dra_driver.kubeletplugin.driver import ClaimRef

# Real UIDs are 36-character UUIDs; the bound only keeps file names and CDI device names short.
UID_MAX = 128
DRIVER_NAME_MAX = 63  # ResourceSlice.spec.driver

UID_PATTERN = r"[A-Za-z0-9](?:[-A-Za-z0-9]*[A-Za-z0-9])?"
_UID_RE = re.compile(UID_PATTERN)


class InvalidNameError(DraDriverError, ValueError):
    """A name that Kubernetes would not accept; the message names the field."""


def _shown(value: str) -> str:
    return repr(value if len(value) <= 80 else value[:77] + "...")


def _problem(value: str, problems: list[str]) -> str | None:
    if not value:
        return "is empty"
    return f"{_shown(value)}: {'; '.join(problems)}" if problems else None


def dns1123_label_problem(value: str) -> str | None:
    """None for a valid DNS-1123 label (a namespace), else the problem in the apiserver's words."""
    return _problem(value, dns_label_problems(value))


def dns1123_subdomain_problem(value: str, max_len: int = DNS_SUBDOMAIN_MAX) -> str | None:
    """None for a valid DNS-1123 subdomain (an object name), else the problem in the apiserver's words."""
    return _problem(value, dns_subdomain_problems(value, max_len))


def uid_problem(value: str) -> str | None:
    if not value:
        return "is empty"
    if len(value) > UID_MAX:
        return f"{_shown(value)} is longer than {UID_MAX} characters"
    if not _UID_RE.fullmatch(value):
        return f"{_shown(value)}: a Kubernetes UID consists of letters, digits and '-' (e.g. a UUID)"
    return None


def is_uid(value: str) -> bool:
    return uid_problem(value) is None


def claim_ref_problem(ref: ClaimRef, where: str = "claim") -> str | None:
    """None if the claim identity is one Kubernetes could have sent, else a message naming the bad field."""
    for field, problem in (
        ("namespace", dns1123_label_problem(ref.namespace)),
        ("name", dns1123_subdomain_problem(ref.name)),
        ("uid", uid_problem(ref.uid)),
    ):
        if problem is not None:
            return f"{where}.{field}: {problem}; refusing this claim"
    return None


def request_problems(claims: Sequence[ClaimRef]) -> dict[str, str]:
    """UID -> error for each claim of one kubelet request that must not be processed: malformed identities,
    and a UID listed twice with different names (which of the two would be meant is unknowable)."""
    problems: dict[str, str] = {}
    seen: dict[str, ClaimRef] = {}
    for i, ref in enumerate(claims):
        problem = claim_ref_problem(ref, f"claims[{i}]")
        if problem is not None:
            problems.setdefault(ref.uid, problem)
            continue
        earlier = seen.setdefault(ref.uid, ref)
        if earlier != ref:
            problems[ref.uid] = (
                f"claims[{i}].uid: {ref.uid!r} is listed twice in this request, as {earlier.namespace}/{earlier.name} "
                f"and as {ref.namespace}/{ref.name}; refusing both"
            )
    return problems


def check_plugin_names(*, driver_name: str, node_name: str) -> None:
    """The plugin's own names go into file names, socket paths and API objects: refuse bad ones at startup."""
    for flag, problem in (
        ("--driver-name", dns1123_subdomain_problem(driver_name, DRIVER_NAME_MAX)),
        ("--node-name", dns1123_subdomain_problem(node_name)),
    ):
        if problem is not None:
            raise InvalidNameError(f"{flag}: {problem}")
