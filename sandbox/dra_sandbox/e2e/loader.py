"""Read and strictly validate scenario directories (`e2e/scenarios/<name>/`).

A scenario directory holds plain Kubernetes YAML files plus `expect.yaml` (format: e2e/README.md).
Everything wrong is collected and reported together, each problem naming the file and the field path
and saying what to write instead, so an author fixes a scenario in one pass.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from dra_driver.k8s.names import DNS_LABEL_RE, DNS_SUBDOMAIN_MAX, DNS_SUBDOMAIN_RE, is_dns_label
from dra_sandbox.e2e.scenario import (
    KINDS,
    NAMESPACE_PREFIX,
    NODE_LABEL,
    PHASES,
    UUID_KINDS,
    ContainerExpect,
    ContainerRef,
    Expectations,
    JsonObject,
    ObjectRef,
    PodExpect,
    Scenario,
    Step,
    namespace_for,
)

EXPECT_FILE = "expect.yaml"
YAML_SUFFIXES = (".yaml", ".yml")
_MAX_NAME = 63 - len(NAMESPACE_PREFIX)  # the namespace e2e-<name> must stay a DNS label
_RESTART_POLICIES = ("Always", "Never", "OnFailure")
# A pod expected Running must keep running on a real cluster; one expected Succeeded must be allowed to end.
_PHASE_POLICIES = {"Running": ("Always",), "Succeeded": ("Never", "OnFailure")}
_TOP_KEYS = ("description", "timeout", "steps")
_STEP_KEYS = ("name", "apply", "delete", "timeout", "expect")
_EXPECT_KEYS = ("pods", "sameDevices", "distinctDevices", "gone")
_POD_KEYS = ("phase", "node", "message", "containers")
_CONTAINER_KEYS = ("devices", "uuid", "env")


class ScenarioError(ValueError):
    """One or more problems in scenario files; `problems` lists them, each naming file and field."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (PyYAML silently keeps the last one)."""


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}: each key may appear once", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def parse_yaml_documents(text: str, source: str) -> list[Any]:
    """All documents of a YAML text (empty ones dropped). Raises ScenarioError naming `source`."""
    try:
        docs = list(yaml.load_all(text, Loader=_StrictLoader))
    except yaml.YAMLError as exc:
        raise ScenarioError([f"{source}: not valid YAML: {exc}"]) from None
    return [d for d in docs if d is not None]


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, message: str) -> None:
        self.items.append(f"{where}: {message}")


def _type_name(value: object) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def _check_keys(value: Mapping[str, Any], allowed: Iterable[str], where: str, problems: _Problems) -> None:
    allowed = tuple(allowed)
    for key in value:
        if key not in allowed:
            problems.add(f"{where}.{key}", f"unknown field; allowed fields: {', '.join(allowed)}")


def _number(value: object, where: str, problems: _Problems) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        problems.add(where, f"must be a positive number of seconds, got {value!r}")
        return None
    return float(value)


def _regex(value: object, where: str, problems: _Problems) -> str | None:
    if not isinstance(value, str) or not value:
        problems.add(where, f"must be a non-empty regular expression (a string), got {_type_name(value)}")
        return None
    try:
        re.compile(value)
    except re.error as exc:
        problems.add(where, f"invalid regular expression {value!r}: {exc}")
        return None
    return value


# --- Kubernetes files -----------------------------------------------------------------------------


