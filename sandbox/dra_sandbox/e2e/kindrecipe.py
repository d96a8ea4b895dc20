"""The kind recipe's facts, per Kubernetes version: feature gates, beta APIs, node images (e2e/kind, e2e/README.md).

A kind cluster passes `featureGates` to every component (kube-apiserver, kube-controller-manager,
kube-scheduler, kubelet, kube-proxy) and `runtimeConfig` to kube-apiserver's `--runtime-config`
(kubernetes-sigs/kind `pkg/cluster/internal/kubeadm/config.go`). A component refuses to start when a gate it
does not know is set (a gate added after its version, or one removed), and when a gate locked to its default
is set to the other value; setting a GA gate locked to `true` to `true` is allowed until the gate is removed.
So each version gets its own config, generated from the tables below:

    python -m dra_sandbox.e2e.kindrecipe           # rewrite e2e/kind/cluster-<version>.yaml and the README table
    python -m dra_sandbox.e2e.kindrecipe --check   # exit 1 when they differ from these tables (a test runs it)

Sources (facts only): the versioned feature-gate specs (`defaultVersionedKubernetesFeatureGates`) of
kubernetes/kubernetes `pkg/features/kube_features.go` at release-1.35 (which lists every stage since the
gate's alpha, so it covers 1.34 as well) and of the 1.37 development tree (stages of 1.36 and 1.37, with the
announced removals in the comments, e.g. "GA in 1.36; remove in 1.39"); ResourceHealthStatus (kubelet and
kube-apiserver, KEP-4680): alpha since 1.31 in kube_features.go, beta and on by default from 1.36 per
kubernetes/website `content/en/docs/reference/command-line-tools-reference/feature-gates/ResourceHealthStatus.md`;
beta API lifecycles: kubernetes/api `resource/v1beta{1,2}/zz_generated.prerelease-lifecycle.go`; beta APIs are
off by default (KEP-3136, kubernetes/kubernetes `pkg/controlplane/apiserver/options` test
`TestNoBetaVersionsEnabledByDefault`); node images: kubernetes-sigs/kind `pkg/apis/config/defaults/image.go`
at the release tags, containerd versions from `images/base/Dockerfile`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml

SUPPORTED_MINORS: tuple[int, ...] = (34, 35, 36, 37)
DEFAULT_MINOR = 36  # the newest version with a released kind (v0.32.0)

StageName = Literal["alpha", "beta", "GA"]


@dataclass(frozen=True)
class Stage:
    since: int  # minor version of Kubernetes 1.x from which this stage holds
    stage: StageName
    default: bool
    locked: bool = False  # LockToDefault: setting the other value makes the component fail to start


@dataclass(frozen=True)
class Gate:
    name: str
    stages: tuple[Stage, ...]  # ascending `since`
    needed_for: str  # what of this driver needs it on; "" when the driver does not use it
    removal: int | None = None  # the announced minor version that no longer knows the gate
    components: str = "all"

    @property
    def needed(self) -> bool:
        return bool(self.needed_for)

    def at(self, minor: int) -> Stage | None:
        """The gate's stage in 1.<minor>; None when that version does not know the gate."""
        if self.removal is not None and minor >= self.removal:
            return None
        current = None
        for stage in self.stages:
            if stage.since <= minor:
                current = stage
        return current

    def recipe_value(self, minor: int) -> bool | None:
        """What the recipe sets in 1.<minor>: `true` for a gate the driver needs that is not GA yet (alpha: off
        by default; beta: on by default, set anyway so a config that turned it off is overridden). A GA gate
        is left alone (on, and setting it only earns a warning and breaks at its removal)."""
        stage = self.at(minor)
        if not self.needed or stage is None or stage.stage == "GA":
            return None
        return True


@dataclass(frozen=True)
class BetaApi:
    group_version: str
    introduced: int
    deprecated: int
    removed: int  # kube-apiserver refuses to enable it from this version on
    needed_for: str

    def served(self, minor: int) -> bool:
        return self.introduced <= minor < self.removed


