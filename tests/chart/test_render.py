"""helm template for several value sets: schema-valid objects (1.34, 1.35) and the DaemonSet's contract."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from dra_driver.commands import kubelet_plugin as plugin_command
from dra_driver.commands.flags import FlagParser, apply_env_defaults, env_name
from dra_driver.commands.sharing_flags import sharing_from_args
from dra_driver.defaults import DRIVER_NAME
from dra_driver.inventory.sharing import EXCLUSIVE, ConsumableMode, ConsumableShares, SharingMode, SharingSettings
from dra_driver.nvml.factory import open_backend, parse_fake_spec
from dra_driver.nvml.fake.backend import FakeNvml
from tests import kubeschema
from tests.chart.helm import (
    KUBE_VERSIONS,
    VALUE_SETS,
    Helm,
    by_kind,
    env_map,
    host_paths,
    of_component,
    one,
    plugin_container,
)

MUST_VALIDATE = {
    "DaemonSet",
    "Deployment",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "DeviceClass",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_rendered_object_is_schema_valid(helm: Helm, kube_version: str) -> None:
    validated: set[str] = set()
    for name, sets in VALUE_SETS.items():
        objects = helm.render(sets, kube_version=kube_version)
        assert objects, name
        for obj in objects:
            if obj["apiVersion"].startswith("monitoring.coreos.com/"):
                continue  # prometheus-operator CRDs: no published schema; tests/chart/test_monitoring.py checks them
            # Raises ValidationError on a bad object and SchemaNotFoundError on a kind it has no schema for,
            # so nothing is skipped silently.
            used = kubeschema.validate(obj, kube_version)
            assert used == kube_version.rsplit(".", 1)[0], f"{name}: {obj['kind']} checked against {used}"
            validated.add(obj["kind"])
    missing = MUST_VALIDATE - validated
    assert not missing, f"never rendered and validated: {missing}"


def test_validation_really_rejects_a_broken_object(helm: Helm) -> None:
    """Guards the test above: strict validation of a DaemonSet with an unknown field must fail."""
    daemonset = one(helm.render(), "DaemonSet")
    broken = {**daemonset, "spec": {**daemonset["spec"], "updateStrategyy": {}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubeschema.validate(broken, KUBE_VERSIONS[0])


@pytest.mark.parametrize("name", ["defaults", "fake", "custom-driver", "operator-dynamic-mig"])
def test_helm3_renders_the_same_objects_as_helm4(helm: Helm, helm3: Helm, name: str) -> None:
    def strip(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted(objects, key=lambda o: (o["kind"], o["metadata"]["name"]))

    assert strip(helm3.render(VALUE_SETS[name])) == strip(helm.render(VALUE_SETS[name]))


def test_default_render_has_the_expected_objects(helm: Helm) -> None:
    kinds = sorted(o["kind"] for o in helm.render())
    assert kinds == sorted(
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "ClusterRole",  # device-taint-admin: for people, bound to nobody (test_rbac.py)
            "DaemonSet",
            "Service",  # the plugin's metrics (test_monitoring.py)
            "DeviceClass",
            "DeviceClass",
            "DeviceClass",
            "DeviceClass",  # vfio.<driver> (docs/passthrough.md)
            "DeviceClass",  # vgpu.<driver> (docs/vgpu.md)
            "DeviceClass",  # fm-partition.<driver> (docs/passthrough.md)
            "ValidatingAdmissionPolicy",  # own-node-slices (test_admission_policy.py)
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicy",  # own-node: the Node patches (test_node_admission_policy.py)
            "ValidatingAdmissionPolicyBinding",
            # the controller (test_controller.py)
            "Deployment",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",  # leader election
            "RoleBinding",
            "Service",  # metrics
            "PodDisruptionBudget",  # two replicas
            # ComputeDomains (test_compute_domains.py): classes, the plugin's, the daemons' and the controller's roles
            "DeviceClass",
            "DeviceClass",
            *("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"),  # compute-domain plugin
            *("ServiceAccount", "Role", "RoleBinding"),  # IMEX daemons
            *("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"),  # controller
            # daemon claims only in the release namespace (test_compute_domain_daemon_claims_policy.py)
            *("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"),
        ]
    )


def test_toggles_remove_their_objects(helm: Helm) -> None:
    assert not by_kind(helm.render(VALUE_SETS["no-admission-policy"]), "ValidatingAdmissionPolicy")
    assert not by_kind(helm.render(VALUE_SETS["no-admission-policy"]), "ValidatingAdmissionPolicyBinding")
    assert not by_kind(helm.render(VALUE_SETS["fake-everywhere-no-classes"]), "DeviceClass")
    existing = helm.render(VALUE_SETS["existing-service-account"])
    assert not by_kind(of_component(existing), "ServiceAccount")
    assert one(existing, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"] == "gpu-plugin"


# --- every kubelet-plugin flag has its env var -------------------------------------------------------


def plugin_parser() -> FlagParser:
    parser = FlagParser(prog="kubelet-plugin")
    plugin_command.add_arguments(parser)
    return parser


def flag_env_names(parser: FlagParser) -> set[str]:
    names = set()
    for action in parser.flag_actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if longs and action.dest != "help":
            names.add(env_name(longs[0]))
    return names


def resolved_env(container: dict[str, Any], node_name: str) -> dict[str, str]:
    """The env the container gets: downward API for the node name, $(VAR) expanded as the kubelet does."""
    env: dict[str, str] = {}
    for entry in container["env"]:
        if "valueFrom" in entry:
            field = entry["valueFrom"]["fieldRef"]["fieldPath"]
            assert field in ("spec.nodeName", "metadata.uid"), entry
            env[entry["name"]] = node_name if field == "spec.nodeName" else "0b5d3c1e-1234-4a5b-9c8d-0123456789ab"
        else:
            env[entry["name"]] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env[m.group(1)], entry["value"])
    return env


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_env_var_for_every_plugin_flag(helm: Helm, name: str) -> None:
    container = plugin_container(one(helm.render(VALUE_SETS[name]), "DaemonSet"))
    wanted = flag_env_names(plugin_parser())
    assert "DRA_DRIVER_NODE_NAME" in wanted and len(wanted) >= 16  # the parser really was read
    rendered = set(env_map(container))
    missing = wanted - rendered
    assert not missing, f"kubelet-plugin flags without an env var in the chart: {sorted(missing)}"
    assert container["args"] == ["kubelet-plugin"]
    node = env_map(container)["DRA_DRIVER_NODE_NAME"]
    assert node["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_rendered_env_parses_with_the_real_flag_parser(helm: Helm, name: str) -> None:
    """Feed the chart's env into `dra-driver kubelet-plugin`'s own parser: every value must be accepted."""
    container = plugin_container(one(helm.render(VALUE_SETS[name]), "DaemonSet"))
    env = resolved_env(container, node_name="gpu-node-7")
    parser = plugin_parser()
    apply_env_defaults(parser, environ=env)
    args = parser.parse_args([])
    assert args.node_name == "gpu-node-7"
    assert args.healthz_port == int(container["ports"][0]["containerPort"])
    assert args.plugin_dir == f"/var/lib/kubelet/plugins/{args.driver_name}"
    policy = sharing_from_args(args)  # the sharing values are accepted as a whole, not only flag by flag
    if name == "shares":
        assert policy == SharingSettings(SharingMode.SHARES, ("0", "GPU-1234"), 512 << 20, 2 << 30, 20)
    elif name == "consumable-shares":  # an integer value reaches the plugin as the share count
        assert policy == replace(EXCLUSIVE, consumable=ConsumableShares(ConsumableMode.COUNT, 4))
    else:
        assert policy == EXCLUSIVE
    if args.nvml.startswith("fake:"):
        spec = parse_fake_spec(args.nvml.removeprefix("fake:"))
        assert spec.settings.state_path is not None and str(spec.settings.state_path).startswith(args.plugin_dir)
        assert isinstance(open_backend(args.nvml), FakeNvml)
    else:
        assert args.nvml == "real"


def test_fake_nodes_get_their_own_gpu_uuids(helm: Helm, tmp_path: Path) -> None:
    container = plugin_container(one(helm.render(VALUE_SETS["fake"]), "DaemonSet"))
    uuids: dict[str, set[str]] = {}
    for node in ("node-a", "node-b"):
        spec = resolved_env(container, node)["DRA_DRIVER_NVML"]
        assert f"seed={node}" in spec
        # Same spec, with the state file moved from the node's plugin dir into tmp_path.
        spec = re.sub(r",state=[^,]*", f",state={tmp_path / node}.json", spec)
        backend = open_backend(spec)
        backend.init()
        try:
            uuids[node] = {gpu.uuid for gpu in backend.gpus()}
        finally:
            backend.shutdown()
        assert len(uuids[node]) == 8
    assert not uuids["node-a"] & uuids["node-b"], "two fake nodes must not publish the same GPU UUIDs"
    # A seed the user chose is kept as is.
    mine = plugin_container(one(helm.render(VALUE_SETS["fake-everywhere-no-classes"]), "DaemonSet"))
    assert env_map(mine)["DRA_DRIVER_NVML"]["value"].startswith("fake:l4x2,seed=fixed,state=")


# --- host paths ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sets",
    [(), ("kubeletDir=/var/lib/k0s/kubelet", "driverName=gpu.example.com", "cdiRoot=/etc/cdi", "computeDomains.enabled=false")],
    ids=["defaults", "custom-paths"],
)
def test_kubelet_dirs_are_mounted_at_the_same_paths(helm: Helm, sets: tuple[str, ...]) -> None:
    values = dict(s.split("=", 1) for s in sets)
    kubelet_dir = values.get("kubeletDir", "/var/lib/kubelet")
    driver = values.get("driverName", DRIVER_NAME)
    cdi_root = values.get("cdiRoot", "/var/run/cdi")
    daemonset = one(helm.render(sets), "DaemonSet")
    container = plugin_container(daemonset)
    hosts = host_paths(daemonset)
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    env = {k: v.get("value") for k, v in env_map(container).items()}
    expected = {
        "plugins-registry": (f"{kubelet_dir}/plugins_registry", "DRA_DRIVER_REGISTRY_DIR"),
        "plugin-dir": (f"{kubelet_dir}/plugins/{driver}", "DRA_DRIVER_PLUGIN_DIR"),
        "cdi-root": (cdi_root, "DRA_DRIVER_CDI_ROOT"),
    }
    for volume, (path, variable) in expected.items():
        assert hosts[volume]["path"] == path, volume
        assert mounts[volume]["mountPath"] == path, f"{volume}: the kubelet dials host paths; mount at the same path"
        assert env[variable] == path, variable
    assert hosts["plugins-registry"]["type"] == "Directory"  # made by the kubelet; a wrong kubeletDir fails loudly
    assert hosts["boot-id"] == {"path": "/proc/sys/kernel/random/boot_id", "type": "File"}
    assert env["DRA_DRIVER_BOOT_ID_PATH"] == mounts["boot-id"]["mountPath"]
    assert mounts["boot-id"]["readOnly"] is True


def test_real_gpus_mount_driver_root_read_only_and_dev(helm: Helm) -> None:
    daemonset = one(helm.render(VALUE_SETS["operator-dynamic-mig"]), "DaemonSet")
    container = plugin_container(daemonset)
    hosts = host_paths(daemonset)
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    env = {k: v.get("value") for k, v in env_map(container).items()}
    assert hosts["driver-root"]["path"] == "/run/nvidia/driver"
    assert mounts["driver-root"]["mountPath"] == env["DRA_DRIVER_DRIVER_ROOT"] == "/driver-root"
    assert mounts["driver-root"]["readOnly"] is True
    assert env["DRA_DRIVER_HOST_DRIVER_ROOT"] == "/run/nvidia/driver"
    assert hosts["dev"]["path"] == "/dev" and mounts["dev"]["mountPath"] == "/dev"
    assert env["DRA_DRIVER_MIG_MODE"] == "dynamic"
    assert env["DRA_DRIVER_LOG_FORMAT"] == "text"


def test_real_gpus_get_mps_with_host_pid_a_shared_mps_root_and_the_host_cgroup(helm: Helm) -> None:
    daemonset = one(helm.render(VALUE_SETS["operator-dynamic-mig"]), "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    container = plugin_container(daemonset)
    hosts = host_paths(daemonset)
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    env = {k: v.get("value") for k, v in env_map(container).items()}
    assert pod["hostPID"] is True
    assert env["DRA_DRIVER_MPS"] == "on"
    assert env["DRA_DRIVER_MPS_ROOT"] == hosts["mps-root"]["path"] == mounts["mps-root"]["mountPath"]
    assert env["DRA_DRIVER_MPS_ROOT"] == f"/run/{DRIVER_NAME}/mps"  # outside the kubelet's 0700/0750 dirs
    assert mounts["mps-root"]["mountPropagation"] == "Bidirectional"  # the shm tmpfs reaches the host
    assert hosts["host-cgroup"]["path"] == "/sys/fs/cgroup"
    assert env["DRA_DRIVER_MPS_CGROUP_ROOT"] == mounts["host-cgroup"]["mountPath"] == "/host-cgroup"


@pytest.mark.parametrize(
    ("sets", "mps", "cgroup"),
    [
        (("mps.enabled=false",), "off", False),
        (("mps.survivePluginRestarts=false",), "on", False),
    ],
)
def test_mps_toggles(helm: Helm, sets: tuple[str, ...], mps: str, cgroup: bool) -> None:
    daemonset = one(helm.render(list(sets)), "DaemonSet")
    container = plugin_container(daemonset)
    env = {k: v.get("value") for k, v in env_map(container).items()}
    assert env["DRA_DRIVER_MPS"] == mps
    assert ("host-cgroup" in host_paths(daemonset)) is cgroup
    assert env["DRA_DRIVER_MPS_CGROUP_ROOT"] == ""
    assert bool(daemonset["spec"]["template"]["spec"].get("hostPID")) is (mps == "on")


# --- privileges --------------------------------------------------------------------------------------


def test_fake_nvml_is_not_privileged(helm: Helm) -> None:
    daemonset = one(helm.render(VALUE_SETS["fake"]), "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    container = plugin_container(daemonset)
    context = container["securityContext"]
    assert context["privileged"] is False
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["readOnlyRootFilesystem"] is True
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    for key in ("hostPID", "hostIPC", "hostNetwork"):
        assert not pod.get(key), key
    assert "initContainers" not in pod
    paths = {h["path"] for h in host_paths(daemonset).values()}
    assert "/dev" not in paths and "/" not in paths, "no device nodes or driver root for simulated GPUs"
    assert not [m for m in container["volumeMounts"] if m["mountPath"] in ("/dev", "/driver-root")]
    assert not by_kind(helm.render(VALUE_SETS["fake"]), "ConfigMap")


@pytest.mark.parametrize("interval", [5, 60])
def test_the_plugin_waits_for_the_driver_itself_with_the_chart_interval_as_its_backoff_cap(
    helm: Helm, interval: int
) -> None:
    """The wait-for-driver init container is gone: the plugin waits in-process (docs/kubelet-plugin.md "The NVIDIA
    driver's lifecycle"); driverWait.intervalSeconds is its backoff cap, and it sees the host's /proc and /dev."""
    rendered = helm.render([f"driverWait.intervalSeconds={interval}"])
    daemonset = one(rendered, "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    assert plugin_container(daemonset)["securityContext"]["privileged"] is True
    assert "initContainers" not in pod
    assert not by_kind(rendered, "ConfigMap")
    env = env_map(plugin_container(daemonset))
    assert env["DRA_DRIVER_DRIVER_WAIT_MAX_INTERVAL"]["value"] == str(interval)
    assert (env["DRA_DRIVER_PROC_ROOT"]["value"], env["DRA_DRIVER_DEV_ROOT"]["value"]) == ("/proc", "/dev")


def test_the_removed_driver_wait_switch_is_refused_by_name(helm: Helm) -> None:
    with pytest.raises(Exception, match="enabled"):
        helm.render(["driverWait.enabled=false"])


def test_security_context_override(helm: Helm) -> None:
    daemonset = one(
        helm.render(
            (),
            extra=["--set-json", 'securityContext={"privileged":true,"capabilities":{"add":["SYS_ADMIN"]}}'],
        ),
        "DaemonSet",
    )
    assert plugin_container(daemonset)["securityContext"] == {
        "privileged": True,
        "capabilities": {"add": ["SYS_ADMIN"]},
    }


# --- scheduling, lifecycle, probes ------------------------------------------------------------------


def test_update_strategy_without_seamless_upgrade_never_runs_two_plugins_on_a_node(helm: Helm) -> None:
    spec = one(helm.render(VALUE_SETS["no-seamless-upgrade"]), "DaemonSet")["spec"]
    assert spec["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}


def test_pod_is_node_critical_with_room_for_in_flight_prepares(helm: Helm) -> None:
    pod = one(helm.render(), "DaemonSet")["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    # Longer than the kubelet's 45 s per-call timeout, so a prepare the kubelet still waits for can finish.
    assert pod["terminationGracePeriodSeconds"] > 45


@pytest.mark.parametrize("port", [51515, 6000])
def test_probes_use_the_healthz_port(helm: Helm, port: int) -> None:
    container = plugin_container(one(helm.render([f"healthzPort={port}"]), "DaemonSet"))
    [named] = [p for p in container["ports"] if p["name"] == "healthz"]
    assert named["containerPort"] == port
    assert env_map(container)["DRA_DRIVER_HEALTHZ_PORT"]["value"] == str(port)
    # Liveness stays 200 while the plugin waits for the driver (no crash loop); readiness says why it is not ready.
    paths = {"startupProbe": "/livez", "livenessProbe": "/livez", "readinessProbe": "/readyz"}
    for probe, path in paths.items():
        get = container[probe]["httpGet"]
        assert get["path"] == path and get["port"] in ("healthz", port), probe
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300, "slow discovery must not be killed"


def test_default_tolerations_and_gpu_node_affinity(helm: Helm) -> None:
    pod = one(helm.render(), "DaemonSet")["spec"]["template"]["spec"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    # Separate terms are ORed: either label is enough.
    keys = sorted(expr["key"] for term in terms for expr in term["matchExpressions"])
    assert keys == ["feature.node.kubernetes.io/pci-10de.present", "nvidia.com/gpu.present"]
    assert all(expr["operator"] == "In" and expr["values"] == ["true"] for t in terms for expr in t["matchExpressions"])


def test_scheduling_is_overridable(helm: Helm) -> None:
    pod = one(
        helm.render(
            ["affinity=null", "nodeSelector.pool=gpu"],
            extra=["--set-json", 'tolerations=[{"operator":"Exists"}]'],
        ),
        "DaemonSet",
    )["spec"]["template"]["spec"]
    assert "affinity" not in pod
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert pod["tolerations"] == [{"operator": "Exists"}]


def test_image_tag_defaults_to_app_version(helm: Helm) -> None:
    import yaml

    from tests.chart.helm import CHART

    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    daemonset = one(helm.render(), "DaemonSet")
    assert plugin_container(daemonset)["image"] == f"dra-driver:{app_version}"
    pinned = one(helm.render(["image.repository=reg.example/dra", "image.tag=v9"]), "DaemonSet")
    images = {c["image"] for c in pinned["spec"]["template"]["spec"]["containers"]}
    assert plugin_container(pinned)["image"] == "reg.example/dra:v9" and images == {"reg.example/dra:v9"}


# --- RBAC (the rules themselves: test_rbac.py, derived from the code) ------------------------------------


def test_role_binding_targets_the_daemonset_service_account(helm: Helm) -> None:
    objects = of_component(helm.render(release="gpus", namespace="accel"))
    binding = one(objects, "ClusterRoleBinding")
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": "accel"}]
    assert binding["roleRef"]["name"] == one(objects, "ClusterRole")["metadata"]["name"]
    assert one(objects, "ServiceAccount")["metadata"] == {
        **one(objects, "ServiceAccount")["metadata"],
        "name": pod["serviceAccountName"],
        "namespace": "accel",
    }


@pytest.mark.parametrize(("name", "surge", "unavailable"), [("defaults", 1, 0), ("no-seamless-upgrade", 0, 1)])
def test_update_strategy_follows_seamless_upgrade(helm: Helm, name: str, surge: int, unavailable: int) -> None:
    daemonset = one(helm.render(VALUE_SETS[name]), "DaemonSet")
    rolling = daemonset["spec"]["updateStrategy"]["rollingUpdate"]
    assert (rolling["maxSurge"], rolling["maxUnavailable"]) == (surge, unavailable)
    pod_uid = env_map(plugin_container(daemonset))["DRA_DRIVER_POD_UID"]
    if surge:  # side by side only with per-pod socket names
        assert pod_uid["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    else:
        assert pod_uid["value"] == ""