def _check_object(doc: Any, where: str, namespace: str, problems: _Problems) -> JsonObject | None:
    if not isinstance(doc, dict):
        problems.add(where, f"must be a Kubernetes object (a mapping), got {_type_name(doc)}")
        return None
    kind = doc.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        problems.add(f"{where}.kind", f"{kind!r} is not supported here; use one of {', '.join(KINDS)}")
        return None
    info = KINDS[kind]
    if doc.get("apiVersion") != info.api_version:
        problems.add(f"{where}.apiVersion", f"{doc.get('apiVersion')!r}: {kind} must use apiVersion {info.api_version}")
    meta = doc.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        problems.add(f"{where}.metadata.name", "required (a string); generateName is not supported")
        return None
    name = meta["name"]
    pattern = DNS_LABEL_RE if kind == "Pod" else DNS_SUBDOMAIN_RE
    if len(name) > DNS_SUBDOMAIN_MAX or not pattern.fullmatch(name):
        problems.add(f"{where}.metadata.name", f"{name!r} is not a valid {kind} name (lower-case DNS name)")
    if "namespace" in meta:
        problems.add(
            f"{where}.metadata.namespace",
            f"remove it: the runner puts every object in the scenario's own namespace ({namespace})",
        )
    if not isinstance(doc.get("spec"), dict):
        problems.add(f"{where}.spec", "required (a mapping)")
        return None
    obj = dict(doc)
    if info.namespaced:
        obj["metadata"] = {**meta, "namespace": namespace}
    if kind == "Pod":
        _check_pod(obj, where, problems)
    return obj


def _check_pod(pod: JsonObject, where: str, problems: _Problems) -> None:
    spec = pod["spec"]
    if spec.get("restartPolicy") not in _RESTART_POLICIES:
        problems.add(
            f"{where}.spec.restartPolicy",
            f"set it explicitly to one of {', '.join(_RESTART_POLICIES)} (Always for pods that must keep holding "
            f"their devices, Never for run-to-completion), got {spec.get('restartPolicy')!r}",
        )
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        problems.add(f"{where}.spec.containers", "required: a non-empty list")
        return
    for i, container in enumerate(containers):
        if not isinstance(container, dict) or not isinstance(container.get("name"), str):
            problems.add(f"{where}.spec.containers[{i}].name", "required (a string)")


def _pod_containers(pod: JsonObject) -> list[str]:
    return [c["name"] for c in pod["spec"].get("containers") or [] if isinstance(c, dict) and "name" in c]


# --- expect.yaml ----------------------------------------------------------------------------------


class _Context:
    """What the steps so far have applied and deleted, to check references in order."""

    def __init__(self, scenario: str, files: Mapping[str, tuple[JsonObject, ...]]) -> None:
        self.namespace = namespace_for(scenario)
        self.files = files
        self.defined: dict[tuple[str, str], JsonObject] = {}
        for objs in files.values():
            for obj in objs:
                self.defined[(obj["kind"], obj["metadata"]["name"])] = obj
        self.live: set[tuple[str, str]] = set()
        self.ever_applied: set[tuple[str, str]] = set()
        self.used_files: set[str] = set()

    def ref(self, kind: str, name: str) -> ObjectRef:
        namespaced = KINDS[kind].namespaced
        return ObjectRef(kind, name, self.namespace if namespaced else None)

    def pods_applied(self) -> dict[str, JsonObject]:
        return {name: self.defined[(k, name)] for (k, name) in self.ever_applied if k == "Pod"}


def _parse_object_ref(text: object, where: str, ctx: _Context, problems: _Problems) -> tuple[str, str] | None:
    if not isinstance(text, str) or "/" not in text:
        problems.add(where, f"must be 'Kind/name' (e.g. 'Pod/holder'), got {text!r}")
        return None
    kind, _, name = text.partition("/")
    if kind not in KINDS:
        problems.add(where, f"{text!r}: kind {kind!r} is not one of {', '.join(KINDS)}")
        return None
    if (kind, name) not in ctx.defined:
        problems.add(where, f"{text!r} is not defined in any file of this scenario")
        return None
    return kind, name


