"""The ResourceClaim (resource.k8s.io/v1) as the product reads it: frozen values parsed by ONE strict function,
`parse_resource_claim`, which names the field path of anything malformed.

What is read (field names as in k8s.io/api/resource/v1 types.go):
- metadata: namespace (absent: `default`, as kubectl would put it), name, uid;
- spec.devices: requests (`exactly` or `firstAvailable` subrequests: deviceClassName, selectors, allocationMode,
  count, adminAccess, tolerations, capacity.requests, derivedAttributes), constraints, config (opaque parameters
  and requests);
- status.allocation.devices: results (request, driver, pool, device, adminAccess, tolerations, shareID,
  consumedCapacity, bindingConditions, bindingFailureConditions) and config (source, requests, opaque);
- status.reservedFor (the consumers) and status.devices (the drivers' per-device status).

Fields the product does not interpret are ignored, so a newer API server's additions do not break the reader.
Opaque parameters stay raw JSON here: decoding them is the job of `dra_driver.claimconfig`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Final

from dra_driver.k8s.quantity import Quantity
from dra_driver.resourceapi.fields import JSON, FieldReader, InvalidObjectError, read_object

MODE_EXACT: Final = "ExactCount"
MODE_ALL: Final = "All"
FROM_CLASS: Final = "FromClass"
FROM_CLAIM: Final = "FromClaim"
_OPERATORS: Final = ("Equal", "Exists")


@dataclass(frozen=True)
class DeviceId:
    """A device as allocation results name it."""

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass(frozen=True)
class Toleration:
    """A DeviceToleration of a request, copied into its allocation result."""

    key: str
    operator: str
    value: str
    effect: str
    raw: JSON = field(compare=False)  # copied verbatim into the allocation result


@dataclass(frozen=True)
class ExactRequest:
    """An `exactly` request or one `firstAvailable` subrequest (which has no adminAccess)."""

    name: str
    class_name: str
    selectors: tuple[str, ...]
    mode: str
    count: int
    admin_access: bool
    tolerations: tuple[Toleration, ...]
    capacity: Mapping[str, Quantity]
    # KEP-6080 `derivedAttributes` (gate DRADerivedAttributes, alpha in 1.37): fully qualified name -> CEL
    # expression over `device`; a constraint on that name compares the expression's value for this request's devices.
    derived_attributes: Mapping[str, str] = field(default_factory=lambda: _NO_DERIVED)


@dataclass(frozen=True)
class Request:
    """A DeviceRequest of spec.devices.requests."""

    name: str
    alternatives: tuple[ExactRequest, ...]  # one entry for `exactly`, the subrequests for `firstAvailable`
    first_available: bool

    def alternative(self, subrequest: str) -> ExactRequest | None:
        """The subrequest of that name; "" names the `exactly` request."""
        if not subrequest:
            return None if self.first_available else self.alternatives[0]
        return next((a for a in self.alternatives if self.first_available and a.name == subrequest), None)


@dataclass(frozen=True)
class Constraint:
    """One of spec.devices.constraints: an attribute the allocated devices of some requests must share or not."""

    requests: tuple[str, ...]
    kind: str  # "matchAttribute" | "distinctAttribute"
    attribute: str

    def __str__(self) -> str:
        scope = ", ".join(self.requests) if self.requests else "all requests"
        return f"{self.kind} {self.attribute} (requests: {scope})"


@dataclass(frozen=True)
class OpaqueParameters:
    """`opaque` of a device configuration: the driver it is for and its parameters, raw."""

    driver: str
    parameters: Any


@dataclass(frozen=True)
class DeviceConfiguration:
    """One entry of spec.devices.config (source None) or of status.allocation.devices.config (source FromClass
    or FromClaim). `opaque` None: an entry of a kind this product does not know (the API has only opaque today)."""

    source: str | None
    requests: tuple[str, ...]  # empty: every request
    opaque: OpaqueParameters | None
    path: str  # where it was read, for messages about its parameters
    raw: JSON = field(compare=False)

    def applies_to(self, request: str) -> bool:
        """Whether it applies to the result of `request` ("req" or "req/sub": an entry naming "req" covers its
        subrequests)."""
        return not self.requests or request in self.requests or request.split("/", 1)[0] in self.requests


@dataclass(frozen=True)
class DeviceResult:
    """One entry of status.allocation.devices.results (upstream DeviceRequestAllocationResult)."""

    request: str  # "<request>" or "<request>/<subrequest>"
    driver: str
    pool: str
    device: str
    admin_access: bool
    tolerations: tuple[Toleration, ...]
    share_id: str | None
    consumed_capacity: Mapping[str, Quantity]
    binding_conditions: tuple[str, ...]
    binding_failure_conditions: tuple[str, ...]
    path: str  # status.allocation.devices.results[i], for messages about this result
    raw: JSON = field(compare=False)

    @property
    def id(self) -> DeviceId:
        return DeviceId(self.driver, self.pool, self.device)

    @property
    def request_name(self) -> str:
        """The claim's request this result serves (containers reference the request, not the subrequest)."""
        return self.request.split("/", 1)[0]


