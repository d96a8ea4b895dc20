"""`dra-sandbox up` / `down` and `dra-sandbox e2e` as real processes: after SIGINT (also when started the way a
shell backgrounds a job, with SIGINT ignored), SIGTERM, SIGHUP or `down`, no process they started runs and no
unix socket is left in their directories."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dra_sandbox.e2e.sandbox import E2E_NODES
from dra_sandbox.e2e.scenario import JsonObject
from dra_sandbox.up import NodeSpecError, parse_nodes
from tests.polling import wait_for

REPO = Path(__file__).resolve().parents[2]
START = 120.0
ENV = {k: v for k, v in os.environ.items() if not k.startswith("DRA_DRIVER_")}
# Start a command as `cmd &` in a non-interactive shell does: SIGINT ignored (inherited across exec).
IGNORE_SIGINT = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); os.execv(sys.argv[1], sys.argv[1:])"


def _sandbox(*args: str) -> list[str]:
    return [sys.executable, "-c", IGNORE_SIGINT, sys.executable, "-m", "dra_sandbox", *args]


def _alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return False
    return fields[0] != "Z"


def _descendants(root: int) -> set[int]:
    """Every live process below `root` (from /proc: parent links)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    out: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def _sockets(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if stat.S_ISSOCK(p.lstat().st_mode)]


def _plugin_pids(state: Path) -> set[int]:
    return set(json.loads((state / "children.json").read_text()).values())


def _assert_all_gone(pids: set[int], directory: Path) -> None:
    assert pids, "nothing was recorded"
    wait_for(lambda: not [p for p in pids if _alive(p)], 30.0, f"processes {sorted(pids)} to be gone")
    assert _sockets(directory) == []


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="dra-up-t-"))  # short: AF_UNIX paths
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _nodes_of(kubeconfig: Path) -> list[str]:
    server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    with urllib.request.urlopen(f"{server}/api/v1/nodes", timeout=10) as answer:
        return sorted(n["metadata"]["name"] for n in json.load(answer)["items"])


def test_node_specs_take_presets_and_node_files(tmp_path: Path) -> None:
    node_file = tmp_path / "mine.yaml"
    node_file.write_text("x: 1\n")
    assert parse_nodes(f"node-a=dgx-h100, node-b=l4x2,node-c={node_file}") == [
        ("node-a", "fake:dgx-h100"), ("node-b", "fake:l4x2"), ("node-c", f"fake:{node_file}")]
    for bad, why in [("node-a", "NAME=PRESET"), ("a=dgx-h100,a=l4x2", "given twice"), ("Bad_Name=l4x2", "valid node"),
                     ("a=no-such", "neither a preset"), ("a=/nope.yaml", "does not exist")]:
        with pytest.raises(NodeSpecError, match=why):
            parse_nodes(bad)


# One signal in the quick phase, the others in the slow one (each starts a sandbox).
@pytest.mark.parametrize("signum", [pytest.param(signal.SIGINT, marks=pytest.mark.slow), signal.SIGTERM,
                                    pytest.param(signal.SIGHUP, marks=pytest.mark.slow)])
def test_foreground_up_stops_everything_on_a_signal(workdir: Path, signum: signal.Signals) -> None:
    state = workdir / "st"
    out = workdir / "out.txt"
    with open(out, "wb") as log:
        proc = subprocess.Popen(_sandbox("up", "--state-dir", str(state), "--nodes", "n1=l4x2,n2=a30x4",
                                         "--runtime", "cdi-check", "--no-controller"),
                                cwd=REPO, env=ENV, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: (state / "ready").exists() or proc.poll() is not None, START, "the sandbox to be up")
        assert proc.poll() is None, out.read_text()
        text = out.read_text()
        assert f"export KUBECONFIG={state}/kubeconfig" in text and "kubectl get nodes" in text
        assert _nodes_of(state / "kubeconfig") == ["n1", "n2"]
        plugins = _plugin_pids(state)
        pids = _descendants(proc.pid) | plugins
        assert len(plugins) == 2 and plugins <= pids
        assert len(_sockets(state)) >= 4  # registration + DRA socket per node
        proc.send_signal(signum)
        assert proc.wait(60) == 0, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert f"stopped by {signum.name}" in out.read_text()
    _assert_all_gone(pids, state)
    assert not (state / "up.pid").exists() and not (state / "kubeconfig").exists()


