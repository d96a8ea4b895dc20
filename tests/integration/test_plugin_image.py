"""The kubelet plugin started FROM THE CONTAINER IMAGE (`make image`) under podman, with the chart's security
settings for simulated GPUs, against the sandbox API server and kubelet simulator: it registers, publishes its
ResourceSlices and prepares a claim (docs/image.md).

Under `make test` (DRA_IMAGE_BUILD_STATE set) the image is built in the background while lint runs
(`python -m dra_sandbox.imagebuild start`) and this test waits for it: it runs whenever podman can run
containers here, fails when the build failed, and skips only when podman cannot run containers (or
IMAGE_TEST=0), with a reason that names the cause (tests/conftest.py repeats it in a banner). Run alone, it
skips when the image is not built; `make image-test` builds the image first. The image is
`localhost/dra-driver:<version>` unless DRA_DRIVER_IMAGE names another. The argv checks run everywhere.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml

from dra_driver._gen import pluginregistration_v1_pb2, pluginregistration_v1_pb2_grpc
from dra_driver.defaults import DRIVER_NAME
from dra_sandbox.cluster import ClusterConfig, NodeSpec, PluginProcess, SandboxCluster
from dra_sandbox.image import DEFAULT_IMAGE, ULIMITS, PodmanImageLauncher, image_unavailable
from dra_sandbox.imagebuild import podman_runtime, wait_for_build
from tests.conftest import IMAGE_TEST_SKIP_PREFIX
from tests.integration.conftest import NODE, allocated_claim, dra_client, sandbox, spec_files
from tests.polling import wait_for

IMAGE = os.environ.get("DRA_DRIVER_IMAGE", DEFAULT_IMAGE)
REPO = Path(__file__).resolve().parents[2]
# tests/conftest.py finds this test's skip by this prefix and repeats the reason in a banner.
SKIP_PREFIX = IMAGE_TEST_SKIP_PREFIX
# From nothing the build takes ~4-5 minutes on 2 busy cores (docs/image.md); waiting longer means it hangs.
BUILD_WAIT_S = 900.0


@pytest.fixture(scope="module")
def image_cluster() -> Iterator[tuple[SandboxCluster, PodmanImageLauncher]]:
    podman = podman_runtime()
    if not podman.usable:
        pytest.skip(f"{SKIP_PREFIX} podman cannot run containers here: {podman.reason}")
    state = os.environ.get("DRA_IMAGE_BUILD_STATE")
    if state:
        outcome = wait_for_build(Path(state), BUILD_WAIT_S)
        if outcome.status == "disabled":
            pytest.skip(f"{SKIP_PREFIX} {outcome.reason}")
        if outcome.status != "built":
            pytest.fail(f"make test's image build did not succeed ({outcome.status}: {outcome.reason}); "
                        f"log {outcome.log}:\n{outcome.log_tail()}")
        print(f"\nimage build ({outcome.log}): {outcome.seconds:.0f} s")
    reason = image_unavailable(IMAGE, podman.global_args)
    if reason is not None:
        if state:
            pytest.fail(f"the image was built but cannot be run: {reason}")
        pytest.skip(f"{SKIP_PREFIX} {reason}")
    launcher = PodmanImageLauncher(IMAGE, global_args=podman.global_args)
    with sandbox("dra-img-", [NodeSpec(NODE, "fake:dgx-h100")], plugin_launcher=launcher) as cluster:
        yield cluster, launcher


def container_of(launcher: PodmanImageLauncher) -> dict[str, object]:
    out = subprocess.run(
        ["podman", "container", "inspect", launcher.containers[NODE]],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    [info] = json.loads(out)
    assert isinstance(info, dict)
    return info


def scrape(port: int | None) -> str | None:
    if port is None:  # not reported yet
        return None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return None


@pytest.mark.podman
@pytest.mark.timeout(BUILD_WAIT_S + 180)  # the fixture may wait for make test's background build
def test_the_plugin_from_the_image_registers_publishes_and_prepares(
    image_cluster: tuple[SandboxCluster, PodmanImageLauncher],
) -> None:
    cluster, launcher = image_cluster
    plugin = cluster.plugins[NODE]

    # It really is the image's process, with the chart's restrictions.
    info = container_of(launcher)
    config = info["Config"]
    host = info["HostConfig"]
    assert isinstance(config, dict) and isinstance(host, dict)
    assert info["ImageName"] == IMAGE
    assert config["User"] == "0:0"
    assert host["ReadonlyRootfs"] is True
    assert not host.get("Privileged")
    assert not host.get("CapAdd")
    assert info.get("EffectiveCaps") in (None, [])
    assert "no-new-privileges" in host["SecurityOpt"]

    # Registered: the registration socket is there, GetInfo answers, the kubelet simulator took it.
    assert plugin.sockets.registration.is_socket()
    with grpc.insecure_channel(f"unix://{plugin.sockets.registration}") as channel:
        got = pluginregistration_v1_pb2_grpc.RegistrationStub(channel).GetInfo(
            pluginregistration_v1_pb2.InfoRequest(), timeout=10
        )
    assert (got.type, got.name, got.endpoint) == ("DRAPlugin", DRIVER_NAME, str(plugin.sockets.dra))
    registered = wait_for(lambda: cluster.kubelets[NODE].plugins.get(DRIVER_NAME), 30, "registration")
    assert plugin.started_at is not None and plugin.serving_at is not None
    seconds = registered.registered_at - plugin.started_at
    print(f"\nplugin from {IMAGE}: `podman run` -> both sockets accept {plugin.serving_at - plugin.started_at:.2f} s, "
          f"-> registered with the kubelet simulator {seconds:.2f} s")
    assert seconds < 60

    # Published: the node's pool, all its ResourceSlices, the eight H100s among the devices.
    slices = cluster.wait_pool_published(NODE)
    devices = {d["name"] for s in slices for d in s["spec"].get("devices", [])}
    assert {f"gpu-{i}" for i in range(8)} <= devices

    # Its metrics endpoint answers on the host network (the port the plugin bound and reported in its ports file).
    metrics = wait_for(lambda: scrape(plugin.metrics_port), 30, "the plugin's /metrics")
    assert "# TYPE" in metrics

    # Prepared: NodePrepareResources answers with CDI ids, and the CDI spec is on the host's CDI root.
    ref = allocated_claim(cluster, ["gpu-0"])
    channel, client = dra_client(cluster)
    result = client.prepare([ref])[ref.uid]
    assert result.ok, result.error
    [device] = result.devices
    assert device.device == "gpu-0" and device.cdi_device_ids
    [spec] = spec_files(cluster, ref.uid)
    kinds = {cdi_id.split("=")[0] for cdi_id in device.cdi_device_ids}
    assert yaml.safe_load(spec.read_text())["kind"] in kinds
    assert client.unprepare([ref]) == {ref.uid: None}
    assert spec_files(cluster, ref.uid) == []
    channel.close()

    # SIGTERM to `podman run` reaches the plugin: a clean exit that removes its sockets.
    assert plugin.stop() == 0
    assert not plugin.sockets.registration.exists() and not plugin.sockets.dra.exists()


def test_the_launcher_uses_the_charts_security_settings_for_fake_nvml() -> None:
    """No podman needed: the argv carries the chart's securityContext and mounts for nvml: fake:*."""
    launcher = PodmanImageLauncher("localhost/dra-driver:test")
    # A short work dir: the plugin's socket paths are checked against the unix limit when they are chosen.
    work = Path(tempfile.mkdtemp(dir="/tmp", prefix="img-argv-"))
    try:
        cluster = SandboxCluster(ClusterConfig(work_dir=work, nodes=[NodeSpec(NODE, "fake:dgx-h100")],
                                               plugin_launcher=launcher))
        plugin = PluginProcess(cluster.config.nodes[0], cluster)
        argv = launcher.command(plugin, {**plugin.env(), "HOME": "/root"})
        joined = " ".join(argv)
        for flag in ("--read-only", "--user 0:0", "--cap-drop ALL", "--security-opt no-new-privileges",
                     "--network host", "--tmpfs /tmp:"):
            assert flag in joined, flag
        assert argv[-2:] == ["localhost/dra-driver:test", "kubelet-plugin"]
        volumes = [argv[i + 1] for i, a in enumerate(argv) if a == "--volume"]
        for path in (plugin.registry_dir, plugin.plugin_dir, cluster.cdi_root, plugin.state_dir):
            assert f"{path}:{path}" in volumes
        assert f"{plugin.boot_id_file}:/host/boot_id:ro" in volumes
        envs = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--env")
        assert envs["DRA_DRIVER_BOOT_ID_PATH"] == "/host/boot_id"
        assert envs["DRA_DRIVER_NVML"] == plugin.nvml_spec and "HOME" not in envs
        # The same settings as the chart's DaemonSet template.
        template = (REPO / "charts/dra-driver/templates/daemonset.yaml").read_text()
        for line in ("readOnlyRootFilesystem: true", "runAsUser: 0", 'drop: ["ALL"]', "allowPrivilegeEscalation: false",
                     "mountPath: /host/boot_id", "mountPath: /tmp"):
            assert line in template, line
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.podman
@pytest.mark.timeout(BUILD_WAIT_S + 180)
def test_the_image_is_labelled_and_cannot_install_anything(
    image_cluster: tuple[SandboxCluster, PodmanImageLauncher],
) -> None:
    """What an admin pulls: the OCI labels the Dockerfile sets, and no pip or setuptools left in it."""
    _, launcher = image_cluster
    out = subprocess.run(
        ["podman", *launcher.global_args, "image", "inspect", "--format", "{{json .Labels}}", IMAGE],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    labels = json.loads(out)
    oci = "org.opencontainers.image."
    assert labels[oci + "licenses"] == "Apache-2.0"
    version = re.search(r'^version = "(.+)"$', (REPO / "pyproject.toml").read_text(), re.MULTILINE)
    assert version is not None and labels[oci + "version"] == version.group(1)
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", labels[oci + "revision"]), labels[oci + "revision"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", labels[oci + "created"])
    assert labels[oci + "source"] and labels[oci + "source"] != "unknown"
    assert "@sha256:" in labels[oci + "base.name"]  # built on a base pinned by digest
    probe = subprocess.run(
        ["podman", *launcher.global_args, "run", "--rm", *ULIMITS, "--network", "none", "--entrypoint", "python3", IMAGE,
         "-c",
         "import importlib.util as u; print([m for m in ('pip', 'setuptools', 'wheel') if u.find_spec(m)])"],
        capture_output=True, text=True, timeout=120, check=True,
    )
    assert probe.stdout.strip() == "[]", probe.stdout + probe.stderr
