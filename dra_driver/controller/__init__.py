"""`dra-driver controller`: turns GpuSharingPolicies (`dra_driver.policy`) into the DeviceClasses they stand
for, with kopf. `reconcile` holds the logic (no kopf), `operator` the kopf handlers and the embedded runner."""
