"""gRPC servicers: registration, DRA v1 + v1beta1 (one driver behind both), and device health."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc
import structlog

from dra_driver._gen import (
    dra_health_v1_pb2 as health_v1_pb,
)
from dra_driver._gen import (
    dra_health_v1_pb2_grpc as health_v1_grpc,
)
from dra_driver._gen import (
    dra_health_v1alpha1_pb2 as health_pb,
)
from dra_driver._gen import (
    dra_health_v1alpha1_pb2_grpc as health_grpc,
)
from dra_driver._gen import (
    dra_v1_pb2 as v1_pb,
)
from dra_driver._gen import (
    dra_v1_pb2_grpc as v1_grpc,
)
from dra_driver._gen import (
    dra_v1beta1_pb2 as v1beta1_pb,
)
from dra_driver._gen import (
    dra_v1beta1_pb2_grpc as v1beta1_grpc,
)
from dra_driver._gen import (
    pluginregistration_v1_pb2 as reg_pb,
)
from dra_driver._gen import (
    pluginregistration_v1_pb2_grpc as reg_grpc,
)
from dra_driver.kubeletplugin.driver import ClaimRef, Driver, HealthSnapshot, HealthSource, PrepareResult
from dra_driver.kubeletplugin.names import request_problems

log = structlog.get_logger(__name__)

T = TypeVar("T")

DRA_PLUGIN_TYPE = "DRAPlugin"
# v1 first: a 1.34+ kubelet picks the first entry of OUR list it supports; 1.32/1.33 look for v1beta1.
# Health: a 1.37 kubelet prefers v1.DRAResourceHealth wherever it stands in the list (pickHealthService in
# pkg/kubelet/cm/dra/plugin); 1.34-1.36 kubelets know only v1alpha1. Both are served from one HealthSource.
SUPPORTED_VERSIONS = (
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1alpha1.DRAResourceHealth",
    "v1.DRAResourceHealth",
)
HEALTH_REFRESH_SECONDS = 30.0


def advertised_versions(*, health: bool) -> list[str]:
    """What GetInfo lists: the health services only when the driver has a health source (the kubelet opens a health
    stream to a plugin that advertises one)."""
    return [v for v in SUPPORTED_VERSIONS if health or not v.endswith(".DRAResourceHealth")]


class RegistrationServicer(reg_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, driver_name: str, endpoint: str, *, health: bool = True) -> None:
        self._info = reg_pb.PluginInfo(
            type=DRA_PLUGIN_TYPE,
            name=driver_name,
            endpoint=endpoint,
            supported_versions=advertised_versions(health=health),
        )
        self.registered = threading.Event()
        self.last_error = ""

    def GetInfo(self, request: Any, context: Any) -> Any:
        return self._info

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        if request.plugin_registered:
            self.last_error = ""
            self.registered.set()
            log.info("registered with the kubelet", driver=self._info.name)
        else:
            self.last_error = request.error
            self.registered.clear()
            log.error("kubelet refused registration", driver=self._info.name, error=request.error)
        return reg_pb.RegistrationStatusResponse()


def _claims(request: Any) -> tuple[list[ClaimRef], dict[str, str]]:
    """The request's claims that may be processed, and UID -> error for those that may not (identities that
    Kubernetes could not have produced never reach the driver, the API or the disk)."""
    claims = [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in request.claims]
    refused = request_problems(claims)
    for uid, problem in refused.items():
        log.warning("refused a malformed claim from the kubelet", claim_uid=uid[:128], error=problem)
    accepted = {c.uid: c for c in claims if c.uid not in refused}  # an exact duplicate is processed once
    return list(accepted.values()), refused


def _internal_error(operation: str, ref: ClaimRef, exc: Exception) -> str:
    return (
        f"{operation} {ref.namespace}/{ref.name}: internal error in the plugin: {type(exc).__name__}: {exc} "
        "(its log has the details); the kubelet retries"
    )


def _each_claim_answered(
    operation: str, call: Callable[[list[ClaimRef]], dict[str, T]], claims: list[ClaimRef], failed: Callable[[str], T]
) -> dict[str, T]:
    """The driver's answers for `claims`, even where it broke its contract and raised: one claim's failure must not
    fail the kubelet's whole call (gRPC UNKNOWN, no answer for the others). A batch that raised is asked again claim
    by claim (prepare and unprepare are idempotent: a claim already done answers the same), so only a claim that
    raises on its own gets `failed(message)`, logged with the claim."""
    if not claims:
        return {}
    try:
        return call(claims)
    except Exception as exc:
        if len(claims) == 1:
            return {claims[0].uid: _logged_failure(operation, claims[0], exc, failed)}
        # The traceback is logged with the claim that raises again alone.
        log.warning("the driver raised for a batch of claims; asking again claim by claim", operation=operation,
                    claims=len(claims), error=f"{type(exc).__name__}: {exc}")  # fmt: skip
    out: dict[str, T] = {}
    for ref in claims:
        try:
            answer = call([ref])
        except Exception as exc:
            out[ref.uid] = _logged_failure(operation, ref, exc, failed)
            continue
        if ref.uid in answer:
            out[ref.uid] = answer[ref.uid]
    return out


def _logged_failure(operation: str, ref: ClaimRef, exc: Exception, failed: Callable[[str], T]) -> T:
    log.error("the driver raised instead of answering for a claim", operation=operation,
              claim=f"{ref.namespace}/{ref.name}", claim_uid=ref.uid, exc_info=exc)  # fmt: skip
    return failed(_internal_error(operation, ref, exc))


class _DraServicerBase:
    """Shared by both API versions; `_pb` is the version's message module."""

    _pb: Any
    _has_share_id: bool

    def __init__(self, driver: Driver) -> None:
        self._driver = driver

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        claims, refused = _claims(request)
        results = _each_claim_answered(
            "prepare", self._driver.prepare, claims, lambda message: PrepareResult(error=message)
        )
        response = self._pb.NodePrepareResourcesResponse()
        for claim in request.claims:
            result = results.get(claim.uid)
            entry = response.claims[claim.uid]
            if claim.uid in refused:
                entry.error = refused[claim.uid]
                continue
            if result is None:
                entry.error = "internal error: the driver returned no result for this claim"
                continue
            if result.error:
                entry.error = result.error
                continue
            try:
                self._add_devices(entry, result)
            except Exception as exc:  # a result the message cannot carry: this claim's error, not the call's
                del entry.devices[:]
                ref = ClaimRef(namespace=claim.namespace, name=claim.name, uid=claim.uid)
                entry.error = _logged_failure("prepare", ref, exc, lambda message: message)
        return response

    def _add_devices(self, entry: Any, result: PrepareResult) -> None:
        for dev in result.devices:
            out = entry.devices.add(
                request_names=list(dev.request_names),
                pool_name=dev.pool,
                device_name=dev.device,
                cdi_device_ids=list(dev.cdi_device_ids),
            )
            if self._has_share_id and dev.share_id:
                out.share_id = dev.share_id

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        claims, refused = _claims(request)
        errors = {**_each_claim_answered("unprepare", self._driver.unprepare, claims, lambda message: message),
                  **refused}  # fmt: skip
        response = self._pb.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            # From 1.34 every claim of the request must have an entry, even a successful one.
            response.claims[claim.uid].error = errors.get(claim.uid, "internal error: no result for this claim")
        return response


