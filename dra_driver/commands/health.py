"""`dra-driver health taint|clear|show|migrate`: an admin's device taints, as DeviceTaintRules (KEP-5055).

- `taint --node N --device D [--effect NoSchedule|NoExecute|None] [--key K] [--value V] [--reason TEXT]` creates
  (or replaces) the DeviceTaintRule `<driver>.admin.<node>.<device>` selecting driver + pool (the node's name, the
  pool this driver publishes for it) + device, with one taint, by default `<driver>/admin=unhealthy:NoSchedule`.
  NoSchedule keeps new claims off the device; NoExecute also evicts the pods whose claims use it (unless a request
  tolerates the taint, for `tolerationSeconds` if given); None changes nothing and makes the eviction controller
  report, in the rule's status, what NoExecute would evict (a dry run). `--reason` is kept in the rule's annotation
  `<driver>/reason`.
- `clear --node N --device D` deletes that rule (nothing to do when there is none).
- `show --node N` lists the DeviceTaintRules that select any device of the node's pool (the admin's and others').
- `migrate` converts the Node annotation `<driver>/device-health` of earlier releases, on every Node, once:
  `<device>=unhealthy` entries become rules (NoSchedule, as the plugin applied them) and the annotation is
  removed; one-shot `healthy@<token>` entries were applied when written and are dropped (docs/operations.md,
  "Upgrading: admin overrides").

The API version is found by discovery (v1, then v1beta2, then v1alpha3: `dra_driver.k8s.taintrules`); a cluster
that serves none gets an error naming the gate to enable. Runs with the admin's kubeconfig: it needs create, get,
update, delete and list on `devicetaintrules` (resource.k8s.io), and for `migrate` list and patch on nodes. The
kubelet plugin needs none of these and no longer reads its Node for overrides.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Mapping
from typing import Any, Final

from dra_driver import defaults
from dra_driver.commands.flags import Flag, FlagParser, add_flags
from dra_driver.commands.listing import list_all
from dra_driver.k8s.client import ApiError, JsonObject, KubeRest, connect
from dra_driver.k8s.kubeconfig import KubeconfigError
from dra_driver.k8s.names import DNS_SUBDOMAIN_MAX, dns_label_problems, label_value_problems, qualified_name_problems
from dra_driver.k8s.taintrules import TaintRulesUnavailable, taint_rules_path
from dra_driver.plugin.health.healing import OVERRIDE_UNHEALTHY, annotation_key, parse_overrides

ACTIONS: Final = ("taint", "clear", "show", "migrate")
EFFECTS: Final = ("NoSchedule", "NoExecute", "None")
DEFAULT_EFFECT: Final = "NoSchedule"
DEFAULT_VALUE: Final = OVERRIDE_UNHEALTHY
MANAGED_BY: Final = "dra-driver-health"
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
CONFLICT_RETRIES: Final = 5


FLAGS: Final = (
    Flag("action", choices=ACTIONS,
         help="taint | clear a device, show a node's rules, or migrate the Node annotations of earlier releases"),
    Flag("--node", default="", help="the node (its pool has the node's name)"),
    Flag("--device", default="", help="the device, as published (e.g. gpu-3, gpu-0-mig-1g10gb-19-0)"),
    Flag("--effect", default=DEFAULT_EFFECT, choices=EFFECTS,
         help="NoSchedule: no new claims; NoExecute: also evict pods using it; None: report only"),
    Flag("--key", default="", help="taint key (default <driver>/admin)"),
    Flag("--value", default=DEFAULT_VALUE, help="taint value"),
    Flag("--reason", default="", help="why, kept in the rule's annotation <driver>/reason"),
    Flag("--driver-name", default=defaults.DRIVER_NAME, help="DRA driver name"),
    Flag("--kubeconfig", help="kubeconfig (default: in-cluster, then $KUBECONFIG)"),
)


def add_arguments(parser: FlagParser) -> None:
    add_flags(parser, FLAGS)


# --- pure: names and objects ----------------------------------------------------------------------------------


def rule_name(driver: str, node: str, device: str) -> str:
    """`<driver>.admin.<node>.<device>`: the same for every run, so `clear` finds what `taint` made. Too long for a
    name (253 characters) only with very long node names: then the node part is shortened and a hash added."""
    name = f"{driver}.admin.{node}.{device}"
    if len(name) <= DNS_SUBDOMAIN_MAX:
        return name
    digest = hashlib.sha256(f"{node}/{device}".encode()).hexdigest()[:10]
    room = DNS_SUBDOMAIN_MAX - len(f"{driver}.admin..{device}") - len(digest) - 1
    return f"{driver}.admin.{node[:room].rstrip('.-')}-{digest}.{device}"


def taint_key(driver: str, key: str) -> str:
    return key or f"{driver}/admin"


def problems_of(action: str, node: str, device: str, key: str, value: str) -> list[str]:
    """What is wrong with the flags, naming each and its fix. Pure."""
    out: list[str] = []
    if action in ("taint", "clear", "show") and not node:
        out.append(f"--node is required for {action}")
    if action in ("taint", "clear"):
        if not device:
            out.append(f"--device is required for {action}")
        else:
            out += [f"--device {device!r}: {p}" for p in dns_label_problems(device)]
    if action == "taint":
        out += [f"--key {key!r}: {p}" for p in qualified_name_problems(key)]
        if value:
            out += [f"--value {value!r}: {p}" for p in label_value_problems(value)]
    return out


def taint_rule(api_version: str, driver: str, node: str, device: str, *, effect: str, key: str, value: str,
               reason: str) -> JsonObject:
    """The DeviceTaintRule for one device of one node. `timeAdded` is left to the API server (the time of the
    write: eviction with `tolerationSeconds` counts from it)."""
    meta: JsonObject = {"name": rule_name(driver, node, device), "labels": {MANAGED_BY_LABEL: MANAGED_BY}}
    if reason:
        meta["annotations"] = {f"{driver}/reason": reason}
    taint: JsonObject = {"key": taint_key(driver, key), "effect": effect}
    if value:
        taint["value"] = value
    return {
        "apiVersion": api_version,
        "kind": "DeviceTaintRule",
        "metadata": meta,
        "spec": {"deviceSelector": {"driver": driver, "pool": node, "device": device}, "taint": taint},
    }


def selects_node(rule: Mapping[str, Any], driver: str, node: str) -> bool:
    """Whether the rule can select devices of this node's pool (fields it leaves unset match anything)."""
    selector = (rule.get("spec") or {}).get("deviceSelector")
    if not isinstance(selector, Mapping):
        return False
    return selector.get("driver") in (None, driver) and selector.get("pool") in (None, node)


