"""Server-wide knobs, fixed when the server starts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .validation.options import CelCheck, ValidationOptions, parse_kube_version


@dataclass(frozen=True)
class Settings:
    # Reported by /version; also picks the resource.k8s.io rule set (1.34 vs 1.35+ limits).
    kube_version: str = "1.37.0"
    # Events kept per resource for watches that resume from a resourceVersion; older ones get 410.
    watch_history: int = 1000
    # Seconds between BOOKMARK events on watches that allow them (the apiserver uses about a minute).
    bookmark_interval: float = 60.0
    # Watch duration when the client sends no timeoutSeconds (the apiserver's default is 30-60 minutes).
    default_watch_timeout: float = 1800.0
    # Upper bound for a "timeout" fault's hang.
    max_hang_seconds: float = 30.0
    # ownerReference garbage collection (background/foreground/orphan, dangling owners).
    garbage_collection: bool = True
    # Validating webhooks with a `service:` clientConfig: "<namespace>/<name>" -> base URL (webhooks.py).
    webhook_service_urls: Mapping[str, str] = field(default_factory=dict)
    # --feature-gates for gates that are off by default in the reported version (DRAListTypeAttributes).
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    # Where the kubelets keep the logs of the pods they run as host processes (`pods/<name>/log` reads them).
    pod_log_roots: tuple[Path, ...] = ()

    def __post_init__(self) -> None:
        parse_kube_version(self.kube_version)  # fail fast on a malformed version
        if self.watch_history < 1:
            raise ValueError("watch_history must be at least 1")
        if self.bookmark_interval <= 0 or self.default_watch_timeout <= 0 or self.max_hang_seconds <= 0:
            raise ValueError("bookmark_interval, default_watch_timeout and max_hang_seconds must be positive")

    @property
    def kube_minor(self) -> int:
        """The reported minor version (35 for "1.35.0"): picks the field selectors served (fieldlabels.py)."""
        return parse_kube_version(self.kube_version)[1]

    @property
    def watch_list(self) -> bool:
        """The WatchList gate (KEP-3157 `sendInitialEvents`): --feature-gates=WatchList=..., else its default for the
        reported version (watch_list_default)."""
        return self.feature_gates.get("WatchList", watch_list_default(parse_kube_version(self.kube_version)))

    def validation_options(
        self, cel_check: CelCheck | None = None, derived_check: CelCheck | None = None
    ) -> ValidationOptions:
        return ValidationOptions(
            kube_version=parse_kube_version(self.kube_version),
            cel_check=cel_check,
            list_type_attributes=self.feature_gates.get("DRAListTypeAttributes", False),
            enabled_gates=frozenset(name for name, on in self.feature_gates.items() if on),
            derived_check=derived_check,
        )


def watch_list_default(version: tuple[int, int]) -> bool:
    """The WatchList gate's default in kube-apiserver (k8s.io/apiserver pkg/features/kube_features.go): alpha off
    in 1.27, beta on in 1.32, off again in 1.33 (the streaming list encoders did better), on from 1.34."""
    if version < (1, 32):
        return False
    return version != (1, 33)