class DraV1Servicer(_DraServicerBase, v1_grpc.DRAPluginServicer):  # type: ignore[misc]
    _pb = v1_pb
    _has_share_id = True


class DraV1beta1Servicer(_DraServicerBase, v1beta1_grpc.DRAPluginServicer):  # type: ignore[misc]
    _pb = v1beta1_pb
    _has_share_id = False


class HealthServicer(health_grpc.DRAResourceHealthServicer):  # type: ignore[misc]
    """Streams the full device list whenever health changes, and at least every refresh interval (v1alpha1;
    `HealthV1Servicer` speaks v1 from the same source: the two protos have the same messages and numbers)."""

    _pb: Any = health_pb

    def __init__(
        self,
        source: HealthSource,
        stopping: threading.Event,
        refresh: float = HEALTH_REFRESH_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._source = source
        self._stopping = stopping
        self._refresh = refresh
        self._clock = clock

    def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        snapshot = self._source.snapshot()
        while context.is_active() and not self._stopping.is_set():
            yield _health_response(self._pb, snapshot)
            deadline = self._clock() + self._refresh
            # Short waits so a cancelled stream or a shutting-down plugin frees its thread quickly.
            while context.is_active() and not self._stopping.is_set() and self._clock() < deadline:
                newer = self._source.wait_for_change(snapshot.version, timeout=min(1.0, self._refresh))
                if newer.version != snapshot.version:
                    snapshot = newer
                    break
            else:
                snapshot = self._source.snapshot()


class HealthV1Servicer(HealthServicer, health_v1_grpc.DRAResourceHealthServicer):  # type: ignore[misc]
    """`/v1.DRAResourceHealth/NodeWatchResources` (kubernetes/kubernetes PR 139477), for 1.37+ kubelets."""

    _pb = health_v1_pb


def _health_response(pb: Any, snapshot: HealthSnapshot) -> Any:
    return pb.NodeWatchResourcesResponse(
        devices=[
            pb.DeviceHealth(
                device=pb.DeviceIdentifier(pool_name=d.pool, device_name=d.device),
                health=_HEALTH[d.healthy],
                last_updated_time=d.last_updated,
                message=_truncate(d.message),
            )
            for d in snapshot.devices
        ]
    )


# The enum numbers are the same in v1alpha1 and v1.
_HEALTH = {True: health_pb.HEALTHY, False: health_pb.UNHEALTHY, None: health_pb.UNKNOWN}


def _truncate(message: str, limit: int = 1024) -> str:
    return message if len(message) <= limit else message[: limit - 3] + "..."
