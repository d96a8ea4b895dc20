"""DRA gRPC client: NodePrepareResources / NodeUnprepareResources over v1 or v1beta1.

Semantics as the kubelet applies them: a 45 s deadline per call; a gRPC-level error fails every claim
of the call; per-claim errors come from the response map (keyed by claim UID); a claim missing from
the map is an error too. `with_retry` repeats a prepare or unprepare for only the failed claims, with
exponential backoff.
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


T = TypeVar("T")


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
        return self._call("NodePrepareResources", claims, prepare_results_from_response,
                          lambda message: PrepareResult(error=message))

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str | None]:
        return self._call("NodeUnprepareResources", claims, unprepare_results_from_response, lambda message: message)

    def _call(self, rpc: str, claims: Sequence[ClaimRef], answers: Callable[[Any, Sequence[ClaimRef]], dict[str, T]],
              failed: Callable[[str], T]) -> dict[str, T]:
        """One `rpc` call for `claims`: each claim's answer, or for all of them the gRPC error of the call."""
        if not claims:
            return {}
        request = getattr(self._pb2, f"{rpc}Request")(claims=self._claims(claims))
        try:
            response = getattr(self._stub, rpc)(request, timeout=self._timeout_s)
        except grpc.RpcError as exc:
            message = _grpc_error(rpc, exc)
            return {c.uid: failed(message) for c in claims}
        return answers(response, claims)


R = TypeVar("R")


def with_retry(
    call: Callable[[Sequence[ClaimRef]], Mapping[str, R]],
    claims: Sequence[ClaimRef],
    *,
    clock: Clock,
    backoff: Backoff,
    stop: threading.Event,
    max_attempts: int | None = None,
) -> dict[str, R]:
    """`call` (a DraClient's prepare or unprepare) until every claim succeeds, attempts run out or `stop` is set;
    only the failed claims are sent again, after the backoff's delay."""
    results: dict[str, R] = {}
    pending = list(claims)
    attempt = 0
    while pending:
        attempt += 1
        for uid, result in call(pending).items():
            results[uid] = result
        pending = [c for c in pending if _failed(results[c.uid])]
        if not pending or (max_attempts is not None and attempt >= max_attempts):
            break
        if clock.wait(stop, backoff.delay(attempt)):
            break
    return results


def _failed(result: object) -> bool:
    """A prepare's result that is not ok, or an unprepare's error."""
    return not result.ok if isinstance(result, PrepareResult) else result is not None