@dataclass(frozen=True)
class Allocation:
    """status.allocation: the devices and the configuration that applies to them."""

    results: tuple[DeviceResult, ...]
    config: tuple[DeviceConfiguration, ...]
    node_selector: JSON | None


@dataclass(frozen=True)
class ConsumerReference:
    """One entry of status.reservedFor."""

    api_group: str
    resource: str
    name: str
    uid: str


@dataclass(frozen=True)
class DeviceCondition:
    """A condition (metav1.Condition) of a device in the claim's status.devices."""

    type: str
    status: str
    reason: str
    message: str


@dataclass(frozen=True)
class NetworkData:
    """The network data of a device in the claim's status.devices: its interface, IPs and hardware address."""

    interface_name: str
    ips: tuple[str, ...]
    hardware_address: str


@dataclass(frozen=True)
class AllocatedDeviceStatus:
    """One entry of status.devices: what a driver reports of a device it prepared."""

    driver: str
    pool: str
    device: str
    share_id: str | None
    conditions: tuple[DeviceCondition, ...]
    data: Any  # raw JSON, the driver's own
    network_data: NetworkData | None


@dataclass(frozen=True)
class DriverAllocation:
    """What one driver's kubelet plugin acts on: its results of a claim (for one pool), and the allocation's
    configuration entries for that driver (opaque, in the order of status.allocation.devices.config; entries of a
    kind the product does not know are kept so that the consumer can refuse them)."""

    results: tuple[DeviceResult, ...]
    configs: tuple[DeviceConfiguration, ...]
    pod_claim_name: str | None = None  # the claim's POD_CLAIM_NAME_ANNOTATION


# Set by the ResourceClaim controller on a claim it makes from a pod's template: the pod's name for the claim
# (pod.spec.resourceClaims[].name). kubernetes/kubernetes pkg/controller/resourceclaim (resourceapi.
# PodResourceClaimAnnotation); KEP-5304 device metadata paths of template claims use it.
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"


@dataclass(frozen=True)
class ResourceClaim:
    """A resource.k8s.io ResourceClaim as the driver reads it: its requests, constraints, configs, allocation and
    status."""

    namespace: str
    name: str
    uid: str
    requests: tuple[Request, ...]
    constraints: tuple[Constraint, ...]
    config: tuple[DeviceConfiguration, ...]  # spec.devices.config
    allocation: Allocation | None = None
    reserved_for: tuple[ConsumerReference, ...] = ()
    devices: tuple[AllocatedDeviceStatus, ...] = ()  # status.devices
    pod_claim_name: str | None = None  # metadata.annotations[POD_CLAIM_NAME_ANNOTATION]; None: not set

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def results(self) -> tuple[DeviceResult, ...]:
        """The allocation results; empty when the claim is not allocated."""
        return self.allocation.results if self.allocation is not None else ()

    def request(self, name: str) -> Request | None:
        return next((r for r in self.requests if r.name == name), None)

    def device_class_of(self, result: DeviceResult) -> str | None:
        """The DeviceClass the result's request (or subrequest) asked for; None when the spec does not name the
        request (a claim edited after allocation cannot be: the spec is immutable)."""
        name, _, sub = result.request.partition("/")
        request = self.request(name)
        chosen = request.alternative(sub) if request is not None else None
        return chosen.class_name if chosen is not None else None

    def for_driver(self, driver: str, pool: str) -> DriverAllocation:
        """This driver's results of the claim in `pool`, with the allocation's config entries for the driver (and
        those of no known kind). Empty when the claim is not allocated."""
        return DriverAllocation(
            tuple(r for r in self.results if r.driver == driver and r.pool == pool),
            self.allocation_configs(driver),
            self.pod_claim_name,
        )

    def allocation_configs(self, driver: str) -> tuple[DeviceConfiguration, ...]:
        """status.allocation.devices.config entries for `driver` (and those of no known kind), in order, each
        `FromClaim` entry with the `requests` its spec.devices.config entry was written with.

        Why: from Kubernetes 1.37 the structured allocator empties an entry's `requests` when they cover every
        request of the claim ("empty means all"; dynamic-resource-allocation structured/internal/*/allocator_*.go),
        while 1.34-1.36 copy them as written. A user who scoped a config to `requests: [gpu]` meant that request
        whatever the count of the others: the spec is immutable, so what was written is still there to read."""
        if self.allocation is None:
            return ()
        written = _claim_configs_as_written(self.allocation.config, self.config)
        return tuple(c for c in written if c.opaque is None or c.opaque.driver == driver)


