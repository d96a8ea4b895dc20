"""PodGroup (scheduling.k8s.io/v1beta1, KEP-5729 with GenericWorkload) as far as the sandbox serves it: the
scheduling policy and the resource claims (k8s.io/kubernetes v1.37.2 pkg/apis/scheduling/validation and the
declarative tags of k8s.io/api scheduling/v1beta1 types.go), and which fields the strategy drops while a gate is
off (`dropDisabledDRAWorkloadResourceClaimsFields`; the pod's `spec.schedulingGroup` without GenericWorkload)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from dra_driver.k8s.names import dns_label_problems, dns_subdomain_problems

from .common import as_int, as_map, as_str, check_exactly_one, each_map
from .fielderrors import Errors, FieldError, child

# resource claims of a PodGroup: scheduling/v1beta1 MaxPodGroupResourceClaims.
MAX_CLAIMS: Final = 4
_POLICIES: Final = ("basic", "gang")

# (kind key, (top-level field, its field), the gate without which kube-apiserver drops that field).
GATED_FIELDS: Final[tuple[tuple[tuple[str, str], tuple[str, str], str], ...]] = (
    (("", "pods"), ("spec", "schedulingGroup"), "GenericWorkload"),
    (("scheduling.k8s.io", "podgroups"), ("spec", "resourceClaims"), "DRAWorkloadResourceClaims"),
    (("scheduling.k8s.io", "podgroups"), ("status", "resourceClaimStatuses"), "DRAWorkloadResourceClaims"),
)


def drop_disabled_fields(key: tuple[str, str], obj: dict[str, Any], gates: frozenset[str]) -> dict[str, Any]:
    """`obj` without the fields whose gate is off (a copy where one is dropped; the strategies do it silently)."""
    for kind, (top, name), gate in GATED_FIELDS:
        part = obj.get(top)
        if kind == key and gate not in gates and isinstance(part, Mapping) and name in part:
            obj = {**obj, top: {k: v for k, v in part.items() if k != name}}
    return obj


def validate_pod_group(obj: Mapping[str, Any]) -> list[FieldError]:
    errs = Errors()
    spec = as_map(errs, obj.get("spec"), "spec")
    policy_path = "spec.schedulingPolicy"
    policy = as_map(errs, spec.get("schedulingPolicy"), policy_path)
    chosen = [p for p in _POLICIES if policy.get(p) is not None]
    check_exactly_one(errs, chosen, policy_path, "must specify exactly one of: `basic`, `gang`")
    if chosen == ["gang"]:
        count_path = f"{policy_path}.gang.minCount"
        count = as_int(errs, as_map(errs, policy["gang"], f"{policy_path}.gang").get("minCount"), count_path)
        if count is None or count <= 0:
            errs.invalid(count_path, count, "must be greater than zero")
    seen: set[str] = set()
    for path, entry in each_map(errs, spec.get("resourceClaims"), "spec.resourceClaims", MAX_CLAIMS):
        name = as_str(errs, entry.get("name"), child(path, "name"))
        if not name:
            errs.required(child(path, "name"))
        else:
            for problem in dns_label_problems(name):
                errs.invalid(child(path, "name"), name, problem)
            if name in seen:
                errs.duplicate(child(path, "name"), name)
            seen.add(name)
        sources = [f for f in ("resourceClaimName", "resourceClaimTemplateName") if entry.get(f) is not None]
        check_exactly_one(errs, sources, path,
                          "must specify exactly one of: `resourceClaimName`, `resourceClaimTemplateName`")
        for f in sources:
            text = as_str(errs, entry.get(f), child(path, f))
            for problem in dns_subdomain_problems(text or ""):
                errs.invalid(child(path, f), text, problem)
    return errs.items