def _check_apply(value: object, where: str, ctx: _Context, problems: _Problems) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        problems.add(where, "must be a non-empty list of file names of this scenario")
        return ()
    names: list[str] = []
    for i, item in enumerate(value):
        if not isinstance(item, str) or item not in ctx.files:
            problems.add(f"{where}[{i}]", f"{item!r} is not a Kubernetes file of this scenario ({_known(ctx.files)})")
            continue
        names.append(item)
        ctx.used_files.add(item)
        for obj in ctx.files[item]:
            key = (obj["kind"], obj["metadata"]["name"])
            ctx.live.add(key)
            ctx.ever_applied.add(key)
    return tuple(names)


def _known(files: Mapping[str, object]) -> str:
    return "files: " + (", ".join(sorted(files)) or "none")


def _check_delete(value: object, where: str, ctx: _Context, problems: _Problems) -> tuple[ObjectRef, ...]:
    if not isinstance(value, list) or not value:
        problems.add(where, "must be a non-empty list of 'Kind/name' or file names")
        return ()
    keys: list[tuple[str, str]] = []
    for i, item in enumerate(value):
        if isinstance(item, str) and item in ctx.files:
            # A file's objects go in reverse order (pods before the claims they use); like
            # `kubectl delete -f`, objects an earlier step deleted already are skipped.
            keys.extend(
                key
                for key in ((o["kind"], o["metadata"]["name"]) for o in reversed(ctx.files[item]))
                if key in ctx.live
            )
            continue
        if isinstance(item, str) and item.endswith(YAML_SUFFIXES):
            problems.add(f"{where}[{i}]", f"{item!r} is not a Kubernetes file of this scenario ({_known(ctx.files)})")
            continue
        key = _parse_object_ref(item, f"{where}[{i}]", ctx, problems)
        if key is not None:
            keys.append(key)
    refs: list[ObjectRef] = []
    for kind, name in keys:
        if (kind, name) not in ctx.live:
            problems.add(where, f"{kind}/{name} is not present at this step (apply it first, and delete it once)")
            continue
        ctx.live.discard((kind, name))
        refs.append(ctx.ref(kind, name))
    return tuple(refs)


def _check_container_expect(value: object, where: str, problems: _Problems) -> ContainerExpect | None:
    if not isinstance(value, dict) or not value:
        problems.add(where, f"must be a mapping with at least one of {', '.join(_CONTAINER_KEYS)}")
        return None
    _check_keys(value, _CONTAINER_KEYS, where, problems)
    devices = value.get("devices")
    if devices is not None and (isinstance(devices, bool) or not isinstance(devices, int) or devices < 0):
        problems.add(
            f"{where}.devices", f"must be a whole number >= 0 (devices the container got), got {devices!r}"
        )
        devices = None
    uuid = value.get("uuid")
    if uuid is not None and uuid not in UUID_KINDS:
        problems.add(f"{where}.uuid", f"must be one of {', '.join(UUID_KINDS)} (the UUID prefix), got {uuid!r}")
        uuid = None
    if uuid is not None and devices == 0:
        problems.add(f"{where}.uuid", "makes no sense with devices: 0; remove one of them")
    env_raw = value.get("env", {})
    env: dict[str, str] = {}
    if not isinstance(env_raw, dict):
        problems.add(f"{where}.env", f"must be a mapping VARIABLE: regex, got {_type_name(env_raw)}")
    else:
        for var, pattern in env_raw.items():
            checked = _regex(pattern, f"{where}.env.{var}", problems)
            if checked is not None:
                env[str(var)] = checked
    return ContainerExpect(devices=devices, uuid=uuid, env=env)


