"""GpuSharingPolicy: the cluster admin's way to say which GPUs a DeviceClass offers and how they are shared.

`model` (the custom resource's spec and status, strict decoding), `render` (policy → DeviceClass) and `crd`
(the CustomResourceDefinition generated from the models) are pure; the controller (`dra_driver.controller`)
does the I/O.
"""
