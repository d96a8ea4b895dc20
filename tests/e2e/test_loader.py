"""The scenario format: every shipped scenario loads; each kind of mistake is an error naming file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_sandbox.e2e.loader import ScenarioError, load_scenario, load_scenarios
from dra_sandbox.e2e.scenario import NODE_LABEL, ContainerRef, ObjectRef

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "e2e" / "scenarios"

CLAIM = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: gpu
spec:
  devices:
    requests:
      - name: gpu
        exactly: {deviceClassName: gpu.dra.dev}
"""


def pod(name: str, policy: str = "Always", containers: tuple[str, ...] = ("main",), alias: str = "h100") -> str:
    items = "".join(
        f"""
    - name: {c}
      image: busybox:1.36
      command: ["sh", "-c", "env; sleep 3600"]
      resources:
        claims: [{{name: gpu}}]"""
        for c in containers
    )
    return f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  restartPolicy: {policy}
  nodeSelector: {{{NODE_LABEL}: {alias}}}
  containers:{items}
  resourceClaims:
    - name: gpu
      resourceClaimName: gpu
"""


GOOD_EXPECT = """
description: two pods share a claim, then one goes
steps:
  - name: both run
    apply: [claim.yaml, pods.yaml]
    timeout: 30
    expect:
      pods:
        a: {phase: Running, node: h100, containers: {main: {devices: 1, uuid: GPU, env: {CUDA_VISIBLE_DEVICES: "^GPU-"}}}}
        b: {phase: Running}
      sameDevices: [[a/main, b/main]]
  - delete: [Pod/a]
    expect:
      gone: [Pod/a]
      pods:
        b: {phase: Running}
  - delete: [pods.yaml, claim.yaml]
    expect:
      gone: [Pod/b, ResourceClaim/gpu]
