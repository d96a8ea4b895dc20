"""Where a cluster serves DeviceTaintRules (KEP-5055), found by discovery before any request to them.

The kind moved `resource.k8s.io/v1alpha3` (1.33-1.35, alpha: gate DRADeviceTaints, from 1.35 DRADeviceTaintRules,
and the alpha API enabled in --runtime-config) → `v1beta2` (1.36, beta but off by default: gate
DRADeviceTaintRules) → `v1` (1.37, GA, on by default) (docs/reference/kubernetes-dra.md, "DeviceTaintRule").
A server whose gate is off serves the group version but not the resource in it, and answers 404 to any request
for it; so the product asks `GET /apis/resource.k8s.io` (the served versions) and then each served version's
resource list, newest first, and uses the first that lists `devicetaintrules`: two or three discovery GETs, then
only requests the server accepts.
"""

from __future__ import annotations

from typing import Final

from dra_driver.errors import DraDriverError
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest
from dra_driver.k8s.liststream import list_all

GROUP: Final = "resource.k8s.io"
RESOURCE: Final = "devicetaintrules"
PREFERRED_VERSIONS: Final = ("v1", "v1beta2", "v1alpha3")


class TaintRulesUnavailable(DraDriverError):
    """The cluster serves no version of DeviceTaintRule."""


def taint_rule_version(rest: KubeRest) -> str | None:
    """The newest version in which the server lists `devicetaintrules`, or None when it serves none."""
    group = rest.get(f"/apis/{GROUP}")
    served = {str(v.get("version")) for v in (group or {}).get("versions") or [] if isinstance(v, dict)}
    for version in PREFERRED_VERSIONS:
        if version not in served:
            continue
        listing = rest.get(f"/apis/{GROUP}/{version}")
        names = {str(r.get("name")) for r in (listing or {}).get("resources") or [] if isinstance(r, dict)}
        if RESOURCE in names:
            return version
    return None


def taint_rules_path(rest: KubeRest) -> str:
    """`/apis/resource.k8s.io/<version>/devicetaintrules`; raises TaintRulesUnavailable saying what to enable."""
    try:
        version = taint_rule_version(rest)
    except ApiError as exc:
        raise TaintRulesUnavailable(f"API discovery of {GROUP} failed: {exc}") from exc
    if version is None:
        raise TaintRulesUnavailable(
            f"this cluster serves no DeviceTaintRule API ({GROUP} {', '.join(PREFERRED_VERSIONS)}): it is GA and on "
            "in Kubernetes 1.37; 1.36 needs the feature gate DRADeviceTaintRules=true (kube-apiserver, "
            "kube-controller-manager, kube-scheduler) and resource.k8s.io/v1beta2 in --runtime-config; 1.34-1.35 "
            "need DRADeviceTaints (1.35 also DRADeviceTaintRules) and resource.k8s.io/v1alpha3 in --runtime-config "
            "(docs/operations.md, \"Admin overrides\")"
        )
    return f"/apis/{GROUP}/{version}/{RESOURCE}"


def list_taint_rules(rest: KubeRest) -> list[JsonObject]:
    """Every DeviceTaintRule, in pages; none when the cluster serves the kind in no version."""
    version = taint_rule_version(rest)
    if version is None:
        return []
    return list_all(rest, f"/apis/{GROUP}/{version}/{RESOURCE}")