def _config_body(entry: DeviceConfiguration) -> dict[str, Any]:
    return {k: v for k, v in entry.raw.items() if k not in ("source", "requests")}


def _claim_configs_as_written(
    allocated: tuple[DeviceConfiguration, ...], spec: tuple[DeviceConfiguration, ...]
) -> tuple[DeviceConfiguration, ...]:
    """The allocation's entries, a `FromClaim` one without `requests` given those of its spec entry. The allocator
    copies claim entries in spec order (1.34-1.36 once per matching request, so the same spec entry may come
    again), so each is matched to the first spec entry at or after the previous match with the same body."""
    out: list[DeviceConfiguration] = []
    start = 0
    for entry in allocated:
        if entry.source == FROM_CLAIM:
            for index in range(start, len(spec)):
                if _config_body(spec[index]) != _config_body(entry):
                    continue
                if entry.requests and entry.requests != spec[index].requests:
                    continue
                start = index
                if not entry.requests and spec[index].requests:
                    entry = replace(entry, requests=spec[index].requests)
                break
        out.append(entry)
    return tuple(out)


# -- parsing ------------------------------------------------------------------------------------------------------


def parse_resource_claim(obj: JSON) -> ResourceClaim:
    """The claim, or InvalidObjectError naming the field path of the first malformed field read."""
    if not isinstance(obj, Mapping):
        problem = f"must be an object, got {type(obj).__name__}"
        raise InvalidObjectError("ResourceClaim <unnamed>", "(the object)", problem)
    r, meta = read_object("ResourceClaim", obj)
    spec = r.mapping(obj.get("spec"), "spec")
    devices = r.mapping(spec.get("devices"), "spec.devices")
    status = r.mapping(obj.get("status"), "status")
    return ResourceClaim(
        namespace=r.string(meta.get("namespace"), "metadata.namespace") or "default",
        name=r.string(meta.get("name"), "metadata.name", required=True),
        uid=r.string(meta.get("uid"), "metadata.uid"),
        requests=_requests(r, devices.get("requests")),
        constraints=_constraints(r, devices.get("constraints")),
        config=_configs(r, "spec.devices.config", devices.get("config"), allocated=False),
        allocation=_allocation(r, status.get("allocation")),
        reserved_for=_reserved_for(r, status.get("reservedFor")),
        devices=_device_statuses(r, status.get("devices")),
        pod_claim_name=_pod_claim_name(r, meta),
    )


def _pod_claim_name(r: FieldReader, meta: JSON) -> str | None:
    annotations = r.mapping(meta.get("annotations"), "metadata.annotations")
    if POD_CLAIM_NAME_ANNOTATION not in annotations:
        return None
    return r.string(annotations[POD_CLAIM_NAME_ANNOTATION], f"metadata.annotations[{POD_CLAIM_NAME_ANNOTATION}]")


def parse_selectors(r: FieldReader, path: str, raw: Any) -> tuple[str, ...]:
    """A list of DeviceSelectors (`cel.expression` each), as requests and DeviceClasses have them."""
    out = []
    for i, sel in enumerate(r.seq(raw, path)):
        cel = r.mapping(r.mapping(sel, f"{path}[{i}]").get("cel"), f"{path}[{i}].cel", required=True)
        out.append(r.string(cel.get("expression"), f"{path}[{i}].cel.expression", required=True))
    return tuple(out)


