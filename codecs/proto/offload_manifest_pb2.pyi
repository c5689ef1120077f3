from streamoffload.codecs.proto import managed_ledger_pb2 as _managed_ledger_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SegmentManifest(_message.Message):
    __slots__ = ("uidMsb", "uidLsb", "topic", "status", "formatVersion", "ordinal", "startLedgerId", "startEntryId", "endLedgerId", "endEntryId", "assignedTimestamp", "offloadedTimestamp", "dataKey", "indexKey", "dataLength", "indexLength", "entries", "entryBytes", "blockCount", "partCount", "sealReason", "failure", "ledgers", "driverMetadata", "softwareVersion", "publishTimeFirst", "publishTimeLast")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ASSIGNED: _ClassVar[SegmentManifest.Status]
        OFFLOADED: _ClassVar[SegmentManifest.Status]
        FAILED: _ClassVar[SegmentManifest.Status]
    ASSIGNED: SegmentManifest.Status
    OFFLOADED: SegmentManifest.Status
    FAILED: SegmentManifest.Status
    UIDMSB_FIELD_NUMBER: _ClassVar[int]
    UIDLSB_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FORMATVERSION_FIELD_NUMBER: _ClassVar[int]
    ORDINAL_FIELD_NUMBER: _ClassVar[int]
    STARTLEDGERID_FIELD_NUMBER: _ClassVar[int]
    STARTENTRYID_FIELD_NUMBER: _ClassVar[int]
    ENDLEDGERID_FIELD_NUMBER: _ClassVar[int]
    ENDENTRYID_FIELD_NUMBER: _ClassVar[int]
    ASSIGNEDTIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    OFFLOADEDTIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    DATAKEY_FIELD_NUMBER: _ClassVar[int]
    INDEXKEY_FIELD_NUMBER: _ClassVar[int]
    DATALENGTH_FIELD_NUMBER: _ClassVar[int]
    INDEXLENGTH_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    ENTRYBYTES_FIELD_NUMBER: _ClassVar[int]
    BLOCKCOUNT_FIELD_NUMBER: _ClassVar[int]
    PARTCOUNT_FIELD_NUMBER: _ClassVar[int]
    SEALREASON_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    LEDGERS_FIELD_NUMBER: _ClassVar[int]
    DRIVERMETADATA_FIELD_NUMBER: _ClassVar[int]
    SOFTWAREVERSION_FIELD_NUMBER: _ClassVar[int]
    PUBLISHTIMEFIRST_FIELD_NUMBER: _ClassVar[int]
    PUBLISHTIMELAST_FIELD_NUMBER: _ClassVar[int]
    uidMsb: int
    uidLsb: int
    topic: str
    status: SegmentManifest.Status
    formatVersion: int
    ordinal: int
    startLedgerId: int
    startEntryId: int
    endLedgerId: int
    endEntryId: int
    assignedTimestamp: int
    offloadedTimestamp: int
    dataKey: str
    indexKey: str
    dataLength: int
    indexLength: int
    entries: int
    entryBytes: int
    blockCount: int
    partCount: int
    sealReason: str
    failure: str
    ledgers: _containers.RepeatedCompositeFieldContainer[_managed_ledger_pb2.ManagedLedgerInfo.LedgerInfo]
    driverMetadata: _managed_ledger_pb2.OffloadDriverMetadata
    softwareVersion: str
    publishTimeFirst: int
    publishTimeLast: int
    def __init__(self, uidMsb: _Optional[int] = ..., uidLsb: _Optional[int] = ..., topic: _Optional[str] = ..., status: _Optional[_Union[SegmentManifest.Status, str]] = ..., formatVersion: _Optional[int] = ..., ordinal: _Optional[int] = ..., startLedgerId: _Optional[int] = ..., startEntryId: _Optional[int] = ..., endLedgerId: _Optional[int] = ..., endEntryId: _Optional[int] = ..., assignedTimestamp: _Optional[int] = ..., offloadedTimestamp: _Optional[int] = ..., dataKey: _Optional[str] = ..., indexKey: _Optional[str] = ..., dataLength: _Optional[int] = ..., indexLength: _Optional[int] = ..., entries: _Optional[int] = ..., entryBytes: _Optional[int] = ..., blockCount: _Optional[int] = ..., partCount: _Optional[int] = ..., sealReason: _Optional[str] = ..., failure: _Optional[str] = ..., ledgers: _Optional[_Iterable[_Union[_managed_ledger_pb2.ManagedLedgerInfo.LedgerInfo, _Mapping]]] = ..., driverMetadata: _Optional[_Union[_managed_ledger_pb2.OffloadDriverMetadata, _Mapping]] = ..., softwareVersion: _Optional[str] = ..., publishTimeFirst: _Optional[int] = ..., publishTimeLast: _Optional[int] = ...) -> None: ...

class DeletedLedger(_message.Message):
    __slots__ = ("ledgerId", "deletedTimestamp", "reason")
    LEDGERID_FIELD_NUMBER: _ClassVar[int]
    DELETEDTIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ledgerId: int
    deletedTimestamp: int
    reason: str
    def __init__(self, ledgerId: _Optional[int] = ..., deletedTimestamp: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class DeletedSegment(_message.Message):
    __slots__ = ("uidMsb", "uidLsb", "startLedgerId", "startEntryId", "endLedgerId", "endEntryId", "deletedTimestamp")
    UIDMSB_FIELD_NUMBER: _ClassVar[int]
    UIDLSB_FIELD_NUMBER: _ClassVar[int]
    STARTLEDGERID_FIELD_NUMBER: _ClassVar[int]
    STARTENTRYID_FIELD_NUMBER: _ClassVar[int]
    ENDLEDGERID_FIELD_NUMBER: _ClassVar[int]
    ENDENTRYID_FIELD_NUMBER: _ClassVar[int]
    DELETEDTIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    uidMsb: int
    uidLsb: int
    startLedgerId: int
    startEntryId: int
    endLedgerId: int
    endEntryId: int
    deletedTimestamp: int
    def __init__(self, uidMsb: _Optional[int] = ..., uidLsb: _Optional[int] = ..., startLedgerId: _Optional[int] = ..., startEntryId: _Optional[int] = ..., endLedgerId: _Optional[int] = ..., endEntryId: _Optional[int] = ..., deletedTimestamp: _Optional[int] = ...) -> None: ...
