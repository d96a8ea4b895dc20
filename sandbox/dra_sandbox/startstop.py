"""`with component:` for the bench's components that have `start()` and `stop()`."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Self


class StartStop:
    """`with x:` runs `x.start()` and, on the way out (an exception included), `x.stop()`."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @contextlib.contextmanager
    def starting(self, timings: dict[str, float]) -> Iterator[Callable[[str], None]]:
        """The body of a `start()` that comes up in parts: `ready(part)` notes in `timings` the seconds since the
        body began; a failure in it (Ctrl-C included) runs `stop()`, which undoes the parts started, and goes on."""
        began = time.monotonic()

        def ready(part: str) -> None:
            timings[part] = time.monotonic() - began

        try:
            yield ready
        except BaseException:
            self.stop()
            raise
