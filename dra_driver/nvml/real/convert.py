"""Pure conversions from raw NVML values to the plain values of dra_driver.nvml.types.

Kept apart from real.py so they are table-testable without any pynvml patching.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping
from types import MappingProxyType

# nvmlBrandType_t -> readable name (the spelling NVIDIA's DRA driver publishes as the `brand` attribute).
BRAND_NAMES: Mapping[int, str] = MappingProxyType(
    {
        0: "Unknown",
        1: "Quadro",
        2: "Tesla",
        3: "NVS",
        4: "Grid",
        5: "GeForce",
        6: "Titan",
        7: "NvidiaVApps",
        8: "NvidiaVPC",
        9: "NvidiaVCS",
        10: "NvidiaVWS",
        11: "NvidiaCloudGaming",
        12: "QuadroRTX",
        13: "NvidiaRTX",
        14: "Nvidia",
        15: "GeForceRTX",
        16: "TitanRTX",
        17: "NvidiaDLA",
        18: "NvidiaVGameDev",
        19: "NvidiaNPU",
    }
)

_BUS_ID = re.compile(r"^([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_PCIE_ROOT = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")
_WORD_BITS = 64


def brand_name(code: int) -> str:
    return BRAND_NAMES.get(code, "Unknown")


def normalize_pci_bus_id(raw: str) -> str:
    """NVML's "00000000:53:00.0" -> "0000:53:00.0": lower case, 4-digit domain (wider only when the
    domain needs it, e.g. VMD domains). This is the name of the device directory in sysfs."""
    text = raw.strip().rstrip("\x00")
    m = _BUS_ID.match(text)
    if m is None:
        # Unknown shape: still lower-case it so comparisons between two NVML answers agree.
        return text.lower()
    domain, bus, device, function = m.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}.{function}"


def set_bits(words: Iterable[int], word_bits: int = _WORD_BITS) -> tuple[int, ...]:
    """Positions of the set bits in an NVML bitmask of unsigned words (bit n%64 of word n//64)."""
    out: list[int] = []
    for word_index, word in enumerate(words):
        value = int(word)
        bit = 0
        while value:
            if value & 1:
                out.append(word_index * word_bits + bit)
            value >>= 1
            bit += 1
    return tuple(out)


def uuid_text(raw: bytes) -> str:
    """16 raw bytes (e.g. a fabric clusterUuid) -> canonical "xxxxxxxx-xxxx-…" text."""
    if len(raw) != 16:
        raise ValueError(f"clusterUuid must be 16 bytes, got {len(raw)}")
    return str(uuid.UUID(bytes=raw))


def pcie_root_from_path(resolved_device_path: str) -> str | None:
    """The "pciDDDD:BB" root-complex component of a resolved sysfs device path, e.g.
    /sys/devices/pci0000:00/0000:00:01.0/0000:53:00.0 -> "pci0000:00"."""
    for part in resolved_device_path.split("/"):
        if _PCIE_ROOT.match(part):
            return part
    return None
