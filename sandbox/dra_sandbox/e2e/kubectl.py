"""The e2e backend for real clusters: every operation is one `kubectl` call (argument list, never a shell).

What a container saw is read from its log: scenario pods run `sh -c 'env; sleep N'`, so the log starts with
the container's environment, which `parse_env_output` turns back into a mapping.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_sandbox.e2e.backend import BackendError, ContainerView, condition_message
from dra_sandbox.e2e.scenario import JsonObject, ObjectRef, kind_info
from dra_sandbox.nvidiadriver import DriverAction, DriverView

_ENV_LINE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)")
SERVICE_ACCOUNT_WAIT = 30.0  # seconds a pod create may wait for its new namespace's default ServiceAccount
# A real node's kernel driver is the admin's (or the GPU Operator's): the runner never unloads it.
NO_DRIVER_CONTROL = ("it unloads or reloads a node's NVIDIA driver, which the runner does only to the sandbox's fake "
                     "nodes (run it with `dra-sandbox e2e`, without --kubeconfig)")


@dataclass(frozen=True)
class KubectlConfig:
    kubectl: str = "kubectl"
    kubeconfig: str | None = None
    context: str | None = None
    call_timeout: float = 60.0  # seconds one kubectl call may take
    poll_interval: float = 1.0  # seconds between two looks at the cluster while a step waits
    validate: str = "strict"  # kubectl apply --validate: strict rejects unknown fields (needs the server's OpenAPI)


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str


# (argv, stdin text or None, timeout) -> Completed; the default runs the process, tests may replace it.
RunCommand = Callable[[Sequence[str], str | None, float], Completed]


def run_command(argv: Sequence[str], stdin: str | None, timeout: float) -> Completed:
    try:
        done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise BackendError(f"{argv[0]}: not found; install kubectl or pass --kubectl PATH") from None
    except subprocess.TimeoutExpired:
        raise BackendError(f"{' '.join(argv[:3])}...: no answer within {timeout:.0f}s") from None
    return Completed(done.returncode, done.stdout, done.stderr)


def parse_env_output(text: str) -> dict[str, str]:
    """The output of `env` -> {name: value}. A line that is not NAME=value continues the previous value
    (env prints multi-line values as they are)."""
    env: dict[str, str] = {}
    last: str | None = None
    for line in text.splitlines():
        match = _ENV_LINE.fullmatch(line)
        if match:
            last = match.group(1)
            env[last] = match.group(2)
        elif last is not None:
            env[last] += "\n" + line
    return env


def latest_warning(events: Sequence[Mapping[str, Any]]) -> str:
    """The message of the newest Warning Event ("" when none)."""
    def when(event: Mapping[str, Any]) -> str:
        return str(
            event.get("lastTimestamp")
            or event.get("eventTime")
            or (event.get("metadata") or {}).get("creationTimestamp")
            or ""
        )

    warnings = [e for e in events if e.get("type") == "Warning" and e.get("message")]
    return str(max(warnings, key=when)["message"]) if warnings else ""


def _decoded(text: str, what: str) -> Any:
    """`kubectl get`'s JSON output; BackendError naming `what` when it is not JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BackendError(f"kubectl get {what}: not JSON: {exc}") from None


