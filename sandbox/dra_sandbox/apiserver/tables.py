"""`meta.k8s.io/v1` Table output, which `kubectl get` asks for.

Built-in kinds get a few familiar columns; custom resources get their CRD's additionalPrinterColumns
(simple JSONPath: `.a.b`, `[N]`, `[?(@.k=="v")]`). Ages read like kubectl's (`5m10s`, `3h`, `2d4h`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from . import conversion
from .registry import PrinterColumn, ResourceType

Cell = Callable[[Mapping[str, Any], datetime], object]


def human_duration(seconds: float) -> str:
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m" if s % 60 == 0 else f"{minutes}m{s % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h" if minutes % 60 == 0 else f"{hours}h{minutes % 60}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d" if hours % 24 == 0 else f"{hours // 24}d{hours % 24}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if days == 0 else f"{hours // 24 // 365}y{days}d"
    return f"{hours // 24 // 365}y"


def _age(obj: Mapping[str, Any], now: datetime) -> object:
    stamp = (obj.get("metadata") or {}).get("creationTimestamp")
    if not isinstance(stamp, str):
        return "<unknown>"
    try:
        created = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=now.tzinfo)
    except ValueError:
        return "<unknown>"
    return human_duration((now - created).total_seconds())


_STEP_RE: Final = re.compile(r"\.([A-Za-z0-9_-]+)|\[(\d+)\]|\[\?\(@\.([A-Za-z0-9_.-]+)\s*==\s*['\"]([^'\"]*)['\"]\)\]")


def json_path(obj: Any, path: str) -> Any:
    """A small JSONPath subset; None when the path does not resolve."""
    cur = obj
    pos = 0
    text = path.strip().removeprefix("{").removesuffix("}").removeprefix("$")
    while pos < len(text):
        m = _STEP_RE.match(text, pos)
        if not m:
            return None
        pos = m.end()
        if m.group(1) is not None:
            cur = cur.get(m.group(1)) if isinstance(cur, Mapping) else None
        elif m.group(2) is not None:
            i = int(m.group(2))
            cur = cur[i] if isinstance(cur, list) and i < len(cur) else None
        else:
            field, want = m.group(3), m.group(4)
            cur = next((x for x in cur if isinstance(x, Mapping) and str(json_path(x, "." + field)) == want),
                       None) if isinstance(cur, list) else None
        if cur is None:
            return None
    return cur


def _path_cell(path: str) -> Cell:
    return lambda obj, now: json_path(obj, path)


def _pod_ready(obj: Mapping[str, Any], now: datetime) -> object:
    containers = ((obj.get("spec") or {}).get("containers")) or []
    statuses = ((obj.get("status") or {}).get("containerStatuses")) or []
    return f"{sum(1 for s in statuses if s.get('ready'))}/{len(containers)}"


def _condition_true(status: Mapping[str, Any], kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True" for c in status.get("conditions") or [])


def _terminated_reason(terminated: Mapping[str, Any], prefix: str = "") -> str:
    if terminated.get("reason"):
        return prefix + str(terminated["reason"])
    if terminated.get("signal"):
        return f"{prefix}Signal:{terminated['signal']}"
    return f"{prefix}ExitCode:{terminated.get('exitCode') or 0}"


def _init_reason(spec: Mapping[str, Any], status: Mapping[str, Any]) -> str | None:
    """printPod's walk over the init containers: the reason of the first one not done, None when all are."""
    specs = spec.get("initContainers") or []
    restartable = {c.get("name") for c in specs if c.get("restartPolicy") == "Always"}
    for i, container in enumerate(status.get("initContainerStatuses") or []):
        state = container.get("state") or {}
        terminated, waiting = state.get("terminated"), state.get("waiting")
        if terminated and not terminated.get("exitCode"):
            continue
        if container.get("name") in restartable and container.get("started"):
            continue
        if terminated:
            return _terminated_reason(terminated, "Init:")
        if waiting and waiting.get("reason") and waiting.get("reason") != "PodInitializing":
            return f"Init:{waiting['reason']}"
        return f"Init:{i}/{len(specs)}"
    return None


