"""`with component:` for the bench's components that have `start()` and `stop()`."""

from __future__ import annotations

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
