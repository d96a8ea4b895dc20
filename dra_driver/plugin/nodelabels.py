"""Per-node overrides of the plugin's flags, from labels on its Node (read once at start; restart the node's plugin
pod after changing one). A bad value is ignored with a warning rather than keeping the plugin from starting.

    <driver>/sharing-mode: shares|exclusive                          overrides --sharing-mode
    <driver>/consumable-shares: disabled|memory|unlimited|<N>        overrides --consumable-shares
    <driver>/passthrough: true|false                                 turns --passthrough on or off for the node
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import structlog

from dra_driver.inventory.passthrough import PASSTHROUGH_LABEL, PassthroughScope, PassthroughSettings
from dra_driver.inventory.sharing import (
    NO_CONSUMABLE_SHARES,
    SharingMode,
    SharingSettings,
    SharingSettingsError,
    consumable_shares,
)
from dra_driver.k8s.client import JsonObject

log = structlog.get_logger(__name__)
SHARING_MODE_LABEL = "sharing-mode"  # node label <driver>/sharing-mode overrides --sharing-mode
CONSUMABLE_SHARES_LABEL = "consumable-shares"  # node label <driver>/consumable-shares overrides --consumable-shares


def node_labels(node: JsonObject | None) -> Mapping[str, object]:
    labels = ((node or {}).get("metadata") or {}).get("labels") or {}
    return labels if isinstance(labels, dict) else {}


def sharing_from_labels(driver_name: str, flags: SharingSettings, labels: Mapping[str, object]) -> SharingSettings:
    """`flags` with the node's sharing-mode and consumable-shares labels applied (they exclude each other, as the
    flags do: the one a label set wins over the flag)."""
    label = f"{driver_name}/{SHARING_MODE_LABEL}"
    sharing = flags
    value = labels.get(label)
    if value is not None:
        try:
            sharing = replace(sharing, mode=SharingMode(str(value)))
            log.info("sharing mode from the node label", label=label, mode=value)
        except ValueError:
            allowed = ", ".join(m.value for m in SharingMode)
            log.warning("ignoring a node label with an unknown sharing mode", label=label, value=value,
                        allowed=allowed)  # fmt: skip
    shares_label = f"{driver_name}/{CONSUMABLE_SHARES_LABEL}"
    shares_value = labels.get(shares_label)
    if shares_value is not None:
        try:
            parsed = consumable_shares(str(shares_value), flag=f"label {shares_label}")
            sharing = replace(sharing, consumable=parsed)
            log.info("consumable shares from the node label", label=shares_label, consumable_shares=shares_value)
        except SharingSettingsError as exc:
            log.warning("ignoring a node label with an unknown consumable-shares mode", label=shares_label,
                        value=shares_value, error=str(exc))  # fmt: skip
    if sharing.enabled and sharing.consumable.enabled:
        if shares_value is not None:
            sharing = replace(sharing, mode=SharingMode.EXCLUSIVE)
        else:
            sharing = replace(sharing, consumable=NO_CONSUMABLE_SHARES)
        log.info("sharing mode and consumable shares exclude each other; the node label's wins",
                 mode=sharing.mode.value, consumable_shares=sharing.consumable.label)  # fmt: skip
    return sharing


def passthrough_from_label(
    driver_name: str, flags: PassthroughSettings, labels: Mapping[str, object]
) -> PassthroughSettings:
    """`<driver>/passthrough: true|false` turns passthrough on or off for this node. `true` keeps the GPUs
    `--passthrough` lists, or takes every GPU when it lists none; a label value cannot hold a list (no commas), so
    per-GPU choices stay with the flag."""
    label = f"{driver_name}/{PASSTHROUGH_LABEL}"
    value = labels.get(label)
    if value is None:
        return flags
    text = str(value).strip().lower()
    if text in ("true", "all"):
        wanted = flags if flags.scope is PassthroughScope.LISTED else replace(flags, scope=PassthroughScope.ALL)
    elif text in ("false", "none"):
        wanted = replace(flags, scope=PassthroughScope.NONE, gpus=())
    else:
        log.warning("ignoring a node label with an unknown passthrough value", label=label, value=value,
                    allowed="true, false")  # fmt: skip
        return flags
    log.info("passthrough from the node label", label=label, passthrough=wanted.label)
    return wanted
