"""The chart's ComputeDomain parts (computeDomains.enabled, default on): the two CRDs agree with the product's
parser (dra_driver/computedomain/model.py), the DeviceClasses are the sandbox's and select exactly the devices
their names say, the controller runs with flags its parser accepts, the compute-domain plugin is the DaemonSet's
second container, and every role grants what its component's code calls (where that code is in the tree)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.cel import DeviceInput, DraCelEnvironment
from dra_driver.commands import controller as controller_command
from dra_driver.commands.flags import FlagParser, apply_env_defaults
from dra_driver.computedomain import names
from dra_driver.computedomain.model import AllocationMode, DomainNode
from dra_sandbox.apiserver.validation import validate_device_class
from dra_sandbox.deviceclasses import compute_domain_device_classes
from tests.chart.helm import CHART, REPO, Helm, by_kind, of_component, one
from tests.chart.test_deviceclasses import without_chart_labels
from tests.chart.test_rbac import SYNTHETIC, derived_rules, granted, synthetic_rules

CRDS = CHART / "crds"


def _schema(file: str) -> dict[str, Any]:
    crd = yaml.safe_load((CRDS / file).read_text())
    [version] = crd["spec"]["versions"]
    assert (crd["spec"]["group"], version["name"]) == (names.API_GROUP, names.API_VERSION)
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def test_the_compute_domain_crd_is_what_the_parser_reads() -> None:
    crd = yaml.safe_load((CRDS / "computedomains.yaml").read_text())
    assert (crd["spec"]["names"]["kind"], crd["spec"]["names"]["plural"]) == (
        names.COMPUTE_DOMAIN_KIND, names.COMPUTE_DOMAIN_PLURAL)
    assert crd["spec"]["scope"] == "Namespaced" and crd["spec"]["versions"][0]["subresources"] == {"status": {}}
    props = _schema("computedomains.yaml")["properties"]
    spec = props["spec"]["properties"]
    assert spec["numNodes"] == {**spec["numNodes"], "type": "integer", "minimum": 0, "default": 0}
    channel = spec["channel"]["properties"]
    assert channel["allocationMode"]["enum"] == [m.value for m in AllocationMode]
    assert channel["allocationMode"]["default"] == AllocationMode.SINGLE.value
    assert channel["resourceClaimTemplate"]["required"] == ["name"]
    status = props["status"]["properties"]
    assert status["status"]["enum"] == [names.STATUS_READY, names.STATUS_NOT_READY]
    node = status["nodes"]["items"]["properties"]
    assert set(node) == set(DomainNode("n").to_json())
    assert node["status"]["enum"] == [names.STATUS_READY, names.STATUS_NOT_READY]
    assert status["nodes"]["x-kubernetes-list-map-keys"] == ["name"]
    # The controller's Ready condition (controller/computedomains/status.py) survives the schema's pruning.
    condition = status["conditions"]["items"]
    assert set(condition["required"]) == {"type", "status", "lastTransitionTime", "reason", "message"}
    assert "observedGeneration" in condition["properties"]


def test_the_clique_crd_is_what_the_parser_reads() -> None:
    crd = yaml.safe_load((CRDS / "computedomaincliques.yaml").read_text())
    assert (crd["spec"]["names"]["kind"], crd["spec"]["names"]["plural"]) == (names.CLIQUE_KIND, names.CLIQUE_PLURAL)
    daemons = _schema("computedomaincliques.yaml")["properties"]["daemons"]
    assert set(daemons["items"]["properties"]) == set(DomainNode("n").to_json(key="nodeName"))
    assert daemons["x-kubernetes-list-map-keys"] == ["nodeName"]


def test_the_chart_renders_the_sandboxs_compute_domain_classes(helm: Helm) -> None:
    rendered = [c for c in by_kind(helm.render(), "DeviceClass") if c["metadata"]["name"].startswith("compute-domain-")]
    expected = compute_domain_device_classes()
    assert sorted(c["metadata"]["name"] for c in expected) == sorted([names.DAEMON_CLASS, names.DEFAULT_CHANNEL_CLASS])
    key = lambda o: o["metadata"]["name"]  # noqa: E731
    assert sorted(without_chart_labels(rendered), key=key) == sorted(expected, key=key)
    for cls in expected:
        assert validate_device_class(cls) == []
    off = helm.render(["computeDomains.enabled=false"])
    assert not [c for c in by_kind(off, "DeviceClass") if c["metadata"]["name"].startswith("compute-domain-")]


@pytest.mark.parametrize(("attributes", "driver", "expected"), [
    ({"type": "channel", "id": 0}, names.DRIVER_NAME, {names.DEFAULT_CHANNEL_CLASS}),
    ({"type": "channel", "id": 7}, names.DRIVER_NAME, set()),  # channels beyond 0 are never the default class's
    ({"type": "daemon", "id": 0}, names.DRIVER_NAME, {names.DAEMON_CLASS}),
    ({"type": "daemon", "id": 0}, "gpu.dra.dev", set()),  # another driver's "daemon"
    ({"type": "gpu"}, names.DRIVER_NAME, set()),
])
def test_each_class_selects_exactly_its_device(attributes: dict[str, Any], driver: str, expected: set[str]) -> None:
    env = DraCelEnvironment()
    device = DeviceInput(driver=driver, attributes={f"{names.DRIVER_NAME}/{k}": v for k, v in attributes.items()})
    hits = {c["metadata"]["name"] for c in compute_domain_device_classes()
            if all(env.matches(s["cel"]["expression"], device) for s in c["spec"]["selectors"])}
    assert hits == expected


def _controller_args(objects: list[dict[str, Any]]) -> Any:
    deployment = one(of_component(objects, "controller"), "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    parser = FlagParser()
    controller_command.add_arguments(parser)
    apply_env_defaults(parser, {e["name"]: e["value"] for e in container["env"] if "value" in e})
    return parser.parse_args(container["args"]), container


def test_the_controller_reconciles_compute_domains_with_the_drivers_image(helm: Helm) -> None:
    objects = helm.render(["image.tag=1.2.3", "computeDomains.bindingTimeoutSeconds=120"])
    args, container = _controller_args(objects)
    assert args.compute_domains is True
    assert args.compute_domain_daemon_image == container["image"] == "dra-driver:1.2.3"
    assert (args.compute_domain_status_interval, args.compute_domain_binding_timeout) == (2.0, 120.0)
    assert args.max_nodes_per_imex_domain == names.MAX_NODES_PER_IMEX_DOMAIN
    daemon_account = one(of_component(objects, "compute-domain-daemon"), "ServiceAccount")
    assert args.compute_domain_daemon_service_account == daemon_account["metadata"]["name"]
    assert args.compute_domain_namespace == ""  # $POD_NAMESPACE: the release namespace
    off, _ = _controller_args(helm.render(["computeDomains.enabled=false"]))
    assert off.compute_domains is False


def test_the_compute_domain_plugin_is_the_daemonsets_second_container(helm: Helm) -> None:
    pod = one(helm.render(), "DaemonSet")["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["plugin", "compute-domain-plugin"]
    cd = pod["containers"][1]
    assert cd["args"] == ["compute-domain-kubelet-plugin"]
    env = {e["name"]: e for e in cd["env"]}
    plugin_dir = f"/var/lib/kubelet/plugins/{names.DRIVER_NAME}"
    assert env["DRA_DRIVER_PLUGIN_DIR"]["value"] == plugin_dir
    assert env["DRA_DRIVER_REGISTRY_DIR"]["value"] == "/var/lib/kubelet/plugins_registry"
    assert env["DRA_DRIVER_KUBECONFIG"]["value"] == ""
    assert env["DRA_DRIVER_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert {m["mountPath"] for m in cd["volumeMounts"]} >= {plugin_dir, "/var/lib/kubelet/plugins_registry",
                                                            "/var/run/cdi"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["compute-domain-plugin-dir"]["hostPath"]["path"] == plugin_dir
    # Its ports differ from the GPU plugin's: both containers share the pod's network namespace.
    ports = [p["containerPort"] for c in pod["containers"] for p in c.get("ports", [])]
    assert len(ports) == len(set(ports))
    off = one(helm.render(["computeDomains.enabled=false"]), "DaemonSet")["spec"]["template"]["spec"]
    assert [c["name"] for c in off["containers"]] == ["plugin"]
    assert "compute-domain-plugin-dir" not in {v["name"] for v in off["volumes"]}


def test_the_compute_domain_plugins_variables_are_flags_of_its_command(helm: Helm) -> None:
    """Each DRA_DRIVER_<FLAG> of the second container names a flag of `dra-driver compute-domain-kubelet-plugin`
    (checked once that command is in the tree: another part of issue 24 builds it)."""
    from dra_driver import cli

    commands = {s.name: s for s in cli.SUBCOMMANDS}
    if "compute-domain-kubelet-plugin" not in commands:
        pytest.skip("the compute-domain-kubelet-plugin command is not in this tree yet")
    sub = FlagParser()
    commands["compute-domain-kubelet-plugin"].load().add_arguments(sub)
    known = {"DRA_DRIVER_" + o.lstrip("-").replace("-", "_").upper() for a in sub.flag_actions
             for o in a.option_strings if o.startswith("--")}
    cd = one(helm.render(), "DaemonSet")["spec"]["template"]["spec"]["containers"][1]
    assert {e["name"] for e in cd["env"] if e["name"].startswith("DRA_DRIVER_")} <= known


@pytest.mark.parametrize("port", [51516, 6001])
def test_the_compute_domain_plugin_is_probed_on_its_own_healthz_port(helm: Helm, port: int) -> None:
    """Startup and liveness on /livez, readiness on /readyz of its named port, as the GPU plugin's container is
    probed (both wait for the NVIDIA driver alive but not ready); the variable the command reads and the container
    port agree, and the defaults are the command's."""
    from dra_driver import defaults

    containers = one(helm.render([f"computeDomains.kubeletPlugin.healthzPort={port}"]),
                     "DaemonSet")["spec"]["template"]["spec"]["containers"]
    gpu, cd = containers
    [named] = [p for p in cd["ports"] if p["name"] == "cd-healthz"]
    env = {e["name"]: e.get("value") for e in cd["env"]}
    assert named["containerPort"] == port and env["DRA_DRIVER_HEALTHZ_PORT"] == str(port)
    for probe, path in (("startupProbe", "/livez"), ("livenessProbe", "/livez"), ("readinessProbe", "/readyz")):
        assert cd[probe]["httpGet"] == {"path": path, "port": "cd-healthz"}, probe
        assert gpu[probe]["httpGet"]["path"] == path, probe
        assert {k: v for k, v in cd[probe].items() if k != "httpGet"} == {
            k: v for k, v in gpu[probe].items() if k != "httpGet"}, probe
    assert env["DRA_DRIVER_DRIVER_WAIT_MAX_INTERVAL"] == {e["name"]: e.get("value") for e in gpu["env"]}[
        "DRA_DRIVER_DRIVER_WAIT_MAX_INTERVAL"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())["computeDomains"]["kubeletPlugin"]
    assert (values["healthzPort"], values["metricsPort"]) == (defaults.CD_HEALTHZ_PORT, defaults.CD_METRICS_PORT)


