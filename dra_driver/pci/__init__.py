"""PCI functions as the kernel's sysfs shows them: drivers, IOMMU groups, binding (docs/reference/passthrough.md)."""
