"""The container runtime `make image` builds with, and `make test`'s image build in the background (docs/image.md).

One probe decides whether podman can run containers here and with which OCI runtime: the sandbox's
(`PodmanRuntime.availability()`: the default runtime, else `--runtime runc`, since crun refuses hosts with
cgroups in hybrid mode). `scripts/build-image.sh` asks it through `podman-args`; the image test and
`PodmanImageLauncher` use the same answer.

    python -m dra_sandbox.imagebuild podman-args          # the global podman arguments, one per line (exit 3: unusable)
    python -m dra_sandbox.imagebuild start --state DIR    # make test: start scripts/build-image.sh in the background
    python -m dra_sandbox.imagebuild run --state RUN_DIR  # (what `start` runs) the build, its log and exit status

`start` never fails `make test`: when podman cannot run containers (or IMAGE_TEST=0) it prints a banner and
records why, and the image test skips with that reason; otherwise the image test waits for the build and fails
when it failed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from dra_driver.fsutil import atomic_write
from dra_sandbox.runtime.podman import PodmanAvailability, PodmanRuntime

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build-image.sh"
UNUSABLE_EXIT = 3
CURRENT = "current"  # in the state dir: the name of the newest run's directory
RUN_PREFIX = "run-"
BuildStatus = Literal["unusable", "disabled", "built", "failed", "running", "absent"]


def podman_runtime(cache_dir: Path | None = None) -> PodmanAvailability:
    """Whether podman can run a container here and the global arguments it needs (e.g. `--runtime runc`)."""
    return PodmanRuntime(cache_dir=cache_dir).availability()


@dataclass(frozen=True)
class BuildOutcome:
    status: BuildStatus
    reason: str = ""
    log: Path | None = None
    exit_code: int | None = None
    seconds: float | None = None

    def log_tail(self, lines: int = 30) -> str:
        if self.log is None or not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def banner(lines: Sequence[str]) -> str:
    rule = "=" * 100
    return "\n".join([rule, *(f"  {line}" for line in lines), rule])


def _current_run(state: Path) -> Path | None:
    pointer = state / CURRENT
    if not pointer.exists():
        return None
    return state / pointer.read_text().strip()


def read_outcome(state: Path) -> BuildOutcome:
    """What the newest `start` in `state` found or started, as far as it has got."""
    run = _current_run(state)
    if run is None or not run.is_dir():
        return BuildOutcome("absent", f"no image build was started in {state}")
    for status in ("unusable", "disabled"):
        marker = run / status
        if marker.exists():
            return BuildOutcome(status, marker.read_text().strip())
    log = run / "build.log"
    rc_file = run / "rc"
    if not rc_file.exists():
        return BuildOutcome("running", "the image build has not finished", log)
    code_text, _, seconds = rc_file.read_text().partition(" ")
    code = int(code_text)
    return BuildOutcome("built" if code == 0 else "failed", f"scripts/build-image.sh exited {code}", log, code,
                        float(seconds or 0))


def wait_for_build(state: Path, timeout_s: float, poll_s: float = 1.0) -> BuildOutcome:
    deadline = time.monotonic() + timeout_s
    while True:
        outcome = read_outcome(state)
        if outcome.status != "running" or time.monotonic() >= deadline:
            return outcome
        time.sleep(poll_s)


def start(state: Path, *, cache_dir: Path | None = None) -> BuildOutcome:
    """Record why no build runs, or start one in the background (a new session: it outlives this process)."""
    state.mkdir(parents=True, exist_ok=True)
    for old in state.glob(f"{RUN_PREFIX}*"):  # finished runs of earlier make tests; a running one stays
        if any((old / marker).exists() for marker in ("rc", "unusable", "disabled")):
            shutil.rmtree(old, ignore_errors=True)
    run = state / f"{RUN_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    run.mkdir()
    atomic_write(state / CURRENT, run.name.encode())
    if os.environ.get("IMAGE_TEST") == "0":
        (run / "disabled").write_text("IMAGE_TEST=0 was set\n")
        return read_outcome(state)
    availability = podman_runtime(cache_dir)
    if not availability.usable:
        (run / "unusable").write_text(f"podman cannot run containers here: {availability.reason}\n")
        return read_outcome(state)
    with open(run / "runner.log", "wb") as out:
        subprocess.Popen(
            [sys.executable, "-m", "dra_sandbox.imagebuild", "run", "--state", str(run)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO,
        )
    return read_outcome(state)


def run_build(run: Path) -> int:
    """scripts/build-image.sh with its output in `run`/build.log; `run`/rc gets "<exit code> <seconds>"."""
    began = time.monotonic()
    with open(run / "build.log", "wb") as log:
        code = subprocess.run(["bash", str(BUILD_SCRIPT)], stdin=subprocess.DEVNULL, stdout=log,
                              stderr=subprocess.STDOUT, cwd=REPO, check=False).returncode
    atomic_write(run / "rc", f"{code} {time.monotonic() - began:.1f}".encode())
    return code


def describe_start(outcome: BuildOutcome, state: Path) -> str:
    if outcome.status in ("unusable", "disabled"):
        return banner([
            "IMAGE TEST WILL NOT RUN: make test does not build the image nor run the kubelet plugin from it.",
            f"Why: {outcome.reason}",
            "scripts/install-system-deps.sh installs podman, runc and gcc; docs/image.md says what is needed.",
        ])
    return f"image: building the image in the background for the image test (log: {outcome.log})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dra_sandbox.imagebuild", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("podman-args", help="print podman's global arguments for this host, one per line")
    for name in ("start", "run"):
        sub.add_parser(name).add_argument("--state", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.action == "podman-args":
        availability = podman_runtime()
        if not availability.usable:
            print(availability.reason, file=sys.stderr)
            return UNUSABLE_EXIT
        for arg in availability.global_args:
            print(arg)
        return 0
    if args.action == "start":
        print(describe_start(start(args.state), args.state), flush=True)
        return 0
    return run_build(args.state)


if __name__ == "__main__":
    raise SystemExit(main())
