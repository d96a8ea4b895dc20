"""Kubernetes-facing helpers: client construction, typed helpers and pure API validation.

`resource_validation` checks resource.k8s.io/v1 objects the way the kube-apiserver does, without
any I/O, so the slice builder, the webhook and the sandbox API server share one rule book.
"""
