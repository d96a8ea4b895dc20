"""The plugin's RBAC is exactly what its code calls.

Every KubeRest call in dra_driver/ is found by reading the source (ast): the HTTP method and the path (module
constants and f-strings resolved, variables shown as `{…}`) give the RBAC verb, API group and resource. The
calls of the kubelet plugin (everything except `dra-driver explain`, which runs with the user's own kubeconfig)
must equal the rules the chart renders and the table in charts/dra-driver/README.md. A running plugin is also
checked: every request it sends is one of those.
"""

from __future__ import annotations

import ast
import functools
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.catalog import MigOffering
from dra_driver.k8s.client import JsonObject, KubeRest, WatchStream
from dra_driver.kubeletplugin.driver import ClaimRef
from dra_driver.nvml.factory import open_backend
from dra_driver.plugin.app import KubeletPlugin, PluginSettings
from dra_sandbox.apiserver import ApiServer
from dra_sandbox.objects import create_allocated_claim
from tests.chart.helm import CHART, REPO, VALUE_SETS, Helm, by_kind
from tests.polling import wait_for

PACKAGE = REPO / "dra_driver"
# Code that does not run as the plugin's service account.
NOT_THE_PLUGIN = {
    "dra_driver/commands/explain.py": "runs with the user's kubeconfig, read-only",
    "dra_driver/commands/status.py": "runs with the user's kubeconfig, read-only",
    "dra_driver/commands/poolstatus.py": "`status --pool-status`: the user's kubeconfig (one ResourcePoolStatusRequest, "
    "deleted again)",
    "dra_driver/commands/listing.py": "paged LISTs of explain and status: the user's kubeconfig, read-only",
    "dra_driver/k8s/liststream.py": "explain's watch-list and the paged LISTs of explain and status: the user's "
    "kubeconfig, read-only",
    "dra_driver/commands/health.py": "runs with the admin's kubeconfig: DeviceTaintRules (and `migrate`: Nodes)",
    "dra_driver/k8s/taintrules.py": "DeviceTaintRule discovery for `health` and `explain`: the user's kubeconfig",
    # The controller runs as its own service account; tests/chart/test_controller.py checks its role.
    "dra_driver/controller/reconcile.py": "runs as the controller",
    "dra_driver/controller/operator.py": "runs as the controller",
    "dra_driver/controller/leader.py": "runs as the controller",
}
CONTROLLER_FILES = ("dra_driver/controller/",)
# Whole packages that run as other components: the controller (its own account, tests/chart/test_controller.py)
# and the compute-domain plugin and IMEX daemons (their own roles, tests/chart/test_compute_domains.py).
OTHER_COMPONENTS = (*CONTROLLER_FILES, "dra_driver/computedomain/")
# request_bytes: `request` with the body undecoded; send_streaming: k8s/liststream.py's watch-list (a watch).
KUBE_REST_METHODS = {"request", "request_bytes", "get", "watch", "send_streaming"}
LOCAL_REST_METHODS = {"credentials", "close"}  # no request to the API server
REST_RECEIVER = re.compile(r"(^|\.)_?rest$")
PAGED_LISTS = {"list_all"}  # functions that LIST a collection through the KubeRest handle they are given
PUBLIC_INFO = {"/version"}  # non-resource URLs every authenticated user may GET (system:public-info-viewer)

Rule = tuple[str, str, str]  # (API group, resource, verb)


@dataclass(frozen=True)
class Call:
    where: str  # file:function
    method: str  # GET POST PUT PATCH DELETE WATCH
    path: str


@functools.cache
def _tree(file: Path) -> ast.Module:
    """One parse per file per test process: the scans below walk the whole package many times."""
    return ast.parse(file.read_text())


@functools.cache
def _constants() -> dict[str, str]:
    """Module-level string constants of the whole package (paths are built from them)."""
    out: dict[str, str] = {}
    aliases: list[tuple[str, str]] = []  # NAME = OTHER_NAME, resolved once every literal is known
    for file in PACKAGE.rglob("*.py"):
        if "_gen" in file.parts:
            continue
        for node in _tree(file).body:
            if not isinstance(node, ast.Assign):
                continue
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                for name in names:
                    assert out.get(name, node.value.value) == node.value.value, f"{name} is ambiguous"
                    out[name] = node.value.value
            elif isinstance(node.value, ast.Name):
                aliases += [(name, node.value.id) for name in names]
    for name, other in aliases:
        if other in out:
            assert out.get(name, out[other]) == out[other], f"{name} is ambiguous"
            out[name] = out[other]
    return out