def _pod_status(obj: Mapping[str, Any], now: datetime) -> object:
    """printPod's STATUS (pkg/printers/internalversion/printers.go): the phase or status.reason, replaced by an
    init container's state while initializing, else by the containers' (waiting reason, terminated reason or
    exit code: `Completed`, `Error`, `ContainerCreating`...), `Running`/`NotReady` where a container still runs,
    `Terminating` for a pod being deleted before it finished."""
    status = obj.get("status") or {}
    spec = obj.get("spec") or {}
    phase = str(status.get("phase") or "Pending")  # PrepareForCreate sets it; a bare object may lack it
    reason = str(status.get("reason") or phase)
    if any(c.get("type") == "PodScheduled" and c.get("reason") == "SchedulingGated"
           for c in status.get("conditions") or []):
        reason = "SchedulingGated"
    init = _init_reason(spec, status)
    if init is not None:
        reason = init
    if init is None or _condition_true(status, "Initialized"):
        has_running, error_reason = False, ""
        for container in reversed(status.get("containerStatuses") or []):
            state = container.get("state") or {}
            waiting, terminated = state.get("waiting"), state.get("terminated")
            if waiting and waiting.get("reason"):
                reason = str(waiting["reason"])
            elif terminated:
                reason = _terminated_reason(terminated)
                if terminated.get("exitCode"):
                    error_reason = reason
            elif container.get("ready") and state.get("running") is not None:
                has_running = True
        if reason == "Completed":
            if has_running and _condition_true(status, "Ready"):
                reason = "Running"
            elif error_reason:
                reason = error_reason
            elif has_running:
                reason = "NotReady"
    deleting = (obj.get("metadata") or {}).get("deletionTimestamp")
    if deleting and status.get("reason") == "NodeLost":
        reason = "Unknown"
    elif deleting and phase not in ("Succeeded", "Failed"):
        reason = "Terminating"
    return reason


def _pod_restarts(obj: Mapping[str, Any], now: datetime) -> object:
    return sum(int(s.get("restartCount") or 0) for s in ((obj.get("status") or {}).get("containerStatuses") or []))


def _node_status(obj: Mapping[str, Any], now: datetime) -> object:
    # pkg/printers/internalversion/printers.go printNode: Ready, NotReady (any other status), Unknown (none).
    ready = [c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"]
    state = ("Ready" if ready[-1].get("status") == "True" else "NotReady") if ready else "Unknown"
    return state + (",SchedulingDisabled" if (obj.get("spec") or {}).get("unschedulable") else "")


_ROLE_PREFIX = "node-role.kubernetes.io/"


def _node_roles(obj: Mapping[str, Any], now: datetime) -> object:
    roles = set()
    for key, value in ((obj.get("metadata") or {}).get("labels") or {}).items():
        if key.startswith(_ROLE_PREFIX) and key[len(_ROLE_PREFIX):]:
            roles.add(key[len(_ROLE_PREFIX):])
        elif key == "kubernetes.io/role" and value:
            roles.add(str(value))
    return ",".join(sorted(roles)) or "<none>"


def _node_address(kind: str) -> Cell:
    def cell(obj: Mapping[str, Any], now: datetime) -> object:
        for address in (obj.get("status") or {}).get("addresses") or []:
            if address.get("type") == kind:
                return address.get("address")
        return "<none>"

    return cell


def _node_info(key: str) -> Cell:
    return lambda obj, now: ((obj.get("status") or {}).get("nodeInfo") or {}).get(key) or "<unknown>"


def _claim_state(obj: Mapping[str, Any], now: datetime) -> object:
    status = obj.get("status") or {}
    states = []
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        states.append("deleted")
    states.append("allocated" if status.get("allocation") else "pending")
    if status.get("reservedFor"):
        states.append("reserved")
    return ",".join(states)


def _count(path: str) -> Cell:
    return lambda obj, now: int(json_path(obj, path) or 0)


def _ratio(done: str, want: str) -> Cell:
    return lambda obj, now: f"{int(json_path(obj, done) or 0)}/{int(json_path(obj, want) or 0)}"


def _job_status(obj: Mapping[str, Any], now: datetime) -> object:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") in ("Complete", "Failed"):
            return str(cond["type"])
    return "Running"


def _job_duration(obj: Mapping[str, Any], now: datetime) -> object:
    status = obj.get("status") or {}
    start = status.get("startTime")
    if not isinstance(start, str):
        return ""
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    end_text = status.get("completionTime")
    end = datetime.strptime(end_text, fmt).replace(tzinfo=now.tzinfo) if isinstance(end_text, str) else now
    return human_duration((end - datetime.strptime(start, fmt).replace(tzinfo=now.tzinfo)).total_seconds())


def _or_none(path: str) -> Cell:
    """A cell kubectl shows as `<none>` when the field is empty (printers.go prints pods' IP and nodes so)."""
    return lambda obj, now: json_path(obj, path) or "<none>"


def _pod_readiness_gates(obj: Mapping[str, Any], now: datetime) -> object:
    gates = ((obj.get("spec") or {}).get("readinessGates")) or []
    if not gates:
        return "<none>"
    true = {c.get("type") for c in ((obj.get("status") or {}).get("conditions") or []) if c.get("status") == "True"}
    return f"{sum(1 for g in gates if g.get('conditionType') in true)}/{len(gates)}"


def _node_selector(obj: Mapping[str, Any], now: datetime) -> object:
    """labels.FormatLabels of the template's nodeSelector: `k=v,...` sorted, `<none>` when empty."""
    selector = ((((obj.get("spec") or {}).get("template") or {}).get("spec") or {}).get("nodeSelector")) or {}
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items())) or "<none>"


