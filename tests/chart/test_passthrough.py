"""The chart's passthrough values (docs/passthrough.md): off by default, the flag the plugin gets, the class it installs,
and the values the schema refuses."""

from __future__ import annotations

import pytest

from dra_driver.commands.flags import apply_env_defaults
from dra_driver.inventory.passthrough import NO_PASSTHROUGH, PassthroughScope, passthrough_settings
from tests.chart.helm import Helm, by_kind, one, plugin_container
from tests.chart.test_render import plugin_parser, resolved_env


def _plugin_env(helm: Helm, sets: tuple[str, ...]) -> dict[str, str]:
    return resolved_env(plugin_container(one(helm.render(sets), "DaemonSet")), node_name="n1")


@pytest.mark.parametrize(
    ("sets", "flag", "groups"),
    [
        ((), "none", "off"),
        (("passthrough.enabled=true",), "all", "off"),
        (("passthrough.enabled=true", "passthrough.gpus={0,GPU-12ab,0000:53:00.0}"), "0,GPU-12ab,0000:53:00.0", "off"),
        (("passthrough.gpus={0}",), "none", "off"),  # listed but not enabled: still off
        (("passthrough.enabled=true", "passthrough.compatibilityGroups=true"), "all", "on"),
    ],
)
def test_values_become_the_plugins_flags(helm: Helm, sets: tuple[str, ...], flag: str, groups: str) -> None:
    env = _plugin_env(helm, sets)
    assert env["DRA_DRIVER_PASSTHROUGH"] == flag
    assert env["DRA_DRIVER_COMPATIBILITY_GROUPS"] == groups
    parser = plugin_parser()
    apply_env_defaults(parser, environ=env)
    args = parser.parse_args([])
    settings = passthrough_settings(args.passthrough, compatibility_groups=args.compatibility_groups == "on")
    if flag == "none":
        assert settings == NO_PASSTHROUGH
    else:
        assert settings.scope is (PassthroughScope.ALL if flag == "all" else PassthroughScope.LISTED)
        assert settings.compatibility_groups is (groups == "on")


def test_the_vfio_class_is_installed_and_selects_type_vfio_only(helm: Helm) -> None:
    classes = {c["metadata"]["name"]: c for c in by_kind(helm.render(()), "DeviceClass")}
    assert classes["vfio.gpu.dra.dev"]["spec"]["selectors"] == [
        {"cel": {"expression": "device.driver == 'gpu.dra.dev' && device.attributes['gpu.dra.dev'].type == 'vfio'"}}
    ]
    assert "extendedResourceName" not in classes["vfio.gpu.dra.dev"]["spec"]
    main = classes["gpu.dra.dev"]["spec"]["selectors"][0]["cel"]["expression"]
    assert main.endswith(".type == 'gpu'")  # the main class never selects a VFIO device


@pytest.mark.parametrize("bad", ["passthrough.gpus={MIG-1}", "passthrough.gpus={gpu0}", "passthrough.enable=true"])
def test_the_schema_refuses_what_the_plugin_would(helm: Helm, bad: str) -> None:
    assert "passthrough" in helm.fail([bad])
