from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Unknown(_message.Message):
    __slots__ = ("typeMeta", "raw", "contentEncoding", "contentType")
    TYPEMETA_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    CONTENTENCODING_FIELD_NUMBER: _ClassVar[int]
    CONTENTTYPE_FIELD_NUMBER: _ClassVar[int]
    typeMeta: TypeMeta
    raw: bytes
    contentEncoding: str
    contentType: str
    def __init__(self, typeMeta: _Optional[_Union[TypeMeta, _Mapping]] = ..., raw: _Optional[bytes] = ..., contentEncoding: _Optional[str] = ..., contentType: _Optional[str] = ...) -> None: ...

class TypeMeta(_message.Message):
    __slots__ = ("apiVersion", "kind")
    APIVERSION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    apiVersion: str
    kind: str
    def __init__(self, apiVersion: _Optional[str] = ..., kind: _Optional[str] = ...) -> None: ...

class ListMeta(_message.Message):
    __slots__ = ("resourceVersion", "remainingItemCount")
    RESOURCEVERSION_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_FIELD_NUMBER: _ClassVar[int]
    REMAININGITEMCOUNT_FIELD_NUMBER: _ClassVar[int]
    resourceVersion: str
    remainingItemCount: int
    def __init__(self, resourceVersion: _Optional[str] = ..., remainingItemCount: _Optional[int] = ..., **kwargs) -> None: ...

class EncodedList(_message.Message):
    __slots__ = ("metadata", "items")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    metadata: ListMeta
    items: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, metadata: _Optional[_Union[ListMeta, _Mapping]] = ..., items: _Optional[_Iterable[bytes]] = ...) -> None: ...

class EncodedListEnvelope(_message.Message):
    __slots__ = ("typeMeta", "raw", "contentEncoding")
    TYPEMETA_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    CONTENTENCODING_FIELD_NUMBER: _ClassVar[int]
    typeMeta: TypeMeta
    raw: EncodedList
    contentEncoding: str
    def __init__(self, typeMeta: _Optional[_Union[TypeMeta, _Mapping]] = ..., raw: _Optional[_Union[EncodedList, _Mapping]] = ..., contentEncoding: _Optional[str] = ...) -> None: ...

class Status(_message.Message):
    __slots__ = ("status", "message", "reason", "code")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    status: str
    message: str
    reason: str
    code: int
    def __init__(self, status: _Optional[str] = ..., message: _Optional[str] = ..., reason: _Optional[str] = ..., code: _Optional[int] = ...) -> None: ...

class Time(_message.Message):
    __slots__ = ("seconds", "nanos")
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    NANOS_FIELD_NUMBER: _ClassVar[int]
    seconds: int
    nanos: int
    def __init__(self, seconds: _Optional[int] = ..., nanos: _Optional[int] = ...) -> None: ...

class OwnerReference(_message.Message):
    __slots__ = ("kind", "name", "uid", "apiVersion", "controller", "blockOwnerDeletion")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    APIVERSION_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    BLOCKOWNERDELETION_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    uid: str
    apiVersion: str
    controller: bool
    blockOwnerDeletion: bool
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ..., uid: _Optional[str] = ..., apiVersion: _Optional[str] = ..., controller: _Optional[bool] = ..., blockOwnerDeletion: _Optional[bool] = ...) -> None: ...

