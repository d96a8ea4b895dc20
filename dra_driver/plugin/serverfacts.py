"""What the GPU plugin asks the API server once at start: its version, and which gated ResourceSlice fields it keeps."""

from __future__ import annotations

import structlog

from dra_driver.k8s.client import ApiError, KubeRest
from dra_driver.k8s.serverfeatures import FeatureMode, SliceFeature, SliceFeatures, discover_slice_features
from dra_driver.k8s.serverfeatures import probe as probe_feature
from dra_driver.k8s.serverfeatures import report as report_probes
from dra_driver.plugin.settings import PluginSettings

log = structlog.get_logger(__name__)


def kube_version(rest: KubeRest, configured: tuple[int, int] | None) -> tuple[int, int]:
    """`configured` where set (`--kube-version`), else the API server's /version (1.35 where it does not answer)."""
    if configured is not None:
        return configured
    try:
        info = rest.request("GET", "/version")
        minor = int("".join(ch for ch in str(info.get("minor", "35")) if ch.isdigit()) or 35)
        return int(info.get("major", 1)), minor
    except (ApiError, ValueError) as exc:
        log.warning("could not read the API server version; assuming 1.35 slice layout", error=str(exc))
        return (1, 35)


def slice_features(rest: KubeRest, settings: PluginSettings, version: tuple[int, int]) -> SliceFeatures:
    """The gated slice fields this plugin would send, each probed by one dry-run create (k8s/serverfeatures.py):
    only those the settings ask for, so `--list-attributes off`, `--partition-types off`, no
    `--compatibility-groups` and no `--node-allocatable-overhead` cost no request."""
    modes: dict[SliceFeature, FeatureMode] = {}
    if settings.list_attributes is not FeatureMode.OFF:
        modes[SliceFeature.LIST_ATTRIBUTES] = settings.list_attributes
    if settings.partition_types is not FeatureMode.OFF:
        modes[SliceFeature.PARTITION_TYPES] = settings.partition_types
    if settings.passthrough.compatibility_groups:
        modes[SliceFeature.COMPATIBILITY_GROUPS] = FeatureMode.ON
    if settings.node_allocatable_overhead:
        modes[SliceFeature.NODE_ALLOCATABLE] = FeatureMode.ON
    features, probes = discover_slice_features(
        frozenset(modes),
        lambda f: probe_feature(rest, f, driver=settings.driver_name, node=settings.node_name, kube_version=version),
    )
    report_probes(probes, modes)
    return features
