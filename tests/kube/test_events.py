"""The event recorder: one Event per series with a count, at most one write per series a minute (fake clock)."""

from __future__ import annotations

from typing import Any

from dra_driver.k8s.events import WARNING, EventRecorder, InvolvedObject
from dra_sandbox.apiserver import ApiServer


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_repeats_are_counted_and_written_at_most_once_a_minute() -> None:
    clock = Clock()
    with ApiServer() as srv:
        rest = srv.rest()
        recorder = EventRecorder(rest, component="gpu.dra.dev-kubelet-plugin", host="n1", clock=clock)
        claim = InvolvedObject("resource.k8s.io/v1", "ResourceClaim", "c1", "default", "uid-1")

        def events() -> list[dict[str, Any]]:
            return list(rest.request("GET", "/api/v1/namespaces/default/events")["items"])

        for _ in range(5):  # the kubelet retries a failing prepare
            recorder.record(claim, type=WARNING, reason="PrepareFailed", message="prepare default/c1: boom")
        assert recorder.flush()
        [event] = events()
        assert (event["reason"], event["message"]) == ("PrepareFailed", "prepare default/c1: boom")
        assert 1 <= event["count"] <= 5  # written by the sender thread: the repeats before it ran are included
        assert event["involvedObject"] == {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                           "name": "c1", "namespace": "default", "uid": "uid-1"}  # fmt: skip
        version = event["metadata"]["resourceVersion"]

        clock.now += 30  # within the minute: counted, not written
        recorder.record(claim, type=WARNING, reason="PrepareFailed", message="prepare default/c1: boom")
        assert recorder.flush()
        assert events()[0]["metadata"]["resourceVersion"] == version

        clock.now += 31  # the minute has passed: the accumulated count goes out in one patch
        assert recorder.flush()
        [event] = events()
        assert event["count"] == 6 and event["lastTimestamp"] != event["firstTimestamp"]

        recorder.record(claim, type=WARNING, reason="PrepareFailed", message="another message")  # a new series
        recorder.close()
        assert sorted(e["message"] for e in events()) == ["another message", "prepare default/c1: boom"]


def test_a_prepare_note_becomes_a_normal_event_on_the_claim() -> None:
    """TimeSlicing on a MIG device (NVIDIA's simple-mig-ts) prepares with a note: a Normal Event says nothing was
    applied; a failure stays a Warning."""
    from dra_driver.kubeletplugin.driver import ClaimRef, PrepareResult
    from dra_driver.kubeletplugin.pipeline import PreparePipeline
    from dra_driver.plugin.claimevents import SHARING_NOT_APPLIED, ClaimEvents

    ok, bad = ClaimRef("default", "mig-ts", "uid-ok"), ClaimRef("default", "broken", "uid-bad")

    class Engine:
        def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
            return {ok.uid: PrepareResult(notes=("nothing to apply",)), bad.uid: PrepareResult(error="boom")}

        def unprepare(self, claims: list[ClaimRef]) -> dict[str, str]:
            return {}

    with ApiServer() as srv:
        rest = srv.rest()
        recorder = EventRecorder(rest, component="gpu.dra.dev-kubelet-plugin", host="n1", clock=Clock())
        PreparePipeline(Engine(), observers=[ClaimEvents(recorder)]).prepare([ok, bad])
        recorder.close()
        seen = {(e["involvedObject"]["name"], e["type"], e["reason"], e["message"])
                for e in rest.request("GET", "/api/v1/namespaces/default/events")["items"]}  # fmt: skip
        assert seen == {("mig-ts", "Normal", SHARING_NOT_APPLIED, "nothing to apply"),
                        ("broken", "Warning", "PrepareFailed", "boom")}  # fmt: skip


def test_an_event_on_a_claim_with_the_longest_name_has_a_valid_name() -> None:
    """A ResourceClaim name may be 253 characters; `<name>.<nanoseconds hex>` would be 270, which the API server
    refuses (the Event, and with it the user's only sign of a failed prepare, would be lost)."""
    from dra_driver.k8s.events import event_name
    from dra_driver.k8s.names import is_dns_subdomain

    longest = ("c" * 62 + ".") * 4 + "c"
    for name in (longest, "c" * 236 + "-" + "c" * 16, "c" * 235 + ".d", "c1"):
        made = event_name(name, now_ns=0x18C0FFEE12345678)
        assert len(made) <= 253 and is_dns_subdomain(made), made
        assert made.endswith(".18c0ffee12345678") and name.startswith(made[: -17].rstrip(".-"))
    assert event_name("c1", now_ns=255) == "c1.ff"
    with ApiServer() as srv:
        rest = srv.rest()
        recorder = EventRecorder(rest, component="gpu.dra.dev-kubelet-plugin", host="n1", clock=Clock())
        claim = InvolvedObject("resource.k8s.io/v1", "ResourceClaim", longest, "default", "uid-1")
        recorder.record(claim, type=WARNING, reason="PrepareFailed", message="boom")
        assert recorder.flush()
        [event] = rest.request("GET", "/api/v1/namespaces/default/events")["items"]
        assert event["involvedObject"]["name"] == longest and is_dns_subdomain(event["metadata"]["name"])
        recorder.close()
