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


@pytest.mark.parametrize(
    ("sets", "env_value", "allows_nic"),
    [
        ((), "", False),
        (("passthrough.allowRebind={mlx5_core}",), "mlx5_core", True),
        (("passthrough.allowRebind={0x0200,nvme}",), "0x0200,nvme", True),
    ],
)
def test_allow_rebind_becomes_the_plugins_flag(
    helm: Helm, sets: tuple[str, ...], env_value: str, allows_nic: bool
) -> None:
    from dra_driver.pci.model import PciFunction, rebind_allowance

    env = _plugin_env(helm, ("passthrough.enabled=true", *sets))
    assert env["DRA_DRIVER_PASSTHROUGH_ALLOW_REBIND"] == env_value
    parser = plugin_parser()
    apply_env_defaults(parser, environ=env)
    allowance = rebind_allowance(parser.parse_args([]).passthrough_allow_rebind)
    nic = PciFunction("0000:19:00.0", "mlx5_core", None, 30, 0x020000, 0x15B3, 0x101D, "")
    assert allowance.allows(nic) is allows_nic


@pytest.mark.parametrize("bad", ["passthrough.allowRebind={0x2}", "passthrough.allowRebind={mlx5 core}"])
def test_the_schema_refuses_an_allow_rebind_entry_the_plugin_would(helm: Helm, bad: str) -> None:
    assert "allowRebind" in helm.fail([bad])