def _check_pod_expect(name: str, value: object, where: str, ctx: _Context, problems: _Problems) -> PodExpect | None:
    if ("Pod", name) not in ctx.defined:
        problems.add(where, f"pod {name!r} is not defined in any file of this scenario")
        return None
    if ("Pod", name) not in ctx.live:
        problems.add(
            where, f"pod {name!r} is not present at this step (apply its file first; it was not or was deleted)"
        )
        return None
    if not isinstance(value, dict):
        problems.add(where, f"must be a mapping with {', '.join(_POD_KEYS)}, got {_type_name(value)}")
        return None
    _check_keys(value, _POD_KEYS, where, problems)
    pod = ctx.defined[("Pod", name)]
    phase = value.get("phase")
    if phase not in PHASES:
        problems.add(f"{where}.phase", f"required, one of {', '.join(PHASES)}; got {phase!r}")
        return None
    policy = pod["spec"].get("restartPolicy")
    if phase in _PHASE_POLICIES and policy not in _PHASE_POLICIES[phase]:
        problems.add(
            f"{where}.phase",
            f"{phase} needs the pod's restartPolicy to be {' or '.join(_PHASE_POLICIES[phase])}, it is {policy!r}",
        )
    node = value.get("node")
    if node is not None and (not isinstance(node, str) or not DNS_LABEL_RE.fullmatch(node)):
        problems.add(f"{where}.node", f"must be a node alias (the node's {NODE_LABEL} label value), got {node!r}")
        node = None
    if node is not None and phase == "Pending":
        problems.add(f"{where}.node", "a Pending pod has no node; remove node or expect another phase")
    message = None
    if phase == "Pending":
        if "message" not in value:
            problems.add(f"{where}.message", "required for Pending: a regex the scheduling explanation must match")
        else:
            message = _regex(value["message"], f"{where}.message", problems)
    elif "message" in value:
        problems.add(f"{where}.message", "only for phase Pending (the scheduling explanation)")
    containers: dict[str, ContainerExpect] = {}
    raw_containers = value.get("containers", {})
    if raw_containers and phase == "Pending":
        problems.add(f"{where}.containers", "a Pending pod has no containers to look at; remove containers")
    elif not isinstance(raw_containers, dict):
        problems.add(
            f"{where}.containers", f"must be a mapping container name -> expectations, got {_type_name(raw_containers)}"
        )
    else:
        names = _pod_containers(pod)
        for cname, cvalue in raw_containers.items():
            if cname not in names:
                problems.add(f"{where}.containers.{cname}", f"pod {name} has no such container ({', '.join(names)})")
                continue
            checked = _check_container_expect(cvalue, f"{where}.containers.{cname}", problems)
            if checked is not None:
                containers[str(cname)] = checked
    return PodExpect(name=name, phase=phase, node=node, message=message, containers=containers)


def _check_groups(
    value: object, where: str, ctx: _Context, problems: _Problems
) -> tuple[tuple[ContainerRef, ...], ...]:
    if not isinstance(value, list) or not value:
        problems.add(where, "must be a non-empty list of groups, each a list of at least two 'pod/container'")
        return ()
    applied = ctx.pods_applied()
    groups: list[tuple[ContainerRef, ...]] = []
    for i, group in enumerate(value):
        if not isinstance(group, list) or len(group) < 2:
            problems.add(f"{where}[{i}]", "must be a list of at least two 'pod/container'")
            continue
        refs: list[ContainerRef] = []
        for j, item in enumerate(group):
            at = f"{where}[{i}][{j}]"
            if not isinstance(item, str) or item.count("/") != 1:
                problems.add(at, f"must be 'pod/container', got {item!r}")
                continue
            pod_name, container = item.split("/")
            if pod_name not in applied:
                problems.add(at, f"pod {pod_name!r} is not applied by this or an earlier step")
                continue
            if container not in _pod_containers(applied[pod_name]):
                problems.add(at, f"pod {pod_name} has no container {container!r}")
                continue
            refs.append(ContainerRef(pod_name, container))
        if len(set(refs)) != len(refs):
            problems.add(f"{where}[{i}]", "names a container twice")
        groups.append(tuple(refs))
    return tuple(groups)