def _tolerations(r: FieldReader, path: str, raw: Any) -> tuple[Toleration, ...]:
    out = []
    for tpath, tol in r.entries(raw, path):
        operator = r.string(tol.get("operator"), f"{tpath}.operator") or "Equal"
        if operator not in _OPERATORS:
            raise r.fail(f"{tpath}.operator", f"must be Equal or Exists, got {operator!r}")
        out.append(
            Toleration(
                key=r.string(tol.get("key"), f"{tpath}.key"),
                operator=operator,
                value=r.string(tol.get("value"), f"{tpath}.value"),
                effect=r.string(tol.get("effect"), f"{tpath}.effect"),
                raw=tol,
            )
        )
    return tuple(out)


def _quantities(r: FieldReader, path: str, raw: Any) -> dict[str, Quantity]:
    return {str(k): r.quantity(v, f"{path}.{k}") for k, v in r.mapping(raw, path).items()}


def _exact(r: FieldReader, path: str, raw: JSON, name: str, *, allow_admin: bool) -> ExactRequest:
    if type(raw) is dict and raw.keys() <= _PLAIN_EXACT:
        class_name, count, mode = raw.get("deviceClassName"), raw.get("count", 1), raw.get("allocationMode")
        if type(class_name) is str and class_name and type(count) is int and count >= 1 and mode in (None, MODE_EXACT):
            return ExactRequest(name, class_name, (), MODE_EXACT, count, False, (), _NO_QUANTITIES)
    mode = r.string(raw.get("allocationMode"), f"{path}.allocationMode") or MODE_EXACT
    if mode not in (MODE_EXACT, MODE_ALL):
        raise r.fail(f"{path}.allocationMode", f"must be {MODE_EXACT} or {MODE_ALL}, got {mode!r}")
    count = r.integer(raw.get("count"), f"{path}.count", default=1)
    if mode == MODE_EXACT and count < 1:
        raise r.fail(f"{path}.count", f"must be >= 1 for ExactCount, got {count}")
    capacity = r.mapping(raw.get("capacity"), f"{path}.capacity")
    admin = r.boolean(raw.get("adminAccess"), f"{path}.adminAccess")
    if admin and not allow_admin:
        raise r.fail(f"{path}.adminAccess", "is not allowed on a firstAvailable subrequest")
    return ExactRequest(
        name=name,
        class_name=r.string(raw.get("deviceClassName"), f"{path}.deviceClassName", required=True),
        selectors=parse_selectors(r, f"{path}.selectors", raw.get("selectors")),
        mode=mode,
        count=count if mode == MODE_EXACT else 0,
        admin_access=admin,
        tolerations=_tolerations(r, f"{path}.tolerations", raw.get("tolerations")),
        capacity=_quantities(r, f"{path}.capacity.requests", capacity.get("requests")),
        derived_attributes=_derived_attributes(r, f"{path}.derivedAttributes", raw.get("derivedAttributes")),
    )


def _derived_attributes(r: FieldReader, path: str, raw: Any) -> Mapping[str, str]:
    if not raw:
        return _NO_DERIVED
    out: dict[str, str] = {}
    for item_path, item in r.entries(raw, path):
        name = r.string(item.get("name"), f"{item_path}.name", required=True)
        if "/" not in name:
            raise r.fail(f"{item_path}.name", f"{name!r} must be fully qualified (<domain>/<name>)")
        if name in out:
            raise r.fail(f"{item_path}.name", f"duplicate derived attribute {name!r}")
        out[name] = r.string(item.get("expression"), f"{item_path}.expression", required=True)
    return MappingProxyType(out)