def _stamp_age(value: Any, now: datetime) -> str | None:
    """translateTimestampSince / translateMicroTimestampSince: the age of a Time or MicroTime, None when unset."""
    if not isinstance(value, str) or not value:
        return None
    try:
        stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return "<unknown>"
    return human_duration((now - stamp.astimezone(now.tzinfo)).total_seconds())


def _event_cells(obj: Mapping[str, Any], now: datetime) -> list[object]:
    """printEvent (pkg/printers/internalversion/printers.go), always wide as the server prints: LAST SEEN, TYPE,
    REASON, OBJECT, SUBOBJECT, SOURCE, MESSAGE, FIRST SEEN, COUNT, NAME. Reads the stored (core) shape."""
    first = _stamp_age(obj.get("firstTimestamp"), now) or _stamp_age(obj.get("eventTime"), now) or "<unknown>"
    last = _stamp_age(obj.get("lastTimestamp"), now) or first
    count = int(obj.get("count") or 0)
    series = obj.get("series") or {}
    if series:
        last = _stamp_age(series.get("lastObservedTime"), now) or "<unknown>"
        count = int(series.get("count") or 0)
    elif count == 0:
        count = 1  # a singleton event of the events.k8s.io API has no count
    involved = obj.get("involvedObject") or {}
    kind = str(involved.get("kind") or "").lower()
    target = f"{kind}/{involved['name']}" if involved.get("name") else kind
    source = obj.get("source") or {}
    component = source.get("component") or obj.get("reportingComponent") or ""
    instance = source.get("host") or obj.get("reportingInstance") or ""
    return [last, obj.get("type") or "", obj.get("reason") or "", target, involved.get("fieldPath") or "",
            f"{component}, {instance}" if instance else component, str(obj.get("message") or "").strip(), first,
            count, (obj.get("metadata") or {}).get("name")]


# Kinds whose table is not NAME + columns + AGE: (name, type, format, priority) of every column, then the cells.
_OWN_TABLES: Final[Mapping[tuple[str, str], tuple[tuple[tuple[str, str, str, int], ...],
                                                    Callable[[Mapping[str, Any], datetime], list[object]]]]] = {
    ("", "events"): ((("Last Seen", "string", "", 0), ("Type", "string", "", 0), ("Reason", "string", "", 0),
                      ("Object", "string", "", 0), ("Subobject", "string", "", 1), ("Source", "string", "", 1),
                      ("Message", "string", "", 0), ("First Seen", "string", "", 1), ("Count", "string", "", 1),
                      ("Name", "string", "name", 1)), _event_cells),
}


_BUILTIN_COLUMNS: Final[Mapping[tuple[str, str], Sequence[tuple[str, str, Cell]]]] = {
    ("", "Pod"): (("Ready", "string", _pod_ready), ("Status", "string", _pod_status),
                  ("Restarts", "integer", _pod_restarts)),
    ("", "Node"): (("Status", "string", _node_status), ("Roles", "string", _node_roles), ("Age", "date", _age),
                   ("Version", "string", _path_cell(".status.nodeInfo.kubeletVersion"))),
    ("", "Namespace"): (("Status", "string", _path_cell(".status.phase")),),
    ("resource.k8s.io", "ResourceSlice"): (("Node", "string", _path_cell(".spec.nodeName")),
                                           ("Driver", "string", _path_cell(".spec.driver")),
                                           ("Pool", "string", _path_cell(".spec.pool.name"))),
    ("resource.k8s.io", "ResourceClaim"): (("State", "string", _claim_state),),
    ("apps", "Deployment"): (("Ready", "string", _ratio(".status.readyReplicas", ".spec.replicas")),
                             ("Up-to-date", "integer", _count(".status.updatedReplicas")),
                             ("Available", "integer", _count(".status.availableReplicas"))),
    ("apps", "ReplicaSet"): (("Desired", "integer", _count(".spec.replicas")),
                             ("Current", "integer", _count(".status.replicas")),
                             ("Ready", "integer", _count(".status.readyReplicas"))),
    # kubectl's printDaemonSet (pkg/printers/internalversion/printers.go): DESIRED CURRENT READY UP-TO-DATE
    # AVAILABLE NODE SELECTOR AGE.
    ("apps", "DaemonSet"): (("Desired", "integer", _count(".status.desiredNumberScheduled")),
                            ("Current", "integer", _count(".status.currentNumberScheduled")),
                            ("Ready", "integer", _count(".status.numberReady")),
                            ("Up-to-date", "integer", _count(".status.updatedNumberScheduled")),
                            ("Available", "integer", _count(".status.numberAvailable")),
                            ("Node Selector", "string", _node_selector)),
    ("batch", "Job"): (("Status", "string", _job_status),
                       ("Completions", "string", _ratio(".status.succeeded", ".spec.completions")),
                       ("Duration", "string", _job_duration)),
    ("coordination.k8s.io", "Lease"): (("Holder", "string", _path_cell(".spec.holderIdentity")),),
}


