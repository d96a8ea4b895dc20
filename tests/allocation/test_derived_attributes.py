"""KEP-6080 derived attributes (gate DRADerivedAttributes, alpha and off in 1.37): a request's `derivedAttributes`
names a CEL expression over `device` whose value a matchAttribute/distinctAttribute constraint on that name compares
for the request's devices (kube-scheduler 1.37's experimental allocator, `lookupAttribute`); with the gate off the
allocator refuses the request, as kube-scheduler does."""

from typing import Any

import pytest

from dra_driver.cel import CelCompileError, CelRuntimeError, DeviceInput, DraCelEnvironment
from dra_driver.defaults import DRIVER_NAME
from dra_driver.k8s.semver import parse_semver
from dra_driver.resourceapi import InvalidObjectError, parse_resource_claim
from tests.allocation.objects import claim, devices_of, exact, first_available, resource_slice, run, sub
from tests.allocation.objects import device as make_device

ON = {"DRADerivedAttributes": True}
SOCKET = "example.com/socket"
A = f'device.attributes["{DRIVER_NAME}"]'
# Four GPUs on two sockets that no attribute names: the derived attribute computes the socket from the PCIe root.
GPUS = [
    make_device("gpu-0", {"pcieRoot": "pci0000:00"}),
    make_device("gpu-1", {"pcieRoot": "pci0000:80"}),
    make_device("gpu-2", {"pcieRoot": "pci0000:01"}),
    make_device("gpu-3", {"pcieRoot": "pci0000:81"}),
]
SOCKET_OF_ROOT = f'{A}.pcieRoot.startsWith("pci0000:8") ? 1 : 0'


def _derived(request: dict[str, Any], *pairs: tuple[str, str]) -> dict[str, Any]:
    body = request.get("exactly", request)
    body["derivedAttributes"] = [{"name": n, "expression": e} for n, e in pairs]
    return request


def test_match_attribute_on_a_derived_attribute_picks_devices_that_agree_on_it() -> None:
    request = _derived(exact("gpu", count=2), (SOCKET, SOCKET_OF_ROOT))
    outcome = run(claim([request], constraints=[{"matchAttribute": SOCKET}]), [resource_slice("s", GPUS)], gates=ON)
    # Without the constraint the first two (gpu-0, gpu-1) would do; they sit on different sockets.
    assert devices_of(outcome) == [("gpu", "gpu-0"), ("gpu", "gpu-2")]


def test_distinct_attribute_on_a_derived_attribute() -> None:
    request = _derived(exact("gpu", count=2), (SOCKET, SOCKET_OF_ROOT))
    constraint = {"distinctAttribute": SOCKET}
    outcome = run(claim([request], constraints=[constraint]), [resource_slice("s", GPUS)], gates=ON)
    assert devices_of(outcome) == [("gpu", "gpu-0"), ("gpu", "gpu-1")]


def test_a_derived_attribute_belongs_to_its_request_only() -> None:
    """Request `b` has no derived attribute of that name, so its devices are compared by their own attribute (none
    here): the constraint cannot hold, as upstream looks derived attributes up per request."""
    a = _derived(exact("a"), (SOCKET, SOCKET_OF_ROOT))
    constraints = [{"requests": ["a", "b"], "matchAttribute": SOCKET}]
    outcome = run(claim([a, exact("b")], constraints=constraints), [resource_slice("s", GPUS)], gates=ON)
    assert not outcome.ok
    both = [a, _derived(exact("b"), (SOCKET, SOCKET_OF_ROOT))]
    outcome = run(claim(both, constraints=constraints), [resource_slice("s", GPUS)], gates=ON)
    assert devices_of(outcome) == [("a", "gpu-0"), ("b", "gpu-2")]


def test_a_derived_attribute_of_a_subrequest() -> None:
    request = first_available("gpu", [_derived(sub("two", count=2), (SOCKET, SOCKET_OF_ROOT))])
    outcome = run(claim([request], constraints=[{"matchAttribute": SOCKET}]), [resource_slice("s", GPUS)], gates=ON)
    assert devices_of(outcome) == [("gpu/two", "gpu-0"), ("gpu/two", "gpu-2")]


def test_the_derived_value_shadows_a_device_attribute_of_the_same_name() -> None:
    name = f"{DRIVER_NAME}/pcieRoot"
    request = _derived(exact("gpu", count=2), (name, SOCKET_OF_ROOT))
    outcome = run(claim([request], constraints=[{"matchAttribute": name}]), [resource_slice("s", GPUS)], gates=ON)
    assert devices_of(outcome) == [("gpu", "gpu-0"), ("gpu", "gpu-2")]


