"""Directory layouts as declarations: `log = Below("up.log")` in a class whose `root` is a Path makes `obj.log` the
path `obj.root / "up.log"`, read-only and computed on each read (the layout classes are frozen dataclasses, or
objects whose base directory is fixed once made)."""

from __future__ import annotations

from pathlib import Path
from typing import overload


class Below:
    """A read-only path attribute: `parts` joined onto the owner's attribute `base` (a Path)."""

    def __init__(self, *parts: str, base: str = "root") -> None:
        if not parts:
            raise ValueError("Below needs at least one path part")
        self._parts = parts
        self._base = base
        self._name = "?"

    def __set_name__(self, owner: type[object], name: str) -> None:
        self._name = name

    @overload
    def __get__(self, obj: None, owner: type[object]) -> Below: ...
    @overload
    def __get__(self, obj: object, owner: type[object]) -> Path: ...
    def __get__(self, obj: object | None, owner: type[object]) -> Below | Path:
        if obj is None:
            return self
        base = getattr(obj, self._base)
        if not isinstance(base, Path):
            raise TypeError(f"{type(obj).__name__}.{self._base} is {type(base).__name__}, not a Path")
        return base.joinpath(*self._parts)

    def __set__(self, obj: object, value: object) -> None:
        # Read-only as the properties it stands for: the path follows the base, it is never set on its own.
        raise AttributeError(f"{type(obj).__name__}.{self._name} is derived from {self._base}; set that instead")
