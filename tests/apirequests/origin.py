"""Which code sent a request through the product's client, read from the call stack in the test process.

Tests use the product's `KubeRest` both as the product (handed to a plugin, a publisher, `fetch_slices`) and as
their own admin client (creating claims, deleting slices). The API server cannot tell those apart, so in the test
process every request the product's transport sends carries `X-Dra-Request-Origin`: `product:<component>` when
product code (other than the client itself) is on the stack nearer than any sandbox code, else `test`.
kopf (the controller's operator framework, in its own tasks) is marked the same way: `kopf.operator` called
from product code sets a context variable that every task kopf spawns inherits, and kopf's API session then
carries the header (a kopf operator of a sandbox test is `test`). Requests from other processes (the kubelet plugin `dra-sandbox` starts, the CLI run as a subprocess) carry no
header; the server reads their User-Agent instead (dra_sandbox/apiserver/shapes.py).
"""

from __future__ import annotations

import contextvars
import sys
from collections.abc import Callable, Coroutine, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, Final

from dra_driver.k8s import transport as transport_module
from dra_sandbox.apiserver.shapes import ORIGIN_HEADER

REPO: Final = Path(__file__).resolve().parents[2]
PRODUCT: Final = str(REPO / "dra_driver") + "/"
SANDBOX: Final = str(REPO / "sandbox" / "dra_sandbox") + "/"
CLIENT: Final = tuple(str(REPO / "dra_driver" / "k8s" / f) for f in ("client.py", "transport.py", "fallback.py"))
# Product paths that name a component; any other product code is the kubelet plugin's.
COMPONENT_PATHS: Final = (
    ("controller/", "controller"),
    ("commands/controller.py", "controller"),
    ("commands/health.py", "health"),
    ("commands/explain.py", "explain"),
    ("commands/status.py", "status"),
    ("computedomain/daemon/", "compute-domain-daemon"),
    ("commands/compute_domain_daemon.py", "compute-domain-daemon"),
    ("computedomain/plugin/", "compute-domain-kubelet-plugin"),
    ("commands/compute_domain_plugin.py", "compute-domain-kubelet-plugin"),
)
# explain's and status's pages and watch-lists, and DeviceTaintRule discovery (health, explain): the caller further out
# decides
LISTING: Final = ("commands/listing.py", "k8s/liststream.py", "k8s/taintrules.py")
TEST: Final = "test"


def origin(frame: FrameType | None) -> str:
    """`product:<component>` or `test`, from the innermost frame outwards."""
    paged = False  # inside commands/listing.py: explain's, status's, or a sandbox caller's pages
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(SANDBOX):
            return TEST
        if path.startswith(PRODUCT) and path not in CLIENT:
            rel = path[len(PRODUCT):]
            named = next((c for prefix, c in COMPONENT_PATHS if rel.startswith(prefix)), "")
            if named:
                return f"product:{named}"
            if rel in LISTING:
                paged = True
            elif not paged:
                return "product:kubelet-plugin"
        frame = frame.f_back
    return "product:explain" if paged else TEST


@contextmanager
def marking_origins() -> Iterator[None]:
    """Mark every request of the product's transport in this process with its origin."""
    original: Callable[..., Any] = transport_module.HttpTransport.send

    def send(self: transport_module.HttpTransport, method: str, path: str, **kwargs: Any) -> Any:
        headers = {**(kwargs.pop("headers", None) or {}), ORIGIN_HEADER: origin(sys._getframe(1))}
        return original(self, method, path, headers=headers, **kwargs)

    transport_module.HttpTransport.send = send  # type: ignore[method-assign]
    try:
        yield
    finally:
        transport_module.HttpTransport.send = original  # type: ignore[method-assign]


_KOPF_ORIGIN: contextvars.ContextVar[str] = contextvars.ContextVar("kopf_origin", default=TEST)


@contextmanager
def marking_kopf_origins() -> Iterator[None]:
    """Mark the API requests of each kopf operator in this process with who started it."""
    import kopf
    from kopf._cogs.clients import auth

    original_operator: Callable[..., Any] = kopf.operator
    original_init: Callable[..., None] = auth.APIContext.__init__

    def operator(*args: Any, **kwargs: Any) -> Coroutine[Any, Any, Any]:
        # Who calls, not who awaits: the product may hand the coroutine to a task.
        who = "product:controller" if origin(sys._getframe(1)) != TEST else TEST

        async def run() -> Any:
            _KOPF_ORIGIN.set(who)
            return await original_operator(*args, **kwargs)

        return run()

    def init(self: auth.APIContext, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self.session.headers[ORIGIN_HEADER] = _KOPF_ORIGIN.get()

    kopf.operator = operator
    auth.APIContext.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        kopf.operator = original_operator
        auth.APIContext.__init__ = original_init  # type: ignore[method-assign]


@contextmanager
def marking_all_origins() -> Iterator[None]:
    with ExitStack() as stack:
        stack.enter_context(marking_origins())
        stack.enter_context(marking_kopf_origins())
        yield