def _requests(r: FieldReader, raw: Any) -> tuple[Request, ...]:
    requests = []
    seen: set[str] = set()
    for path, req in r.entries(raw, "spec.devices.requests"):
        name = r.string(req.get("name"), f"{path}.name", required=True)
        if name in seen:
            raise r.fail(f"{path}.name", f"duplicate request name {name!r}; request names must be unique")
        seen.add(name)
        has_exact, has_first = req.get("exactly") is not None, bool(req.get("firstAvailable"))
        if has_exact == has_first:
            raise r.fail(path, "set exactly one of 'exactly' and 'firstAvailable'")
        if has_exact:
            exact = _exact(r, f"{path}.exactly", r.mapping(req["exactly"], f"{path}.exactly"), name, allow_admin=True)
            requests.append(Request(name=name, alternatives=(exact,), first_available=False))
            continue
        subs = []
        for sub_path, sub in r.entries(req.get("firstAvailable"), f"{path}.firstAvailable"):
            subs.append(_exact(r, sub_path, sub, r.string(sub.get("name"), f"{sub_path}.name", required=True),
                               allow_admin=False))  # fmt: skip
        requests.append(Request(name=name, alternatives=tuple(subs), first_available=True))
    return tuple(requests)


def _constraints(r: FieldReader, raw: Any) -> tuple[Constraint, ...]:
    constraints = []
    for path, con in r.entries(raw, "spec.devices.constraints"):
        kinds = [k for k in ("matchAttribute", "distinctAttribute") if con.get(k)]
        if len(kinds) != 1:
            raise r.fail(path, "set exactly one of matchAttribute and distinctAttribute")
        attribute = r.string(con[kinds[0]], f"{path}.{kinds[0]}", required=True)
        if "/" not in attribute:
            raise r.fail(f"{path}.{kinds[0]}", f"{attribute!r} must be fully qualified (<domain>/<name>)")
        names = r.strings(con.get("requests"), f"{path}.requests")
        constraints.append(Constraint(requests=names, kind=kinds[0], attribute=attribute))
    return tuple(constraints)


def _configs(r: FieldReader, path: str, raw: Any, *, allocated: bool) -> tuple[DeviceConfiguration, ...]:
    out = []
    for entry_path, entry in r.entries(raw, path):
        source = None
        if allocated:
            source = r.string(entry.get("source"), f"{entry_path}.source", required=True)
            if source not in (FROM_CLASS, FROM_CLAIM):
                raise r.fail(f"{entry_path}.source", f"must be {FROM_CLASS} or {FROM_CLAIM}, got {source!r}")
        opaque = None
        if entry.get("opaque") is not None:
            body = r.mapping(entry["opaque"], f"{entry_path}.opaque")
            opaque = OpaqueParameters(
                driver=r.string(body.get("driver"), f"{entry_path}.opaque.driver", required=True),
                parameters=body.get("parameters"),
            )
        out.append(
            DeviceConfiguration(
                source=source,
                requests=r.strings(entry.get("requests"), f"{entry_path}.requests"),
                opaque=opaque,
                path=entry_path,
                raw=entry,
            )
        )
    return tuple(out)


# A cluster's allocations are read again and again (the allocator reads every allocated claim for each node it tries),
# so the common, valid shapes of a result, a consumer and a request are taken straight to their values; anything
# else (and anything invalid) goes through the field-by-field reader, which gives the same value or names the field.
_PLAIN_RESULT: Final = frozenset({"request", "driver", "pool", "device", "shareID", "adminAccess"})
_PLAIN_CONSUMER: Final = frozenset({"apiGroup", "resource", "name", "uid"})
_NO_DERIVED: Final[Mapping[str, str]] = MappingProxyType({})
_PLAIN_EXACT: Final = frozenset({"deviceClassName", "count", "allocationMode"})
_NO_QUANTITIES: Final[Mapping[str, Quantity]] = MappingProxyType({})


def _plain_result(path: str, res: dict[str, Any]) -> DeviceResult | None:
    request, driver, pool, device = res.get("request"), res.get("driver"), res.get("pool"), res.get("device")
    share, admin = res.get("shareID"), res.get("adminAccess")
    if not (type(request) is str and request and type(driver) is str and driver and type(pool) is str and pool
            and type(device) is str and device and (share is None or type(share) is str)
            and (admin is None or type(admin) is bool)):  # fmt: skip
        return None
    return DeviceResult(
        request, driver, pool, device, admin is True, (), share or None, _NO_QUANTITIES, (), (), path, res
    )


