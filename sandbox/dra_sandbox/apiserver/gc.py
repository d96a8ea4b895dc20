"""ownerReference garbage collection, as kube-controller-manager's garbage collector does it.

- Background deletion: once an owner is gone, dependents without another live owner are deleted;
  dependents that still have one lose the dangling reference. Cluster-scoped owners of namespaced
  dependents (a Node owning ResourceSlices, a CRD...) work the same.
- Foreground deletion: the owner keeps the `foregroundDeletion` finalizer until every dependent with
  `blockOwnerDeletion: true` is gone.
- Orphan: dependents lose the reference, then the `orphan` finalizer is removed.
- A dependent created with an ownerReference whose owner does not exist (wrong uid included) is
  deleted, just as a real cluster does.

Work runs after the write that caused it (`schedule`, the event loop's call_soon, which also absorbs
an ApiError from a lost race), never inside it: asynchronous like the real controller, no polling.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from . import errors, kinds
from .lifecycle import DeleteOptions, Resources, Target
from .registry import ResourceType
from .store import Obj, meta

Schedule = Callable[[Callable[[], None]], None]


def _refs(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [r for r in meta(obj).get("ownerReferences") or [] if isinstance(r, Mapping)]


def _group_of(api_version: str) -> str:
    return api_version.rpartition("/")[0]


class GarbageCollector:
    def __init__(self, resources: Resources, schedule: Schedule) -> None:
        self._res = resources
        self._schedule = schedule

    def _later(self, work: Callable[[], None]) -> None:
        self._schedule(work)

    # -- ChangeListener ---------------------------------------------------------------------

    def on_change(self, rt: ResourceType, old: Obj | None, new: Obj | None) -> None:
        if new is None:
            assert old is not None
            uid = str(meta(old).get("uid") or "")
            self._later(lambda: self._owner_removed(uid))
            for ref in _refs(old):
                self._later(lambda ref=ref, obj=old: self._recheck_owner(rt, obj, ref))  # type: ignore[misc]
            return
        m = meta(new)
        finalizers = m.get("finalizers") or []
        if m.get("deletionTimestamp"):
            if kinds.FOREGROUND_FINALIZER in finalizers:
                self._later(lambda: self._foreground(rt, new))
            if kinds.ORPHAN_FINALIZER in finalizers:
                self._later(lambda: self._orphan(rt, new))
        if _refs(new) and (old is None or _refs(old) != _refs(new)):
            self._later(lambda: self._verify_owners(rt, new))

    # -- owner lookups ----------------------------------------------------------------------

    def _owner(self, dep_rt: ResourceType, dep: Obj, ref: Mapping[str, Any]) -> tuple[ResourceType, Obj | None] | None:
        """The owner's type and object (None if absent); None overall if it cannot be resolved."""
        owner_rt = self._res.registry.by_kind(_group_of(str(ref.get("apiVersion") or "")), str(ref.get("kind")))
        if owner_rt is None:
            return None  # a kind this server does not serve: unverifiable, leave the dependent alone
        if owner_rt.namespaced and not dep_rt.namespaced:
            return None  # invalid reference (cluster-scoped dependent, namespaced owner): ignored
        namespace = str(meta(dep).get("namespace") or "") if owner_rt.namespaced else ""
        owner = self._res.store.get(owner_rt.key, namespace, str(ref.get("name")))
        if owner is not None and meta(owner).get("uid") != ref.get("uid"):
            owner = None
        return owner_rt, owner

    def _dependents(self, uid: str) -> list[tuple[ResourceType, Obj]]:
        out = []
        for rkey, (namespace, name) in self._res.store.dependents_of(uid):
            rt = self._res.registry.by_key(rkey)
            obj = self._res.store.get(rkey, namespace, name)
            if rt is not None and obj is not None:
                out.append((rt, obj))
        return out

    def _delete(self, rt: ResourceType, obj: Obj, propagation: str) -> None:
        m = meta(obj)
        if m.get("deletionTimestamp") and propagation != "Foreground":
            return
        target = Target(rt, rt.versions[0], str(m.get("namespace") or ""), str(m.get("name")))
        try:
            self._res.delete(target, DeleteOptions(propagation=propagation, uid=str(m.get("uid"))))
        except errors.ApiError as exc:
            if exc.code not in (404, 409):
                raise

    def _drop_refs(self, rt: ResourceType, obj: Obj, uids: set[str]) -> None:
        def change(o: Obj) -> None:
            refs = [r for r in o["metadata"].get("ownerReferences") or [] if r.get("uid") not in uids]
            if refs:
                o["metadata"]["ownerReferences"] = refs
            else:
                o["metadata"].pop("ownerReferences", None)

        self._res.mutate(rt, obj, change)

    # -- work items -------------------------------------------------------------------------

    def _owner_removed(self, uid: str) -> None:
        for rt, dep in self._dependents(uid):
            others = [r for r in _refs(dep) if r.get("uid") != uid]
            alive = [r for r in others if (found := self._owner(rt, dep, r)) is None or found[1] is not None]
            if alive:
                self._drop_refs(rt, dep, {uid})
            else:
                self._delete(rt, dep, "Background")

    def _recheck_owner(self, dep_rt: ResourceType, dep: Obj, ref: Mapping[str, Any]) -> None:
        found = self._owner(dep_rt, dep, ref)
        if found is None:
            return
        owner_rt, owner = found
        if owner is None or not meta(owner).get("deletionTimestamp"):
            return
        if kinds.FOREGROUND_FINALIZER in (meta(owner).get("finalizers") or []):
            self._foreground(owner_rt, owner)

    def _still_finalizing(self, rt: ResourceType, owner: Obj, finalizer: str) -> Obj | None:
        """The owner as stored now, where it still carries `finalizer` (None: gone, or that finalizer is done)."""
        m = meta(owner)
        current = self._res.store.get(rt.key, str(m.get("namespace") or ""), str(m.get("name")))
        if current is None or finalizer not in (meta(current).get("finalizers") or []):
            return None
        return current

    def _foreground(self, rt: ResourceType, owner: Obj) -> None:
        current = self._still_finalizing(rt, owner, kinds.FOREGROUND_FINALIZER)
        if current is None:
            return
        uid = str(meta(current).get("uid"))
        blocking = 0
        for dep_rt, dep in self._dependents(uid):
            others = [r for r in _refs(dep) if r.get("uid") != uid]
            if any((f := self._owner(dep_rt, dep, r)) is None or f[1] is not None for r in others):
                self._drop_refs(dep_rt, dep, {uid})
                continue
            ref = next(r for r in _refs(dep) if r.get("uid") == uid)
            if ref.get("blockOwnerDeletion") is True:
                blocking += 1
            self._delete(dep_rt, dep, "Foreground")
        if blocking == 0:
            self._res.mutate(rt, current, _without_finalizer(kinds.FOREGROUND_FINALIZER))

    def _orphan(self, rt: ResourceType, owner: Obj) -> None:
        current = self._still_finalizing(rt, owner, kinds.ORPHAN_FINALIZER)
        if current is None:
            return
        uid = str(meta(current).get("uid"))
        for dep_rt, dep in self._dependents(uid):
            self._drop_refs(dep_rt, dep, {uid})
        self._res.mutate(rt, current, _without_finalizer(kinds.ORPHAN_FINALIZER))

    def _verify_owners(self, rt: ResourceType, obj: Obj) -> None:
        m = meta(obj)
        current = self._res.store.get(rt.key, str(m.get("namespace") or ""), str(m.get("name")))
        if current is None or meta(current).get("deletionTimestamp"):
            return
        refs = _refs(current)
        dangling = set()
        for ref in refs:
            found = self._owner(rt, current, ref)
            if found is not None and found[1] is None:
                dangling.add(str(ref.get("uid")))
        if not dangling:
            return
        if len(dangling) == len(refs):
            self._delete(rt, current, "Background")
        else:
            self._drop_refs(rt, current, dangling)


def _without_finalizer(name: str) -> Callable[[Obj], None]:
    def change(o: Obj) -> None:
        o["metadata"]["finalizers"] = [f for f in o["metadata"].get("finalizers") or [] if f != name]
        if not o["metadata"]["finalizers"]:
            del o["metadata"]["finalizers"]

    return change
