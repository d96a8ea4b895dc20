"""The kind recipe's facts, per Kubernetes version: feature gates, beta APIs, node images (e2e/kind, e2e/README.md).

A kind cluster passes `featureGates` to every component (kube-apiserver, kube-controller-manager,
kube-scheduler, kubelet, kube-proxy) and `runtimeConfig` to kube-apiserver's `--runtime-config`
(kubernetes-sigs/kind `pkg/cluster/internal/kubeadm/config.go`). A component refuses to start when a gate it
does not know is set (a gate added after its version, or one removed), and when a gate locked to its default
is set to the other value; setting a GA gate locked to `true` to `true` is allowed until the gate is removed.
So each version gets its own config, generated from the tables in kindrecipe.yaml beside this module (which
names their upstream sources):

    python -m dra_sandbox.e2e.kindrecipe           # rewrite e2e/kind/cluster-<version>.yaml and the README table
    python -m dra_sandbox.e2e.kindrecipe --check   # exit 1 when they differ from these tables (a test runs it)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

import yaml

from dra_driver.strictdecode import CamelModel, Decoder, Items, Opt, load_yaml

SUPPORTED_MINORS: tuple[int, ...] = (34, 35, 36, 37)
DEFAULT_MINOR = 36  # the newest version with a released kind (v0.32.0)

StageName = Literal["alpha", "beta", "GA"]


# The fields are described in kindrecipe.yaml.
class Stage(CamelModel):
    since: int
    stage: StageName
    default: bool
    locked: bool = False


class Gate(CamelModel):
    name: str
    stages: Items[Stage]
    needed_for: str
    removal: Opt[int] = None
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


class BetaApi(CamelModel):
    group_version: str
    introduced: int
    deprecated: int
    removed: int
    needed_for: str

    def served(self, minor: int) -> bool:
        return self.introduced <= minor < self.removed


class AlphaApi(CamelModel):
    group_version: str
    minors: Items[int]
    needed_for: str


class NodeImage(CamelModel):
    image: str
    kind_version: str
    containerd: str


class _Facts(CamelModel):
    gates: Items[Gate]
    beta_apis: Items[BetaApi]
    alpha_apis: Items[AlphaApi]
    node_images: dict[int, NodeImage]


FACTS_FILE = Path(__file__).with_name("kindrecipe.yaml")


def load_facts(path: Path = FACTS_FILE) -> _Facts:
    """The tables of kindrecipe.yaml (package data); an error names the field that is off."""
    return Decoder[_Facts](_Facts)(load_yaml(path.read_text(encoding="utf-8")), at=path.name)


_FACTS = load_facts()
GATES: tuple[Gate, ...] = _FACTS.gates
UNUSED_WHY: Mapping[str, str] = {
    "DRADeviceBindingConditions": "not used: the driver publishes no binding conditions",
}

BETA_APIS: tuple[BetaApi, ...] = _FACTS.beta_apis
ALPHA_APIS: tuple[AlphaApi, ...] = _FACTS.alpha_apis
NODE_IMAGES: Mapping[int, NodeImage] = _FACTS.node_images

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
