"""DRA gRPC client: NodePrepareResources / NodeUnprepareResources over v1 or v1beta1.

Semantics as the kubelet applies them: a 45 s deadline per call; a gRPC-level error fails every claim
of the call; per-claim errors come from the response map (keyed by claim UID); a claim missing from
the map is an error too. `prepare_with_retry` / `unprepare_with_retry` retry only the failed claims
with exponential backoff.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

import grpc

from dra_driver._gen import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from dra_sandbox.kubelet.clock import Backoff, Clock
from dra_sandbox.kubelet.versions import V1, V1BETA1

DEFAULT_CALL_TIMEOUT_S = 45.0
_MODULES: dict[str, tuple[ModuleType, Any]] = {
    V1: (dra_v1_pb2, dra_v1_pb2_grpc.DRAPluginStub),
    V1BETA1: (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc.DRAPluginStub),
}


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass(frozen=True)
class PrepareResult:
    devices: tuple[PreparedDevice, ...] = ()
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _grpc_error(call: str, exc: grpc.RpcError) -> str:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    return f"{call} failed: {code.name if code else 'UNKNOWN'}: {details}"


def prepare_results_from_response(response: Any, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
    """Pure: response map -> result per requested claim UID (missing entries become errors)."""
    out: dict[str, PrepareResult] = {}
    for claim in claims:
        if claim.uid not in response.claims:
            out[claim.uid] = PrepareResult(error=f"NodePrepareResources returned no result for claim "
                                                 f"{claim.namespace}/{claim.name} ({claim.uid})")
            continue
        entry = response.claims[claim.uid]
        if entry.error:
            out[claim.uid] = PrepareResult(error=entry.error)
            continue
        devices = tuple(
            PreparedDevice(
                request_names=tuple(d.request_names),
                pool=d.pool_name,
                device=d.device_name,
                cdi_device_ids=tuple(d.cdi_device_ids),
                share_id=d.share_id if "share_id" in d.DESCRIPTOR.fields_by_name and d.HasField("share_id") else None,
            )
            for d in entry.devices
        )
        out[claim.uid] = PrepareResult(devices=devices)
    return out


def unprepare_results_from_response(response: Any, claims: Sequence[ClaimRef]) -> dict[str, str | None]:
    """Pure: response map -> error (or None) per requested claim UID; missing entries are errors."""
    out: dict[str, str | None] = {}
    for claim in claims:
        if claim.uid not in response.claims:
            out[claim.uid] = (f"NodeUnprepareResources returned no result for claim "
                              f"{claim.namespace}/{claim.name} ({claim.uid})")
        else:
            out[claim.uid] = response.claims[claim.uid].error or None
    return out


class DraClient:
    """One plugin's DRAPlugin service at the version chosen during registration."""

    def __init__(self, channel: grpc.Channel, service: str, timeout_s: float = DEFAULT_CALL_TIMEOUT_S) -> None:
        if service not in _MODULES:
            raise ValueError(f"unsupported DRA service {service!r}; expected one of {sorted(_MODULES)}")
        self.service = service
        self._pb2, stub_class = _MODULES[service]
        self._stub = stub_class(channel)
        self._timeout_s = timeout_s

    def _claims(self, claims: Sequence[ClaimRef]) -> list[Any]:
        return [self._pb2.Claim(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims]

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        if not claims:
            return {}
        request = self._pb2.NodePrepareResourcesRequest(claims=self._claims(claims))
        try:
            response = self._stub.NodePrepareResources(request, timeout=self._timeout_s)
        except grpc.RpcError as exc:
            message = _grpc_error("NodePrepareResources", exc)
            return {c.uid: PrepareResult(error=message) for c in claims}
        return prepare_results_from_response(response, claims)

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str | None]:
        if not claims:
            return {}
        request = self._pb2.NodeUnprepareResourcesRequest(claims=self._claims(claims))
        try:
            response = self._stub.NodeUnprepareResources(request, timeout=self._timeout_s)
        except grpc.RpcError as exc:
            message = _grpc_error("NodeUnprepareResources", exc)
            return {c.uid: message for c in claims}
        return unprepare_results_from_response(response, claims)


R = TypeVar("R")


def _retry(
    call: Callable[[Sequence[ClaimRef]], Mapping[str, R]],
    failed: Callable[[R], bool],
    claims: Sequence[ClaimRef],
    clock: Clock,
    backoff: Backoff,
    stop: threading.Event,
    max_attempts: int | None,
) -> dict[str, R]:
    results: dict[str, R] = {}
    pending = list(claims)
    attempt = 0
    while pending:
        attempt += 1
        for uid, result in call(pending).items():
            results[uid] = result
        pending = [c for c in pending if failed(results[c.uid])]
        if not pending or (max_attempts is not None and attempt >= max_attempts):
            break
        if clock.wait(stop, backoff.delay(attempt)):
            break
    return results


def prepare_with_retry(
    client: DraClient,
    claims: Sequence[ClaimRef],
    *,
    clock: Clock,
    backoff: Backoff,
    stop: threading.Event,
    max_attempts: int | None = None,
) -> dict[str, PrepareResult]:
    """Call until every claim is prepared (or attempts run out / stop is set); only failed claims are resent."""
    return _retry(client.prepare, lambda r: not r.ok, claims, clock, backoff, stop, max_attempts)


def unprepare_with_retry(
    client: DraClient,
    claims: Sequence[ClaimRef],
    *,
    clock: Clock,
    backoff: Backoff,
    stop: threading.Event,
    max_attempts: int | None = None,
) -> dict[str, str | None]:
    return _retry(client.unprepare, lambda e: e is not None, claims, clock, backoff, stop, max_attempts)