def test_the_compute_domain_plugin_gets_no_host_driver_root(helm: Helm) -> None:
    """Its CDI edits name device nodes by type, major and minor and mount nothing of the driver: a host driver
    root would have no use (docs/compute-domains.md, "Flags"); NVML still loads from the mounted driver root."""
    objects = helm.render(["driverRoot=/run/nvidia/driver", "nvml=real"])
    cd = one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"][1]
    env = {e["name"]: e.get("value") for e in cd["env"]}
    assert "DRA_DRIVER_HOST_DRIVER_ROOT" not in env
    assert env["DRA_DRIVER_DRIVER_ROOT"] == "/driver-root"
    assert {"name": "driver-root", "mountPath": "/driver-root", "readOnly": True,
            "mountPropagation": "HostToContainer"} in cd["volumeMounts"]


COMPONENT_CODE = {
    "compute-domain-daemon": ("dra_driver/computedomain/daemon/",),
    "compute-domain-kubelet-plugin": ("dra_driver/computedomain/plugin/",),
}
# What the roles grant, written from the other parts' contracts (docs/compute-domains.md); held to the code by
# the test below once that code is in the tree.
EXPECTED = {
    "compute-domain-daemon": {("gpu.dra.dev", "computedomaincliques", v)
                              for v in ("get", "list", "watch", "create", "update")},
    "compute-domain-kubelet-plugin": {("gpu.dra.dev", "computedomains", "list"), ("", "nodes", "get"),
                                      ("", "nodes", "patch"), ("gpu.dra.dev", "computedomaincliques", "get"),
                                      ("gpu.dra.dev", "computedomaincliques", "list")},
}