# `down` in the quick phase is test_down_removes_every_cdi_spec_its_plugins_wrote's; this one in the slow phase.
@pytest.mark.parametrize("how", [pytest.param("down", marks=pytest.mark.slow), "SIGTERM"])
def test_detached_up_stops_everything_on_down_or_sigterm(workdir: Path, how: str) -> None:
    state = workdir / "st"
    done = subprocess.run(_sandbox("up", "--detach", "--state-dir", str(state), "--nodes", "n1=l4x2",
                                   "--runtime", "cdi-check"),
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=START + 30, check=False)
    owner = int((state / "up.pid").read_text()) if (state / "up.pid").exists() else 0
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"export KUBECONFIG={state}/kubeconfig" in done.stdout
        assert _nodes_of(state / "kubeconfig") == ["n1"]
        pids = {owner} | _descendants(owner) | _plugin_pids(state)
        assert len(pids) >= 2
        again = subprocess.run(_sandbox("up", "--detach", "--state-dir", str(state), "--nodes", "n1=l4x2"),
                               cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60, check=False)
        assert again.returncode == 1 and f"already up in {state} (pid {owner})" in again.stderr
        if how == "down":
            down = subprocess.run(_sandbox("down", "--state-dir", str(state)), cwd=REPO, env=ENV,
                                  capture_output=True, text=True, timeout=120, check=False)
            assert down.returncode == 0 and "stopped" in down.stdout, down.stdout + down.stderr
        else:
            os.kill(owner, signal.SIGTERM)
    finally:
        if owner and _alive(owner):
            subprocess.run(_sandbox("down", "--state-dir", str(state)), cwd=REPO, env=ENV, timeout=120, check=False)
    _assert_all_gone(pids, state)
    wait_for(lambda: not (state / "up.pid").exists(), 30.0, "the PID file to go")
    down = subprocess.run(_sandbox("down", "--state-dir", str(state)), cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=60, check=False)
    assert down.returncode == 0 and "nothing is up" in down.stdout


def _waiting_scenario(root: Path) -> Path:
    """A copy of the `unsatisfiable` scenario whose Pending message never matches: the run waits (until stopped)."""
    scenarios = root / "scenarios"
    shutil.copytree(REPO / "e2e" / "scenarios" / "unsatisfiable", scenarios / "waits")
    expect = scenarios / "waits" / "expect.yaml"
    data = yaml.safe_load(expect.read_text())
    data["steps"][0]["timeout"] = 300
    data["steps"][0]["expect"]["pods"]["too-greedy"]["message"] = "this never appears"
    expect.write_text(yaml.safe_dump(data))
    return scenarios


@pytest.mark.parametrize("signum", [pytest.param(signal.SIGINT, marks=pytest.mark.slow), signal.SIGTERM])
def test_backgrounded_e2e_stops_the_sandbox_on_a_signal(workdir: Path, signum: signal.Signals) -> None:
    work = workdir / "w"
    out = workdir / "out.txt"
    with open(out, "wb") as log:
        proc = subprocess.Popen(_sandbox("e2e", "--scenarios", str(_waiting_scenario(workdir)), "--work-dir",
                                         str(work), "--runtime", "cdi-check"),
                                cwd=REPO, env=ENV, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: "--- waits" in out.read_text() or proc.poll() is not None, START, "the scenario to run")
        assert proc.poll() is None, out.read_text()
        pids = _descendants(proc.pid)
        plugins = [p for p in pids if "kubelet-plugin" in Path(f"/proc/{p}/cmdline").read_text()]
        assert len(plugins) == len(E2E_NODES)
        proc.send_signal(signum)
        assert proc.wait(90) == 128 + signum, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert f"stopped by {signum.name}; the sandbox is stopped" in out.read_text()
    _assert_all_gone(pids, work)


def _api(kubeconfig: Path, method: str, path: str, body: dict[str, object] | None = None) -> dict[str, object]:
    server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{server}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as answer:
        result: dict[str, object] = json.load(answer)
        return result


def _claim_and_pod() -> tuple[dict[str, object], dict[str, object]]:
    claim: dict[str, object] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.dra.dev"}}]}}}
    pod: dict[str, object] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"restartPolicy": "Always", "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "c", "image": "busybox:1.36", "command": ["sh", "-c", "sleep 9999"],
                                    "resources": {"claims": [{"name": "gpu"}]}}],
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}]}}  # fmt: skip
    return claim, pod


