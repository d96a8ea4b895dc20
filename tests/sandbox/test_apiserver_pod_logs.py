"""`kubectl logs` of a pod the sandbox runs as a host process reads the process's output; what the sandbox does not
serve (exec, attach, port-forward, proxy) answers with a message naming it and where to go (issue 38)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dra_driver.k8s.client import ApiError
from dra_sandbox.apiserver import ApiServer

KUBECTL = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "kubectl"


def _pod(srv: ApiServer, name: str, containers: list[str]) -> dict[str, object]:
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": c, "image": "i"} for c in containers]}}
    return dict(srv.rest().request("POST", "/api/v1/namespaces/default/pods", body=body))



def _write(root: Path, pod: dict[str, object], container: str, restart: int, text: str) -> None:
    meta = pod["metadata"]
    assert isinstance(meta, dict)
    folder = root / f"default_{meta['name']}_{meta['uid']}" / container
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{restart}.log").write_text(text)


@pytest.fixture
def served(tmp_path: Path) -> ApiServer:
    return ApiServer(pod_log_roots=[tmp_path / "node-a" / "pods", tmp_path / "node-b" / "pods"])


def _kubectl(srv: ApiServer, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    kubeconfig = tmp_path / "kubeconfig"
    srv.write_kubeconfig(kubeconfig)
    return subprocess.run([str(KUBECTL), "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True,
                          timeout=60, check=False)


def test_kubectl_logs_reads_the_process_output(served: ApiServer, tmp_path: Path) -> None:
    with served as srv:
        one = _pod(srv, "imex-daemon", ["imex"])
        two = _pod(srv, "two", ["a", "b"])
        _write(tmp_path / "node-b" / "pods", one, "imex", 0, "first run\n")
        _write(tmp_path / "node-b" / "pods", one, "imex", 1, "line 1\nline 2\nline 3\n")
        _write(tmp_path / "node-a" / "pods", two, "b", 0, "b says hi\n")
        assert _kubectl(srv, tmp_path, "logs", "imex-daemon").stdout == "line 1\nline 2\nline 3\n"
        assert _kubectl(srv, tmp_path, "logs", "imex-daemon", "--tail", "1").stdout == "line 3\n"
        assert _kubectl(srv, tmp_path, "logs", "imex-daemon", "--previous").stdout == "first run\n"
        assert _kubectl(srv, tmp_path, "logs", "imex-daemon", "-f").stdout == "line 1\nline 2\nline 3\n"
        assert _kubectl(srv, tmp_path, "logs", "two", "-c", "b").stdout == "b says hi\n"
        none = _kubectl(srv, tmp_path, "logs", "two")  # kubectl picks the first container: no process ran it
        assert none.returncode == 1 and "keeps logs only of the pods it runs as host processes" in none.stderr
        with pytest.raises(ApiError, match=r"a container name must be specified for pod two, choose one of: \[a b\]"):
            srv.rest().request("GET", "/api/v1/namespaces/default/pods/two/log")
        missing = _kubectl(srv, tmp_path, "logs", "nosuchpod")
        assert 'pods "nosuchpod" not found' in missing.stderr


@pytest.mark.parametrize("sub", ["exec", "attach", "portforward", "proxy"])
def test_what_is_not_served_says_so(served: ApiServer, sub: str) -> None:
    with served as srv:
        _pod(srv, "p", ["c"])
        with pytest.raises(ApiError) as err:
            srv.rest().request("POST" if sub != "proxy" else "GET", f"/api/v1/namespaces/default/pods/p/{sub}")
        assert err.value.status == 405
        assert f"does not serve pods/{sub}" in str(err.value) and "--kubernetes upstream" in str(err.value)
        with pytest.raises(ApiError) as nothing:
            srv.rest().request("GET", "/api/v1/namespaces/default/pods/p/nosuchsub")
        assert nothing.value.status == 404


def test_kubectl_exec_prints_the_message(served: ApiServer, tmp_path: Path) -> None:
    with served as srv:
        _pod(srv, "p", ["c"])
        done = _kubectl(srv, tmp_path, "exec", "p", "--", "true")
        assert done.returncode != 0
        assert "does not serve pods/exec" in done.stderr, done.stderr