@dataclass(frozen=True)
class AlphaApi:
    """An alpha API version the recipe enables only where nothing newer serves what the driver needs from it."""

    group_version: str
    minors: tuple[int, ...]
    needed_for: str


@dataclass(frozen=True)
class NodeImage:
    image: str  # with the digest kind's release notes pin
    kind_version: str  # the kind release it is made for ("main": not released yet)
    containerd: str


GATES: tuple[Gate, ...] = (
    Gate(
        "DynamicResourceAllocation",
        (Stage(26, "alpha", False), Stage(32, "beta", False), Stage(34, "GA", True), Stage(35, "GA", True, True)),
        "everything (ResourceSlices, claims, the kubelet's DRA plugin manager)",
        removal=38,
    ),
    Gate(
        "DRAAdminAccess",
        (Stage(32, "alpha", False), Stage(34, "beta", True), Stage(36, "GA", True, True)),
        "`adminAccess` requests (the plugin prepares them without taking the device)",
        removal=39,
    ),
    Gate(
        "DRAPrioritizedList",
        (Stage(33, "alpha", False), Stage(34, "beta", True), Stage(36, "GA", True), Stage(37, "GA", True, True)),
        "`firstAvailable` subrequests (the plugin maps `<request>/<subrequest>` results)",
        removal=40,
    ),
    Gate(
        "DRAPartitionableDevices",
        (Stage(33, "alpha", False), Stage(36, "beta", True)),
        "dynamic MIG (`migMode: dynamic`): `sharedCounters` and `consumesCounters` keep overlapping MIG "
        "placements and the whole GPU apart; without it the API server drops those fields",
    ),
    Gate(
        "DRADeviceTaints",
        (Stage(33, "alpha", False), Stage(36, "beta", True), Stage(37, "GA", True)),
        "taints on unhealthy devices in the ResourceSlices (the scheduler keeps new claims off them)",
        removal=41,
    ),
    Gate(
        "DRAConsumableCapacity",
        (Stage(34, "alpha", False), Stage(36, "beta", True)),
        "shared GPUs (`allowMultipleAllocations`, capacity requests, `shareID`): the gpu-share class, "
        "scenario gpu-shares",
    ),
    Gate(
        "DRAExtendedResource",
        (Stage(34, "alpha", False), Stage(36, "beta", True), Stage(37, "GA", True, True)),
        "`extendedResourceName` on DeviceClasses (`resources.limits: {nvidia.com/gpu: 1}`), scenario "
        "device-plugin-pod",
        removal=40,
    ),
    Gate(
        "ResourceHealthStatus",
        (Stage(31, "alpha", False), Stage(36, "beta", True)),
        "the kubelet's DRAResourceHealth stream and `allocatedResourcesStatus` in pod status (kubelet and "
        "kube-apiserver)",
        components="kubelet, kube-apiserver",
    ),
    Gate(
        "DRAResourceClaimDeviceStatus",
        (Stage(32, "alpha", False), Stage(33, "beta", True), Stage(37, "GA", True, True)),
        "the plugin's `status.devices` entries in each prepared claim (UUID, MIG profile and placement, sharing; "
        "`dra-driver status`); on by default in every supported release",
        removal=40,
    ),
    Gate(
        "DRADeviceBindingConditions",
        (Stage(34, "alpha", False), Stage(36, "beta", True)),
        "",
    ),
    Gate(
        "DRADeviceTaintRules",
        (Stage(35, "alpha", False), Stage(36, "beta", False), Stage(37, "GA", True)),
        "DeviceTaintRules (`dra-driver health taint|clear`, the device-taint scenarios); 1.34 serves them under "
        "DRADeviceTaints",
        removal=41,
    ),
)
UNUSED_WHY: Mapping[str, str] = {
    "DRADeviceBindingConditions": "not used: the driver publishes no binding conditions",
}

BETA_APIS: tuple[BetaApi, ...] = (
    BetaApi("resource.k8s.io/v1beta1", 32, 35, 38, "scenario example-v1beta1-template (a v1beta1 claim template)"),
    BetaApi("resource.k8s.io/v1beta2", 33, 36, 39, "scenario files may use v1beta2 (the e2e runner accepts it)"),
)
# DeviceTaintRule is in v1alpha3 only before 1.36 (v1beta2 from 1.36, v1 from 1.37).
ALPHA_APIS: tuple[AlphaApi, ...] = (
    AlphaApi("resource.k8s.io/v1alpha3", (34, 35), "DeviceTaintRule before 1.36 (`dra-driver health taint`)"),
)