def describe(rule: Mapping[str, Any]) -> str:
    spec = rule.get("spec") or {}
    selector = spec.get("deviceSelector") or {}
    taint = spec.get("taint") or {}
    where = "/".join(str(selector.get(k) or "*") for k in ("driver", "pool", "device"))
    value = f"={taint['value']}" if taint.get("value") else ""
    conditions = [c for c in (rule.get("status") or {}).get("conditions") or [] if isinstance(c, Mapping)]
    state = "; ".join(f"{c.get('type')}={c.get('status')} ({c.get('reason')}): {c.get('message')}"
                      for c in conditions)
    return (f"{(rule.get('metadata') or {}).get('name')}: {where} {taint.get('key')}{value}:{taint.get('effect')} "
            f"since {taint.get('timeAdded', '?')}" + (f"; {state}" if state else ""))


# --- I/O --------------------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    problems = problems_of(args.action, args.node, args.device, taint_key(args.driver_name, args.key), args.value)
    if problems:
        for problem in problems:
            print(f"dra-driver health {args.action}: {problem}", file=sys.stderr)
        return 2
    try:
        rest = connect(args.kubeconfig, component="health")
    except KubeconfigError as exc:
        print(f"dra-driver health: {exc}", file=sys.stderr)
        return 1
    try:
        path = taint_rules_path(rest)
        if args.action == "taint":
            return taint(rest, path, args.driver_name, args.node, args.device, effect=args.effect, key=args.key,
                         value=args.value, reason=args.reason)
        if args.action == "clear":
            return clear(rest, path, args.driver_name, args.node, args.device)
        if args.action == "show":
            return show(rest, path, args.driver_name, args.node)
        return migrate(rest, path, args.driver_name)
    except TaintRulesUnavailable as exc:
        print(f"dra-driver health {args.action}: {exc}", file=sys.stderr)
        return 1
    except ApiError as exc:
        print(f"dra-driver health {args.action}: API request failed: {exc}", file=sys.stderr)
        return 1


