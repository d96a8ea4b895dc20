"""`dra-sandbox nvidia-driver unload|load|reload --node NODE [--version X]`: the fake node's NVIDIA kernel driver.

What a GPU node's admin (or the GPU Operator's driver container) does under a running kubelet plugin: `rmmod nvidia`
(unload), `modprobe nvidia` (load, of another version after an upgrade), both in a row (reload, the Operator's
driver upgrade: NVIDIA/k8s-driver-manager#203). A node of `dra-sandbox up --driver absent` starts without it, as
while the Operator's driver container still installs it (NVIDIA/k8s-dra-driver-gpu#1008).

It acts through the fake NVML's shared driver file (`<state>.driver`, dra_driver/nvml/fake/driver.py): a FakeNvml
built on the node's backend spec (`<state dir>/<node>/nvml/spec`, written by the sandbox when the plugin starts)
calls `unload_driver()` / `load_driver(version)`, and the plugin process, which reads the same file on every NVML
call, sees the change. The e2e runner's `nvidiaDriver` step calls `change_driver` the same way.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

from dra_driver.commands.flags import FlagParser, apply_env_defaults
from dra_sandbox.statedir import StateDir, add_state_dir_argument

if TYPE_CHECKING:  # imported when used: the fake backend parses YAML node files
    from dra_driver.nvml.fake.backend import FakeNvml

DriverAction = Literal["unload", "load", "reload"]
ACTIONS: tuple[DriverAction, ...] = get_args(DriverAction)
# What an NVIDIA driver version looks like (580.105.08, 570.124.06, 535.86): two or three dot-separated numbers.
VERSION_RE = re.compile(r"[0-9]{1,4}\.[0-9]{1,4}(\.[0-9]{1,4})?")
SPEC_FILE = Path("nvml") / "spec"  # under the node's work dir (dra_sandbox.cluster.PluginProcess.spec_file)


@dataclass(frozen=True)
class DriverView:
    """The fake node's driver as `nvidia-smi` would summarise it: loaded or not, which version, which load."""

    loaded: bool
    version: str
    generation: int

    def __str__(self) -> str:
        state = "loaded" if self.loaded else "not loaded"
        return f"{state} (version {self.version}, load #{self.generation})"


def check_version(version: str | None, action: DriverAction, flag: str = "--version") -> str | None:
    """Why `version` cannot go with `action` (None: it can)."""
    if version is None:
        return None
    if action == "unload":
        return f"{flag} goes with load or reload (unload removes whatever version is loaded); remove it"
    if not VERSION_RE.fullmatch(version):
        return f"{flag} {version!r} is not a driver version; write e.g. 580.126.09"
    return None


def _fake(spec: str) -> FakeNvml:
    from dra_driver.nvml.factory import open_backend
    from dra_driver.nvml.fake.backend import FakeNvml

    backend = open_backend(spec)
    if not isinstance(backend, FakeNvml) or "state=" not in spec:
        raise ValueError(f"{spec!r} is no fake NVML with a state file: only the sandbox's fake nodes have a driver "
                         "this command can unload")
    return backend


def driver_of(spec: str) -> DriverView:
    """The driver of the fake node whose backend spec is `spec` (with its `state=` file)."""
    driver = _fake(spec).driver()
    return DriverView(driver.loaded, driver.version, driver.generation)


def change_driver(spec: str, action: DriverAction, version: str | None = None) -> tuple[DriverView, DriverView]:
    """Unload, load (`version`: default the last one loaded) or reload the driver; returns (before, after)."""
    problem = check_version(version, action)
    if problem is not None:
        raise ValueError(problem)
    fake = _fake(spec)
    before = fake.driver()
    if action in ("unload", "reload"):
        fake.unload_driver()
    if action in ("load", "reload"):
        fake.load_driver(version)
    after = fake.driver()
    return (DriverView(before.loaded, before.version, before.generation),
            DriverView(after.loaded, after.version, after.generation))


def node_specs(state_dir: Path) -> dict[str, Path]:
    """node name -> its backend spec file, for every fake node the sandbox in `state_dir` started."""
    if not state_dir.is_dir():
        return {}
    return {p.parent.parent.name: p for p in sorted(state_dir.glob(f"*/{SPEC_FILE}")) if p.is_file()}


def add_arguments(parser: FlagParser) -> None:
    parser.add_argument("action", choices=ACTIONS,
                        help="unload (rmmod nvidia), load (modprobe nvidia, --version X after an upgrade) or reload "
                        "(both, as the GPU Operator's driver upgrade)")
    parser.add_argument("--node", required=True, help="the fake node (a name `dra-sandbox up` started)")
    parser.add_argument("--version", default=None,
                        help="the driver version to load (load/reload; default: the version loaded last)")
    add_state_dir_argument(parser)
    apply_env_defaults(parser)


def run(args: argparse.Namespace) -> int:
    prog = "dra-sandbox nvidia-driver"
    problem = check_version(args.version, args.action)
    if problem is not None:
        print(f"{prog}: {problem}", file=sys.stderr)
        return 2
    state = StateDir.chosen(args.state_dir)
    specs = node_specs(state.root)
    if args.node not in specs:
        known = ", ".join(specs) or "none (is the sandbox up? `dra-sandbox up`, or pass its --state-dir)"
        print(f"{prog}: --node {args.node}: no fake node of that name in {state.root}; nodes: {known}",
              file=sys.stderr)
        return 2
    if state.owner() is None:
        # The files still change, and a sandbox started later on this state dir starts with this driver.
        print(f"{prog}: note: no `dra-sandbox up` runs in {state.root}; changing the node's files only")
    try:
        before, after = change_driver(specs[args.node].read_text().strip(), args.action, args.version)
    except (OSError, ValueError) as exc:
        print(f"{prog}: {args.node}: {exc}", file=sys.stderr)
        return 1
    print(f"{args.node}: NVIDIA driver {before} -> {after}")
    return 0