class ObjectMeta(_message.Message):
    __slots__ = ("name", "generateName", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp", "labels", "annotations", "ownerReferences", "finalizers")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    GENERATENAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    RESOURCEVERSION_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    CREATIONTIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    DELETIONTIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    OWNERREFERENCES_FIELD_NUMBER: _ClassVar[int]
    FINALIZERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    generateName: str
    namespace: str
    uid: str
    resourceVersion: str
    generation: int
    creationTimestamp: Time
    deletionTimestamp: Time
    labels: _containers.ScalarMap[str, str]
    annotations: _containers.ScalarMap[str, str]
    ownerReferences: _containers.RepeatedCompositeFieldContainer[OwnerReference]
    finalizers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., generateName: _Optional[str] = ..., namespace: _Optional[str] = ..., uid: _Optional[str] = ..., resourceVersion: _Optional[str] = ..., generation: _Optional[int] = ..., creationTimestamp: _Optional[_Union[Time, _Mapping]] = ..., deletionTimestamp: _Optional[_Union[Time, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., annotations: _Optional[_Mapping[str, str]] = ..., ownerReferences: _Optional[_Iterable[_Union[OwnerReference, _Mapping]]] = ..., finalizers: _Optional[_Iterable[str]] = ...) -> None: ...

class Quantity(_message.Message):
    __slots__ = ("string",)
    STRING_FIELD_NUMBER: _ClassVar[int]
    string: str
    def __init__(self, string: _Optional[str] = ...) -> None: ...

class NodeSelector(_message.Message):
    __slots__ = ("nodeSelectorTerms",)
    NODESELECTORTERMS_FIELD_NUMBER: _ClassVar[int]
    nodeSelectorTerms: _containers.RepeatedCompositeFieldContainer[NodeSelectorTerm]
    def __init__(self, nodeSelectorTerms: _Optional[_Iterable[_Union[NodeSelectorTerm, _Mapping]]] = ...) -> None: ...

class NodeSelectorTerm(_message.Message):
    __slots__ = ("matchExpressions", "matchFields")
    MATCHEXPRESSIONS_FIELD_NUMBER: _ClassVar[int]
    MATCHFIELDS_FIELD_NUMBER: _ClassVar[int]
    matchExpressions: _containers.RepeatedCompositeFieldContainer[NodeSelectorRequirement]
    matchFields: _containers.RepeatedCompositeFieldContainer[NodeSelectorRequirement]
    def __init__(self, matchExpressions: _Optional[_Iterable[_Union[NodeSelectorRequirement, _Mapping]]] = ..., matchFields: _Optional[_Iterable[_Union[NodeSelectorRequirement, _Mapping]]] = ...) -> None: ...

class NodeSelectorRequirement(_message.Message):
    __slots__ = ("key", "operator", "values")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    key: str
    operator: str
    values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, key: _Optional[str] = ..., operator: _Optional[str] = ..., values: _Optional[_Iterable[str]] = ...) -> None: ...

class ResourceSlice(_message.Message):
    __slots__ = ("metadata", "spec")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    metadata: ObjectMeta
    spec: ResourceSliceSpec
    def __init__(self, metadata: _Optional[_Union[ObjectMeta, _Mapping]] = ..., spec: _Optional[_Union[ResourceSliceSpec, _Mapping]] = ...) -> None: ...

class ResourceSliceSpec(_message.Message):
    __slots__ = ("driver", "pool", "nodeName", "nodeSelector", "allNodes", "devices", "perDeviceNodeSelection", "sharedCounters", "partitionTypeAttribute")
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    NODENAME_FIELD_NUMBER: _ClassVar[int]
    NODESELECTOR_FIELD_NUMBER: _ClassVar[int]
    ALLNODES_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    PERDEVICENODESELECTION_FIELD_NUMBER: _ClassVar[int]
    SHAREDCOUNTERS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONTYPEATTRIBUTE_FIELD_NUMBER: _ClassVar[int]
    driver: str
    pool: ResourcePool
    nodeName: str
    nodeSelector: NodeSelector
    allNodes: bool
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    perDeviceNodeSelection: bool
    sharedCounters: _containers.RepeatedCompositeFieldContainer[CounterSet]
    partitionTypeAttribute: str
    def __init__(self, driver: _Optional[str] = ..., pool: _Optional[_Union[ResourcePool, _Mapping]] = ..., nodeName: _Optional[str] = ..., nodeSelector: _Optional[_Union[NodeSelector, _Mapping]] = ..., allNodes: _Optional[bool] = ..., devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ..., perDeviceNodeSelection: _Optional[bool] = ..., sharedCounters: _Optional[_Iterable[_Union[CounterSet, _Mapping]]] = ..., partitionTypeAttribute: _Optional[str] = ...) -> None: ...

class ResourcePool(_message.Message):
    __slots__ = ("name", "generation", "resourceSliceCount")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    RESOURCESLICECOUNT_FIELD_NUMBER: _ClassVar[int]
    name: str
    generation: int
    resourceSliceCount: int
    def __init__(self, name: _Optional[str] = ..., generation: _Optional[int] = ..., resourceSliceCount: _Optional[int] = ...) -> None: ...

class Device(_message.Message):
    __slots__ = ("name", "attributes", "capacity", "consumesCounters", "nodeName", "nodeSelector", "allNodes", "taints", "bindsToNode", "bindingConditions", "bindingFailureConditions", "allowMultipleAllocations")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: DeviceAttribute
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[DeviceAttribute, _Mapping]] = ...) -> None: ...
    class CapacityEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: DeviceCapacity
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[DeviceCapacity, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    CONSUMESCOUNTERS_FIELD_NUMBER: _ClassVar[int]
    NODENAME_FIELD_NUMBER: _ClassVar[int]
    NODESELECTOR_FIELD_NUMBER: _ClassVar[int]
    ALLNODES_FIELD_NUMBER: _ClassVar[int]
    TAINTS_FIELD_NUMBER: _ClassVar[int]
    BINDSTONODE_FIELD_NUMBER: _ClassVar[int]
    BINDINGCONDITIONS_FIELD_NUMBER: _ClassVar[int]
    BINDINGFAILURECONDITIONS_FIELD_NUMBER: _ClassVar[int]
    ALLOWMULTIPLEALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    attributes: _containers.MessageMap[str, DeviceAttribute]
    capacity: _containers.MessageMap[str, DeviceCapacity]
    consumesCounters: _containers.RepeatedCompositeFieldContainer[DeviceCounterConsumption]
    nodeName: str
    nodeSelector: NodeSelector
    allNodes: bool
    taints: _containers.RepeatedCompositeFieldContainer[DeviceTaint]
    bindsToNode: bool
    bindingConditions: _containers.RepeatedScalarFieldContainer[str]
    bindingFailureConditions: _containers.RepeatedScalarFieldContainer[str]
    allowMultipleAllocations: bool
    def __init__(self, name: _Optional[str] = ..., attributes: _Optional[_Mapping[str, DeviceAttribute]] = ..., capacity: _Optional[_Mapping[str, DeviceCapacity]] = ..., consumesCounters: _Optional[_Iterable[_Union[DeviceCounterConsumption, _Mapping]]] = ..., nodeName: _Optional[str] = ..., nodeSelector: _Optional[_Union[NodeSelector, _Mapping]] = ..., allNodes: _Optional[bool] = ..., taints: _Optional[_Iterable[_Union[DeviceTaint, _Mapping]]] = ..., bindsToNode: _Optional[bool] = ..., bindingConditions: _Optional[_Iterable[str]] = ..., bindingFailureConditions: _Optional[_Iterable[str]] = ..., allowMultipleAllocations: _Optional[bool] = ...) -> None: ...

class DeviceAttribute(_message.Message):
    __slots__ = ("int", "bool", "string", "version", "ints", "bools", "strings", "versions")
    INT_FIELD_NUMBER: _ClassVar[int]
    BOOL_FIELD_NUMBER: _ClassVar[int]
    STRING_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INTS_FIELD_NUMBER: _ClassVar[int]
    BOOLS_FIELD_NUMBER: _ClassVar[int]
    STRINGS_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    int: int
    bool: bool
    string: str
    version: str
    ints: _containers.RepeatedScalarFieldContainer[int]
    bools: _containers.RepeatedScalarFieldContainer[bool]
    strings: _containers.RepeatedScalarFieldContainer[str]
    versions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, int: _Optional[int] = ..., bool: _Optional[bool] = ..., string: _Optional[str] = ..., version: _Optional[str] = ..., ints: _Optional[_Iterable[int]] = ..., bools: _Optional[_Iterable[bool]] = ..., strings: _Optional[_Iterable[str]] = ..., versions: _Optional[_Iterable[str]] = ...) -> None: ...

