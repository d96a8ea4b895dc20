"""The GPU driver on the kubelet-plugin layer (dra_driver.kubeletplugin): prepare engine, GPU checkpoint records,
CDI, MIG, MPS, time-slicing, health, and the app that composes them with the layer."""