def _render(expr: ast.expr, constants: dict[str, str]) -> str:
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value
    if isinstance(expr, ast.Name) and expr.id in constants:
        return constants[expr.id]
    if isinstance(expr, ast.JoinedStr):
        return "".join(_render(v.value if isinstance(v, ast.FormattedValue) else v, constants) for v in expr.values)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        return _render(expr.left, constants) + _render(expr.right, constants)
    return "{" + ast.unparse(expr) + "}"


def code_calls(only: tuple[str, ...] | None = None) -> list[Call]:
    """The plugin's calls; with `only` (path prefixes), the calls of those files instead."""
    return list(_scan(only))


@functools.cache
def _scan(only: tuple[str, ...] | None) -> tuple[Call, ...]:
    constants = _constants()
    calls: list[Call] = []
    for file in sorted(PACKAGE.rglob("*.py")):
        rel = file.relative_to(REPO).as_posix()
        if "_gen" in file.parts or rel == "dra_driver/k8s/client.py":
            continue
        if (rel in NOT_THE_PLUGIN or rel.startswith(OTHER_COMPONENTS)) if only is None else not rel.startswith(only):
            continue
        tree = _tree(file)
        for func in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]:
            for node in ast.walk(func):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in PAGED_LISTS
                        and node.args and REST_RECEIVER.search(ast.unparse(node.args[0]))):
                    # A paged LIST over the handle (k8s.liststream.list_all): GETs of the collection's path.
                    calls.append(Call(f"{rel}:{func.name}", "GET", _render(node.args[1], constants)))
                    continue
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                if not REST_RECEIVER.search(ast.unparse(node.func.value)):
                    continue
                name = node.func.attr
                if name in LOCAL_REST_METHODS:
                    continue
                assert name in KUBE_REST_METHODS, (
                    f"{rel}:{func.name}: unknown KubeRest method {name!r}: teach this test"
                )
                if name == "send_streaming":
                    method, path = "WATCH", node.args[1]
                elif name in ("request", "request_bytes"):
                    method_arg = node.args[0]
                    assert isinstance(method_arg, ast.Constant), f"{rel}:{func.name}: the HTTP method must be literal"
                    method, path = str(method_arg.value), node.args[1]
                else:
                    method, path = ("GET" if name == "get" else "WATCH"), node.args[0]
                calls.append(Call(f"{rel}:{func.name}", method, _render(path, constants)))
    return tuple(calls)


def rule_of(method: str, path: str) -> Rule | None:
    """RBAC (group, resource, verb) of one request; None for a public non-resource URL."""
    path = path.split("?", 1)[0]
    if path in PUBLIC_INFO:
        return None
    parts = path.strip("/").split("/")
    if parts[0] == "api":
        group, rest = "", parts[2:]
    else:
        assert parts[0] == "apis", path
        group, rest = parts[1], parts[3:]
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]
    resource, named = rest[0], len(rest) >= 2
    if len(rest) >= 3:
        resource = f"{resource}/{rest[2]}"
    verb = {
        ("GET", True): "get",
        ("GET", False): "list",
        ("WATCH", False): "watch",
        ("POST", False): "create",
        ("PUT", True): "update",
        ("PATCH", True): "patch",
        ("DELETE", True): "delete",
        ("DELETE", False): "deletecollection",
    }[(method, named)]
    return group, resource, verb


def derived_rules(only: tuple[str, ...] | None = None) -> set[Rule]:
    return {r for c in code_calls(only) if (r := rule_of(c.method, c.path)) is not None}


# Rules that no request maps to: the checks Kubernetes 1.36+ makes on a status write besides its own verb
# (KEP-4817 granular status authorization; docs/reference/claim-device-status.md). Held to exactly this by
# test_the_plugin_may_write_its_own_drivers_device_status.
SYNTHETIC: Final = {("resource.k8s.io", "resourceclaims/driver")}


def synthetic_rules(objects: list[dict[str, Any]], component: str = "kubelet-plugin") -> list[dict[str, Any]]:
    roles = by_kind(objects, "ClusterRole") + by_kind(objects, "Role")
    return [rule for role in roles if role["metadata"]["labels"].get("app.kubernetes.io/component") == component
            for rule in role["rules"] if {(g, r) for g in rule["apiGroups"] for r in rule["resources"]} & SYNTHETIC]