def test_with_the_gate_off_the_request_is_refused_not_its_constraint_ignored() -> None:
    request = _derived(exact("gpu", count=2), (SOCKET, SOCKET_OF_ROOT))
    outcome = run(claim([request], constraints=[{"matchAttribute": SOCKET}]), [resource_slice("s", GPUS)])
    assert outcome.explanation is not None and not outcome.ok
    assert outcome.explanation.summary == (
        "request gpu has derived attributes, but the DRADerivedAttributes feature is disabled"
    )


def test_an_expression_that_does_not_compile_names_the_request_and_attribute() -> None:
    request = _derived(exact("gpu"), (SOCKET, f"{A}.pcieRoot == "))
    outcome = run(claim([request], constraints=[{"matchAttribute": SOCKET}]), [resource_slice("s", GPUS)], gates=ON)
    assert outcome.explanation is not None and not outcome.ok
    assert outcome.explanation.summary.startswith(f"request 'gpu': compile derived attribute {SOCKET} failed:")


def test_a_runtime_error_aborts_the_allocation() -> None:
    request = _derived(exact("gpu", count=2), (SOCKET, f"{A}.numaNode"))  # no device has numaNode
    outcome = run(claim([request], constraints=[{"matchAttribute": SOCKET}]), [resource_slice("s", GPUS)], gates=ON)
    assert outcome.explanation is not None and not outcome.ok
    assert outcome.explanation.summary.startswith(
        f"allocation aborted: CEL runtime error in derived attribute {SOCKET} on device "
    )
    assert "no such key" in outcome.explanation.summary


def test_the_claim_reader_keeps_derived_attributes_and_names_bad_ones() -> None:
    request = _derived(exact("gpu"), (SOCKET, SOCKET_OF_ROOT))
    parsed = parse_resource_claim(claim([request], constraints=[{"matchAttribute": SOCKET}]))
    assert dict(parsed.requests[0].alternatives[0].derived_attributes) == {SOCKET: SOCKET_OF_ROOT}
    with pytest.raises(InvalidObjectError, match=r"derivedAttributes\[0\]\.name.*fully qualified"):
        parse_resource_claim(claim([_derived(exact("gpu"), ("socket", "1"))]))


# -- the CEL side --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ('device.attributes["d.io"].x + 1', 8),
        ('device.attributes["d.io"].x > 1', True),
        ('"s-" + string(device.attributes["d.io"].x)', "s-7"),
        ('semver("1.2.3")', parse_semver("1.2.3")),
        ('[device.attributes["d.io"].x, 1]', [7, 1]),
        ("[]", []),
    ],
)
def test_a_derived_expression_evaluates_to_a_value(expression: str, value: Any) -> None:
    env = DraCelEnvironment(kubernetes_minor=37)
    device = env.activate(DeviceInput(driver="d.io", attributes={"x": 7}))
    assert env.compile_derived(expression).evaluate(device) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("1.5", "must evaluate to a primitive scalar (string, integer, boolean, semver) or a list of these scalars, "
                "not double"),
        ('{"a": 1}', "not map(string, int)"),
    ],
)
def test_a_derived_expression_of_another_type_does_not_compile(expression: str, message: str) -> None:
    with pytest.raises(CelCompileError, match=message.replace("(", r"\(").replace(")", r"\)")):
        DraCelEnvironment(kubernetes_minor=37).compile_derived(expression)


def test_a_derived_expression_is_checked_at_evaluation_where_its_type_is_unknown() -> None:
    env = DraCelEnvironment(kubernetes_minor=37)
    device = env.activate(DeviceInput(driver="d.io", attributes={"x": 7}))
    with pytest.raises(CelRuntimeError, match="unsupported CEL return type: double"):
        env.compile_derived('dyn(1.5)').evaluate(device)
    with pytest.raises(CelRuntimeError, match="expected list element at index 1 to be int, got string"):
        env.compile_derived('[device.attributes["d.io"].x, dyn("a")]').evaluate(device)


def test_a_selector_and_a_derived_attribute_of_one_text_are_cached_apart() -> None:
    env = DraCelEnvironment(kubernetes_minor=37)
    env.compile_derived("1")
    with pytest.raises(CelCompileError, match="must evaluate to bool"):
        env.compile("1")
