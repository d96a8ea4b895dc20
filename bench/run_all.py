"""Run every benchmark and print its figures (`make bench`; `BENCH_SHORT=1` for the quick CI form).

`python -m bench.run_all SECTION...` runs only the named sections (`--list` prints the names), in the order given:
the test suite runs each section as a test of its own so the two CI workers share them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from bench.common import emit


@dataclass(frozen=True)
class Section:
    """One benchmark: its module (imported only when it runs: `--list` stays instant), its title, and the tables
    printed after its figures."""

    module: str
    title: Callable[[ModuleType], str]
    tables: Callable[[ModuleType, dict[str, Any]], None] = lambda module, figures: None

    def load(self) -> ModuleType:
        return importlib.import_module(f"bench.{self.module}")


def _prepare_tables(prepare_bench: ModuleType, prepare: dict[str, Any]) -> None:
    print("== summary: prepare/unprepare against their floors (ratio = value / floor; claims/s: floor / value)")
    print(prepare_bench.format_summary(prepare["summary"]))
    print("== goals of issue 22 in this run (CPU and RSS hold on a busy machine; rates and ratios need a quiet one)")
    print(prepare_bench.format_goals(prepare["goals"]))


def _soak_tables(soak_bench: ModuleType, soak: dict[str, Any]) -> None:
    print(f"== soak: RSS curve, every {max(1, soak['cycles'] // 10)} cycles")
    print(soak_bench.format_curve(soak))


def _fixed(title: str) -> Callable[[ModuleType], str]:
    return lambda module: title


SECTIONS: dict[str, Section] = {
    "prepare": Section("prepare_bench", lambda module: str(module.TITLE), _prepare_tables),
    "sharing": Section(
        "sharing_bench", _fixed("sharing: whole GPU vs MPS claim vs MPS share (fake dgx-h100, shares on)")
    ),
    "startup": Section("startup_bench", _fixed("kubelet-plugin start-up (fake dgx-h100, dynamic MIG)")),
    "publish": Section(
        "publish_bench",
        _fixed("ResourceSlice publishing (dgx-h100, dynamic MIG, plugin process vs sandbox API server)"),
    ),
    "convergence": Section(
        "publish_convergence_bench",
        _fixed("ResourceSlice convergence under API errors (publisher loop vs sandbox API server, dgx-h100)"),
    ),
    "controller": Section(
        "controller_bench", _fixed("controller: policy → DeviceClass (sandbox API server, kopf in-process)")
    ),
    "fleet": Section(
        "fleet_bench",
        lambda module: (
            f"fleet scale: explain and scheduler pass over {module.node_count()} fake nodes (sandbox API server)"
        ),
    ),
    "publish-fleet": Section("publish_fleet_bench", lambda module: str(module.title())),
    "soak": Section(
        "soak_bench",
        _fixed("soak: prepare/unprepare cycles, plugin RSS curve (fake dgx-h100, dynamic MIG)"),
        _soak_tables,
    ),
}


def main(argv: list[str]) -> int:
    if argv == ["--list"]:
        print("\n".join(SECTIONS))
        return 0
    unknown = [name for name in argv if name not in SECTIONS]
    if unknown:
        print(f"unknown section(s) {', '.join(unknown)}; choose from: {', '.join(SECTIONS)}", file=sys.stderr)
        return 2
    ran: list[tuple[Section, ModuleType, dict[str, Any]]] = []
    for name in argv or list(SECTIONS):
        section = SECTIONS[name]
        module = section.load()
        figures: dict[str, Any] = module.run()
        emit(section.title(module), figures)
        ran.append((section, module, figures))
    # The tables come last, after every section's figures and in reverse, so `make bench` ends with prepare's
    # summary against its floors: the one to read first.
    for section, module, figures in reversed(ran):
        section.tables(module, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
