"""`make image` runs under the runtime the sandbox's probe picks (runc where crun cannot run), and make test's
background image build records what happened (dra_sandbox.imagebuild, scripts/build-image.sh).

A fake `podman` on PATH plays a host where podman's default runtime is crun on hybrid cgroups: every container
it is asked to run without `--runtime runc` fails with crun's real message; with it, the probe runs for real."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dra_sandbox import imagebuild
from dra_sandbox.runtime.probe import probe_binary
from dra_sandbox.runtime.staticbuild import StaticBuildError

REPO = Path(__file__).resolve().parents[2]
CRUN_HYBRID = "Error: OCI runtime error: crun: cgroups in hybrid mode not supported, drop all controllers from cgroupv2"

FAKE_PODMAN = f'''#!{sys.executable}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_PODMAN_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
runc = args[:2] == ["--runtime", "runc"]
rest = args[2:] if runc else args
verb = rest[0] if rest else ""
if verb in ("run", "build") and not runc:
    print({CRUN_HYBRID!r}, file=sys.stderr)
    sys.exit(126)
if verb == "run" and "--rootfs" in rest:
    at = rest.index("--rootfs")
    rootfs, program = rest[at + 1], rest[at + 2]
    os.execv(rootfs + program, [program, *rest[at + 3:]])
if rest[:2] == ["image", "inspect"]:
    fmt = rest[rest.index("--format") + 1] if "--format" in rest else ""
    print({{"{{{{.Digest}}}}": "sha256:" + "ab" * 32, "{{{{.Id}}}}": "f00d" * 16}}.get(fmt, 123000000))
sys.exit(0)
'''


@pytest.fixture
def crun_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PATH with the fake podman and a runc (the probe retries with runc only where one is installed)."""
    try:
        probe_binary(tmp_path / "cache-home" / "dra-driver" / "sandbox")  # where PodmanRuntime looks
    except StaticBuildError as exc:  # no gcc or no static libc here
        pytest.skip(f"the probe cannot be built here: {exc}")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "podman").write_text(FAKE_PODMAN)
    (bin_dir / "runc").write_text("#!/bin/sh\nexit 0\n")
    for tool in ("podman", "runc"):
        (bin_dir / tool).chmod(0o755)
    log = tmp_path / "podman.log"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_PODMAN_LOG", str(log))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache-home"))
    return log


def podman_calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_the_probe_answers_runc_where_crun_cannot_run(crun_host: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "dra_sandbox.imagebuild", "podman-args"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert (proc.returncode, proc.stdout.split()) == (0, ["--runtime", "runc"]), proc.stderr
    calls = podman_calls(crun_host)
    assert calls[0][0] == "run" and calls[-1][:3] == ["--runtime", "runc", "run"]  # default first, then runc


def test_make_image_passes_runc_to_every_podman_call_that_runs_a_container(crun_host: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON_IMAGE": "localhost/some-python:3.11", "IMAGE": "localhost/dra-driver:probe-test",
           "SANDBOX_PYTHON": sys.executable, "IMAGE_WORK_DIR": str(tmp_path / "work")}
    proc = subprocess.run(["bash", str(REPO / "scripts" / "build-image.sh")], capture_output=True, text=True,
                          env=env, timeout=300, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OCI runtime: podman --runtime runc (the default runtime cannot run containers here)" in proc.stdout
    calls = [c for c in podman_calls(crun_host) if "--rootfs" not in c]  # the probe's own runs aside
    verbs = [c[2:4] if c[2] == "image" else c[2:3] for c in calls]
    # exists + inspect: the base pinned by digest; inspect (the old image), build, prune, inspect (the new), size, run
    assert verbs == [["image", "exists"], ["image", "inspect"], ["image", "inspect"], ["build"], ["image", "prune"],
                     ["image", "inspect"], ["image", "inspect"], ["run"]], verbs
    assert all(c[:2] == ["--runtime", "runc"] for c in calls)
    [build] = [c for c in calls if c[2] == "build"]
    assert f"PYTHON_IMAGE=localhost/some-python:3.11@sha256:{'ab' * 32}" in build
    assert build[-3:] == ["-f", "Dockerfile", "."]


def test_start_with_no_podman_records_why_and_says_so_loudly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("IMAGE_TEST", raising=False)
    state = tmp_path / "state"
    outcome = imagebuild.start(state, cache_dir=tmp_path / "cache")
    assert outcome.status == "unusable" and "'podman' is not installed" in outcome.reason
    assert imagebuild.read_outcome(state) == outcome
    text = imagebuild.describe_start(outcome, state)
    assert "IMAGE TEST WILL NOT RUN" in text and outcome.reason in text and text.startswith("=" * 100)


def test_image_test_0_disables_it_with_that_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IMAGE_TEST", "0")
    outcome = imagebuild.start(tmp_path / "state")
    assert (outcome.status, outcome.reason) == ("disabled", "IMAGE_TEST=0 was set")


def test_outcomes_of_a_run_directory(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert imagebuild.read_outcome(state).status == "absent"
    run = state / "run-1"
    run.mkdir(parents=True)
    (state / imagebuild.CURRENT).write_text("run-1")
    (run / "build.log").write_text("step 1\nimage: error: debootstrap failed\n")
    assert imagebuild.wait_for_build(state, timeout_s=0.2, poll_s=0.05).status == "running"
    (run / "rc").write_text("1 42.5")
    failed = imagebuild.read_outcome(state)
    assert (failed.status, failed.exit_code, failed.seconds) == ("failed", 1, 42.5)
    assert failed.log_tail().endswith("debootstrap failed")
    (run / "rc").write_text("0 7.0")
    assert imagebuild.wait_for_build(state, timeout_s=5).status == "built"


def test_run_build_writes_the_log_and_the_exit_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "build.sh"
    script.write_text("echo building; exit 3\n")
    monkeypatch.setattr(imagebuild, "BUILD_SCRIPT", script)
    assert imagebuild.run_build(tmp_path) == 3
    assert (tmp_path / "build.log").read_text() == "building\n"
    code, seconds = (tmp_path / "rc").read_text().split()
    assert code == "3" and float(seconds) >= 0
    assert shutil.which("bash")