NODE_IMAGES: Mapping[int, NodeImage] = {
    34: NodeImage(
        "kindest/node:v1.34.0@sha256:7416a61b42b1662ca6ca89f02028ac133a309a2a30ba309614e8ec94d976dc5a",
        "v0.30.0", "2.1.4",
    ),
    35: NodeImage(
        "kindest/node:v1.35.0@sha256:452d707d4862f52530247495d180205e029056831160e22870e37e3f6c1ac31f",
        "v0.31.0", "2.2.0",
    ),
    36: NodeImage(
        "kindest/node:v1.36.1@sha256:3489c7674813ba5d8b1a9977baea8a6e553784dab7b84759d1014dbd78f7ebd5",
        "v0.32.0", "2.3.1",
    ),
    37: NodeImage(
        "kindest/node:v1.37.0-rc.1@sha256:aabfbaf916de1af22a1e0bf56307b9f775e8e8961a61a653c86e373320dbea2e",
        "main", "2.3.4",
    ),
}

# The scenarios select nodes by this label (e2e/README.md); run.sh installs one fake GPU preset per alias.
NODE_LABEL = "e2e.dra.dev/node"
WORKER_ALIASES: tuple[str, ...] = ("h100", "a100")
# kind's containerd config is version 2; containerd 2.x moves these keys to io.containerd.cri.v1.runtime and has
# CDI on by default, containerd 1.7 needs them. The plugin writes its CDI specs to /var/run/cdi.
CONTAINERD_CDI_PATCH = (
    '[plugins."io.containerd.grpc.v1.cri"]\n'
    "  enable_cdi = true\n"
    '  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]'
)

REPO = Path(__file__).resolve().parents[3]
KIND_DIR = REPO / "e2e" / "kind"
README = REPO / "e2e" / "README.md"
TABLE_BEGIN = "<!-- kind-gates:begin (generated: python -m dra_sandbox.e2e.kindrecipe) -->"
TABLE_END = "<!-- kind-gates:end -->"


def version_label(minor: int) -> str:
    return f"1.{minor}"


def config_path(minor: int, kind_dir: Path = KIND_DIR) -> Path:
    return kind_dir / f"cluster-{version_label(minor)}.yaml"


def feature_gates(minor: int) -> dict[str, bool]:
    return {g.name: value for g in GATES if (value := g.recipe_value(minor)) is not None}


def runtime_config(minor: int) -> dict[str, str]:
    out = {api.group_version: "true" for api in BETA_APIS if api.served(minor)}
    out.update({api.group_version: "true" for api in ALPHA_APIS if minor in api.minors})
    return out


def cluster_config(minor: int) -> dict[str, object]:
    """The kind `Cluster` (kind.x-k8s.io/v1alpha4) for Kubernetes 1.<minor>."""
    if minor not in SUPPORTED_MINORS:
        raise ValueError(f"Kubernetes {version_label(minor)} is not supported; use one of "
                         f"{', '.join(map(version_label, SUPPORTED_MINORS))}")
    image = NODE_IMAGES[minor].image
    nodes: list[dict[str, object]] = [{"role": "control-plane", "image": image}]
    nodes += [{"role": "worker", "image": image, "labels": {NODE_LABEL: alias}} for alias in WORKER_ALIASES]
    return {
        "kind": "Cluster",
        "apiVersion": "kind.x-k8s.io/v1alpha4",
        "featureGates": feature_gates(minor),
        "runtimeConfig": runtime_config(minor),
        "containerdConfigPatches": [CONTAINERD_CDI_PATCH],
        "nodes": nodes,
    }


class _LiteralDumper(yaml.SafeDumper):
    """Multi-line strings (the containerd patch) as `|-` blocks, as one would write them by hand."""