def _check_expect(value: object, where: str, ctx: _Context, problems: _Problems) -> Expectations:
    if not isinstance(value, dict) or not any(k in value for k in _EXPECT_KEYS):
        problems.add(where, f"required: a mapping with at least one of {', '.join(_EXPECT_KEYS)}")
        return Expectations()
    _check_keys(value, _EXPECT_KEYS, where, problems)
    pods: list[PodExpect] = []
    raw_pods = value.get("pods", {})
    if not isinstance(raw_pods, dict):
        problems.add(f"{where}.pods", f"must be a mapping pod name -> expectations, got {_type_name(raw_pods)}")
    else:
        for name, pod_value in raw_pods.items():
            checked = _check_pod_expect(str(name), pod_value, f"{where}.pods.{name}", ctx, problems)
            if checked is not None:
                pods.append(checked)
    same = _check_groups(value["sameDevices"], f"{where}.sameDevices", ctx, problems) if "sameDevices" in value else ()
    distinct = (
        _check_groups(value["distinctDevices"], f"{where}.distinctDevices", ctx, problems)
        if "distinctDevices" in value
        else ()
    )
    gone: list[ObjectRef] = []
    if "gone" in value:
        raw_gone = value["gone"]
        if not isinstance(raw_gone, list) or not raw_gone:
            problems.add(f"{where}.gone", "must be a non-empty list of 'Kind/name'")
        else:
            for i, item in enumerate(raw_gone):
                key = _parse_object_ref(item, f"{where}.gone[{i}]", ctx, problems)
                if key is None:
                    continue
                if key in ctx.live:
                    problems.add(f"{where}.gone[{i}]", f"{item} is still applied at this step; delete it first")
                    continue
                gone.append(ctx.ref(*key))
    return Expectations(pods=tuple(pods), same_devices=same, distinct_devices=distinct, gone=tuple(gone))


def _check_step(number: int, value: object, where: str, ctx: _Context, problems: _Problems) -> Step | None:
    if not isinstance(value, dict):
        problems.add(where, f"must be a mapping with {', '.join(_STEP_KEYS)}, got {_type_name(value)}")
        return None
    _check_keys(value, _STEP_KEYS, where, problems)
    name = value.get("name", "")
    if not isinstance(name, str):
        problems.add(f"{where}.name", f"must be a string, got {_type_name(name)}")
        name = ""
    has_apply, has_delete = "apply" in value, "delete" in value
    if has_apply == has_delete:
        problems.add(where, "needs exactly one of apply (files) or delete (objects or files)")
    apply = _check_apply(value["apply"], f"{where}.apply", ctx, problems) if has_apply else ()
    delete = _check_delete(value["delete"], f"{where}.delete", ctx, problems) if has_delete else ()
    timeout = _number(value.get("timeout"), f"{where}.timeout", problems)
    expect = _check_expect(value.get("expect"), f"{where}.expect", ctx, problems)
    return Step(number=number, name=name, apply=apply, delete=delete, expect=expect, timeout=timeout)


def _node_aliases(files: Mapping[str, tuple[JsonObject, ...]], steps: Iterable[Step]) -> frozenset[str]:
    aliases = {p.node for s in steps for p in s.expect.pods if p.node}
    for objs in files.values():
        for obj in objs:
            if obj["kind"] == "Pod":
                selector = obj["spec"].get("nodeSelector") or {}
                if isinstance(selector, dict) and isinstance(selector.get(NODE_LABEL), str):
                    aliases.add(selector[NODE_LABEL])
    return frozenset(aliases)