class DeviceCapacity(_message.Message):
    __slots__ = ("value", "requestPolicy")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    REQUESTPOLICY_FIELD_NUMBER: _ClassVar[int]
    value: Quantity
    requestPolicy: CapacityRequestPolicy
    def __init__(self, value: _Optional[_Union[Quantity, _Mapping]] = ..., requestPolicy: _Optional[_Union[CapacityRequestPolicy, _Mapping]] = ...) -> None: ...

class CapacityRequestPolicy(_message.Message):
    __slots__ = ("default", "validValues", "validRange")
    DEFAULT_FIELD_NUMBER: _ClassVar[int]
    VALIDVALUES_FIELD_NUMBER: _ClassVar[int]
    VALIDRANGE_FIELD_NUMBER: _ClassVar[int]
    default: Quantity
    validValues: _containers.RepeatedCompositeFieldContainer[Quantity]
    validRange: CapacityRequestPolicyRange
    def __init__(self, default: _Optional[_Union[Quantity, _Mapping]] = ..., validValues: _Optional[_Iterable[_Union[Quantity, _Mapping]]] = ..., validRange: _Optional[_Union[CapacityRequestPolicyRange, _Mapping]] = ...) -> None: ...

class CapacityRequestPolicyRange(_message.Message):
    __slots__ = ("min", "max", "step")
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    min: Quantity
    max: Quantity
    step: Quantity
    def __init__(self, min: _Optional[_Union[Quantity, _Mapping]] = ..., max: _Optional[_Union[Quantity, _Mapping]] = ..., step: _Optional[_Union[Quantity, _Mapping]] = ...) -> None: ...

