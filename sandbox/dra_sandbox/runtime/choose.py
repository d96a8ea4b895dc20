"""Pick the container runtime: podman when it can really run containers here, else the CDI check."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from dra_sandbox.runtime.cdi.registry import DEFAULT_SPEC_DIRS
from dra_sandbox.runtime.cdicheck import CdiCheckedRuntime
from dra_sandbox.runtime.podman import PodmanRuntime
from dra_sandbox.runtime.types import ContainerRuntime

RUNTIME_MODES = ("auto", "podman", "cdi-check")


def add_runtime_argument(parser: argparse.ArgumentParser) -> None:
    """`--runtime`, as `dra-sandbox up`, `demo` and `e2e` take it."""
    parser.add_argument(
        "--runtime",
        choices=RUNTIME_MODES,
        default="auto",
        help="the sandbox's container runtime: podman runs the containers (needs root), cdi-check only resolves "
        "the CDI edits",
    )


def select_runtime(
    mode: str = "auto",
    *,
    cdi_dirs: Sequence[str | Path] = DEFAULT_SPEC_DIRS,
    cache_dir: Path | None = None,
    work_dir: Path | None = None,
) -> ContainerRuntime:
    """`auto`: podman if usable (detected once), else the CDI check; `podman` / `cdi-check` force one.

    With `podman` forced but unusable, the runtime is still podman: every container then fails with the
    detection reason, which is what someone who forced it wants to see.
    """
    if mode not in RUNTIME_MODES:
        raise ValueError(f"runtime mode {mode!r} is not one of {', '.join(RUNTIME_MODES)}")
    if mode == "cdi-check":
        return CdiCheckedRuntime(cdi_dirs, reason="selected explicitly")
    podman = PodmanRuntime(cache_dir=cache_dir, work_dir=work_dir)
    if mode == "podman":
        return podman
    availability = podman.availability()
    if availability.usable:
        return podman
    return CdiCheckedRuntime(cdi_dirs, reason=availability.reason)
