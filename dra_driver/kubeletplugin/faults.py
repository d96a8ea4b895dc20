"""Named points where tests crash a kubelet plugin on purpose, for any driver on this layer.

`DRA_DRIVER_CRASH_AT=<point>[,<point>...]` makes the process SIGKILL itself when it reaches the point (the first
time, or the N-th with `<point>#N`). Each driver names its own points (`known`); a name it does not know is refused
at start, so a typo in a test never passes silently. Production never sets the variable; a point costs one lookup.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Mapping, Sequence
from typing import Self

ENV_VAR = "DRA_DRIVER_CRASH_AT"


class FaultPoints:
    KNOWN: tuple[str, ...] = ()  # a driver's subclass names its points here

    def __init__(self, spec: str = "", known: Sequence[str] | None = None) -> None:
        names = tuple(known) if known is not None else self.KNOWN
        self._targets: dict[str, int] = {}
        for item in filter(None, (s.strip() for s in spec.split(","))):
            name, _, nth = item.partition("#")
            if name not in names:
                raise ValueError(f"{ENV_VAR}: unknown crash point {name!r}; known: {', '.join(names)}")
            self._targets[name] = int(nth or 1)
        self._hits: dict[str, int] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        return cls((environ if environ is not None else os.environ).get(ENV_VAR, ""))

    def reached(self, point: str) -> None:
        if point not in self._targets:
            return
        with self._lock:
            self._hits[point] = self._hits.get(point, 0) + 1
            if self._hits[point] == self._targets[point]:
                os.kill(os.getpid(), signal.SIGKILL)