"""


def write(tmp_path: Path, files: dict[str, str], name: str = "demo-scenario") -> Path:
    directory = tmp_path / name
    directory.mkdir()
    for file_name, text in files.items():
        (directory / file_name).write_text(text)
    return directory


def good_files() -> dict[str, str]:
    return {
        "claim.yaml": CLAIM,
        "pods.yaml": pod("a") + "---" + pod("b"),
        "expect.yaml": GOOD_EXPECT,
    }


def problems_of(directory: Path) -> list[str]:
    with pytest.raises(ScenarioError) as info:
        load_scenario(directory)
    return info.value.problems


def test_every_shipped_scenario_loads_and_covers_the_required_cases() -> None:
    scenarios = {s.name: s for s in load_scenarios(SCENARIOS)}
    assert set(scenarios) >= {
        "single-gpu",
        "shared-claim",
        "nvlink-pair",
        "mig-one-h100",
        "selectors",
        "unsatisfiable",
        "claim-release",
        "device-plugin-pod",
        "policy-time-slicing",
    }
    for scenario in scenarios.values():
        assert scenario.description
        for objs in scenario.files.values():
            for obj in objs:
                if obj["kind"] not in ("DeviceClass", "GpuSharingPolicy", "DeviceTaintRule"):
                    assert obj["metadata"]["namespace"] == f"e2e-{scenario.name}"
                if obj["kind"] == "Pod":
                    assert obj["spec"]["containers"][0]["image"] == "busybox:1.36"
                    assert obj["spec"]["containers"][0]["command"][:2] == ["sh", "-c"]
                    # Compute-domain workers list their channels first (a cluster's log then shows them before env).
                    assert obj["spec"]["containers"][0]["command"][2].removeprefix(
                        "ls -d /dev/nvidia-caps-imex-channels/*; ").startswith("env; sleep ")
    mig = scenarios["mig-one-h100"]
    assert [bool(s.apply) for s in mig.steps] == [True, True, False]
    assert mig.steps[2].delete == (
        ObjectRef("Pod", "mig-trio", "e2e-mig-one-h100"),
        ObjectRef("ResourceClaim", "three-migs", "e2e-mig-one-h100"),
    )
    assert mig.steps[1].expect.pods[0].phase == "Pending"
    assert scenarios["selectors"].node_aliases == frozenset({"h100", "a100"})
    assert scenarios["selectors"].cluster_scoped() == (ObjectRef("DeviceClass", "e2e-selectors-h100.gpu.dra.dev"),)
    policy = scenarios["policy-time-slicing"]
    assert policy.cluster_scoped() == (ObjectRef("GpuSharingPolicy", "e2e-policy-time-slicing"),)
    # `gone` may name the class the controller makes for the scenario's policy (never applied by the scenario).
    assert policy.steps[1].expect.gone == (ObjectRef("DeviceClass", "e2e-policy-time-slicing.gpu.dra.dev"),)


def test_a_good_scenario_becomes_frozen_values(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, good_files()))
    assert scenario.namespace == "e2e-demo-scenario"
    first, second, third = scenario.steps
    assert first.apply == ("claim.yaml", "pods.yaml") and first.timeout == 30.0
    assert first.expect.pods[0].containers["main"].env == {"CUDA_VISIBLE_DEVICES": "^GPU-"}
    assert first.expect.same_devices == ((ContainerRef("a", "main"), ContainerRef("b", "main")),)
    assert second.delete == (ObjectRef("Pod", "a", "e2e-demo-scenario"),)
    # A file deletes its objects in reverse order (pods before the claims they use); `a` went already.
    assert third.delete == (
        ObjectRef("Pod", "b", "e2e-demo-scenario"),
        ObjectRef("ResourceClaim", "gpu", "e2e-demo-scenario"),
    )
    assert scenario.node_aliases == frozenset({"h100"})
    with pytest.raises(AttributeError):
        scenario.name = "other"  # type: ignore[misc]


def test_passthrough_and_device_node_expectations_load(tmp_path: Path) -> None:
    text = GOOD_EXPECT.replace("description: two pods share a claim, then one goes\n",
                               "description: two pods share a claim, then one goes\npassthrough: true\n")
    text = text.replace('env: {CUDA_VISIBLE_DEVICES: "^GPU-"}',
                        'deviceNodes: ["^/dev/vfio/[0-9]+$"], mounts: ["metadata\\\\.json$"]')
    scenario = load_scenario(write(tmp_path, {**good_files(), "expect.yaml": text}))
    assert scenario.passthrough
    want = scenario.steps[0].expect.pods[0].containers["main"]
    assert (want.device_nodes, want.mounts) == (("^/dev/vfio/[0-9]+$",), ("metadata\\.json$",))
    assert not load_scenario(write(tmp_path, good_files(), name="plain")).passthrough
    bad = text.replace('"^/dev/vfio/[0-9]+$"', '"^/dev/vfio/[0-9+$"')
    with pytest.raises(ScenarioError, match=r"deviceNodes\[0\]"):
        load_scenario(write(tmp_path, {**good_files(), "expect.yaml": bad}, name="bad-regex"))


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"expect.yaml": GOOD_EXPECT.replace("phase: Running, node", "phase: Runing, node")},
            "steps[0].expect.pods.a.phase: must be one of Pending, Running, Succeeded, Failed; got 'Runing'",
        ),
        (
            {"expect.yaml": GOOD_EXPECT.replace("timeout: 30", "timout: 30")},
            "steps[0].timout: unknown field; allowed fields: name, apply, delete, applyFails, nvidiaDriver, timeout, expect",
        ),
        (
            {
                "expect.yaml": GOOD_EXPECT.replace(
                    "b: {phase: Running}\n      sameDevices", "b: {phase: Pending}\n      sameDevices"
                )
            },
            "steps[0].expect.pods.b.message: required for Pending",
        ),
        (
            {"pods.yaml": pod("a", policy="Never") + "---" + pod("b")},
            "pods.a.phase: Running needs the pod's restartPolicy to be Always, it is 'Never'",
        ),
        (
            {"pods.yaml": pod("a").replace("  restartPolicy: Always\n", "") + "---" + pod("b")},
            "spec.restartPolicy: set it explicitly",
        ),
        (
            {"claim.yaml": CLAIM.replace("name: gpu\nspec", "name: gpu\n  namespace: default\nspec")},
            "metadata.namespace: remove it: the runner puts every object in the scenario's own namespace",
        ),
        (
            {"claim.yaml": CLAIM.replace("kind: ResourceClaim", "kind: Deployment")},
            "kind: 'Deployment' is not supported",
        ),
        (
            {"claim.yaml": CLAIM.replace("apiVersion: resource.k8s.io/v1", "apiVersion: resource.k8s.io/v1alpha3")},
            "apiVersion: 'resource.k8s.io/v1alpha3': ResourceClaim must use apiVersion resource.k8s.io/v1 or "
            "resource.k8s.io/v1beta2 or resource.k8s.io/v1beta1",
        ),
        (
            {"expect.yaml": GOOD_EXPECT.replace("containers: {main:", "containers: {nope:")},
            "pods.a.containers.nope: pod a has no such container (main)",
        ),
        (
            {"expect.yaml": GOOD_EXPECT.replace("devices: 1, uuid: GPU", "devices: -1, uuid: GPU")},
            "containers.main.devices: must be a whole number >= 0",
        ),
        (
            {"expect.yaml": GOOD_EXPECT.replace("uuid: GPU", "uuid: gpu")},
            "containers.main.uuid: must be one of GPU, MIG",
        ),
        (
            {"expect.yaml": GOOD_EXPECT.replace('"^GPU-"', '"^(GPU-"')},
            "env.CUDA_VISIBLE_DEVICES: invalid regular expression",
        ),
        (
            {"expect.yaml": GOOD_EXPECT.replace("sameDevices: [[a/main, b/main]]", "sameDevices: [[a/main]]")},
            "sameDevices[0]: must be a list of at least two 'pod/container'",
        ),
        (
            {"expect.yaml": GOOD_EXPECT.replace("delete: [Pod/a]", "delete: [Pod/c]")},
            "steps[1].delete[0]: 'Pod/c' is not defined in any file of this scenario",
        ),
        (
            {"expect.yaml": GOOD_EXPECT.replace("gone: [Pod/a]", "gone: [Pod/b]")},
            "steps[1].expect.gone[0]: Pod/b is still applied at this step; delete it first",
        ),
        (
            {"expect.yaml": GOOD_EXPECT.replace("delete: [pods.yaml, claim.yaml]", "delete: [pods.yaml, Pod/a]")},
            "Pod/a is not present at this step",
        ),
        (
            {"expect.yaml": GOOD_EXPECT.replace("apply: [claim.yaml, pods.yaml]", "apply: [claim.yaml, pod.yaml]")},
            "steps[0].apply[1]: 'pod.yaml' is not a Kubernetes file of this scenario",
        ),
        (
            {"expect.yaml": GOOD_EXPECT.replace("  - delete: [Pod/a]", "  - apply: [claim.yaml]\n    delete: [Pod/a]")},
            "steps[1]: needs exactly one of apply (files), delete",
        ),
        (
            {"expect.yaml": GOOD_EXPECT.replace("description: two", "description: one\ndescription: two")},
            "duplicate key",
        ),
        (
            {"extra.yaml": CLAIM.replace("name: gpu\nspec", "name: spare\nspec")},
            "extra.yaml: is never applied by a step",
        ),
        (
            {"expect.yaml": GOOD_EXPECT.replace("description: two pods share a claim, then one goes\n", "")},
            "description: required",
        ),
        (
            {
                "expect.yaml": GOOD_EXPECT.replace(
                    "b: {phase: Running}\n      sameDevices",
                    "b: {phase: Pending, message: x, node: h100}\n      sameDevices",
                )
            },
            "pods.b.node: a Pending pod has no node",
        ),
    ],
)
def test_each_mistake_is_reported_with_file_and_field(tmp_path: Path, change: dict[str, str], expected: str) -> None:
    files = {**good_files(), **change}
    directory = write(tmp_path, files)
    problems = problems_of(directory)
    assert any(expected in p for p in problems), problems
    assert all(p.startswith(str(directory)) for p in problems), problems


def test_all_problems_come_together(tmp_path: Path) -> None:
    bad = GOOD_EXPECT.replace("phase: Running, node", "phase: Runing, node").replace("gone: [Pod/a]", "gone: [Pod/zzz]")
    problems = problems_of(write(tmp_path, {**good_files(), "expect.yaml": bad}))
    assert len(problems) == 2
    assert "steps[0].expect.pods.a.phase" in problems[0]
    assert "steps[1].expect.gone[0]: 'Pod/zzz' is not defined" in problems[1]


def test_directory_level_errors(tmp_path: Path) -> None:
    no_expect = write(tmp_path, {"claim.yaml": CLAIM}, name="lonely")
    assert problems_of(no_expect) == [
        f"{no_expect}/expect.yaml: missing; every scenario needs an expect.yaml (see e2e/README.md)"
    ]
    bad_name = write(tmp_path, good_files(), name="Bad_Name")
    assert any("scenario name 'Bad_Name' must be a lower-case DNS label" in p for p in problems_of(bad_name))
    with pytest.raises(ScenarioError, match=r"no scenario named nope under .*; available: Bad_Name, lonely"):
        load_scenarios(tmp_path, ["nope"])
    with pytest.raises(ScenarioError, match="scenario directory not found; pass --scenarios"):
        load_scenarios(tmp_path / "missing")
    # Loading several reports the problems of every bad scenario at once.
    with pytest.raises(ScenarioError) as info:
        load_scenarios(tmp_path)
    assert any("Bad_Name" in p for p in info.value.problems) and any("lonely" in p for p in info.value.problems)


def test_broken_yaml_names_the_file(tmp_path: Path) -> None:
    directory = write(tmp_path, {**good_files(), "claim.yaml": "kind: [unclosed"})
    problems = problems_of(directory)
    assert any(p.startswith(f"{directory}/claim.yaml: not valid YAML") for p in problems), problems


@pytest.mark.parametrize(
    ("expect", "expected"),
    [
        (
            GOOD_EXPECT.replace("containers: {main: {devices: 1, uuid: GPU, env:", "containers: {main: {devices: null, env:"),
            "steps[0].expect.pods.a.containers.main.devices: must not be null; leave the field out for its default",
        ),
        (GOOD_EXPECT.replace("timeout: 30", "timeout: '30'"), "steps[0].timeout: must be a number, got a string '30'"),
        (
            GOOD_EXPECT.replace("    expect:\n      gone: [Pod/a]\n      pods:\n        b: {phase: Running}\n", ""),
            "steps[1]: needs expect (only an applyFails step may leave it out)",
        ),
        (
            GOOD_EXPECT.replace("b: {phase: Running}\n      sameDevices", "b: {node: h100}\n      sameDevices"),
            "steps[0].expect.pods.b.phase: required field is missing; must be one of Pending, Running, Succeeded, Failed",
        ),
        (
            GOOD_EXPECT.replace("sameDevices: [[a/main, b/main]]", "sameDevices: [[a/main, a/main]]"),
            "steps[0].expect.sameDevices[0]: names a container twice",
        ),
        (
            GOOD_EXPECT.replace("containers: {main: {devices: 1, uuid: GPU, env:", "containers: {main: {devices: 0, uuid: GPU, env:"),
            "steps[0].expect.pods.a.containers.main.uuid: makes no sense with devices: 0",
        ),
    ],
)
def test_more_mistakes_named_with_their_field(tmp_path: Path, expect: str, expected: str) -> None:
    problems = problems_of(write(tmp_path, {**good_files(), "expect.yaml": expect}))
    assert any(expected in p for p in problems), problems