def _api_version(path: str) -> str:
    group, version = path.split("/")[2:4]
    return f"{group}/{version}"


def put_rule(rest: KubeRest, path: str, rule: JsonObject) -> JsonObject:
    """Create the rule, or replace the spec of the one already there (same name)."""
    name = rule["metadata"]["name"]
    for _ in range(CONFLICT_RETRIES):
        try:
            created: JsonObject = rest.request("POST", path, body=rule)
            return created
        except ApiError as exc:
            if exc.status != 409:
                raise
        current = rest.get(f"{path}/{name}")
        if current is None:
            continue  # deleted meanwhile: create again
        meta = {**(current.get("metadata") or {}), **rule["metadata"]}
        try:
            updated: JsonObject = rest.request("PUT", f"{path}/{name}", body={**rule, "metadata": meta})
            return updated
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise
    raise ApiError(409, f"DeviceTaintRule {name} kept changing; try again")


def taint(rest: KubeRest, path: str, driver: str, node: str, device: str, *, effect: str, key: str, value: str,
          reason: str) -> int:
    rule = taint_rule(_api_version(path), driver, node, device, effect=effect, key=key, value=value, reason=reason)
    stored = put_rule(rest, path, rule)
    print(describe(stored))
    if effect == "NoExecute":
        print("pods whose claims use the device and do not tolerate the taint are evicted by kube-controller-manager")
    return 0


def clear(rest: KubeRest, path: str, driver: str, node: str, device: str) -> int:
    name = rule_name(driver, node, device)
    try:
        rest.request("DELETE", f"{path}/{name}")
    except ApiError as exc:
        if not exc.not_found:
            raise
        print(f"no DeviceTaintRule {name}: {node}/{device} has no admin taint")
        return 0
    print(f"DeviceTaintRule {name} deleted")
    return 0


def show(rest: KubeRest, path: str, driver: str, node: str) -> int:
    rules = [r for r in list_all(rest, path) if selects_node(r, driver, node)]
    for rule in rules:
        print(describe(rule))
    if not rules:
        print(f"no DeviceTaintRule selects devices of {node}")
    return 0


def migrate(rest: KubeRest, path: str, driver: str) -> int:
    """The Node annotations of releases before DeviceTaintRules, converted once (see the module docstring)."""
    key = annotation_key(driver)
    converted = 0
    for node in list_all(rest, "/api/v1/nodes"):
        meta = node.get("metadata") or {}
        text = str((meta.get("annotations") or {}).get(key) or "")
        if not text:
            continue
        name = str(meta.get("name"))
        entries, bad = parse_overrides(text)
        for problem in bad:
            print(f"{name}: dropping a bad entry of {key}: {problem}", file=sys.stderr)
        for device, value in sorted(entries.items()):
            if value != OVERRIDE_UNHEALTHY or dns_label_problems(device):
                continue
            rule = taint_rule(_api_version(path), driver, name, device, effect=DEFAULT_EFFECT, key="",
                              value=DEFAULT_VALUE, reason=f"converted from the Node annotation {key}")
            print(describe(put_rule(rest, path, rule)))
            converted += 1
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"), "annotations": {key: None}}}
        try:
            rest.request("PATCH", f"/api/v1/nodes/{name}", body=patch, content_type="application/merge-patch+json")
        except ApiError as exc:
            if exc.status != 409:
                raise
            print(f"{name}: the Node changed meanwhile; run migrate again to remove {key}", file=sys.stderr)
            continue
        print(f"{name}: {key} removed")
    print(f"{converted} admin taint(s) converted to DeviceTaintRules")
    return 0
