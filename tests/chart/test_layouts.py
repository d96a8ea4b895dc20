"""The documented driver-layout presets (charts/dra-driver/examples, docs/gpu-operator.md) under `helm template`:
mounts, flags and node selection of each, schema-valid objects, and values the plugin's own parser accepts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from dra_driver.commands.flags import apply_env_defaults
from dra_driver.plugin.driverlayout import (
    OPERATOR_DRIVER_ROOT,
    OPERATOR_TOOLKIT_DIR,
    PACKAGE_TOOLKIT_DIR,
    CdiHooks,
)
from tests import kubeschema
from tests.chart.helm import CHART, KUBE_VERSIONS, REPO, Helm, env_map, host_paths, one, plugin_container
from tests.chart.test_render import plugin_parser, resolved_env

EXAMPLES = CHART / "examples"
PRESETS = {
    "host-driver": EXAMPLES / "host-driver-values.yaml",
    "gpu-operator": EXAMPLES / "gpu-operator-values.yaml",
}
# What each preset must render: host driver root, toolkit dir on the node, node selector.
EXPECTED = {
    "host-driver": ("/", PACKAGE_TOOLKIT_DIR, None),
    "gpu-operator": (OPERATOR_DRIVER_ROOT, OPERATOR_TOOLKIT_DIR, {"gpu.dra.dev/kubelet-plugin": "true"}),
}


def render_preset(helm: Helm, name: str, sets: tuple[str, ...] = (), kube_version: str = KUBE_VERSIONS[0]) -> list[
    dict[str, Any]
]:
    return helm.render(sets, kube_version=kube_version, extra=("-f", str(PRESETS[name])))


def plugin_view(daemonset: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, Any]]:
    container = plugin_container(daemonset)
    env = {k: v.get("value") for k, v in env_map(container).items()}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    return env, mounts, host_paths(daemonset)


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_render_schema_valid_objects(helm: Helm, name: str, kube_version: str) -> None:
    objects = render_preset(helm, name, kube_version=kube_version)
    assert {o["kind"] for o in objects} >= {"DaemonSet", "ClusterRole", "DeviceClass"}
    for obj in objects:
        used = kubeschema.validate(obj, kube_version)
        assert used == kube_version.rsplit(".", 1)[0], f"{name}: {obj['kind']}"


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_mount_the_driver_root_and_the_toolkit_dir_read_only(helm: Helm, name: str) -> None:
    driver_root, toolkit_dir, _ = EXPECTED[name]
    env, mounts, hosts = plugin_view(one(render_preset(helm, name), "DaemonSet"))
    assert hosts["driver-root"]["path"] == driver_root
    assert env["DRA_DRIVER_DRIVER_ROOT"] == mounts["driver-root"]["mountPath"] == "/driver-root"
    assert env["DRA_DRIVER_HOST_DRIVER_ROOT"] == driver_root
    assert mounts["driver-root"]["readOnly"] is True
    assert mounts["driver-root"]["mountPropagation"] == "HostToContainer"
    assert hosts["toolkit-root"] == {"path": toolkit_dir, "type": "DirectoryOrCreate"}
    assert env["DRA_DRIVER_TOOLKIT_DIR"] == mounts["toolkit-root"]["mountPath"] == "/toolkit-root"
    assert mounts["toolkit-root"]["readOnly"] is True
    assert env["DRA_DRIVER_HOST_TOOLKIT_DIR"] == toolkit_dir
    assert env["DRA_DRIVER_CDI_HOOKS"] == "auto"


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_flags_parse_into_the_layout_check_settings(helm: Helm, name: str) -> None:
    """The rendered env through the plugin's own parser gives the layout check exactly the preset's layout."""
    driver_root, toolkit_dir, _ = EXPECTED[name]
    container = plugin_container(one(render_preset(helm, name), "DaemonSet"))
    parser = plugin_parser()
    apply_env_defaults(parser, environ=resolved_env(container, node_name="gpu-node-1"))
    args = parser.parse_args([])
    assert (args.driver_root, args.host_driver_root) == ("/driver-root", driver_root)
    assert CdiHooks(args.cdi_hooks) is CdiHooks.AUTO
    assert (args.toolkit_dir, args.host_toolkit_dir) == ("/toolkit-root", toolkit_dir)


def test_gpu_operator_preset_selects_the_dra_nodes_and_keeps_the_gpu_affinity(helm: Helm) -> None:
    pod = one(render_preset(helm, "gpu-operator"), "DaemonSet")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == EXPECTED["gpu-operator"][2]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert sorted(e["key"] for t in terms for e in t["matchExpressions"]) == [
        "feature.node.kubernetes.io/pci-10de.present",
        "nvidia.com/gpu.present",
    ]
    host = one(render_preset(helm, "host-driver"), "DaemonSet")["spec"]["template"]["spec"]
    assert "nodeSelector" not in host


def test_the_driver_managers_label_is_the_one_the_docs_and_preset_name() -> None:
    """The label the Operator's driver manager pauses (NODE_LABEL_FOR_GPU_POD_EVICTION) must be the preset's
    nodeSelector, or the plugin keeps running through a driver upgrade."""
    doc = (REPO / "docs" / "gpu-operator.md").read_text()
    [label] = EXPECTED["gpu-operator"][2] or {}
    assert f"NODE_LABEL_FOR_GPU_POD_EVICTION --set driver.manager.env[0].value={label}" in PRESETS[
        "gpu-operator"
    ].read_text()
    assert re.search(rf"NODE_LABEL_FOR_GPU_POD_EVICTION.*\n.*value: {re.escape(label)}", doc)
    assert f"kubectl label node <node> {label}=true nvidia.com/gpu.deploy.device-plugin=false" in doc


def test_hooks_off_by_default_mounts_no_toolkit_dir(helm: Helm) -> None:
    env, mounts, hosts = plugin_view(one(helm.render(), "DaemonSet"))
    assert env["DRA_DRIVER_CDI_HOOKS"] == "off" and env["DRA_DRIVER_TOOLKIT_DIR"] == ""
    assert "toolkit-root" not in mounts and "toolkit-root" not in hosts


def test_fake_gpus_never_look_for_hooks(helm: Helm) -> None:
    env, mounts, hosts = plugin_view(one(helm.render(["nvml=fake:l4x2", "containerToolkit.cdiHooks=on"]), "DaemonSet"))
    assert env["DRA_DRIVER_CDI_HOOKS"] == "off" and env["DRA_DRIVER_TOOLKIT_DIR"] == ""
    assert "toolkit-root" not in mounts and "toolkit-root" not in hosts and "driver-root" not in hosts


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (("containerToolkit.cdiHooks=yes",), r"cdiHooks.*auto.*on.*off"),
        (("containerToolkit.cdiHooks=false",), r"cdiHooks.*(string|boolean)"),  # an unquoted YAML `off`
        (("containerToolkit.installDir=usr/bin",), r"installDir.*pattern"),
        (("containerToolkit.hookDir=/usr/bin",), r"(?i)additional propert.*hookDir"),
    ],
)
def test_bad_toolkit_values_are_rejected_by_the_schema(helm: Helm, sets: tuple[str, ...], expected: str) -> None:
    message = helm.fail(sets)
    assert "schema" in message and re.search(expected, message, re.DOTALL), message


def test_examples_are_only_values_the_chart_knows(helm: Helm, tmp_path: Path) -> None:
    # The schema forbids unknown keys, so a preset that rendered above uses only real values; this proves the
    # schema really reads the file (a typo in a preset fails).
    broken = tmp_path / "typo.yaml"
    broken.write_text(PRESETS["gpu-operator"].read_text().replace("installDir:", "installdir:"))
    proc = helm.run(*helm.template_args(extra=("-f", str(broken))), check=False)
    assert proc.returncode != 0 and "installdir" in proc.stderr
