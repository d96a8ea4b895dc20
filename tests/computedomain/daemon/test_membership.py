"""Slot allocation in a clique: the lowest free slot, gaps filled, a restarted daemon keeps its slot, a full clique
refuses; and the GET + PUT-with-resourceVersion loop that keeps two racing daemons off one slot."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dra_driver.computedomain.daemon.clique import CliqueClient, CliqueRef
from dra_driver.computedomain.daemon.membership import CliqueFull, Member, choose_index, joined, with_status, without
from dra_driver.computedomain.model import DomainNode
from dra_driver.computedomain.names import STATUS_NOT_READY, STATUS_READY
from dra_driver.k8s.client import KubeRest
from dra_sandbox.apiserver import ApiServer
from tests.computedomain.daemon.harness import NAMESPACE, install_clique_crd

CLIQUE = "c.1"


def entry(name: str, index: int, status: str = STATUS_NOT_READY) -> DomainNode:
    return DomainNode(name=name, ip_address=f"127.9.0.{index + 1}", clique_id=CLIQUE, index=index, status=status)


def test_first_daemon_takes_slot_zero() -> None:
    assert choose_index((), "a", 18) == 0


def test_lowest_free_slot_fills_gaps() -> None:
    assert choose_index([entry("a", 0), entry("c", 2)], "d", 18) == 1
    assert choose_index([entry("a", 0), entry("b", 1), entry("c", 2)], "d", 18) == 3


def test_a_daemon_whose_entry_is_there_keeps_its_slot() -> None:
    # Restarted with slot 5 while 0 is free: it keeps 5 (its peers' mapping does not change).
    assert choose_index([entry("a", 5), entry("b", 1)], "a", 18) == 5


def test_an_own_slot_out_of_range_is_chosen_again() -> None:
    assert choose_index([entry("a", 20), entry("b", 0)], "a", 18) == 1


def test_of_two_entries_on_one_slot_the_later_name_moves() -> None:
    daemons = [entry("a", 0), entry("b", 0)]
    assert choose_index(daemons, "a", 18) == 0
    assert choose_index(daemons, "b", 18) == 1


def test_a_full_clique_refuses_naming_the_fix() -> None:
    with pytest.raises(CliqueFull, match=r"all 2 slots.*--max-nodes"):
        choose_index([entry("a", 0), entry("b", 1)], "c", 2)


def test_joined_writes_the_entry_not_ready_and_keeps_others() -> None:
    others = (entry("b", 0, STATUS_READY),)
    member = Member("a", "127.9.9.9", CLIQUE)
    assert joined(others, member, 18) == (*others, DomainNode("a", "127.9.9.9", CLIQUE, 1, STATUS_NOT_READY))
    # Rejoining after a restart, with a new pod IP: same slot, new address, NotReady until IMEX says otherwise.
    again = joined((entry("a", 3, STATUS_READY), *others), member, 18)
    assert again == (DomainNode("a", "127.9.9.9", CLIQUE, 3, STATUS_NOT_READY), *others)


def test_status_and_removal_touch_only_the_own_entry() -> None:
    daemons = (entry("a", 0), entry("b", 1))
    assert with_status(daemons, "b", STATUS_READY) == (entry("a", 0), entry("b", 1, STATUS_READY))
    assert with_status(daemons, "z", STATUS_READY) is None
    assert without(daemons, "a") == (entry("b", 1),)


@given(st.lists(st.tuples(st.sampled_from("abcdefgh"), st.booleans()), max_size=40))
def test_churn_keeps_slots_unique_and_dense(steps: list[tuple[str, bool]]) -> None:
    """Any sequence of joins and leaves: no two entries share a slot, and a joiner takes the lowest free one."""
    daemons: tuple[DomainNode, ...] = ()
    for name, join in steps:
        if join:
            before = {d.index for d in daemons if d.name != name}
            own = next((d for d in daemons if d.name == name), None)
            daemons = joined(daemons, Member(name, "127.9.0.1", CLIQUE), 8)
            index = next(d.index for d in daemons if d.name == name)
            assert index == (own.index if own else min(set(range(8)) - before))
        else:
            daemons = without(daemons, name)
        indexes = [d.index for d in daemons]
        assert len(indexes) == len(set(indexes))


# ---- against the sandbox API server: the resourceVersion precondition decides races ---------------------------


class InterferingRest(KubeRest):
    """Before forwarding its first write, lets `rival` write first (as if another daemon's PUT landed between this
    daemon's GET and PUT)."""

    def __init__(self, inner: KubeRest, rival: CliqueClient, rival_member: Member) -> None:
        super().__init__(inner.transport, inner.timeout, user_agent=inner.user_agent)
        self.rival, self.rival_member = rival, rival_member
        self.writes: list[tuple[str, int]] = []

    def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        if method in ("PUT", "POST") and not self.writes:
            self.writes.append((method, -1))
            self.rival.change(lambda d: joined(d, self.rival_member, 18))
        try:
            out = super().request(method, path, **kwargs)
        except Exception as exc:
            if method in ("PUT", "POST"):
                self.writes.append((method, getattr(exc, "status", 0)))
            raise
        if method in ("PUT", "POST"):
            self.writes.append((method, 200))
        return out


@pytest.mark.parametrize("existing", [False, True], ids=["create-race", "update-race"])
def test_a_rival_write_between_read_and_write_makes_the_daemon_choose_again(existing: bool) -> None:
    with ApiServer() as srv, srv.rest() as rest:
        install_clique_crd(rest)
        ref = CliqueRef(NAMESPACE, "uid.c.1")
        admin = CliqueClient(rest, ref)
        if existing:
            admin.change(lambda d: joined(d, Member("first", "127.9.0.1", CLIQUE), 18))
        racing = InterferingRest(rest, CliqueClient(rest, ref), Member("rival", "127.9.0.2", CLIQUE))
        clique = CliqueClient(racing, ref).change(lambda d: joined(d, Member("me", "127.9.0.3", CLIQUE), 18))
        assert clique is not None
        # Our first write was refused (409: AlreadyExists or the stale resourceVersion), the second went through.
        assert [status for _, status in racing.writes[1:]] == [409, 200]
        stored = admin.read()
        assert stored is not None
        slots = {d.name: d.index for d in stored.daemons}
        base = 1 if existing else 0
        assert slots == {**({"first": 0} if existing else {}), "rival": base, "me": base + 1}


def test_daemons_joining_at_once_get_distinct_slots() -> None:
    with ApiServer() as srv, srv.rest() as rest:
        install_clique_crd(rest)
        ref = CliqueRef(NAMESPACE, "uid.c.1")
        start = threading.Barrier(8)
        errors: list[BaseException] = []

        def join(i: int) -> None:
            try:
                start.wait()
                CliqueClient(rest, ref).change(lambda d: joined(d, Member(f"node-{i}", f"127.9.1.{i}", CLIQUE), 18))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=join, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors
        stored = CliqueClient(rest, ref).read()
        assert stored is not None
        assert sorted(d.index for d in stored.daemons) == list(range(8))
