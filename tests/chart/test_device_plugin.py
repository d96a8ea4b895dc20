"""The chart's devicePlugin values (docs/device-plugin.md): off by default and nothing mounted; on, the plugin gets
`--device-plugin on`, the kubelet's device-plugins dir and its PodResources socket (under kubeletDir)."""

from __future__ import annotations

import argparse
from pathlib import Path

from dra_driver.commands.deviceplugin_flags import device_plugin_from_args
from dra_driver.commands.flags import apply_env_defaults
from tests.chart.helm import Helm, host_paths, one, plugin_container
from tests.chart.test_render import plugin_parser, resolved_env


def _args(env: dict[str, str]) -> argparse.Namespace:
    parser = plugin_parser()
    apply_env_defaults(parser, env)
    return parser.parse_args([])


def test_off_by_default_with_nothing_of_the_kubelets_mounted(helm: Helm) -> None:
    daemonset = one(helm.render(()), "DaemonSet")
    assert device_plugin_from_args(_args(resolved_env(plugin_container(daemonset), node_name="n1"))) is None
    assert not {"device-plugins", "pod-resources"} & set(host_paths(daemonset))


def test_on_mounts_the_kubelets_dirs_and_sets_the_flags(helm: Helm) -> None:
    daemonset = one(helm.render(("devicePlugin.enabled=true", "kubeletDir=/var/lib/k0s/kubelet",
                                 "devicePlugin.resourceName=example.com/gpu")), "DaemonSet")  # fmt: skip
    container = plugin_container(daemonset)
    settings = device_plugin_from_args(_args(resolved_env(container, node_name="n1")))
    assert settings is not None
    # The device manager's dir is fixed whatever the kubelet's root dir; PodResources follows the root dir.
    assert settings.directory == Path("/var/lib/kubelet/device-plugins")
    assert settings.pod_resources_socket == Path("/var/lib/k0s/kubelet/pod-resources/kubelet.sock")
    assert settings.resource_name == "example.com/gpu"
    paths = host_paths(daemonset)
    assert paths["device-plugins"] == {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}
    assert paths["pod-resources"] == {"path": "/var/lib/k0s/kubelet/pod-resources", "type": "Directory"}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["device-plugins"] == "/var/lib/kubelet/device-plugins"
    assert mounts["pod-resources"] == "/var/lib/k0s/kubelet/pod-resources"


def test_the_schema_refuses_a_resource_name_without_a_domain(helm: Helm) -> None:
    failed = helm.fail(("devicePlugin.resourceName=gpu",))
    assert "devicePlugin.resourceName" in failed or "resourceName" in failed
