"""`--passthrough-allow-rebind`: which host functions of a GPU's IOMMU group an admin lets a passthrough move."""

from __future__ import annotations

import pytest

from dra_driver.pci.model import NO_REBIND, PciFunction, RebindAllowance, rebind_allowance


def _function(class_code: int, driver: str | None) -> PciFunction:
    return PciFunction("0000:19:00.0", driver, None, 30, class_code, 0x15B3, 0x101D, "")


NIC = _function(0x020000, "mlx5_core")
NVME = _function(0x010802, "nvme")


def test_nothing_is_allowed_by_default() -> None:
    assert not NO_REBIND.allows(NIC) and not NO_REBIND.allows(NVME)
    assert rebind_allowance("") == NO_REBIND and rebind_allowance(" , ") == NO_REBIND


@pytest.mark.parametrize("text", ["0x02", "0x0200", "0x020000", "mlx5_core", "0X0200", " mlx5_core , nvme "])
def test_a_class_prefix_or_a_driver_allows_the_nic(text: str) -> None:
    assert rebind_allowance(text).allows(NIC)


def test_a_class_matches_by_prefix_only() -> None:
    allowance = rebind_allowance("0x0200,0x0c03")
    assert allowance == RebindAllowance(("0200", "0c03"), ())
    assert allowance.allows(NIC) and not allowance.allows(NVME)
    assert not allowance.allows(_function(0x020800, "other"))
    assert allowance.label == "0x0200,0x0c03"


def test_an_unbound_function_matches_by_class_only() -> None:
    assert not rebind_allowance("mlx5_core").allows(_function(0x020000, None))
    assert rebind_allowance("0x02").allows(_function(0x020000, None))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0x2", "'0x2' is no PCI class code"),
        ("0x02000", "'0x02000' is no PCI class code"),
        ("0xzz", "is no PCI class code"),
        ("mlx5 core", "is neither a PCI class code (0x0200) nor a kernel driver name"),
        ("../evil", "is neither a PCI class code"),
    ],
)
def test_a_bad_entry_names_the_flag_and_the_fix(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="--passthrough-allow-rebind") as raised:
        rebind_allowance(text)
    assert message in str(raised.value)