def granted(objects: list[dict[str, Any]], component: str = "kubelet-plugin") -> set[Rule]:
    """The rules of the roles of one component (label app.kubernetes.io/component), but the synthetic ones."""
    out: set[Rule] = set()
    roles = by_kind(objects, "ClusterRole") + by_kind(objects, "Role")
    for role in [r for r in roles if r["metadata"]["labels"].get("app.kubernetes.io/component") == component]:
        for rule in role["rules"]:
            if {(g, r) for g in rule["apiGroups"] for r in rule["resources"]} & SYNTHETIC:
                continue
            assert "nonResourceURLs" not in rule and "resourceNames" not in rule, rule
            out |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return out


def readme_rules() -> set[Rule]:
    """The `| request | verb | group | resource |` rows of the README's table of the plugin's requests."""
    text = (CHART / "README.md").read_text()
    section = text.split("#### Every API request the plugin makes", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\|[^|]+\|\s*`(\w+)`\s*\|\s*`([^`]*)`\s*\|\s*`([\w/]+)`\s*\|", section, re.MULTILINE)
    assert rows, "the README table of the plugin's requests is missing"
    return {(group.strip('"'), resource, verb) for verb, group, resource in rows}


def test_the_scan_sees_every_request_site() -> None:
    """Guards the scan itself: it finds the known call sites, and a KubeRest handle always goes by `rest`."""
    sites = {(c.where.split(":")[0], c.method) for c in code_calls()}
    assert ("dra_driver/slices/publisher.py", "POST") in sites
    assert ("dra_driver/kubeletplugin/claims.py", "GET") in sites
    assert ("dra_driver/plugin/app.py", "GET") in sites
    assert ("dra_driver/k8s/events.py", "POST") in sites and ("dra_driver/k8s/events.py", "PATCH") in sites
    assert not [c for c in code_calls() if c.where.startswith("dra_driver/plugin/health/")]  # no Node polling
    for file in PACKAGE.rglob("*.py"):
        if "_gen" in file.parts:
            continue
        for node in ast.walk(_tree(file)):
            if isinstance(node, ast.arg) and node.annotation is not None and "KubeRest" in ast.unparse(node.annotation):
                assert node.arg == "rest", f"{file}: a KubeRest parameter named {node.arg!r} escapes the scan"
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id == "rest":
                for target in node.targets:
                    if isinstance(target, ast.Attribute):
                        assert target.attr in ("rest", "_rest"), f"{file}: KubeRest kept as {target.attr!r}"


def test_derived_rules_are_what_the_plugin_needs_today() -> None:
    """The list written into charts/dra-driver/README.md, as derived from the code."""
    assert derived_rules() == {
        ("resource.k8s.io", "resourceslices", "list"),
        ("resource.k8s.io", "resourceslices", "watch"),
        ("resource.k8s.io", "resourceslices", "create"),
        ("resource.k8s.io", "resourceslices", "update"),
        ("resource.k8s.io", "resourceslices", "delete"),
        ("resource.k8s.io", "resourceslices", "get"),
        ("resource.k8s.io", "resourceclaims", "get"),
        ("resource.k8s.io", "resourceclaims", "list"),
        ("resource.k8s.io", "resourceclaims/status", "patch"),
        ("", "nodes", "get"),
        ("", "nodes", "patch"),  # the driver-state annotation (plugin/driverreport.py)
        ("", "events", "create"),
        ("", "events", "patch"),
    }


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_rendered_roles_grant_exactly_what_the_code_calls(helm: Helm, name: str) -> None:
    objects = helm.render(VALUE_SETS[name])
    # (The controller's leader-election Role is namespaced; test_controller.py checks it.)
    assert not [b for b in by_kind(objects, "RoleBinding")
                if b["metadata"]["labels"].get("app.kubernetes.io/component") == "kubelet-plugin"]
    assert granted(objects) == derived_rules()


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_the_plugin_may_write_its_own_drivers_device_status(helm: Helm, name: str) -> None:
    """From 1.36 a status write that changes status.devices entries of driver D also needs
    `associated-node:<verb>` on `resourceclaims/driver` named D (the plugin PATCHes): exactly that, no more."""
    objects = helm.render(VALUE_SETS[name])
    driver = next(d["spec"]["template"]["spec"]["containers"][0] for d in by_kind(objects, "DaemonSet"))
    names = [e.get("value") for e in driver.get("env") or [] if e.get("name") == "DRA_DRIVER_DRIVER_NAME"]
    expected = names[0] if names else DRIVER_NAME
    assert synthetic_rules(objects) == [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"],
                                         "resourceNames": [expected], "verbs": ["associated-node:patch"]}]
    # The controller's only one is for the compute-domain driver (tests/chart/test_compute_domains.py).
    assert all(r["resourceNames"] == ["compute-domain.gpu.dra.dev"] for r in synthetic_rules(objects, "controller"))


def test_readme_lists_exactly_what_the_code_calls() -> None:
    assert readme_rules() == derived_rules()


# --- a running plugin ---------------------------------------------------------------------------------------


class RecordingRest(KubeRest):
    """The plugin's own client, noting (method, path) of every request it sends."""

    sent: list[tuple[str, str]]

    def request(self, method: str, path: str, **kwargs: Any) -> JsonObject:
        self.sent.append((method, path))
        return super().request(method, path, **kwargs)

    def watch(self, path: str, **kwargs: Any) -> WatchStream:
        self.sent.append(("WATCH", path))
        return super().watch(path, **kwargs)


@pytest.fixture
def work() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="dra-rbac-"))
    (path / "boot_id").write_text("b\n")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_running_plugin_sends_only_requests_the_role_grants(helm: Helm, work: Path) -> None:
    """Start (publish), prepare a claim, the claim is deleted, the stale-claim sweep unprepares it, a slice is
    deleted by someone (repair), stop: every request the plugin sent maps to a rendered rule."""
    allowed = granted(helm.render())
    backend = open_backend("fake:l4x2")
    backend.init()
    with ApiServer() as srv:
        admin = srv.rest()
        admin.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
        rest = RecordingRest(srv.connection())
        rest.sent = []
        settings = PluginSettings(
            node_name="n1", driver_name=DRIVER_NAME, plugin_dir=work / "p", registry_dir=work / "r",
            cdi_root=work / "cdi", driver_root=Path("/"), host_driver_root=Path("/"), mig_offering=MigOffering.DYNAMIC,
            fake_cdi=True, healthz_port=None, boot_id_path=work / "boot_id",
        )  # fmt: skip
        plugin = KubeletPlugin(settings, nvml=backend, rest=rest)
        plugin.start()
        try:
            slices = "/apis/resource.k8s.io/v1/resourceslices"
            wait_for(lambda: bool(admin.request("GET", slices).get("items")), 20, "the plugin's slices")
            claim = create_allocated_claim(
                admin, namespace="default", name="c1", driver=DRIVER_NAME, pool="n1", devices=["gpu-0"]
            )
            ref = ClaimRef("default", "c1", claim["metadata"]["uid"])
            assert plugin.engine.prepare([ref])[ref.uid].error == ""
            stale = create_allocated_claim(
                admin, namespace="default", name="c2", driver=DRIVER_NAME, pool="n1", devices=["gpu-9"]
            )
            stale_ref = ClaimRef("default", "c2", stale["metadata"]["uid"])
            assert plugin.claim_engine.prepare([stale_ref])[stale_ref.uid].error  # a failed prepare: an Event
            assert plugin.events is not None and plugin.events.flush()
            assert ("POST", "/api/v1/namespaces/default/events") in rest.sent
            admin.request("DELETE", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c1")
            assert plugin.engine.recovery.cleanup_stale() == [ref.uid]
            victim = admin.request("GET", slices)["items"][0]["metadata"]["name"]
            admin.request("DELETE", f"{slices}/{victim}")
            wait_for(lambda: len(admin.request("GET", slices)["items"]) >= 1 and
                     victim not in {s["metadata"]["name"] for s in admin.request("GET", slices)["items"]},
                     20, "the deleted slice replaced")  # fmt: skip
        finally:
            plugin.stop()
    needed = {rule_of(m, p) for m, p in rest.sent} - {None}
    assert needed, "the plugin sent no request"
    assert needed <= allowed, f"not granted: {needed - allowed}"
    assert needed <= derived_rules(), f"the code scan missed: {needed - derived_rules()}"


def test_the_device_taint_admin_role_is_for_people_and_bound_to_nobody(helm: Helm) -> None:
    """`dra-driver health` runs with an admin's credentials: the chart offers the role, binds it to no subject, and
    no component's role holds a verb on devicetaintrules."""
    objects = helm.render()
    rules = granted(objects, "device-taint-admin")
    assert rules == {("resource.k8s.io", "devicetaintrules", v) for v in ("get", "list", "create", "update", "delete")} \
        | {("", "nodes", "list"), ("", "nodes", "patch")}
    role = next(r for r in by_kind(objects, "ClusterRole")
                if r["metadata"]["labels"].get("app.kubernetes.io/component") == "device-taint-admin")
    bindings = by_kind(objects, "ClusterRoleBinding") + by_kind(objects, "RoleBinding")
    assert not [b for b in bindings if b["roleRef"]["name"] == role["metadata"]["name"]]
    for component in ("kubelet-plugin", "controller"):
        assert not [r for r in granted(objects, component) if r[1] == "devicetaintrules"], component
