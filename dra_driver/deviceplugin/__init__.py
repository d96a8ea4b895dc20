"""The kubelet's device-plugin API v1beta1 beside DRA (`--device-plugin`, docs/device-plugin.md): whole GPUs as
`nvidia.com/gpu`, a GPU offered to one world at a time."""
