"""`dra-sandbox demo`: the whole driver on a local sandbox with fake GPUs, in about two minutes.

It starts the e2e sandbox (8x H100 with dynamic MIG, 8x A100 with MIG on, 8x A100 with MIG off; the chart's
DeviceClasses), runs a few of the e2e scenarios through the e2e runner (the same YAML files, no copies),
and prints what happened: for each claim its node and devices, the CDI ids the kubelet passed to the
runtime, and what the container saw; plus why the pending claims are pending. The sandbox runs
`dra-driver controller` too: one scenario's GpuSharingPolicy is shown becoming a DeviceClass. Exit 0 only when
every scenario's expectations held. A last step runs one ComputeDomain on two GB200 trays (its own small sandbox:
the IMEX daemons run as host processes with stand-in IMEX binaries) and shows the domain, the daemons' pod IPs and
each worker's channel.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dra_driver.commands.explain import explain_claim
from dra_driver.commands.flags import FlagParser, apply_env_defaults
from dra_sandbox.conditions import status_condition
from dra_sandbox.e2e.backend import Backend, ContainerView, PodView
from dra_sandbox.e2e.command import default_scenarios_dir, sandbox_backend
from dra_sandbox.e2e.expect import Observation
from dra_sandbox.e2e.loader import ScenarioError, load_scenarios
from dra_sandbox.e2e.runner import PASS, Runner, RunnerConfig, ScenarioResult, format_result, summary
from dra_sandbox.e2e.sandbox import SandboxBackend, compute_domain_support
from dra_sandbox.e2e.scenario import COMPUTE_DOMAIN_CLUSTER, JsonObject, ObjectRef, Scenario, Step
from dra_sandbox.e2e.table import render_table, shorten_id
from dra_sandbox.runtime.choose import add_runtime_argument
from dra_sandbox.signals import StopRequested

DEMO_SCENARIOS = ("shared-claim", "nvlink-pair", "mig-one-h100", "selectors", "unsatisfiable", "policy-time-slicing")
# The last step: one ComputeDomain on two GB200 trays (its own small sandbox; skipped, not failed, where the
# compute-domain parts are missing).
COMPUTE_DOMAIN_SCENARIO = "compute-domain-2node"
DEFAULT_WORK_ROOT = Path(".demo")
STEP_TIMEOUT = 60.0
MAX_SOCKET_PATH = 107  # AF_UNIX paths must be shorter than 108 bytes
# The longest kubelet socket path below the work dir (the registration socket of the longest node name).
_SOCKET_SUFFIX = "node-h100/plugins_registry/gpu.dra.dev-reg.sock"
_EXPLANATION_LINES = 12
_RESOURCE = "/apis/resource.k8s.io/v1"


@dataclass(frozen=True)
class DemoRow:
    scenario: str
    step: str
    claim: str
    template: str | None
    pod: str
    container: str | None  # None for a pending pod
    node: str | None
    devices: tuple[str, ...] = ()
    cdi_ids: tuple[str, ...] = ()
    visible: tuple[str, ...] = ()
    ran: str = ""
    pending: str = ""  # the scheduling explanation of a pending pod (kube-scheduler's words)
    # Why, per node, from `dra-driver explain <namespace>/<claim>` (kube-scheduler's message names no device reason).
    explained: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[object, ...]:
        return (self.scenario, self.pod, self.container, self.claim, bool(self.pending), self.devices)


def _pod_claims(pod: JsonObject) -> list[tuple[str, str, str | None]]:
    """(pod's name for the claim, claim object name, template name or None) for each pod claim."""
    statuses = {
        s.get("name"): s.get("resourceClaimName") for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    out = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        template = entry.get("resourceClaimTemplateName")
        name = entry.get("resourceClaimName") or statuses.get(entry.get("name")) or ""
        out.append((str(entry.get("name")), str(name), str(template) if template else None))
    return out


def _results_for(claim: JsonObject | None, request: str | None) -> tuple[str, ...]:
    results = ((((claim or {}).get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    return tuple(
        f"{r.get('pool')}/{r.get('device')}"
        for r in results
        if request is None or r.get("request") == request or str(r.get("request", "")).startswith(request + "/")
    )


def describe_run(view: ContainerView) -> str:
    if view.executed:
        return f"executed under {view.runtime}"
    return "CDI checked, not executed"


def rows_for_pod(
    scenario: str, step: str, view: PodView, pod: JsonObject, claims: Mapping[str, JsonObject | None]
) -> list[DemoRow]:
    """The table rows of one observed pod. Pure: `claims` maps claim object names to what the API returned."""
    rows: list[DemoRow] = []
    for pod_claim, claim_name, template in _pod_claims(pod):
        claim = claims.get(claim_name)
        uid = str(((claim or {}).get("metadata") or {}).get("uid") or "")
        shown = claim_name or f"(not created yet, from template {template})"
        if view.phase == "Pending":
            rows.append(DemoRow(scenario, step, shown, template, view.name, None, None, pending=view.message))
            continue
        for spec in (pod.get("spec") or {}).get("containers") or []:
            refs = [c for c in (spec.get("resources") or {}).get("claims") or [] if c.get("name") == pod_claim]
            if not refs:
                continue
            request = refs[0].get("request")
            container = view.containers.get(spec["name"])
            rows.append(
                DemoRow(
                    scenario,
                    step,
                    shown,
                    template,
                    view.name,
                    spec["name"],
                    view.node,
                    devices=_results_for(claim, request),
                    cdi_ids=tuple(i for i in (container.cdi_devices if container else ()) if uid and uid in i),
                    visible=container.visible_devices if container else (),
                    ran=describe_run(container) if container else "no report",
                )
            )
    return rows


class DemoCollector:
    """The runner's step hook: reads each observed pod's claims while they still exist."""

    def __init__(self, backend: Backend, explain: Callable[[JsonObject], str] | None = None) -> None:
        self.backend = backend
        self._explain = explain  # the claim -> `dra-driver explain`'s text
        self.rows: list[DemoRow] = []
        self._seen: set[tuple[object, ...]] = set()
        self.policies: dict[str, list[str]] = {}  # scenario -> lines: each policy and the DeviceClass it became

    def on_step(self, scenario: Scenario, step: Step, observation: Observation) -> None:
        if scenario.name not in self.policies:
            lines = [
                policy_line(self.backend, obj)
                for objs in scenario.files.values()
                for obj in objs
                if obj["kind"] == "GpuSharingPolicy"
            ]
            if lines and all("→ DeviceClass" in line for line in lines):
                self.policies[scenario.name] = lines
        for view in observation.pods.values():
            if not view.exists:
                continue
            pod = self.backend.get(ObjectRef("Pod", view.name, scenario.namespace))
            if pod is None:
                continue
            claims = {
                name: self.backend.get(ObjectRef("ResourceClaim", name, scenario.namespace))
                for _, name, _ in _pod_claims(pod)
                if name
            }
            for row in rows_for_pod(scenario.name, step.title, view, pod, claims):
                claim = claims.get(row.claim)
                if row.pending and claim is not None and self._explain is not None:
                    summaries = [line for line in self._explain(claim).splitlines()
                                 if line.startswith("claim ") and " cannot be allocated on node " in line]
                    row = replace(row, explained=tuple(summaries))
                if row.key not in self._seen:
                    self._seen.add(row.key)
                    self.rows.append(row)


class ComputeDomainCollector:
    """At each passed step of the compute-domain scenario: the domain's status and the IMEX daemon pods."""

    def __init__(self, backend: SandboxBackend) -> None:
        self.backend = backend
        self.lines: list[str] = []

    def on_step(self, scenario: Scenario, step: Step, observation: Observation) -> None:
        domains = {name: d for name, d in observation.compute_domains.items() if d is not None}
        if not domains:
            return
        for name, domain in domains.items():
            status = domain.get("status") or {}
            nodes = ", ".join(f"{n.get('name')} {n.get('ipAddress')} (slot {n.get('index')}, {n.get('status')})"
                              for n in status.get("nodes") or [])
            self.lines.append(f"ComputeDomain {name}: {status.get('status')}; nodes {nodes}")
        for pod in self.backend.cluster.items("/api/v1/namespaces/dra-driver/pods"):
            st = pod.get("status") or {}
            ready = next((c.get("status") for c in st.get("conditions") or [] if c.get("type") == "Ready"), "?")
            self.lines.append(f"  IMEX daemon pod {pod['metadata']['name']} on {pod['spec'].get('nodeName')}: "
                              f"{st.get('phase')}, Ready={ready}, podIP {st.get('podIP')}")
        for view in observation.pods.values():
            for cname, seen in view.containers.items():
                channels = [d for d in seen.device_nodes or () if d.startswith("/dev/nvidia-caps-imex-channels/")]
                self.lines.append(f"  {view.name}/{cname} on {view.node}: {', '.join(channels) or 'no channel'}")


def compute_domain_step(root: Path, work_dir: Path, runtime: str,
                        write: Callable[[str], None]) -> tuple[list[ScenarioResult], list[str]]:
    """Run COMPUTE_DOMAIN_SCENARIO on a two-tray compute-domain sandbox; a line saying why when it cannot run."""
    why = compute_domain_support()
    if why:
        return [], [f"skipped: {why}"]
    (scenario,) = load_scenarios(root, (COMPUTE_DOMAIN_SCENARIO,))
    with sandbox_backend(work_dir / "cd", runtime, write, None, scenario.node_aliases,
                         COMPUTE_DOMAIN_CLUSTER) as backend:
        collector = ComputeDomainCollector(backend)
        results = Runner(backend, RunnerConfig(step_timeout=STEP_TIMEOUT * 3), on_step=collector.on_step,
                         write=write).run([scenario])
    return results, collector.lines


def policy_line(backend: Backend, policy: JsonObject) -> str:
    """`policy NAME: Ready=True (reason) → DeviceClass CLASS: SELECTOR; sharing STRATEGY` as the API shows it."""
    name = policy["metadata"]["name"]
    current = backend.get(ObjectRef("GpuSharingPolicy", name))
    status = (current or {}).get("status") or {}
    ready = status_condition(current, "Ready")
    said = f"Ready={ready['status']} ({ready['reason']})" if ready else "no Ready condition yet"
    class_name = status.get("deviceClassName")
    cls = backend.get(ObjectRef("DeviceClass", str(class_name))) if class_name and ready else None
    if cls is None:
        return f"policy {name}: {said}"
    spec = cls.get("spec") or {}
    selectors = " && ".join(str(sel.get("cel", {}).get("expression", "")) for sel in spec.get("selectors") or [])
    config = spec.get("config") or [{}]
    sharing = ((config[0].get("opaque") or {}).get("parameters") or {}).get("sharing") or {}
    return (
        f"policy {name}: {said} → DeviceClass {class_name}\n      selects: {selectors}\n"
        f"      sharing: {sharing.get('strategy', 'default')} (the class's opaque config)"
    )


def render_rows(rows: Sequence[DemoRow]) -> str:
    headers = ["CLAIM", "POD/CONTAINER", "NODE / DEVICES", "CDI IDS", "NVIDIA_VISIBLE_DEVICES", "CONTAINER"]
    table: list[list[Any]] = []
    for row in rows:
        claim = [row.claim] + ([f"(template {row.template})"] if row.template else [])
        if row.pending:
            table.append([claim, row.pod, "PENDING (see below)", "-", "-", "not started"])
            continue
        placement = [row.node or "-", *[d.split("/", 1)[-1] for d in row.devices]]
        table.append(
            [
                claim,
                f"{row.pod}/{row.container}",
                placement,
                [shorten_id(i) for i in row.cdi_ids] or ["-"],
                [shorten_id(v) for v in row.visible] or ["(none)"],
                row.ran,
            ]
        )
    return render_table(headers, table, indent="  ")


def render_report(
    scenarios: Sequence[Scenario], rows: Sequence[DemoRow], policies: Mapping[str, Sequence[str]] | None = None
) -> str:
    out: list[str] = []
    for scenario in scenarios:
        mine = [r for r in rows if r.scenario == scenario.name]
        out += ["", f"== {scenario.name}: {scenario.description}"]
        out += [f"  {line}" for line in (policies or {}).get(scenario.name, ())]
        if mine:
            out.append(render_rows(mine))
        pending = [r for r in mine if r.pending]
        for row in pending:
            out.append(f"  pending: pod {row.pod}, claim {row.claim}, at {row.step}; the scheduler says:")
            lines = row.pending.splitlines() or ["(no explanation yet)"]
            shown = lines[:_EXPLANATION_LINES]
            out += [f"      {line}" for line in shown]
            if len(lines) > len(shown):
                out.append(f"      ... ({len(lines) - len(shown)} more lines)")
            if row.explained:
                out.append("    dra-driver explain says:")
                out += [f"      {line}" for line in row.explained[:_EXPLANATION_LINES]]
    return "\n".join(out)


def choose_work_dir(requested: Path | None, now: Callable[[], float] = time.time) -> Path:
    """A fresh directory per run (state from an earlier run, e.g. fake MIG devices, must not leak in).

    Default: .demo/<timestamp> (`make clean` removes .demo); /tmp instead when the kubelet socket paths
    below it would be too long for AF_UNIX.
    """
    if requested is not None:
        return requested
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now()))
    candidate = (Path.cwd() / DEFAULT_WORK_ROOT / stamp).resolve()
    if len(str(candidate / _SOCKET_SUFFIX)) <= MAX_SOCKET_PATH:
        suffix = 0
        while candidate.exists():  # two runs in the same second
            suffix += 1
            candidate = candidate.with_name(f"{stamp}-{suffix}")
        candidate.mkdir(parents=True, mode=0o700)
        return candidate
    return Path(tempfile.mkdtemp(dir="/tmp", prefix="dra-demo-"))


def add_arguments(parser: FlagParser) -> None:
    parser.add_argument("--scenarios", type=Path, default=None, help="scenario directory (default: e2e/scenarios)")
    add_runtime_argument(parser)
    parser.add_argument("--work-dir", type=Path, default=None, help="work dir (default: a new .demo/<timestamp>)")
    apply_env_defaults(parser)


def run(args: argparse.Namespace) -> int:
    def write(line: str) -> None:
        print(line, flush=True)

    started = time.monotonic()
    root = args.scenarios or default_scenarios_dir()
    try:
        scenarios = load_scenarios(root, DEMO_SCENARIOS)
    except ScenarioError as exc:
        print(f"dra-sandbox demo: the demo's scenarios are not usable:\n{exc}", file=sys.stderr)
        return 2
    work_dir = choose_work_dir(args.work_dir)
    try:
        with sandbox_backend(work_dir, args.runtime, write) as backend:
            runtime = backend.cluster.runtime
            assert runtime is not None
            cluster = backend.cluster

            def explain(claim: JsonObject) -> str:
                return explain_claim(
                    claim, nodes=cluster.items("/api/v1/nodes"), classes=cluster.items(f"{_RESOURCE}/deviceclasses"),
                    slices=cluster.items(f"{_RESOURCE}/resourceslices"),
                    claims=cluster.items(f"{_RESOURCE}/resourceclaims"), namespace_labels={})[1]

            collector = DemoCollector(backend, explain)
            runner = Runner(backend, RunnerConfig(step_timeout=STEP_TIMEOUT), on_step=collector.on_step, write=write)
            results = runner.run(scenarios)
    except StopRequested as stop:
        write(f"demo: {stop}; the sandbox is stopped")
        return stop.exit_code
    try:
        domain_results, domain_lines = compute_domain_step(root, work_dir, args.runtime, write)
    except StopRequested as stop:
        write(f"demo: {stop}; the sandbox is stopped")
        return stop.exit_code
    results += domain_results
    write(render_report(scenarios, collector.rows, collector.policies))
    write("")
    write(f"== compute domain ({COMPUTE_DOMAIN_SCENARIO}): IMEX daemons as host processes, pod IPs on loopback")
    for line in domain_lines:
        write(f"  {line}")
    write("")
    if runtime.name == "podman":
        write("Containers ran under podman: NVIDIA_VISIBLE_DEVICES above is what each container saw inside, as")
        write("podman injected it from the CDI specs the plugin wrote.")
    else:
        why = "--runtime cdi-check" if args.runtime == "cdi-check" else "podman is not usable here"
        write(f"Containers were not executed ({why}): CDI checked, not executed.")
        write("NVIDIA_VISIBLE_DEVICES above is what the CDI edits would inject; scripts/install-system-deps.sh")
        write("installs podman (needs root and apt).")
    write(f"Work dir: {work_dir} (plugin logs: {work_dir}/<node>/plugin.log)")
    problems = [format_result(r) for r in results if r.status != PASS]
    if not any(r.pending for r in collector.rows):
        problems.append("no pending claim was observed, so no explanation could be shown")
    if not any(r.container and r.visible for r in collector.rows):
        problems.append("no container reported any device")
    if not collector.policies:
        problems.append("no GpuSharingPolicy was seen becoming a DeviceClass")
    line, _ = summary(results)
    write(f"Scenarios: {line}; {time.monotonic() - started:.0f}s in all.")
    if problems:
        write("DEMO FAILED:")
        for problem in problems:
            write(f"  {problem}")
        return 1
    return 0