class DeviceCounterConsumption(_message.Message):
    __slots__ = ("counterSet", "counters", "compatibilityGroups")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Counter
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Counter, _Mapping]] = ...) -> None: ...
    COUNTERSET_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    COMPATIBILITYGROUPS_FIELD_NUMBER: _ClassVar[int]
    counterSet: str
    counters: _containers.MessageMap[str, Counter]
    compatibilityGroups: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, counterSet: _Optional[str] = ..., counters: _Optional[_Mapping[str, Counter]] = ..., compatibilityGroups: _Optional[_Iterable[str]] = ...) -> None: ...

class Counter(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: Quantity
    def __init__(self, value: _Optional[_Union[Quantity, _Mapping]] = ...) -> None: ...

class CounterSet(_message.Message):
    __slots__ = ("name", "counters")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Counter
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Counter, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    counters: _containers.MessageMap[str, Counter]
    def __init__(self, name: _Optional[str] = ..., counters: _Optional[_Mapping[str, Counter]] = ...) -> None: ...

class DeviceTaint(_message.Message):
    __slots__ = ("key", "value", "effect", "timeAdded")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    EFFECT_FIELD_NUMBER: _ClassVar[int]
    TIMEADDED_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    effect: str
    timeAdded: Time
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ..., effect: _Optional[str] = ..., timeAdded: _Optional[_Union[Time, _Mapping]] = ...) -> None: ...

class LightSlice(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: LightSpec
    def __init__(self, spec: _Optional[_Union[LightSpec, _Mapping]] = ...) -> None: ...

class LightSpec(_message.Message):
    __slots__ = ("driver", "pool", "nodeName", "devices")
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    NODENAME_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    driver: str
    pool: LightPool
    nodeName: str
    devices: _containers.RepeatedCompositeFieldContainer[LightDevice]
    def __init__(self, driver: _Optional[str] = ..., pool: _Optional[_Union[LightPool, _Mapping]] = ..., nodeName: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[LightDevice, _Mapping]]] = ...) -> None: ...

class LightPool(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class LightDevice(_message.Message):
    __slots__ = ("attributes", "allowMultipleAllocations")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    ALLOWMULTIPLEALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    attributes: _containers.ScalarMap[str, bytes]
    allowMultipleAllocations: bool
    def __init__(self, attributes: _Optional[_Mapping[str, bytes]] = ..., allowMultipleAllocations: _Optional[bool] = ...) -> None: ...

class StatusSlice(_message.Message):
    __slots__ = ("metadata", "spec")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    metadata: ObjectMeta
    spec: StatusSpec
    def __init__(self, metadata: _Optional[_Union[ObjectMeta, _Mapping]] = ..., spec: _Optional[_Union[StatusSpec, _Mapping]] = ...) -> None: ...

class StatusSpec(_message.Message):
    __slots__ = ("driver", "pool", "nodeName", "devices")
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    NODENAME_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    driver: str
    pool: ResourcePool
    nodeName: str
    devices: _containers.RepeatedCompositeFieldContainer[StatusDevice]
    def __init__(self, driver: _Optional[str] = ..., pool: _Optional[_Union[ResourcePool, _Mapping]] = ..., nodeName: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[StatusDevice, _Mapping]]] = ...) -> None: ...

class StatusDevice(_message.Message):
    __slots__ = ("name", "attributes", "capacity", "taints")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    class CapacityEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    TAINTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    attributes: _containers.ScalarMap[str, bytes]
    capacity: _containers.ScalarMap[str, bytes]
    taints: _containers.RepeatedCompositeFieldContainer[DeviceTaint]
    def __init__(self, name: _Optional[str] = ..., attributes: _Optional[_Mapping[str, bytes]] = ..., capacity: _Optional[_Mapping[str, bytes]] = ..., taints: _Optional[_Iterable[_Union[DeviceTaint, _Mapping]]] = ...) -> None: ...
