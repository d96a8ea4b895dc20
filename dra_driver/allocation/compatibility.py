"""KEP-5963 device compatibility groups (gate DRADeviceCompatibilityGroups, alpha in 1.37), as kube-scheduler 1.37's
experimental allocator enforces them (k8s.io/dynamic-resource-allocation v0.37.2 `compatibilityGroupIntersection`):
per counter set, the devices drawing from it (allocated ones and those of the attempt) must all share a group. A
device without groups goes only with others without groups. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class GroupState:
    """The devices on one counter set so far: all without groups, or the groups every one of them names."""

    all_empty: bool
    groups: frozenset[str] = frozenset()


NO_MEMBERS: Final[GroupState | None] = None


def admits(state: GroupState | None, groups: frozenset[str]) -> bool:
    if state is None:
        return True
    if not groups:
        return state.all_empty
    return not state.all_empty and bool(state.groups & groups)


def add(state: GroupState | None, groups: frozenset[str]) -> GroupState:
    """The state with one more device (which `admits` let in)."""
    if state is None:
        return GroupState(all_empty=not groups, groups=groups)
    if state.all_empty or not groups:
        return state
    return GroupState(all_empty=False, groups=state.groups & groups)