def _str_presenter(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_LiteralDumper.add_representer(str, _str_presenter)


def render_config(minor: int) -> str:
    node = NODE_IMAGES[minor]
    header = (
        f"# kind cluster for the e2e scenarios on Kubernetes {version_label(minor)} (generated by\n"
        f"# `python -m dra_sandbox.e2e.kindrecipe` from its tables; edit those, not this file).\n"
        f"# e2e/kind/run.sh uses it:\n"
        f"#   K8S_VERSION={version_label(minor)} e2e/kind/run.sh\n"
        f"# or by hand: kind create cluster --config e2e/kind/{config_path(minor).name}\n"
        f"# Node image {node.image.split('@')[0]} is kind {node.kind_version}'s (containerd {node.containerd}).\n"
        "# featureGates go to every component: only gates this version knows, none that is GA there\n"
        "# (the table in e2e/README.md).\n"
    )
    body = yaml.dump(cluster_config(minor), Dumper=_LiteralDumper, sort_keys=False, default_flow_style=False)
    return header + body


def _cell(gate: Gate, minor: int) -> str:
    stage = gate.at(minor)
    if stage is None:
        return "—"
    text = f"{stage.stage}, {'on' if stage.default else 'off'}{', locked' if stage.locked else ''}"
    return f"{text} → **true**" if gate.recipe_value(minor) else text


def render_table() -> str:
    heads = ["gate", *map(version_label, SUPPORTED_MINORS), "what needs it"]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for gate in GATES:
        why = gate.needed_for or UNUSED_WHY[gate.name]
        if gate.removal is not None:
            why += f" (removal announced for {version_label(gate.removal)})"
        if gate.components != "all":
            why += f"; components: {gate.components}"
        lines.append("| " + " | ".join([f"`{gate.name}`", *(_cell(gate, m) for m in SUPPORTED_MINORS), why]) + " |")
    for api in BETA_APIS:
        cells = [
            ("served, off → **true**" if api.served(m) else "not served") + (" (deprecated)" if m >= api.deprecated
                                                                             and api.served(m) else "")
            for m in SUPPORTED_MINORS
        ]
        why = f"{api.needed_for} (beta API: off by default; removed in {version_label(api.removed)})"
        lines.append("| " + " | ".join([f"runtime-config `{api.group_version}`", *cells, why]) + " |")
    for alpha in ALPHA_APIS:
        cells = ["served, off → **true**" if m in alpha.minors else "not enabled" for m in SUPPORTED_MINORS]
        why = f"{alpha.needed_for} (alpha API: off by default)"
        lines.append("| " + " | ".join([f"runtime-config `{alpha.group_version}`", *cells, why]) + " |")
    images = [f"`{NODE_IMAGES[m].image.split('@')[0].split(':')[1]}` (kind {NODE_IMAGES[m].kind_version})"
              for m in SUPPORTED_MINORS]
    lines.append("| " + " | ".join(["node image", *images, "pinned by digest in the config"]) + " |")
    return "\n".join(lines)


def readme_with_table(text: str) -> str:
    begin, end = text.find(TABLE_BEGIN), text.find(TABLE_END)
    if begin < 0 or end < begin:
        raise ValueError(f"{README}: the markers {TABLE_BEGIN!r} ... {TABLE_END!r} are missing")
    return text[: begin + len(TABLE_BEGIN)] + "\n" + render_table() + "\n" + text[end:]


def expected_files(kind_dir: Path = KIND_DIR, readme: Path = README) -> dict[Path, str]:
    files = {config_path(m, kind_dir): render_config(m) for m in SUPPORTED_MINORS}
    files[readme] = readme_with_table(readme.read_text())
    return files


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dra_sandbox.e2e.kindrecipe", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report files that differ; exit 1 if any")
    args = parser.parse_args(argv)
    stale = []
    for path, text in expected_files().items():
        if path.exists() and path.read_text() == text:
            continue
        stale.append(path)
        if not args.check:
            path.write_text(text)
    if args.check and stale:
        names = ", ".join(str(p.relative_to(REPO)) for p in stale)
        print(f"kindrecipe: out of date: {names}; run `python -m dra_sandbox.e2e.kindrecipe`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
