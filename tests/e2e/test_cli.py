"""The two commands: `dra-sandbox demo` as a subprocess (what `make demo` runs), `dra-sandbox e2e` argument errors."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dra_sandbox.cli import main, parser
from dra_sandbox.demo import DEMO_SCENARIOS, render_rows, rows_for_pod
from dra_sandbox.e2e.backend import ContainerView, PodView
from dra_sandbox.e2e.loader import load_scenarios

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "e2e" / "scenarios"


def test_both_commands_are_registered() -> None:
    help_text = parser().format_help()
    assert "e2e" in help_text and "demo" in help_text
    args = parser().parse_args(["e2e", "--only", "a", "b", "--timeout", "5", "--kubeconfig", "/k"])
    assert (args.only, args.timeout, args.kubeconfig) == (["a", "b"], 5.0, "/k")


def test_e2e_rejects_bad_scenarios_before_touching_a_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["e2e", "--scenarios", str(tmp_path / "none")]) == 2
    assert "scenario directory not found; pass --scenarios" in capsys.readouterr().err
    assert main(["e2e", "--scenarios", str(SCENARIOS), "--only", "no-such"]) == 2
    assert "--only: no scenario named no-such" in capsys.readouterr().err
    bad = tmp_path / "broken"
    bad.mkdir()
    (bad / "expect.yaml").write_text("description: x\nsteps: []\n")
    assert main(["e2e", "--scenarios", str(tmp_path)]) == 2
    assert "expect.yaml: steps: needs at least 1 entry" in capsys.readouterr().err


# A log line at warning or above (structlog's console renderer, the product's text format) or one of gRPC's C core.
NOISE = re.compile(r"\[(warning|error|critical)\s*\]|level=(warning|error)|^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ",
                   re.IGNORECASE)


@pytest.mark.xdist_group("system-cdi")  # its containers run under podman from the machine's /var/run/cdi
def test_demo_prints_every_claim_and_exits_zero() -> None:
    work = Path(tempfile.mkdtemp(dir="/tmp", prefix="demo-t-"))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "dra_sandbox", "demo", "--work-dir", str(work)],
            capture_output=True,
            text=True,
            timeout=110,
            cwd=REPO,
            env={k: v for k, v in os.environ.items() if not k.startswith("DRA_DRIVER_")},
            check=False,
        )
        out = done.stdout
        assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
        # Every claim the demo's scenarios create: named claims by name, template claims by their template.
        for scenario in load_scenarios(SCENARIOS, DEMO_SCENARIOS):
            for objs in scenario.files.values():
                for obj in objs:
                    if obj["kind"] == "ResourceClaim":
                        assert re.search(rf"^  {re.escape(obj['metadata']['name'])}\s", out, re.M), obj["metadata"]
                    if obj["kind"] == "ResourceClaimTemplate":
                        assert f"(template {obj['metadata']['name']})" in out
        assert "CLAIM" in out and "NVIDIA_VISIBLE_DEVICES" in out and "CDI IDS" in out
        assert re.search(r"k8s\.gpu\.dra\.dev/claim=[0-9a-f]{8}…-gpu-\d", out)
        assert "executed under podman" in out or "CDI checked, not executed" in out
        assert "Containers ran under podman" in out or "Containers were not executed" in out
        # The pending claims come with the scheduler's explanation.
        assert "pending: pod too-greedy, claim nine-gpus" in out
        assert "needs 9 devices, at most 8 on the node match its selectors" in out  # explain, counted before parsing
        assert f"Work dir: {work}" in out
        assert list(work.glob("node-*/plugin.log")), "the plugin logs stay in the work dir"
        # The controller turned the time-slicing policy into its DeviceClass.
        assert re.search(r"policy e2e-policy-time-slicing: Ready=True \(DeviceClassReady\) → DeviceClass "
                         r"e2e-policy-time-slicing\.gpu\.dra\.dev\n\s+selects: device\.driver == \"gpu\.dra\.dev\"", out)
        assert "sharing: TimeSlicing (the class's opaque config)" in out
        # One ComputeDomain on two GB200 trays: Ready, each worker with its IMEX channel.
        assert re.search(r"^\s+ComputeDomain \S+: Ready; nodes ", out, re.M)
        assert "/dev/nvidia-caps-imex-channels/channel0" in out
        assert "Scenarios: 7 passed, 0 failed, 0 skipped" in out
        # Quiet (issue 38): what the demo expects (a conflict retried, a pod applied before its claim template, the
        # controller's kopf in a thread, a plugin's connection going away as it stops, a plugin socket seen just
        # before it listens) is no warning; a warning, an error or gRPC's own log lines would mean something.
        assert [line for line in (out + done.stderr).splitlines() if NOISE.search(line)] == []
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_demo_rows_follow_claims_requests_and_cdi_ids() -> None:
    uid = "3250a72f-8345-41ae-9994-4af0e39ce361"
    pod = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {
            "containers": [
                {"name": "small", "resources": {"claims": [{"name": "migs", "request": "small"}]}},
                {"name": "other", "resources": {}},
            ],
            "resourceClaims": [{"name": "migs", "resourceClaimTemplateName": "t"}],
        },
        "status": {"resourceClaimStatuses": [{"name": "migs", "resourceClaimName": "p-migs-x1"}]},
    }
    claim = {
        "metadata": {"uid": uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "small", "pool": "node-h100", "device": "gpu-0-mig-1g10gb-19-6"},
                        {"request": "large", "pool": "node-h100", "device": "gpu-0-mig-3g40gb-9-0"},
                    ]
                }
            }
        },
    }
    seen = ContainerView(
        {"NVIDIA_VISIBLE_DEVICES": "MIG-1"},
        "cdi-check",
        False,
        cdi_devices=(f"k8s.gpu.dra.dev/claim={uid}-gpu-0-mig-1g10gb-19-6", "other.vendor/x=y"),
    )
    running = PodView("p", True, phase="Running", node="node-h100", containers={"small": seen})
    [row] = rows_for_pod("s", "step 1", running, pod, {"p-migs-x1": claim})
    assert (row.claim, row.template, row.container, row.node) == ("p-migs-x1", "t", "small", "node-h100")
    assert row.devices == ("node-h100/gpu-0-mig-1g10gb-19-6",)  # only the container's request
    assert row.cdi_ids == (f"k8s.gpu.dra.dev/claim={uid}-gpu-0-mig-1g10gb-19-6",)  # only this claim's ids
    assert (row.visible, row.ran) == (("MIG-1",), "CDI checked, not executed")
    pending = PodView("p", True, phase="Pending", message="cannot allocate")
    [waiting] = rows_for_pod("s", "step 1", pending, pod, {"p-migs-x1": None})
    assert (waiting.pending, waiting.container) == ("cannot allocate", None)
    table = render_rows([row, waiting]).splitlines()
    assert table[0].split() == [
        "CLAIM",
        "POD/CONTAINER",
        "NODE",
        "/",
        "DEVICES",
        "CDI",
        "IDS",
        "NVIDIA_VISIBLE_DEVICES",
        "CONTAINER",
    ]
    assert "k8s.gpu.dra.dev/claim=3250a72f…-gpu-0-mig-1g10gb-19-6" in table[2]
    assert any("PENDING (see below)" in line for line in table)
