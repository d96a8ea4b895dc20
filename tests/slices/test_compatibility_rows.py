"""The KEP-5963 group table (slices/counters.py GROUP_OF_KIND) has a row for every kind of device, and MIG partitions
share their GPU's container group: among them the counters already decide (docs/reference/dra-in-flight.md)."""

from dra_driver.inventory.catalog import DeviceKind
from dra_driver.slices.counters import GROUP_OF_KIND, NATIVE_GROUP, VFIO_GROUP


def test_every_device_kind_has_a_group() -> None:
    assert set(GROUP_OF_KIND) == set(DeviceKind)


def test_mig_partitions_share_the_container_group_and_vfio_has_its_own() -> None:
    assert GROUP_OF_KIND[DeviceKind.MIG_DYNAMIC] == GROUP_OF_KIND[DeviceKind.MIG_STATIC] == NATIVE_GROUP
    assert GROUP_OF_KIND[DeviceKind.GPU] == NATIVE_GROUP and GROUP_OF_KIND[DeviceKind.VFIO] == VFIO_GROUP
