"""`dra-sandbox apiserver`: serve the sandbox API server in the foreground until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from dra_driver.commands.flags import FlagParser, apply_env_defaults
from dra_driver.ports import PortError, check_free


def add_arguments(parser: FlagParser) -> None:
    parser.add_argument("--kubeconfig-out", type=Path, required=True,
                        help="write a kubeconfig for this server here (mode 0600)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: any free port)")
    parser.add_argument("--kube-version", default="1.37.0",
                        help="Kubernetes version to report (also selects the resource.k8s.io rule set)")
    parser.add_argument("--watch-history", type=int, default=1000,
                        help="events kept per resource for resuming watches (older ones get 410 Gone)")
    parser.add_argument("--bookmark-interval", type=float, default=60.0,
                        help="seconds between watch BOOKMARK events")
    apply_env_defaults(parser)


def run(args: argparse.Namespace) -> int:
    from .server import ApiServer  # aiohttp is imported only when the server really runs

    if not 0 <= args.port <= 65535:
        print(f"--port {args.port} is out of range: use 0 (any free port) to 65535", file=sys.stderr)
        return 2
    try:  # the server binds inside its own event loop thread, where a taken port would be a traceback
        check_free("--port", args.host, args.port, disable=None)
    except PortError as exc:
        print(f"sandbox apiserver: {exc} (or 0 for any free port)", file=sys.stderr)
        return 1
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            server = ApiServer(host=args.host, port=args.port, kube_version=args.kube_version,
                               watch_history=args.watch_history, bookmark_interval=args.bookmark_interval)
            server.start()
        except (RuntimeError, ValueError) as exc:
            print(f"sandbox apiserver: {exc}", file=sys.stderr)
            return 1
        try:
            path = server.write_kubeconfig(args.kubeconfig_out)
            print(f"sandbox API server listening on {server.url} (Kubernetes {args.kube_version}); "
                  f"kubeconfig: {path}", flush=True)
            while not stop.wait(1.0):  # a timed wait keeps signal delivery prompt on every platform
                pass
        finally:
            server.stop()
        print("sandbox API server stopped", flush=True)
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
