"""values.yaml cannot import Python: hold the chart's defaults equal to dra_driver.defaults, the one source."""

from __future__ import annotations

from typing import Any

import yaml

from dra_driver import defaults
from dra_driver.commands import kubelet_plugin
from dra_driver.commands.flags import FlagParser
from dra_driver.inventory import sharing
from tests.chart.helm import CHART


def values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return loaded


def test_chart_values_equal_the_product_defaults() -> None:
    v = values()
    assert v["driverName"] == defaults.DRIVER_NAME
    assert v["healthzPort"] == defaults.HEALTHZ_PORT
    assert v["metrics"]["port"] == defaults.METRICS_PORT
    assert v["metrics"]["usageIntervalSeconds"] == defaults.USAGE_INTERVAL_S
    assert v["cleanupIntervalSeconds"] == defaults.CLEANUP_INTERVAL_S
    assert v["rediscoveryIntervalSeconds"] == defaults.REDISCOVERY_INTERVAL_S
    assert v["shutdownGraceSeconds"] == defaults.SHUTDOWN_GRACE_S
    assert v["driverWait"]["intervalSeconds"] == defaults.DRIVER_WAIT_MAX_INTERVAL_S
    assert v["cdiRoot"] == str(defaults.CDI_ROOT)
    assert f"{v['kubeletDir']}/plugins" == str(defaults.KUBELET_PLUGINS_DIR)
    assert f"{v['kubeletDir']}/plugins_registry" == str(defaults.KUBELET_REGISTRY_DIR)
    assert v["sharing"] == {
        "mode": sharing.SharingMode.EXCLUSIVE.value,
        "sharedGpus": [],
        "memoryStep": sharing.DEFAULT_MEMORY_STEP,
        "memoryDefault": sharing.DEFAULT_MEMORY_DEFAULT,
        "computeDefault": sharing.DEFAULT_COMPUTE_DEFAULT,
        "consumableShares": sharing.ConsumableMode.DISABLED.value,
    }
    assert v["deviceClasses"]["extendedResourceName"] == defaults.EXTENDED_RESOURCE_NAME
    assert v["controller"]["healthzPort"] == defaults.CONTROLLER_HEALTHZ_PORT
    assert v["healthMonitor"]["healAfterSeconds"] == defaults.HEALTH_HEAL_AFTER_S
    assert v["healthMonitor"]["healAfterMaxSeconds"] == defaults.HEALTH_HEAL_AFTER_MAX_S
    assert v["healthMonitor"]["checkIntervalSeconds"] == defaults.HEALTH_CHECK_INTERVAL_S
    assert v["controller"]["resyncIntervalSeconds"] == defaults.CONTROLLER_RESYNC_S


def test_plugin_flags_default_to_the_product_defaults() -> None:
    parser = FlagParser()
    kubelet_plugin.add_arguments(parser)
    args = parser.parse_args(["--node-name", "n"])
    assert args.driver_name == defaults.DRIVER_NAME
    assert args.healthz_port == defaults.HEALTHZ_PORT
    assert (args.metrics_port, args.usage_interval) == (defaults.METRICS_PORT, defaults.USAGE_INTERVAL_S)
    assert args.registry_dir == str(defaults.KUBELET_REGISTRY_DIR)
    assert args.cdi_root == str(defaults.CDI_ROOT)
    assert args.boot_id_path == str(defaults.BOOT_ID_PATH)
    assert (args.cleanup_interval, args.rediscovery_interval, args.shutdown_grace) == (
        defaults.CLEANUP_INTERVAL_S,
        defaults.REDISCOVERY_INTERVAL_S,
        defaults.SHUTDOWN_GRACE_S,
    )
    assert (args.health_heal_after, args.health_heal_after_max, args.health_check_interval) == (
        defaults.HEALTH_HEAL_AFTER_S,
        defaults.HEALTH_HEAL_AFTER_MAX_S,
        defaults.HEALTH_CHECK_INTERVAL_S,
    )
    assert args.plugin_dir is None  # derived: defaults.plugin_dir(driver name)
    assert (args.sharing_mode, args.shared_gpus, args.share_memory_step, args.share_memory_default) == (
        sharing.SharingMode.EXCLUSIVE.value,
        "",
        sharing.DEFAULT_MEMORY_STEP,
        sharing.DEFAULT_MEMORY_DEFAULT,
    )
    assert int(args.share_compute_default) == sharing.DEFAULT_COMPUTE_DEFAULT
    assert args.consumable_shares == sharing.ConsumableMode.DISABLED.value
    assert defaults.plugin_dir("x.example.com") == defaults.KUBELET_PLUGINS_DIR / "x.example.com"