@pytest.mark.parametrize("component", sorted(COMPONENT_CODE))
def test_each_compute_domain_component_is_granted_what_its_code_calls(helm: Helm, component: str) -> None:
    objects = helm.render()
    assert granted(objects, component) == EXPECTED[component]
    if not any((REPO / prefix).is_dir() for prefix in COMPONENT_CODE[component]):
        pytest.skip(f"{component}'s code is not in this tree yet")
    calls = derived_rules(COMPONENT_CODE[component])
    assert calls <= EXPECTED[component], f"not granted: {calls - EXPECTED[component]}"


def test_the_daemons_and_the_cd_plugin_roles_stay_in_the_release_namespace_or_read_only(helm: Helm) -> None:
    objects = helm.render()
    daemon = of_component(objects, "compute-domain-daemon")
    assert not by_kind(daemon, "ClusterRole") and not by_kind(daemon, "ClusterRoleBinding")
    assert one(daemon, "Role")["metadata"]["namespace"] == "dra-system"
    binding = one(of_component(objects, "compute-domain-kubelet-plugin"), "ClusterRoleBinding")
    account = one(of_component(objects, "kubelet-plugin"), "ServiceAccount")["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "dra-system"}]


def test_the_controller_may_write_the_compute_domain_drivers_device_status(helm: Helm) -> None:
    """From 1.36 a status.devices write of driver D by a controller (not node-bound) needs `arbitrary-node:patch` on
    `resourceclaims/driver` named D: the compute-domain driver only, never the GPU driver."""
    assert {("resource.k8s.io", "resourceclaims/driver")} == SYNTHETIC
    assert synthetic_rules(helm.render(), "controller") == [{
        "apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"],
        "resourceNames": [names.DRIVER_NAME], "verbs": ["arbitrary-node:patch"]}]
    assert synthetic_rules(helm.render(["computeDomains.enabled=false"]), "controller") == []


def test_the_schema_refuses_unknown_compute_domain_values(helm: Helm) -> None:
    assert "computeDomains" in helm.fail(["computeDomains.imexMode=hostManaged"])
    assert "bindingTimeoutSeconds" in helm.fail(["computeDomains.bindingTimeoutSeconds=0"])


def test_docs_describe_the_values() -> None:
    readme = (CHART / "README.md").read_text()
    for key in ("computeDomains.enabled", "computeDomains.bindingTimeoutSeconds"):
        assert key in readme, key
    assert Path(REPO / "docs" / "compute-domains.md").is_file()
