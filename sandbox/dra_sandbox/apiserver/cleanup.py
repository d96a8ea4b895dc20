"""The two built-in cleanup controllers clients can observe: namespace deletion and CRD deletion.

- A deleted namespace turns `Terminating`; everything in it is deleted (finalizers and graceful pod
  deletion respected); when it is empty its `kubernetes` spec finalizer is removed and it goes.
- A deleted CRD stops accepting creates; its custom resources are deleted; when none remain the
  `customresourcecleanup` finalizer is removed, the CRD goes and its endpoints disappear.
- A created/updated CRD is served at once (the Established condition is set on create).
"""

from __future__ import annotations

import dataclasses

from . import kinds
from .crds import rows_for_crd
from .gc import Schedule
from .lifecycle import DeleteOptions, Resources, Target
from .registry import ResourceType
from .store import Obj, meta


def _name(obj: Obj) -> str:
    return str(meta(obj).get("name"))


class _CleanupController:
    """A listener on the resources that runs its cleanup on the server's loop, after the write that called for it."""

    def __init__(self, resources: Resources, schedule: Schedule) -> None:
        self._res = resources
        self._schedule = schedule


class NamespaceController(_CleanupController):
    def on_change(self, rt: ResourceType, old: Obj | None, new: Obj | None) -> None:
        if rt.key == kinds.NAMESPACE_KEY:
            if new is not None and meta(new).get("deletionTimestamp"):
                self._schedule(lambda: self._drain(_name(new)))
        elif rt.namespaced and new is None and old is not None:
            namespace = str(meta(old).get("namespace") or "")
            ns = self._res.store.get(kinds.NAMESPACE_KEY, "", namespace)
            if ns is not None and meta(ns).get("deletionTimestamp"):
                self._schedule(lambda: self._drain(namespace))

    def _drain(self, namespace: str) -> None:
        ns = self._res.store.get(kinds.NAMESPACE_KEY, "", namespace)
        if ns is None or not meta(ns).get("deletionTimestamp"):
            return
        remaining = list(self._res.store.in_namespace(namespace))
        for rkey, obj in remaining:
            rt = self._res.registry.by_key(rkey)
            if rt is None or meta(obj).get("deletionTimestamp"):
                continue
            self._res.delete(Target(rt, rt.versions[0], namespace, _name(obj)),
                             DeleteOptions(propagation="Background", uid=str(meta(obj).get("uid"))))
        if not any(True for _ in self._res.store.in_namespace(namespace)):
            ns_rt = self._res.registry.by_key(kinds.NAMESPACE_KEY)
            assert ns_rt is not None

            def finalize(o: Obj) -> None:
                spec = o.setdefault("spec", {})
                spec["finalizers"] = [f for f in spec.get("finalizers") or [] if f != kinds.NAMESPACE_FINALIZER]
                if not spec["finalizers"]:
                    del spec["finalizers"]

            self._res.mutate(ns_rt, ns, finalize)


class CrdController(_CleanupController):
    def on_change(self, rt: ResourceType, old: Obj | None, new: Obj | None) -> None:
        if rt.key == kinds.CRD_KEY:
            if new is None:
                assert old is not None
                for row in rows_for_crd(old):
                    self._res.store.close_watchers(row.key)
                self._res.registry.set_custom(_name(old), ())
                return
            rows = rows_for_crd(new)
            if meta(new).get("deletionTimestamp"):
                rows = tuple(dataclasses.replace(r, terminating=True) for r in rows)
                self._schedule(lambda: self._drain(_name(new)))
            self._res.registry.set_custom(_name(new), rows)
        elif rt.custom and new is None:
            crd = self._res.store.get(kinds.CRD_KEY, "", f"{rt.plural}.{rt.group}")
            if crd is not None and meta(crd).get("deletionTimestamp"):
                self._schedule(lambda: self._drain(_name(crd)))

    def _drain(self, crd_name: str) -> None:
        crd = self._res.store.get(kinds.CRD_KEY, "", crd_name)
        if crd is None or not meta(crd).get("deletionTimestamp"):
            return
        rows = rows_for_crd(crd)
        for row in rows:
            served = self._res.registry.by_key(row.key) or row
            for obj in self._res.store.objects(row.key):
                if not meta(obj).get("deletionTimestamp"):
                    m = meta(obj)
                    self._res.delete(Target(served, served.versions[0], str(m.get("namespace") or ""), _name(obj)),
                                     DeleteOptions(propagation="Background", uid=str(m.get("uid"))))
        if any(self._res.store.objects(row.key) for row in rows):
            return
        crd_rt = self._res.registry.by_key(kinds.CRD_KEY)
        assert crd_rt is not None

        def release(o: Obj) -> None:
            o["metadata"]["finalizers"] = [
                f for f in o["metadata"].get("finalizers") or [] if f != kinds.CRD_CLEANUP_FINALIZER]
            if not o["metadata"]["finalizers"]:
                del o["metadata"]["finalizers"]

        self._res.mutate(crd_rt, crd, release)