# Priority-1 columns (`kubectl get -o wide`), after the others.
_WIDE_COLUMNS: Final[Mapping[tuple[str, str], Sequence[tuple[str, str, Cell]]]] = {
    ("", "Pod"): (("IP", "string", _or_none(".status.podIP")), ("Node", "string", _or_none(".spec.nodeName")),
                  ("Nominated Node", "string", _or_none(".status.nominatedNodeName")),
                  ("Readiness Gates", "string", _pod_readiness_gates)),
    ("", "Node"): (("Internal-IP", "string", _node_address("InternalIP")),
                   ("External-IP", "string", _node_address("ExternalIP")),
                   ("OS-Image", "string", _node_info("osImage")),
                   ("Kernel-Version", "string", _node_info("kernelVersion")),
                   ("Container-Runtime", "string", _node_info("containerRuntimeVersion"))),
}


def _columns(rt: ResourceType) -> list[tuple[str, str, Cell, int]]:
    if rt.custom:
        if not rt.printer_columns:
            return [("Age", "date", _age, 0)]
        return [(c.name, c.type, _custom_cell(c), 0) for c in rt.printer_columns]
    builtin = list(_BUILTIN_COLUMNS.get((rt.group, rt.kind), ()))
    if not any(name == "Age" for name, _, _ in builtin):
        builtin.append(("Age", "date", _age))
    wide = _WIDE_COLUMNS.get((rt.group, rt.kind), ())
    return [(n, t, c, 0) for n, t, c in builtin] + [(n, t, c, 1) for n, t, c in wide]


def _custom_cell(col: PrinterColumn) -> Cell:
    def cell(obj: Mapping[str, Any], now: datetime) -> object:
        value = json_path(obj, col.json_path)
        if col.type == "date" and isinstance(value, str):
            return _age({"metadata": {"creationTimestamp": value}}, now)
        return value

    return cell


def to_table(rt: ResourceType, objects: Sequence[Mapping[str, Any]], now: datetime, *,
             include_object: str = "Metadata", list_meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The Table of `objects` (as served); kubectl shows the priority-0 columns, `-o wide` all of them."""
    own = None if rt.custom else _OWN_TABLES.get(rt.key)
    cells: Callable[[Mapping[str, Any], datetime], list[object]]
    if own is not None:
        defs = [{"name": name, "type": typ, "format": fmt, "description": name, "priority": priority}
                for name, typ, fmt, priority in own[0]]
        stored_cells = own[1]

        def cells(obj: Mapping[str, Any], now: datetime) -> list[object]:
            # The printer reads the storage shape (events.k8s.io Events print as the core Events they are).
            return stored_cells(conversion.to_storage(rt.group, rt.kind, rt.versions[0], dict(obj)), now)
    else:
        columns = _columns(rt)
        defs = [{"name": "Name", "type": "string", "format": "name", "description": "Name of the object",
                 "priority": 0}]
        defs += [{"name": name, "type": "string" if typ == "date" else typ, "format": "", "description": name,
                  "priority": priority} for name, typ, _, priority in columns]

        def cells(obj: Mapping[str, Any], now: datetime) -> list[object]:
            return [(obj.get("metadata") or {}).get("name")] + [cell(obj, now) for _, _, cell, _ in columns]
    rows = []
    for obj in objects:
        row: dict[str, Any] = {"cells": cells(obj, now)}
        if include_object == "Object":
            row["object"] = obj
        elif include_object != "None":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                             "metadata": obj.get("metadata") or {}}
        rows.append(row)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": dict(list_meta or {}),
            "columnDefinitions": defs, "rows": rows}


def wants_table(accept: str) -> bool:
    """True when the first acceptable media type the client lists is a Table."""
    for part in accept.split(","):
        params = {p.strip().split("=", 1)[0]: p.strip().split("=", 1)[-1] for p in part.split(";")[1:]}
        if params.get("as") == "Table":
            return True
        if part.strip():
            return False
    return False
