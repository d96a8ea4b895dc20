"""The real node's parts that need no upstream binary (docs/upstream.md "Real node"): the OCI image archives, the
pause program, containerd's config, the CNI network config and the kubelet's configuration."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_sandbox.upstream.containerd import ContainerdConfig, ContainerdError, Network, NodeDirs
from dra_sandbox.upstream.images import (
    BUSYBOX_IMAGE,
    PAUSE_IMAGE,
    Entry,
    ImageError,
    _is_static,
    busybox_archive,
    oci_archive,
    pause_archive,
    pause_binary,
)
from dra_sandbox.upstream.kubeletconfig import KubeletSettings, kubelet_argv, kubelet_configuration
from dra_sandbox.upstream.node import (
    RUN_ROOT,
    Footprint,
    _make_bridge,
    _make_cgroups,
    cgroup_root_for,
    clean_leftover_nodes,
    network_for,
)


def _members(archive: bytes) -> dict[str, bytes]:
    out = {}
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            handle = tar.extractfile(member) if member.isfile() else None
            out[member.name] = handle.read() if handle else b""
    return out


def _blob(files: dict[str, bytes], descriptor: dict[str, Any]) -> bytes:
    digest = str(descriptor["digest"])
    data = files[f"blobs/sha256/{digest.removeprefix('sha256:')}"]
    assert "sha256:" + hashlib.sha256(data).hexdigest() == digest
    assert len(data) == descriptor["size"]
    return data


def _image(archive: bytes) -> tuple[dict[str, Any], dict[str, Any], tarfile.TarFile]:
    """index entry, config and the one layer of an archive, every digest and size checked on the way."""
    files = _members(archive)
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(files["index.json"])
    [entry] = index["manifests"]
    manifest = json.loads(_blob(files, entry))
    config = json.loads(_blob(files, manifest["config"]))
    [layer_desc] = manifest["layers"]
    layer = gzip.decompress(_blob(files, layer_desc))
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]
    return entry, config, tarfile.open(fileobj=io.BytesIO(layer))


def test_an_archive_names_its_image_for_containerd_and_its_digests_hold() -> None:
    archive = oci_archive("localhost/x/y:v1", [Entry("bin", "dir"), Entry("bin/a", "file", 0o755, b"#!")],
                          entrypoint=("/bin/a",))
    entry, config, layer = _image(archive)
    assert entry["annotations"] == {"io.containerd.image.name": "localhost/x/y:v1",
                                    "org.opencontainers.image.ref.name": "v1"}
    assert entry["platform"] == {"architecture": "amd64", "os": "linux"}
    assert config["config"]["Entrypoint"] == ["/bin/a"]
    member = layer.getmember("bin/a")
    assert (member.mode, member.uid, member.mtime) == (0o755, 0, 0)
    assert archive == oci_archive("localhost/x/y:v1", [Entry("bin", "dir"), Entry("bin/a", "file", 0o755, b"#!")],
                                  entrypoint=("/bin/a",))  # byte-identical: one digest per content


def test_an_image_name_without_a_tag_is_refused() -> None:
    with pytest.raises(ImageError, match="has no tag"):
        oci_archive("localhost/x/y", [], entrypoint=())


def test_the_busybox_image_has_the_applets_specs_use(tmp_path: Path) -> None:
    fake = tmp_path / "busybox"
    fake.write_bytes(b"not really busybox")
    entry, config, layer = _image(busybox_archive(fake))
    assert entry["annotations"]["io.containerd.image.name"] == BUSYBOX_IMAGE
    assert config["config"]["Cmd"] == ["sh"]
    names = {m.name: m for m in layer.getmembers()}
    assert names["bin/busybox"].size == len(b"not really busybox")
    for applet in ("sh", "env", "cat", "sleep"):
        assert names[f"bin/{applet}"].issym() and names[f"bin/{applet}"].linkname == "busybox"
    assert names["tmp"].mode == 0o1777


def test_static_is_told_from_dynamic() -> None:
    ls = shutil.which("ls")
    assert ls is not None
    assert not _is_static(Path(ls))  # Debian's coreutils: dynamically linked
    busybox = Path("/bin/busybox")
    if busybox.is_file():
        assert _is_static(busybox) == (b"ld-linux" not in busybox.read_bytes()[:4096])


def test_the_pause_program_sleeps_until_sigterm(tmp_path: Path) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("no gcc here (make system-deps installs it)")
    binary = pause_binary(tmp_path / "cache")
    assert _is_static(binary)
    assert pause_binary(tmp_path / "cache") == binary  # cached by its source
    proc = subprocess.Popen([str(binary)])
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(0.3)  # still sleeping
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        proc.kill()
        proc.wait()
    entry, config, layer = _image(pause_archive(binary))
    assert entry["annotations"]["io.containerd.image.name"] == PAUSE_IMAGE
    assert config["config"]["Entrypoint"] == ["/pause"]
    assert layer.getmember("pause").size == binary.stat().st_size


def _containerd_config(root: Path) -> ContainerdConfig:
    return ContainerdConfig(NodeDirs(root), PAUSE_IMAGE, (root / 'cdi "x"',), Network("drasbf00001", "10.140.1.0/24"),
                            Path("/usr/sbin/runc"))


def test_containerd_config_names_the_sandbox_image_cdi_dirs_and_cgroupfs(tmp_path: Path) -> None:
    config = _containerd_config(tmp_path)
    files = config.files()
    doc = tomllib.loads(files[tmp_path / "config.toml"])
    assert doc["version"] == 3
    assert doc["root"] == str(tmp_path / "root") and doc["state"] == str(tmp_path / "state")
    assert doc["grpc"]["address"] == str(tmp_path / "containerd.sock")
    plugins = doc["plugins"]
    assert plugins["io.containerd.cri.v1.images"]["pinned_images"] == {"sandbox": PAUSE_IMAGE}
    runtime = plugins["io.containerd.cri.v1.runtime"]
    assert runtime["cdi_spec_dirs"] == [str(tmp_path / 'cdi "x"')]  # quotes survive
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2"
    assert runc["options"] == {"BinaryName": "/usr/sbin/runc", "Root": str(tmp_path / "runc"), "SystemdCgroup": False}
    assert runtime["cni"]["conf_dir"] == str(tmp_path / "net.d")
    assert plugins["io.containerd.nri.v1.nri"] == {"disable": True}
    conflist = json.loads(files[tmp_path / "net.d" / "10-dra-sandbox.conflist"])
    bridge, loopback = conflist["plugins"]
    assert (bridge["type"], bridge["bridge"], loopback["type"]) == ("bridge", "drasbf00001", "loopback")
    assert bridge["ipam"] == {"type": "host-local", "dataDir": str(tmp_path / "cni-ipam"),
                              "ranges": [[{"subnet": "10.140.1.0/24", "gateway": "10.140.1.1"}]]}
    assert (bridge["isGateway"], bridge["ipMasq"]) == (False, False)  # the host's forwarding and iptables untouched


def test_a_bridge_name_the_kernel_would_refuse_is_refused() -> None:
    with pytest.raises(ContainerdError, match="1 to 15"):
        Network("a-bridge-name-too-long", "10.1.1.0/24").conflist()


def test_each_control_plane_address_gets_its_own_bridge_subnet_and_cgroup_root() -> None:
    seen = set()
    for address in ("127.240.0.1", "127.240.0.2", "127.249.0.254"):
        net = network_for(address)
        assert len(net.bridge) <= 15
        seen.add((net.bridge, net.subnet, cgroup_root_for(address)))
    assert len({b for b, _, _ in seen}) == len({s for _, s, _ in seen}) == len({c for _, _, c in seen}) == 3


def test_kubelet_configuration_for_cgroup_v1_without_systemd(tmp_path: Path) -> None:
    settings = KubeletSettings(
        node_name="node-a", node_ip="127.241.0.9", root_dir=tmp_path / "kubelet", config_file=tmp_path / "k.yaml",
        kubeconfig=tmp_path / "kubeconfig", client_ca=tmp_path / "ca.crt", serving_cert=tmp_path / "s.crt",
        serving_key=tmp_path / "s.key", runtime_endpoint="unix:///x/containerd.sock",
        pod_logs_dir=tmp_path / "pod-logs", volume_plugin_dir=tmp_path / "vp", cgroup_root="/dra-sandbox-x",
        feature_gates={"DRAListTypeAttributes": True}, labels={"b": "2", "a": "1"})
    config = yaml.safe_load(yaml.safe_dump(kubelet_configuration(settings)))
    assert config["kind"] == "KubeletConfiguration" and config["apiVersion"] == "kubelet.config.k8s.io/v1beta1"
    assert (config["failCgroupV1"], config["cgroupDriver"], config["failSwapOn"]) == (False, "cgroupfs", False)
    assert config["cgroupRoot"] == "/dra-sandbox-x"
    assert config["containerRuntimeEndpoint"] == "unix:///x/containerd.sock"
    assert config["authentication"]["x509"]["clientCAFile"] == str(tmp_path / "ca.crt")
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["authorization"]["mode"] == "Webhook"
    assert (config["address"], config["healthzBindAddress"], config["readOnlyPort"]) == ("127.241.0.9",) * 2 + (0,)
    assert config["featureGates"] == {"DRAListTypeAttributes": True}
    argv = kubelet_argv(Path("/bin/kubelet"), settings)
    assert f"--root-dir={tmp_path / 'kubelet'}" in argv and "--hostname-override=node-a" in argv
    assert "--node-ip=127.241.0.9" in argv and "--node-labels=a=1,b=2" in argv


def test_what_a_killed_node_left_is_found_and_removed(tmp_path: Path) -> None:
    """A bridge, a cgroup root in every v1 hierarchy, a run dir and a mount below the node's dir, recorded in node.json as a
    started node records them: clean_leftover_nodes removes each (what `down` does after its owner was killed)."""
    if os.geteuid() != 0 or shutil.which("ip") is None or not Path("/sys/fs/cgroup/memory/cgroup.procs").exists():
        pytest.skip("needs root, iproute2 and cgroup v1 hierarchies (as the real node does)")
    node_dir = tmp_path / "node-x"
    (node_dir / "kubelet" / "vol").mkdir(parents=True)
    network = network_for("127.249.0.251")
    cgroup_root = cgroup_root_for("127.249.0.251") + "-test"
    run_dir = RUN_ROOT / f"test-{os.getpid()}"
    (run_dir / "kubelet").mkdir(parents=True)
    footprint = Footprint(node_dir, run_dir, network.bridge, cgroup_root)
    try:
        _make_bridge(network)
        _make_cgroups(cgroup_root)
        (Path("/sys/fs/cgroup/memory") / cgroup_root.lstrip("/") / "kubepods").mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(node_dir / "kubelet" / "vol")], check=True)
        footprint.save()
        assert clean_leftover_nodes(tmp_path) == ["node-x"]
        links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
        assert f" {network.bridge}:" not in links
        assert not [h for h in Path("/sys/fs/cgroup").iterdir() if (h / cgroup_root.lstrip("/")).exists()]
        assert str(node_dir) not in Path("/proc/self/mountinfo").read_text()
        assert not footprint.record.exists() and not run_dir.exists()
    finally:
        footprint.clean()  # whatever an assertion left