def load_scenario(directory: Path) -> Scenario:
    """Read one scenario directory. Raises ScenarioError listing every problem found."""
    directory = Path(directory)
    name = directory.name
    problems = _Problems()
    if not is_dns_label(name) or len(name) > _MAX_NAME:
        problems.add(
            str(directory),
            f"scenario name {name!r} must be a lower-case DNS label of at most {_MAX_NAME} characters "
            f"(its namespace is {NAMESPACE_PREFIX}<name>)",
        )
    namespace = namespace_for(name)
    expect_path = directory / EXPECT_FILE
    if not expect_path.is_file():
        raise ScenarioError([f"{expect_path}: missing; every scenario needs an {EXPECT_FILE} (see e2e/README.md)"])
    files: dict[str, tuple[JsonObject, ...]] = {}
    seen: dict[tuple[str, str], str] = {}
    for path in sorted(p for p in directory.iterdir() if p.suffix in YAML_SUFFIXES and p.name != EXPECT_FILE):
        try:
            docs = parse_yaml_documents(path.read_text(encoding="utf-8"), str(path))
        except ScenarioError as exc:
            problems.items.extend(exc.problems)
            continue
        objs: list[JsonObject] = []
        for i, doc in enumerate(docs):
            obj = _check_object(doc, f"{path}: document {i + 1}", namespace, problems)
            if obj is None:
                continue
            key = (obj["kind"], obj["metadata"]["name"])
            if key in seen:
                problems.add(f"{path}: document {i + 1}", f"{key[0]}/{key[1]} is already defined in {seen[key]}")
                continue
            seen[key] = path.name
            objs.append(obj)
        if not objs:
            problems.add(str(path), "holds no Kubernetes object; remove the file or add objects")
        files[path.name] = tuple(objs)
    try:
        raw_docs = parse_yaml_documents(expect_path.read_text(encoding="utf-8"), str(expect_path))
    except ScenarioError as exc:
        raise ScenarioError(problems.items + exc.problems) from None
    where = str(expect_path)
    if len(raw_docs) != 1 or not isinstance(raw_docs[0], dict):
        problems.add(where, "must be one YAML mapping with description and steps")
        raise ScenarioError(problems.items)
    raw = raw_docs[0]
    _check_keys(raw, _TOP_KEYS, where, problems)
    description = raw.get("description")
    if not isinstance(description, str) or not description.strip():
        problems.add(f"{where}: description", "required: one line saying what the scenario proves")
        description = ""
    timeout = _number(raw.get("timeout"), f"{where}: timeout", problems)
    ctx = _Context(name, files)
    steps: list[Step] = []
    raw_steps = raw.get("steps")
    if not isinstance(raw_steps, list) or not raw_steps:
        problems.add(f"{where}: steps", "required: a non-empty list of steps")
        raw_steps = []
    for i, raw_step in enumerate(raw_steps):
        step = _check_step(i + 1, raw_step, f"{where}: steps[{i}]", ctx, problems)
        if step is not None:
            steps.append(step)
    for unused in sorted(set(files) - ctx.used_files):
        problems.add(str(directory / unused), "is never applied by a step; apply it or remove it")
    if problems.items:
        raise ScenarioError(problems.items)
    return Scenario(
        name=name,
        directory=directory,
        description=description.strip(),
        files=files,
        steps=tuple(steps),
        node_aliases=_node_aliases(files, steps),
        timeout=timeout,
    )


def load_scenarios(root: Path, only: Iterable[str] = ()) -> list[Scenario]:
    """Every scenario under `root` (sorted by name), or just those named in `only`.

    Raises ScenarioError with the problems of every bad scenario, and for names in `only` that do not exist.
    """
    root = Path(root)
    if not root.is_dir():
        raise ScenarioError([f"{root}: scenario directory not found; pass --scenarios DIR (e.g. e2e/scenarios)"])
    available = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    wanted = list(dict.fromkeys(only)) or available
    unknown = [n for n in wanted if n not in available]
    if unknown:
        raise ScenarioError(
            [f"--only: no scenario named {', '.join(unknown)} under {root}; available: {', '.join(available)}"]
        )
    scenarios: list[Scenario] = []
    problems: list[str] = []
    for scenario_name in wanted:
        try:
            scenarios.append(load_scenario(root / scenario_name))
        except ScenarioError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ScenarioError(problems)
    return scenarios
