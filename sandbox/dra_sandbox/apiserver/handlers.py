"""HTTP layer: routes Kubernetes REST paths to the verbs in `lifecycle`, and renders answers.

Paths: `/api/v1/...` (core) and `/apis/<group>/<version>/...`, each with
`[namespaces/<ns>/]<plural>[/<name>[/<subresource>]]`, plus discovery and health endpoints.
Every resource request is logged and may be failed by an injected fault before it touches state.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import yaml
from aiohttp import web

from . import discovery, errors, openapi, openapiv2, protobuf, scale, tables
from .encoding import dumps, list_body
from .hooks import TIMEOUT, Faults, RequestLog, RequestRecord
from .labelselector import SelectorError, parse_label_selector
from .lifecycle import (
    APPLY_PATCH,
    Clock,
    DeleteOptions,
    Resources,
    Target,
    WriteOptions,
    accepted_patch_types,
    render,
)
from .podlogs import pod_log
from .registry import SUBRESOURCE_VERBS, UNSERVED_SUBRESOURCES, Registry
from .selectors import parse_field_selector
from .settings import Settings
from .shapes import RequestShape, ShapeRecorder, client_of, selector_terms
from .store import object_key
from .validation.admission import FIELD_VALIDATION_MODES, WARN
from .validation.fielderrors import FORBIDDEN, NOT_SUPPORTED, FieldError
from .watch import WatchParams, serve_watch, wait_for_version

LOG = logging.getLogger(__name__)
MAX_BODY_BYTES: Final = 3 * 1024 * 1024  # the apiserver's request size limit
CLIENT_CLOSED: Final = 499  # logged for a hanging request the client abandoned (nginx's code for it)


@dataclass
class ServerContext:
    resources: Resources
    registry: Registry
    settings: Settings
    request_log: RequestLog
    faults: Faults
    shutdown: asyncio.Event
    clock: Clock
    # Set by DRA_SANDBOX_REQUEST_SHAPES: every new request shape is written down for the test suite (shapes.py).
    shapes: ShapeRecorder | None = None


def _json(body: Any, status: int = 200, warnings: list[str] | None = None,
          headers: Mapping[str, str] | None = None) -> web.Response:
    resp = web.Response(body=json.dumps(body, separators=(",", ":")).encode(), status=status,
                        content_type="application/json")
    for k, v in (headers or {}).items():
        resp.headers[k] = v
    for w in warnings or []:
        resp.headers.add("Warning", "299 - " + json.dumps(w))
    return resp


def _error(exc: errors.ApiError) -> web.Response:
    return _json(exc.status(), exc.code, headers=exc.headers)


def build_app(ctx: ServerContext) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES)

    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            return await _dispatch(ctx, request)
        except errors.ApiError as exc:
            return _error(exc)
        except web.HTTPRequestEntityTooLarge:
            # limitedReadBody in k8s.io/apiserver pkg/endpoints/handlers/rest.go
            return _error(errors.request_entity_too_large(f"limit is {MAX_BODY_BYTES}"))
        except Exception as exc:  # keep serving; clients see a real InternalError Status
            LOG.exception("sandbox apiserver: unhandled error on %s %s", request.method, request.path)
            return _error(errors.ApiError(500, "InternalError", f"Internal error occurred: {exc}",
                                          {"causes": [{"message": str(exc)}]}))

    app.router.add_route("*", "/{tail:.*}", handle)
    return app


# ---------------------------------------------------------------------------------------------
# Routing
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResourcePath:
    group: str
    version: str
    plural: str
    namespace: str
    name: str
    subresource: str


def parse_resource_path(segments: list[str]) -> ResourcePath | None:
    if len(segments) >= 3 and segments[0] == "api" and segments[1] == "v1":
        group, version, rest = "", "v1", segments[2:]
    elif len(segments) >= 4 and segments[0] == "apis":
        group, version, rest = segments[1], segments[2], segments[3:]
    else:
        return None
    namespace = ""
    # /namespaces/<ns>/<plural>... addresses namespaced resources; /namespaces/<name>[/status] the namespace.
    if len(rest) >= 3 and rest[0] == "namespaces" and not (group == "" and rest[2] in ("status", "finalize")):
        namespace, rest = rest[1], rest[2:]
    if not 1 <= len(rest) <= 3 or not all(rest):
        return None
    plural, name, sub = rest[0], rest[1] if len(rest) > 1 else "", rest[2] if len(rest) > 2 else ""
    return ResourcePath(group, version, plural, namespace, name, sub)


async def _dispatch(ctx: ServerContext, request: web.Request) -> web.StreamResponse:
    segments = [s for s in request.path.split("/") if s]
    if request.method in ("GET", "HEAD"):
        static = _non_resource(ctx, request, segments)
        if static is not None:
            if ctx.shapes is not None and segments[:1] != ["debug"]:
                _record(ctx, request, "get", "", "", _non_resource_pattern(segments), "", named=False)
            return static
    path = parse_resource_path(segments)
    if path is None:
        if segments and segments[0] in ("api", "apis", "version", "healthz", "livez", "readyz"):
            raise errors.method_not_allowed()
        raise errors.path_not_found()
    return await _resource_request(ctx, request, path)


def _non_resource(ctx: ServerContext, request: web.Request, segments: list[str]) -> web.StreamResponse | None:
    registry = ctx.registry
    if segments == ["version"]:
        return _json(discovery.version_info(ctx.settings.kube_version))
    if segments and segments[0] in ("healthz", "livez", "readyz"):
        return web.Response(text="ok", content_type="text/plain")
    if segments == ["debug", "requests"]:
        # The request log's counts for a client in another process (a bench running the server as its own
        # process); like /healthz, not a resource request, so reading it is not counted.
        tally = sorted(ctx.request_log.tally().items())
        return _json({"requests": [{"verb": verb, "resource": resource, "code": code, "count": n}
                                   for (verb, resource, code), n in tally]})
    if segments == ["openapi", "v2"]:
        if openapiv2.wants_protobuf(request.headers.get("Accept", "")):
            return web.Response(body=openapiv2.protobuf_document(registry, ctx.settings.kube_version),
                                content_type=openapiv2.PROTOBUF_ANSWER_TYPE)
        return _json(openapiv2.document(registry, ctx.settings.kube_version))
    if segments[:2] == ["openapi", "v3"]:
        if len(segments) == 2:
            return _json(openapi.index(registry, ctx.settings.kube_version))
        doc = openapi.document_for_path(registry, ctx.settings.kube_version, segments[2:])
        if doc is None:
            raise errors.path_not_found()
        return _json(doc)
    if segments == ["api"]:
        return _json(discovery.api_versions(request.host))
    if segments == ["api", "v1"]:
        return _json(discovery.api_resource_list(registry, "", "v1"))
    if segments == ["apis"]:
        return _json(discovery.api_group_list(registry))
    if len(segments) == 2 and segments[0] == "apis":
        doc = discovery.api_group(registry, segments[1])
        if doc is None:
            raise errors.path_not_found()
        return _json(doc)
    if len(segments) == 3 and segments[0] == "apis":
        doc = discovery.api_resource_list(registry, segments[1], segments[2])
        if doc is None:
            raise errors.path_not_found()
        return _json(doc)
    return None


def _non_resource_pattern(segments: list[str]) -> str:
    if segments[:1] == ["apis"] and len(segments) in (2, 3):
        return "/apis/{group}" if len(segments) == 2 else "/apis/{group}/{version}"
    if segments[:2] == ["openapi", "v3"] and len(segments) > 2:
        return "/openapi/v3/{path}"
    return "/" + "/".join(segments)


def _record(ctx: ServerContext, request: web.Request, verb: str, group: str, version: str, resource: str,
            scope: str, *, named: bool) -> None:
    assert ctx.shapes is not None
    query = request.query
    fields, labels = selector_terms(query.get("fieldSelector"), query.get("labelSelector"))
    content_type = request.headers.get("Content-Type", "").split(";", 1)[0].strip()
    shape = RequestShape(client_of(request.headers), verb, group, version, resource, scope, named,
                         tuple(sorted(set(query))), fields, labels, content_type)
    ctx.shapes.record(shape, f"{request.method} {request.path_qs}", request.headers.get("User-Agent", ""))


# ---------------------------------------------------------------------------------------------
# Query parameters and bodies
# ---------------------------------------------------------------------------------------------


def _flag(query: Mapping[str, str], name: str) -> bool:
    return query.get(name, "").lower() in ("1", "true")


def _int_param(query: Mapping[str, str], name: str) -> int | None:
    raw = query.get(name)
    if raw in (None, ""):
        return None
    try:
        return int(raw)
    except ValueError as exc:
        raise errors.bad_request(f"{name}: Invalid value: {raw!r}: must be an integer") from exc


def _dry_run(values: list[str]) -> bool:
    for v in values:
        if v != "All":
            raise errors.bad_request(f'dryRun: Unsupported value: "{v}": supported values: "All"')
    return bool(values)


def _write_options(request: web.Request) -> WriteOptions:
    mode = request.query.get("fieldValidation") or WARN
    if mode not in FIELD_VALIDATION_MODES:
        raise errors.bad_request(f'fieldValidation: Unsupported value: "{mode}": supported values: '
                                 + ", ".join(f'"{m}"' for m in FIELD_VALIDATION_MODES))
    return WriteOptions(dry_run=_dry_run(request.query.getall("dryRun", [])), field_validation=mode)


async def _body(request: web.Request, *, required: bool = True) -> Any:
    raw = await request.read()
    if not raw.strip():
        if required:
            raise errors.bad_request("the request body is empty: send a JSON object")
        return None
    content_type = request.content_type
    if content_type == protobuf.CONTENT_TYPE:
        try:
            return protobuf.decode(raw)
        except protobuf.ProtobufError as exc:
            raise errors.unsupported_media_type(f"the protobuf body could not be read: {exc}") from exc
    if "protobuf" in content_type or "cbor" in content_type:
        raise errors.unsupported_media_type(
            f"the sandbox API server reads JSON, YAML and (for the kinds kubectl's generators send) protobuf "
            f"bodies, not {content_type}")
    try:
        if content_type.endswith("yaml"):
            return yaml.safe_load(raw)
        return json.loads(raw)
    except (ValueError, yaml.YAMLError) as exc:
        raise errors.bad_request(f"couldn't get version/kind; json parse error: {exc}") from exc


def _delete_options(request: web.Request, body: Any) -> DeleteOptions:
    opts: Mapping[str, Any] = body if isinstance(body, Mapping) else {}
    propagation = request.query.get("propagationPolicy") or opts.get("propagationPolicy")
    orphan = request.query.get("orphanDependents")
    orphan_flag = opts.get("orphanDependents") if orphan is None else orphan.lower() == "true"
    if propagation is None and orphan_flag is not None:
        propagation = "Orphan" if orphan_flag else "Background"
    grace = _int_param(request.query, "gracePeriodSeconds")
    if grace is None and isinstance(opts.get("gracePeriodSeconds"), int):
        grace = int(opts["gracePeriodSeconds"])
    pre = opts.get("preconditions") if isinstance(opts.get("preconditions"), Mapping) else {}
    assert isinstance(pre, Mapping)
    dry = request.query.getall("dryRun", []) + list(opts.get("dryRun") or [])
    return DeleteOptions(
        propagation=str(propagation) if propagation else None,
        grace_period=grace,
        uid=pre.get("uid"),
        resource_version=pre.get("resourceVersion"),
        dry_run=_dry_run(dry),
    )


NOT_OLDER_THAN: Final = "NotOlderThan"
EXACT: Final = "Exact"


def _send_initial_events(query: Mapping[str, str], *, watch_list: bool) -> bool | None:
    """sendInitialEvents as sent, else SetListOptionsDefaults' (apimachinery pkg/apis/meta/internalversion/
    defaults.go): with the WatchList gate on, a watch from "" or "0" setting neither it nor resourceVersionMatch
    is a watch-list (its initial state ends with the initial-events-end bookmark if bookmarks are allowed)."""
    if "sendInitialEvents" in query:
        return _flag(query, "sendInitialEvents")
    if watch_list and not query.get("resourceVersionMatch") and query.get("resourceVersion", "") in ("", "0"):
        return True
    return None


def _validate_list_options(query: Mapping[str, str], *, watch: bool, watch_list: bool) -> None:
    """ValidateListOptions (apimachinery pkg/apis/meta/internalversion/validation): 422 on ListOptions.
    `watch_list`: the WatchList feature gate (Settings.watch_list)."""
    errs: list[FieldError] = []
    match = query.get("resourceVersionMatch", "")
    path = "resourceVersionMatch"
    initial = "sendInitialEvents" in query
    if watch:
        if initial and match != NOT_OLDER_THAN:
            errs.append(FieldError(path, FORBIDDEN, f"sendInitialEvents requires setting resourceVersionMatch to "
                                                    f"{NOT_OLDER_THAN}"))
        if initial and not watch_list:
            errs.append(FieldError("sendInitialEvents", FORBIDDEN,
                                   "sendInitialEvents is forbidden for watch unless the WatchList feature gate is "
                                   "enabled"))
        if match:
            if not initial:
                errs.append(FieldError(path, FORBIDDEN, "resourceVersionMatch is forbidden for watch unless "
                                                        "sendInitialEvents is provided"))
            if match != NOT_OLDER_THAN:
                errs.append(FieldError(path, NOT_SUPPORTED, f'supported values: "{NOT_OLDER_THAN}"', match))
            if query.get("continue"):
                errs.append(FieldError(path, FORBIDDEN, "resourceVersionMatch is forbidden when continue is provided"))
    else:
        if match:
            if not query.get("resourceVersion"):
                errs.append(FieldError(path, FORBIDDEN,
                                       "resourceVersionMatch is forbidden unless resourceVersion is provided"))
            if query.get("continue"):
                errs.append(FieldError(path, FORBIDDEN, "resourceVersionMatch is forbidden when continue is provided"))
            if match not in (EXACT, NOT_OLDER_THAN):
                errs.append(FieldError(path, NOT_SUPPORTED,
                                       f'supported values: "{EXACT}", "{NOT_OLDER_THAN}", ""', match))
            if match == EXACT and query.get("resourceVersion") == "0":
                errs.append(FieldError(path, FORBIDDEN,
                                       'resourceVersionMatch "exact" is forbidden for resourceVersion "0"'))
        if initial:
            errs.append(FieldError("sendInitialEvents", FORBIDDEN, "sendInitialEvents is forbidden for list"))
    if errs:
        raise errors.invalid("ListOptions", "meta.k8s.io", "", errs)


# ---------------------------------------------------------------------------------------------
# Resource requests
# ---------------------------------------------------------------------------------------------


def _verb(method: str, path: ResourcePath, query: Mapping[str, str]) -> str:
    if method in ("GET", "HEAD"):
        if path.name:
            return "get"
        return "watch" if _flag(query, "watch") else "list"
    table = {"POST": "create", "PUT": "update", "PATCH": "patch"}
    if method == "DELETE":
        return "delete" if path.name else "deletecollection"
    if method in table:
        return table[method]
    raise errors.method_not_allowed()


async def _resource_request(ctx: ServerContext, request: web.Request, path: ResourcePath) -> web.StreamResponse:
    rt = ctx.registry.lookup(path.group, path.version, path.plural)
    if rt is None:
        raise errors.path_not_found()
    if (path.subresource and path.subresource not in rt.subresources and not rt.group
            and path.subresource in UNSERVED_SUBRESOURCES.get(rt.plural, ())):
        raise errors.not_served(rt.plural, path.subresource)
    if (path.namespace and not rt.namespaced) or (path.subresource and path.subresource not in rt.subresources):
        raise errors.path_not_found()
    verb = _verb(request.method, path, request.query)
    if path.subresource and verb not in SUBRESOURCE_VERBS.get(path.subresource, ()):
        raise errors.method_not_allowed()
    if not path.name and verb in ("update", "patch"):
        raise errors.method_not_allowed()
    if path.name and verb == "create" and not path.subresource:
        raise errors.method_not_allowed()
    if rt.namespaced and not path.namespace and verb not in ("list", "watch"):
        if not path.name:
            raise errors.method_not_allowed()
        raise errors.path_not_found()
    t = Target(rt, path.version, path.namespace, path.name, path.subresource)
    if t.subresource == "log":
        pod = ctx.resources.get(Target(rt, path.version, path.namespace, path.name))
        return web.Response(body=pod_log(pod, ctx.settings.pod_log_roots, request.query),
                            content_type="text/plain", charset="utf-8")
    if ctx.shapes is not None:
        scope = ("namespaced" if path.namespace else "all-namespaces") if rt.namespaced else "cluster"
        resource = f"{rt.plural}/{path.subresource}" if path.subresource else rt.plural
        _record(ctx, request, verb, rt.group, path.version, resource, scope, named=bool(path.name))

    def log(code: int) -> None:
        ctx.request_log.record(RequestRecord(verb, rt.group, path.version, rt.plural, path.subresource,
                                             path.namespace, path.name, code, "dryRun" in request.query))

    fault = ctx.faults.take(verb, rt.plural, path.subresource, path.namespace, path.name, rt.group)
    if fault is not None:
        if fault.status == TIMEOUT:
            try:  # held until the client gives up (the handler is cancelled) or the bound passes
                await asyncio.wait_for(ctx.shutdown.wait(), timeout=fault.hang_seconds)
            except TimeoutError:
                pass
            except asyncio.CancelledError:
                log(CLIENT_CLOSED)
                raise
            log(504)
            raise errors.from_code(504, name=path.name, plural=rt.plural, group=rt.group)
        assert isinstance(fault.status, int)
        log(fault.status)
        raise errors.from_code(fault.status, fault.message, name=path.name, plural=rt.plural, group=rt.group)
    logged = False

    def log_once(code: int) -> None:
        nonlocal logged
        if not logged:
            logged = True
            log(code)

    try:
        resp = await _execute(ctx, request, verb, t, lambda: log_once(200))
    except errors.ApiError as exc:
        log_once(exc.code)
        raise
    log_once(resp.status)
    return resp


async def _execute(ctx: ServerContext, request: web.Request, verb: str, t: Target,
                   watch_started: Callable[[], None]) -> web.StreamResponse:
    res = ctx.resources
    rt = t.rt
    query = request.query
    as_table = tables.wants_table(request.headers.get("Accept", ""))
    include = query.get("includeObject", "Metadata")

    def out(obj: Mapping[str, Any]) -> dict[str, Any]:
        return render(obj, rt, t.version)

    variant = (rt.api_version(t.version), rt.kind)

    def encode(obj: Mapping[str, Any]) -> bytes:
        """`out(obj)` as JSON bytes, rendered once per stored object and version."""
        store = res.store
        return store.encodings.encoded(rt.key, object_key(obj), obj, variant, out,
                                       current=store.is_current(rt.key, obj))

    if verb in ("list", "watch", "deletecollection"):
        try:
            labels = parse_label_selector(query.get("labelSelector"))
            fields = parse_field_selector(query.get("fieldSelector"))
            fields.check_supported(rt.field_selectors, ctx.settings.kube_minor, group=rt.group, version=t.version,
                                   kind=rt.kind)
        except SelectorError as exc:
            raise errors.bad_request(str(exc)) from exc
        rv = query.get("resourceVersion", "")
        if rv and not rv.isdigit():
            raise errors.bad_request(f'invalid resource version: resourceVersion: Invalid value: "{rv}": '
                                     f'strconv.ParseUint: parsing "{rv}": invalid syntax')
        _validate_list_options(query, watch=verb == "watch", watch_list=ctx.settings.watch_list)

    if t.subresource == "scale":
        return await _scale(ctx, request, verb, t)
    if verb == "get":
        obj = out(res.get(t))
        if as_table:
            return _json(tables.to_table(rt, [obj], ctx.clock(), include_object=include))
        return _json(obj)
    if verb == "list":
        limit = _int_param(query, "limit")
        token = query.get("continue") or None
        if token and rv not in ("", "0"):
            raise errors.bad_request("specifying resource version is not allowed when using continue")
        if rv not in ("", "0"):
            await wait_for_version(res, int(rv))
        exact = int(rv) if query.get("resourceVersionMatch") == "Exact" else None
        result = res.list_objects(t, labels, fields, limit, token, exact_version=exact)
        list_meta: dict[str, Any] = {"resourceVersion": str(result.resource_version)}
        if result.continue_token:
            list_meta["continue"] = result.continue_token
            list_meta["remainingItemCount"] = result.remaining
        if as_table:
            items = [out(o) for o in result.items]
            return _json(tables.to_table(rt, items, ctx.clock(), include_object=include, list_meta=list_meta))
        # From each object's cached encoding (encoding.py: the watch cache's economy, the same bytes).
        head = {"kind": rt.list_kind, "apiVersion": rt.api_version(t.version), "metadata": list_meta}
        return web.Response(body=list_body(head, [encode(o) for o in result.items]), content_type="application/json")
    if verb == "watch":
        timeout = _int_param(query, "timeoutSeconds")
        params = WatchParams(
            resource_version=rv,
            timeout=float(timeout) if timeout and timeout > 0 else ctx.settings.default_watch_timeout,
            bookmarks=_flag(query, "allowWatchBookmarks"),
            send_initial_events=_send_initial_events(query, watch_list=ctx.settings.watch_list),
            bookmark_interval=ctx.settings.bookmark_interval,
        )

        def encode_event(obj: Mapping[str, Any]) -> bytes:
            if as_table:
                return dumps(tables.to_table(rt, [out(obj)], ctx.clock(), include_object=include))
            return encode(obj)

        return await serve_watch(request, res, t, labels, fields, params, encode_event, watch_started)
    if verb == "create" and t.subresource == "binding":
        res.bind_pod(t, await _body(request), _write_options(request))
        return _json({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, 201)
    if verb == "create":
        body = await _body(request)
        result_w = res.create(t, body, _write_options(request))
        return _json(out(result_w.obj), 201, result_w.warnings)
    if verb == "update":
        body = await _body(request)
        result_w = res.update(t, body, _write_options(request))
        return _json(out(result_w.obj), 200, result_w.warnings)
    if verb == "patch":
        accepted = accepted_patch_types(rt)
        if request.content_type not in accepted:
            # PatchResource in k8s.io/apiserver pkg/endpoints/handlers/patch.go checks this before anything else.
            raise errors.unsupported_media_type(
                f"the body of the request was in an unknown format - accepted media types include: "
                f"{', '.join(accepted)}")
        body = None if request.content_type == APPLY_PATCH else await _body(request)
        result_w = res.patch(t, request.content_type, body, _write_options(request))
        return _json(out(result_w.obj), 200, result_w.warnings)
    if verb == "delete":
        opts = _delete_options(request, await _body(request, required=False))
        result_d = res.delete(t, opts)
        if result_d.removed and not rt.return_deleted_object:
            m = result_d.obj.get("metadata") or {}
            return _json(errors.success_status(t.name, rt.group, rt.plural, str(m.get("uid"))))
        return _json(out(result_d.obj))
    # deletecollection
    opts = _delete_options(request, await _body(request, required=False))
    deleted = res.delete_collection(t, labels, fields, opts)
    return _json({"kind": rt.list_kind, "apiVersion": rt.api_version(t.version),
                  "metadata": {"resourceVersion": str(res.store.resource_version)},
                  "items": [out(o) for o in deleted]})


async def _scale(ctx: ServerContext, request: web.Request, verb: str, t: Target) -> web.Response:
    """`<deployments|replicasets>/<name>/scale` (scale.py): the parent's Scale read, or written through the
    parent's spec.replicas; the answer is the Scale of what was stored."""
    res = ctx.resources
    current = res.get(Target(t.rt, t.version, t.namespace, t.name))
    old = scale.scale_of(render(current, t.rt, t.version))
    if verb == "get":
        return _json(old)
    if verb == "update":
        new = scale.decode_put(await _body(request), t.name)
    else:
        if request.content_type not in accepted_patch_types(t.rt):
            raise errors.unsupported_media_type(
                f"the body of the request was in an unknown format - accepted media types include: "
                f"{', '.join(accepted_patch_types(t.rt))}")
        new = scale.apply_patch(old, request.content_type, await _body(request))
    wanted = scale.requested(t.rt, current, new)
    result = res.write_replicas(t, wanted.replicas, wanted.resource_version, _write_options(request))
    return _json(scale.scale_of(render(result.obj, t.rt, t.version)), 200, result.warnings)