class KubectlBackend:
    name = "kubectl"

    def __init__(
        self,
        config: KubectlConfig,
        run: RunCommand = run_command,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.config = config
        self._run_command = run
        self._monotonic = monotonic
        self._sleep = sleep

    @property
    def poll_interval(self) -> float:
        return self.config.poll_interval

    def _argv(self, args: Sequence[str]) -> list[str]:
        argv = [self.config.kubectl]
        if self.config.kubeconfig:
            argv += ["--kubeconfig", self.config.kubeconfig]
        if self.config.context:
            argv += ["--context", self.config.context]
        return argv + list(args)

    def _call(self, args: Sequence[str], stdin: str | None = None, *, check: bool = True) -> Completed:
        done = self._run_command(self._argv(args), stdin, self.config.call_timeout)
        if check and done.returncode != 0:
            said = done.stderr.strip() or done.stdout.strip() or "no output"
            raise BackendError(f"kubectl {' '.join(args)} failed (exit {done.returncode}): {said}")
        return done

    @staticmethod
    def _address(ref: ObjectRef) -> list[str]:
        info = kind_info(ref.kind)
        args = [info.resource, ref.name]
        if info.namespaced:
            if ref.namespace is None:
                raise ValueError(f"{ref}: a namespaced kind needs a namespace")
            args += ["--namespace", ref.namespace]
        return args

    def apply(self, obj: JsonObject) -> None:
        args = ["apply", "--filename", "-", "--output", "name", f"--validate={self.config.validate}"]
        deadline = self._monotonic() + SERVICE_ACCOUNT_WAIT
        while True:
            try:
                self._call(args, stdin=json.dumps(obj))
                return
            except BackendError as exc:
                # A namespace's default ServiceAccount appears a moment after the namespace; until then the
                # API server refuses pods in it. Only that refusal is retried.
                if "serviceaccount" not in str(exc).lower() or self._monotonic() >= deadline:
                    raise
            self._sleep(self.poll_interval)

    def delete(self, ref: ObjectRef) -> None:
        self._call(["delete", *self._address(ref), "--ignore-not-found", "--wait=false"])

    def get(self, ref: ObjectRef) -> JsonObject | None:
        done = self._call(["get", *self._address(ref), "--output", "json", "--ignore-not-found"])
        if not done.stdout.strip():
            return None
        obj: JsonObject = _decoded(done.stdout, str(ref))
        return obj

    def _items(self, args: Sequence[str], what: str) -> list[JsonObject]:
        """The `items` of `kubectl get ARGS` (a list in JSON); `what` names the list in an error."""
        items: list[JsonObject] = _decoded(self._call(["get", *args]).stdout, what).get("items") or []
        return items

    def nodes(self) -> list[JsonObject]:
        return self._items(["nodes", "--output", "json"], "nodes")

    def resource_slices(self) -> list[JsonObject]:
        return self._items(["resourceslices.v1.resource.k8s.io", "--output", "json"], "resourceslices")

    def container(self, pod: JsonObject, container: str) -> ContainerView | None:
        meta = pod["metadata"]
        done = self._call(
            ["logs", meta["name"], "--container", container, "--namespace", meta["namespace"]], check=False
        )
        if done.returncode != 0:
            return None  # not started yet (or its log is gone): the runner asks again
        env = parse_env_output(done.stdout)
        if not env:
            return None  # started, but `env` has not printed yet
        # Device nodes: the lines of the log that are /dev/ paths (a scenario's container prints `ls -d /dev/...`).
        nodes = tuple(line.strip() for line in done.stdout.splitlines() if line.strip().startswith("/dev/"))
        return ContainerView(env=env, runtime="cluster", executed=True, device_nodes=nodes)

    def events(self, about: ObjectRef) -> list[JsonObject]:
        namespace = about.namespace or "default"
        selector = f"involvedObject.kind={about.kind},involvedObject.name={about.name}"
        return self._items(["events", "--namespace", namespace, "--output", "json", "--field-selector", selector],
                           f"events about {about}")

    def plugin_ready(self, node: str) -> tuple[bool, str] | None:
        return None  # the plugin's /healthz is its pod's probe; the runner does not look for the chart's pods

    def driver_control(self) -> str:
        return NO_DRIVER_CONTROL

    def driver_of(self, node: str) -> DriverView:
        raise BackendError(NO_DRIVER_CONTROL)

    def change_driver(self, node: str, action: DriverAction, version: str | None) -> tuple[DriverView, DriverView]:
        raise BackendError(NO_DRIVER_CONTROL)

    def scheduling_message(self, pod: JsonObject) -> str:
        message = condition_message(pod)
        if message:
            return message
        # Failures on the node's side (e.g. NodePrepareResources) are events, not conditions.
        meta = pod["metadata"]
        done = self._call(
            [
                "get",
                "events",
                "--namespace",
                meta["namespace"],
                "--output",
                "json",
                "--field-selector",
                f"involvedObject.kind=Pod,involvedObject.name={meta['name']}",
            ],
            check=False,
        )
        if done.returncode != 0:
            return ""
        try:
            events = json.loads(done.stdout).get("items") or []
        except json.JSONDecodeError:
            return ""
        return latest_warning(events)