def _result(r: FieldReader, path: str, raw: Any) -> DeviceResult:
    if type(raw) is dict and raw.keys() <= _PLAIN_RESULT and (plain := _plain_result(path, raw)) is not None:
        return plain
    res = r.mapping(raw, path, required=True)
    return DeviceResult(
        request=r.string(res.get("request"), f"{path}.request", required=True),
        driver=r.string(res.get("driver"), f"{path}.driver", required=True),
        pool=r.string(res.get("pool"), f"{path}.pool", required=True),
        device=r.string(res.get("device"), f"{path}.device", required=True),
        admin_access=r.boolean(res.get("adminAccess"), f"{path}.adminAccess"),
        tolerations=_tolerations(r, f"{path}.tolerations", res.get("tolerations")),
        share_id=r.string(res.get("shareID"), f"{path}.shareID") or None,
        consumed_capacity=_quantities(r, f"{path}.consumedCapacity", res.get("consumedCapacity")),
        binding_conditions=r.strings(res.get("bindingConditions"), f"{path}.bindingConditions"),
        binding_failure_conditions=r.strings(res.get("bindingFailureConditions"), f"{path}.bindingFailureConditions"),
        path=path,
        raw=res,
    )


def _allocation(r: FieldReader, raw: Any) -> Allocation | None:
    if raw is None:
        return None
    allocation = r.mapping(raw, "status.allocation")
    devices = r.mapping(allocation.get("devices"), "status.allocation.devices")
    path = "status.allocation.devices.results"
    selector = allocation.get("nodeSelector")
    return Allocation(
        results=tuple(_result(r, f"{path}[{i}]", item) for i, item in enumerate(r.seq(devices.get("results"), path))),
        config=_configs(r, "status.allocation.devices.config", devices.get("config"), allocated=True),
        node_selector=None if selector is None else r.mapping(selector, "status.allocation.nodeSelector"),
    )


def _reserved_for(r: FieldReader, raw: Any) -> tuple[ConsumerReference, ...]:
    out = []
    for i, item in enumerate(r.seq(raw, "status.reservedFor")):
        if type(item) is dict and item.keys() <= _PLAIN_CONSUMER:
            group, resource, name, uid = item.get("apiGroup"), item.get("resource"), item.get("name"), item.get("uid")
            if (group is None or type(group) is str) and type(resource) is str and resource and type(name) is str \
                    and name and type(uid) is str and uid:  # fmt: skip
                out.append(ConsumerReference(group or "", resource, name, uid))
                continue
        path = f"status.reservedFor[{i}]"
        ref = r.mapping(item, path, required=True)
        out.append(
            ConsumerReference(
                api_group=r.string(ref.get("apiGroup"), f"{path}.apiGroup"),
                resource=r.string(ref.get("resource"), f"{path}.resource", required=True),
                name=r.string(ref.get("name"), f"{path}.name", required=True),
                uid=r.string(ref.get("uid"), f"{path}.uid", required=True),
            )
        )
    return tuple(out)


def _device_statuses(r: FieldReader, raw: Any) -> tuple[AllocatedDeviceStatus, ...]:
    out = []
    for path, dev in r.entries(raw, "status.devices"):
        conditions = []
        for cpath, cond in r.entries(dev.get("conditions"), f"{path}.conditions"):
            conditions.append(
                DeviceCondition(
                    type=r.string(cond.get("type"), f"{cpath}.type", required=True),
                    status=r.string(cond.get("status"), f"{cpath}.status", required=True),
                    reason=r.string(cond.get("reason"), f"{cpath}.reason"),
                    message=r.string(cond.get("message"), f"{cpath}.message"),
                )
            )
        network = None
        if dev.get("networkData") is not None:
            net = r.mapping(dev["networkData"], f"{path}.networkData")
            network = NetworkData(
                interface_name=r.string(net.get("interfaceName"), f"{path}.networkData.interfaceName"),
                ips=r.strings(net.get("ips"), f"{path}.networkData.ips"),
                hardware_address=r.string(net.get("hardwareAddress"), f"{path}.networkData.hardwareAddress"),
            )
        out.append(
            AllocatedDeviceStatus(
                driver=r.string(dev.get("driver"), f"{path}.driver", required=True),
                pool=r.string(dev.get("pool"), f"{path}.pool", required=True),
                device=r.string(dev.get("device"), f"{path}.device", required=True),
                share_id=r.string(dev.get("shareID"), f"{path}.shareID") or None,
                conditions=tuple(conditions),
                data=dev.get("data"),
                network_data=network,
            )
        )
    return tuple(out)
