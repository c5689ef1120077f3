from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class KeyValue(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class OffloadDriverMetadata(_message.Message):
    __slots__ = ("name", "properties")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    name: str
    properties: _containers.RepeatedCompositeFieldContainer[KeyValue]
    def __init__(self, name: _Optional[str] = ..., properties: _Optional[_Iterable[_Union[KeyValue, _Mapping]]] = ...) -> None: ...

class OffloadContext(_message.Message):
    __slots__ = ("uidMsb", "uidLsb", "complete", "bookkeeperDeleted", "timestamp", "driverMetadata", "offloadSegment")
    UIDMSB_FIELD_NUMBER: _ClassVar[int]
    UIDLSB_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    BOOKKEEPERDELETED_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    DRIVERMETADATA_FIELD_NUMBER: _ClassVar[int]
    OFFLOADSEGMENT_FIELD_NUMBER: _ClassVar[int]
    uidMsb: int
    uidLsb: int
    complete: bool
    bookkeeperDeleted: bool
    timestamp: int
    driverMetadata: OffloadDriverMetadata
    offloadSegment: _containers.RepeatedCompositeFieldContainer[OffloadSegment]
    def __init__(self, uidMsb: _Optional[int] = ..., uidLsb: _Optional[int] = ..., complete: bool = ..., bookkeeperDeleted: bool = ..., timestamp: _Optional[int] = ..., driverMetadata: _Optional[_Union[OffloadDriverMetadata, _Mapping]] = ..., offloadSegment: _Optional[_Iterable[_Union[OffloadSegment, _Mapping]]] = ...) -> None: ...

class OffloadSegment(_message.Message):
    __slots__ = ("uidMsb", "uidLsb", "complete", "assignedTimestamp", "offloadedTimestamp", "endEntryId", "driverMetadata")
    UIDMSB_FIELD_NUMBER: _ClassVar[int]
    UIDLSB_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    ASSIGNEDTIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    OFFLOADEDTIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    ENDENTRYID_FIELD_NUMBER: _ClassVar[int]
    DRIVERMETADATA_FIELD_NUMBER: _ClassVar[int]
    uidMsb: int
    uidLsb: int
    complete: bool
    assignedTimestamp: int
    offloadedTimestamp: int
    endEntryId: int
    driverMetadata: OffloadDriverMetadata
    def __init__(self, uidMsb: _Optional[int] = ..., uidLsb: _Optional[int] = ..., complete: bool = ..., assignedTimestamp: _Optional[int] = ..., offloadedTimestamp: _Optional[int] = ..., endEntryId: _Optional[int] = ..., driverMetadata: _Optional[_Union[OffloadDriverMetadata, _Mapping]] = ...) -> None: ...

class NestedPositionInfo(_message.Message):
    __slots__ = ("ledgerId", "entryId")
    LEDGERID_FIELD_NUMBER: _ClassVar[int]
    ENTRYID_FIELD_NUMBER: _ClassVar[int]
    ledgerId: int
    entryId: int
    def __init__(self, ledgerId: _Optional[int] = ..., entryId: _Optional[int] = ...) -> None: ...

class ManagedLedgerInfo(_message.Message):
    __slots__ = ("ledgerInfo", "terminatedPosition", "properties")
    class LedgerInfo(_message.Message):
        __slots__ = ("ledgerId", "entries", "size", "timestamp", "offloadContext", "properties")
        LEDGERID_FIELD_NUMBER: _ClassVar[int]
        ENTRIES_FIELD_NUMBER: _ClassVar[int]
        SIZE_FIELD_NUMBER: _ClassVar[int]
        TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
        OFFLOADCONTEXT_FIELD_NUMBER: _ClassVar[int]
        PROPERTIES_FIELD_NUMBER: _ClassVar[int]
        ledgerId: int
        entries: int
        size: int
        timestamp: int
        offloadContext: OffloadContext
        properties: _containers.RepeatedCompositeFieldContainer[KeyValue]
        def __init__(self, ledgerId: _Optional[int] = ..., entries: _Optional[int] = ..., size: _Optional[int] = ..., timestamp: _Optional[int] = ..., offloadContext: _Optional[_Union[OffloadContext, _Mapping]] = ..., properties: _Optional[_Iterable[_Union[KeyValue, _Mapping]]] = ...) -> None: ...
    LEDGERINFO_FIELD_NUMBER: _ClassVar[int]
    TERMINATEDPOSITION_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    ledgerInfo: _containers.RepeatedCompositeFieldContainer[ManagedLedgerInfo.LedgerInfo]
    terminatedPosition: NestedPositionInfo
    properties: _containers.RepeatedCompositeFieldContainer[KeyValue]
    def __init__(self, ledgerInfo: _Optional[_Iterable[_Union[ManagedLedgerInfo.LedgerInfo, _Mapping]]] = ..., terminatedPosition: _Optional[_Union[NestedPositionInfo, _Mapping]] = ..., properties: _Optional[_Iterable[_Union[KeyValue, _Mapping]]] = ...) -> None: ...
