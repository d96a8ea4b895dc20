"""The only door to pynvml: call a wrapper by name, translate its exceptions, fill caller-made arrays.

pynvml functions are looked up on the module at call time (``getattr(pynvml, name)``) so tests can
monkeypatch them one by one, and `call` names the NVML operation in every NvmlError.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

from dra_driver.nvml.types import NvmlError, NvmlReturn

# Caller-sized list calls start from a hint (a profile's instanceCount) and grow on INSUFFICIENT_SIZE
# up to this many slots; NVML never lists more than a few dozen MIG objects per GPU.
MAX_ARRAY_SLOTS = 1024

# Codes meaning "this GPU / driver cannot answer that question": treated as "no value".
MISSING = frozenset({NvmlReturn.NOT_SUPPORTED, NvmlReturn.FUNCTION_NOT_FOUND})


def nv(name: str, *args: Any, detail: str = "") -> Any:
    """pynvml.<name>(*args); any pynvml failure becomes NvmlError(code, call=name, detail=detail)."""
    fn = getattr(pynvml, name)
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        raise NvmlError(int(exc.value), call=name, detail=detail) from exc
    except pynvml.NVMLLibraryMismatchError as exc:
        # pynvml's "use a versioned function" wrapper error: the driver lacks the symbol.
        raise NvmlError(NvmlReturn.FUNCTION_NOT_FOUND, call=name, detail=str(exc)) from exc


def fill(name: str, element: Any, hint: int, *lead: Any) -> list[Any]:
    """The caller-allocated list pattern of the MIG APIs:
    ``fn(*lead, (element * n)(), byref(c_uint(n)))`` then read ``array[:count]``, growing the array
    while NVML answers INSUFFICIENT_SIZE (a hint from instanceCount can be too small: a "+me" profile
    has instanceCount 1 but seven possible placements)."""
    size = max(int(hint), 1)
    while True:
        array = (element * size)()
        count = ctypes.c_uint(size)
        try:
            nv(name, *lead, array, ctypes.byref(count))
        except NvmlError as err:
            if err.code is not NvmlReturn.INSUFFICIENT_SIZE or size >= MAX_ARRAY_SLOTS:
                raise
            # NVML may report the needed size in count; otherwise double.
            size = min(max(int(count.value), size * 2), MAX_ARRAY_SLOTS)
            continue
        return list(array)[: min(int(count.value), size)]


def handle_address(handle: Any) -> int:
    """Identity of an NVML handle: its pointer value (0 for NULL). ctypes pointers compare by Python
    identity, so two handles of one GPU from two calls are never `==`."""
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)