# Its `up` runs podman from the machine's /var/run/cdi where it can: beside the other tests that do (the demo's
# sandbox would find the directory taken and check CDI instead, saying so in a warning).
@pytest.mark.xdist_group("system-cdi")
def test_down_removes_every_cdi_spec_its_plugins_wrote(workdir: Path) -> None:
    """up (with the chart's extended-resource mapping switched on), a prepared claim whose pod still runs, down:
    no spec of the sandbox's nodes is left in its CDI dir (/var/run/cdi when podman runs), another's is kept."""
    state = workdir / "st"
    done = subprocess.run(_sandbox("up", "--detach", "--state-dir", str(state), "--nodes", "n1=l4x2",
                                   "--extended-resource-name", "nvidia.com/gpu"),
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=START + 30, check=False)
    owner = int((state / "up.pid").read_text()) if (state / "up.pid").exists() else 0
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        cdi_root = Path((state / "cdi-root").read_text().strip())
        assert f"CDI specs in {cdi_root}" in done.stdout
        kubeconfig = state / "kubeconfig"
        main = _api(kubeconfig, "GET", "/apis/resource.k8s.io/v1/deviceclasses/gpu.dra.dev")
        assert main["spec"]["extendedResourceName"] == "nvidia.com/gpu"  # type: ignore[index]
        other = None
        if cdi_root != Path("/var/run/cdi"):  # never plant files where other sandboxes' podman reads
            other = cdi_root / "k8s.gpu.dra.dev-claim_other-node_11111111-2222-3333-4444-555555555555.json"
            other.write_text("{}")
        claim, pod = _claim_and_pod()
        _api(kubeconfig, "POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims", claim)
        _api(kubeconfig, "POST", "/api/v1/namespaces/default/pods", pod)
        uid = str(_api(kubeconfig, "GET", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c")
                   ["metadata"]["uid"])  # type: ignore[index]
        spec = cdi_root / f"k8s.gpu.dra.dev-claim_n1_{uid}.json"
        wait_for(spec.exists, 60.0, "the claim's CDI spec")
        down = subprocess.run(_sandbox("down", "--state-dir", str(state)), cwd=REPO, env=ENV,
                              capture_output=True, text=True, timeout=120, check=False)
        assert down.returncode == 0, down.stdout + down.stderr
    finally:
        if owner and _alive(owner):
            subprocess.run(_sandbox("down", "--state-dir", str(state)), cwd=REPO, env=ENV, timeout=120, check=False)
    assert not spec.exists()
    assert not list(cdi_root.glob("k8s.gpu.dra.dev-claim_n1_*")) and not list(cdi_root.glob(".k8s.gpu.dra.dev-claim_n1_*"))
    if other is not None:
        assert other.exists()  # another node's (another sandbox's) spec is untouched


def test_up_refuses_a_bad_extended_resource_name(workdir: Path) -> None:
    done = subprocess.run(_sandbox("up", "--state-dir", str(workdir / "st"), "--extended-resource-name", "gpu"),
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "--extended-resource-name gpu: Invalid value" in done.stderr and "nvidia.com/gpu" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (workdir / "st" / "up.pid").exists()


def _our_slices(kubeconfig: Path, node: str) -> list[JsonObject]:
    server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    with urllib.request.urlopen(f"{server}/apis/resource.k8s.io/v1/resourceslices", timeout=10) as answer:
        items: list[JsonObject] = json.load(answer)["items"]
    return [s for s in items if s["spec"].get("nodeName") == node and s["spec"]["driver"] == "gpu.dra.dev"]


def _readyz(state: Path, node: str) -> int:
    port = int((state / node / "healthz-port").read_text())
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_up_without_a_driver_then_nvidia_driver_load_brings_the_node(workdir: Path) -> None:
    """Issue 26: `up --driver absent` comes up with the node's plugin waiting (no slice, /readyz 503);
    `dra-sandbox nvidia-driver load --version X` on the running sandbox makes it publish with that driverVersion."""
    state = workdir / "st"
    done = subprocess.run(_sandbox("up", "--detach", "--state-dir", str(state), "--nodes", "n1=l4x2",
                                   "--runtime", "cdi-check", "--no-controller", "--driver", "absent"),
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=START + 30, check=False)
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        kubeconfig = state / "kubeconfig"
        assert _our_slices(kubeconfig, "n1") == [] and _readyz(state, "n1") == 503
        load = subprocess.run(_sandbox("nvidia-driver", "load", "--node", "n1", "--version", "570.124.06",
                                       "--state-dir", str(state)),
                              cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60, check=False)
        assert load.returncode == 0, load.stdout + load.stderr
        assert "n1: NVIDIA driver not loaded (version 580.105.08, load #0) -> loaded (version 570.124.06, load #1)" in (
            load.stdout)
        slices = wait_for(lambda: _our_slices(kubeconfig, "n1"), 60.0, "n1 to publish once its driver is loaded")
        versions = {d["attributes"]["driverVersion"]["version"] for s in slices for d in s["spec"].get("devices", [])
                    if "driverVersion" in d["attributes"]}
        assert versions == {"570.124.6"}
        wait_for(lambda: _readyz(state, "n1") == 200, 30.0, "n1's plugin to be ready")
    finally:
        subprocess.run(_sandbox("down", "--state-dir", str(state)), cwd=REPO, env=ENV, timeout=120, check=False)
