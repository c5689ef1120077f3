"""A topic's value schema (policy key ``offloadTableSchema``) as Iceberg types, and its values decoded to them.

The key holds a JSON document inline (text starting with ``{``) or ``@PATH``, a file holding one (a relative path
is from the job's working directory), or ``broker`` (``BROKER``): the topic's schema in the broker's schema registry
(``table.registry_schema``). The document is one of:

- a **JSON Schema** (``"type": "object"`` with ``properties``): values are JSON. ``string``, ``integer`` (long),
  ``number`` (double), ``boolean``, ``array`` (with ``items``), ``object`` (with ``properties``: a struct); a
  property is required when it is in ``required`` and its ``type`` does not list ``"null"``; properties the schema
  does not name are ignored;
- an **Avro record** (``"type": "record"``): values are Avro binary without a header, as Pulsar's ``AVRO`` schema
  writes them. Primitives, unions of ``null`` and one other type (optional), nested records, arrays, maps, enums
  (as strings) and fixed (as binary); logical types are read as their underlying type;
- with ``json_values`` (``document_schema``: Pulsar's ``JSON`` schema type, whose definition is an Avro record), an
  Avro record whose values are JSON: its fields' types checked as a JSON Schema's are (``int`` and ``float`` in
  their ranges, maps as objects); ``bytes`` and ``fixed`` fields are refused, as JSON has no one encoding of them.

The decoded value is the table's struct column ``value_decoded`` (``VALUE_DECODED``), beside the raw ``value``:
one column, so no field of a topic's schema can clash with pulsar-spark's columns. ``decode`` raises
``ValueDecodeError`` (one line, naming the field) for a value that does not fit the schema; the sync writes such
a record to the dead-letter table (``table.dead_letters``).

Evolution (``check_evolution``): fields added as optional become new columns; a type change, a required field
added or a required field removed is refused, naming the field.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import fastavro
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
)

from streamoffload.table.errors import TableError

KEY = "offloadTableSchema"
BROKER = "broker"
"""The key's value that takes the topic's schema from the broker's schema registry (``table.registry_schema``)."""
VALUE_DECODED = "value_decoded"
FIRST_FIELD_ID = 1000
"""Field ids of a schema built here: placeholders, the catalog assigns the table's own at creation or evolution."""


class TableSchemaError(TableError):
    """A topic's value schema that cannot be read, mapped to Iceberg, or evolved into its table's."""


class ValueDecodeError(TableError, ValueError):
    """A value that does not fit the topic's schema (the text names the field): a dead letter."""


Decoder = Callable[[bytes], dict[str, object]]


@dataclass(frozen=True)
class ValueSchema:
    """A topic's value schema: ``kind`` (``json`` or ``avro``), its Iceberg struct, and its values' decoder."""

    kind: str
    struct: StructType
    decode: Decoder
    decoder_for: Callable[[bytes | None], Decoder] | None = None
    """The decoder of a message of a given ``schema_version`` (its metadata's) into ``struct``, for a schema that
    has versions (the registry's); None: every value decodes with ``decode``."""


class _Ids:
    def __init__(self) -> None:
        self.next = FIRST_FIELD_ID

    def __call__(self) -> int:
        self.next += 1
        return self.next


def parse_value_schema(text: str, where: str) -> ValueSchema:
    """The schema ``text`` (the policy's value) names; ``where`` (the topic) starts every error."""
    prefix = f"{where}: {KEY}"
    if text.startswith("@"):
        path = Path(text[1:])
        try:
            text = path.read_text()
        except OSError as err:
            raise TableSchemaError(f"{prefix}: cannot read {path}: {err.strerror}") from None
        prefix = f"{prefix} ({path})"
    try:
        doc: object = json.loads(text)
    except ValueError as err:
        raise TableSchemaError(f"{prefix} is not JSON: {err}") from None
    if not isinstance(doc, dict):
        raise TableSchemaError(f"{prefix} must be a JSON Schema object or an Avro record, got {type(doc).__name__}")
    if doc.get("type") not in ("record", "object"):
        raise TableSchemaError(f"{prefix} {_KINDS}, got type {doc.get('type')!r}")
    try:
        return document_schema(doc)
    except TableSchemaError as err:
        raise TableSchemaError(f"{prefix}: {err}") from None


_KINDS = 'must be a JSON Schema ("type": "object") or an Avro record ("type": "record")'


def document_schema(doc: dict[str, object], *, json_values: bool = False) -> ValueSchema:
    """The schema of a JSON Schema object or an Avro record; ``json_values``: an Avro record's values are JSON."""
    if doc.get("type") == "record":
        return _avro_json(doc) if json_values else _avro(doc)
    if doc.get("type") == "object":
        return _json_schema(doc)
    raise TableSchemaError(f"{_KINDS}, got type {doc.get('type')!r}")


# -- JSON Schema ---------------------------------------------------------------------------------------------------

_JSON_PRIMITIVES: dict[str, IcebergType] = {
    "string": StringType(),
    "integer": LongType(),
    "number": DoubleType(),
    "boolean": BooleanType(),
}


def _json_types(node: dict[str, object], path: str) -> tuple[str, bool]:
    """The one non-null type a JSON Schema node names, and whether it allows null."""
    kind = node.get("type")
    kinds: list[object] = kind if isinstance(kind, list) else [kind]
    nullable = "null" in kinds
    rest = [k for k in kinds if k != "null"]
    if len(rest) != 1 or not isinstance(rest[0], str):
        raise TableSchemaError(f'field {path!r}: type must be one type, or one and "null", got {kind!r}')
    return rest[0], nullable


def _json_type(node: object, path: str, ids: _Ids) -> IcebergType:
    if not isinstance(node, dict):
        raise TableSchemaError(f"field {path!r}: a schema must be an object")
    kind, _ = _json_types(node, path)
    if kind in _JSON_PRIMITIVES:
        return _JSON_PRIMITIVES[kind]
    if kind == "array":
        items = node.get("items")
        if not isinstance(items, dict):
            raise TableSchemaError(f"field {path!r}: an array needs items")
        _, item_nullable = _json_types(items, f"{path}[]")
        return ListType(ids(), _json_type(items, f"{path}[]", ids), element_required=not item_nullable)
    if kind == "object":
        return _json_struct(node, path, ids)
    raise TableSchemaError(f"field {path!r}: unsupported type {kind!r}")


def _json_struct(node: dict[str, object], path: str, ids: _Ids) -> StructType:
    properties = node.get("properties")
    if not isinstance(properties, dict) or not properties:
        raise TableSchemaError(f"field {path or '(root)'!r}: an object needs properties")
    required = node.get("required", [])
    if not isinstance(required, list):
        raise TableSchemaError(f"field {path or '(root)'!r}: required must be a list of names")
    fields = []
    for name, sub in properties.items():
        sub_path = f"{path}.{name}" if path else str(name)
        iceberg = _json_type(sub, sub_path, ids)
        _, nullable = _json_types(sub, sub_path)
        fields.append(NestedField(ids(), name, iceberg, required=name in required and not nullable))
    return StructType(*fields)


def _json_schema(doc: dict[str, object]) -> ValueSchema:
    return _json_values(_json_struct(doc, "", _Ids()))


def _json_values(struct: StructType) -> ValueSchema:
    """JSON values checked against ``struct``."""

    def decode(value: bytes) -> dict[str, object]:
        try:
            parsed = json.loads(value)
        except ValueError as err:
            raise ValueDecodeError(f"not JSON: {err}") from None
        if not isinstance(parsed, dict):
            raise ValueDecodeError(f"field '(root)': expected an object, got {_json_name(parsed)}")
        return _check_struct(struct, parsed, "")

    return ValueSchema("json", struct, decode)


_JSON_NAMES: dict[type, str] = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    dict: "object",
}


def _json_name(value: object) -> str:
    return "null" if value is None else _JSON_NAMES.get(type(value), type(value).__name__)


def _check_struct(struct: StructType, value: dict[str, object], path: str) -> dict[str, object]:
    out: dict[str, object] = {}
    for f in struct.fields:
        sub = f"{path}.{f.name}" if path else f.name
        item = value.get(f.name)
        if item is None:
            if f.required:
                raise ValueDecodeError(f"field {sub!r}: required, " + ("null" if f.name in value else "missing"))
            out[f.name] = None
        else:
            out[f.name] = _check(f.field_type, item, sub)
    return out


_FLOAT_MAX = 3.4028234663852886e38
"""The largest finite 32-bit float (Avro's ``float``)."""


def _finite(value: object) -> bool:
    """A JSON number a double holds: an integer within its range, or a finite float (not NaN, not Infinity)."""
    return (type(value) is int and abs(value) < 2**1023) or (type(value) is float and math.isfinite(value))


def _check(kind: IcebergType, value: object, path: str) -> object:
    """``value`` (parsed JSON) as the Arrow column of ``kind`` takes it; ``ValueDecodeError`` if it is not one."""
    if isinstance(kind, StringType) and isinstance(value, str):
        return value
    if isinstance(kind, LongType) and type(value) is int and -(2**63) <= value < 2**63:
        return value
    if isinstance(kind, IntegerType) and type(value) is int and -(2**31) <= value < 2**31:
        return value
    if isinstance(kind, FloatType) and _finite(value):
        assert isinstance(value, int | float)
        if abs(value) <= _FLOAT_MAX:
            return float(value)
    if isinstance(kind, DoubleType) and _finite(value):
        assert isinstance(value, int | float)
        return float(value)
    if isinstance(kind, BooleanType) and isinstance(value, bool):
        return value
    if isinstance(kind, ListType) and isinstance(value, list):
        out: list[object] = []
        for i, item in enumerate(value):
            if item is None:
                if kind.element_required:
                    raise ValueDecodeError(f"field '{path}[{i}]': required, null")
                out.append(None)
            else:
                out.append(_check(kind.element_type, item, f"{path}[{i}]"))
        return out
    if isinstance(kind, StructType) and isinstance(value, dict):
        return _check_struct(kind, value, path)
    if isinstance(kind, MapType) and isinstance(value, dict):
        pairs: list[tuple[str, object]] = []
        for k, item in value.items():
            if item is None and kind.value_required:
                raise ValueDecodeError(f"field '{path}{{{k}}}': required, null")
            pairs.append((k, None if item is None else _check(kind.value_type, item, f"{path}{{{k}}}")))
        return pairs
    expected: dict[type, str] = {
        LongType: "integer",
        IntegerType: "integer",
        FloatType: "number",
        DoubleType: "number",
        BooleanType: "boolean",
        StringType: "string",
    }
    name = expected.get(type(kind), "array" if isinstance(kind, ListType) else "object")
    got = _json_name(value)
    if got == name or (got == "integer" and name == "number"):
        raise ValueDecodeError(f"field {path!r}: {name} out of range: {json.dumps(value)[:40]}")
    raise ValueDecodeError(f"field {path!r}: expected {name}, got {got} {json.dumps(value)[:40]}")


# -- Avro ----------------------------------------------------------------------------------------------------------

_AVRO_PRIMITIVES: dict[str, IcebergType] = {
    "string": StringType(),
    "bytes": BinaryType(),
    "int": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "boolean": BooleanType(),
}


def _avro_type(node: object, path: str, ids: _Ids, named: dict[str, IcebergType]) -> tuple[IcebergType, bool]:
    """The Iceberg type of an Avro schema node, and whether it is optional (a union with null)."""
    if isinstance(node, list):
        rest = [n for n in node if n != "null"]
        if len(rest) != 1 or len(node) > 2:
            raise TableSchemaError(f"field {path!r}: a union must be null and one other type, got {node!r}")
        inner, _ = _avro_type(rest[0], path, ids, named)
        return inner, len(node) == 2
    if isinstance(node, str):
        if node in _AVRO_PRIMITIVES:
            return _AVRO_PRIMITIVES[node], False
        if node in named:
            return named[node], False
        raise TableSchemaError(f"field {path!r}: unsupported type {node!r}")
    if not isinstance(node, dict):
        raise TableSchemaError(f"field {path!r}: a type must be a name, a union or an object")
    kind = node.get("type")
    if kind == "record":
        fields = node.get("fields")
        if not isinstance(fields, list) or not fields:
            raise TableSchemaError(f"field {path or '(root)'!r}: a record needs fields")
        out = []
        for f in fields:
            name = f.get("name") if isinstance(f, dict) else None
            if not isinstance(f, dict) or not isinstance(name, str):
                raise TableSchemaError(f"field {path or '(root)'!r}: every field needs a name")
            sub = f"{path}.{name}" if path else name
            field_type, optional = _avro_type(f.get("type"), sub, ids, named)
            out.append(NestedField(ids(), name, field_type, required=not optional))
        struct = StructType(*out)
        record_name = node.get("name")
        if isinstance(record_name, str):
            named[record_name] = struct
        return struct, False
    if kind == "array":
        items, optional = _avro_type(node.get("items"), f"{path}[]", ids, named)
        return ListType(ids(), items, element_required=not optional), False
    if kind == "map":
        values, optional = _avro_type(node.get("values"), f"{path}{{}}", ids, named)
        return MapType(ids(), StringType(), ids(), values, value_required=not optional), False
    if kind == "enum":
        return StringType(), False
    if kind == "fixed":
        return BinaryType(), False
    if isinstance(kind, str) and kind in _AVRO_PRIMITIVES:  # {"type": "long", "logicalType": ...}
        return _AVRO_PRIMITIVES[kind], False
    raise TableSchemaError(f"field {path!r}: unsupported type {kind!r}")


def _without_logical_types(node: object) -> object:
    """The schema with its ``logicalType`` annotations dropped: fastavro then reads the underlying values."""
    if isinstance(node, list):
        return [_without_logical_types(n) for n in node]
    if isinstance(node, dict):
        return {k: _without_logical_types(v) for k, v in node.items() if k != "logicalType"}
    return node


def _avro(doc: dict[str, object]) -> ValueSchema:
    kind, _ = _avro_type(doc, "", _Ids(), {})
    assert isinstance(kind, StructType)
    plain = _without_logical_types(doc)
    assert isinstance(plain, dict)
    fields = plain["fields"]
    assert isinstance(fields, list)
    try:
        parsed = fastavro.parse_schema(plain)
    except Exception as err:  # fastavro's SchemaParseException and others: the schema's problem, said once
        raise TableSchemaError(f"not a valid Avro schema: {err}") from None
    prefixes: dict[int, fastavro.types.Schema] = {}

    def failing_field(value: bytes) -> str:
        """The first field a value that does not decode fails at: the shortest prefix of the record's fields that
        does not decode either (on the error path only; each prefix schema parsed once)."""
        for k in range(1, len(fields) + 1):
            if k not in prefixes:
                prefixes[k] = fastavro.parse_schema({**plain, "fields": fields[:k]})
            try:
                fastavro.schemaless_reader(io.BytesIO(value), prefixes[k], None)
            except Exception:
                return str(fields[k - 1]["name"])
        return "?"

    def decode(value: bytes) -> dict[str, object]:
        buffer = io.BytesIO(value)
        try:
            record = fastavro.schemaless_reader(buffer, parsed, None)
        except (EOFError, IndexError):  # fastavro's pure and C readers, at the end of the bytes
            raise ValueDecodeError(
                f"field {failing_field(value)!r}: Avro value ends early ({len(value)} bytes)"
            ) from None
        except Exception as err:  # a bad union index, bad UTF-8, ...: fastavro's message
            raise ValueDecodeError(
                f"field {failing_field(value)!r}: Avro value does not decode: {type(err).__name__}: {err}"
            ) from None
        extra = len(value) - buffer.tell()
        if extra:
            raise ValueDecodeError(f"Avro value has {extra} bytes past the end of the record")
        decoded = _arrow_maps(kind, record)
        assert isinstance(decoded, dict)
        return decoded

    return ValueSchema("avro", kind, decode)


def _avro_json(doc: dict[str, object]) -> ValueSchema:
    kind, _ = _avro_type(doc, "", _Ids(), {})
    assert isinstance(kind, StructType)
    _refuse_binary(kind, "")
    return _json_values(kind)


def _refuse_binary(kind: IcebergType, path: str) -> None:
    if isinstance(kind, BinaryType):
        raise TableSchemaError(
            f"field {path!r}: bytes in a JSON schema have no one encoding (Java's clients write base64, Python's "
            "the text itself): not decoded"
        )
    if isinstance(kind, StructType):
        for f in kind.fields:
            _refuse_binary(f.field_type, f"{path}.{f.name}" if path else f.name)
    elif isinstance(kind, ListType):
        _refuse_binary(kind.element_type, f"{path}[]")
    elif isinstance(kind, MapType):
        _refuse_binary(kind.value_type, f"{path}{{}}")


def _arrow_maps(kind: IcebergType, value: object) -> object:
    """A decoded Avro value as Arrow takes it: maps as lists of pairs."""
    if isinstance(kind, StructType) and isinstance(value, dict):
        return {f.name: _arrow_maps(f.field_type, value.get(f.name)) for f in kind.fields}
    if isinstance(kind, ListType) and isinstance(value, list):
        return [_arrow_maps(kind.element_type, v) for v in value]
    if isinstance(kind, MapType) and isinstance(value, dict):
        return [(k, _arrow_maps(kind.value_type, v)) for k, v in value.items()]
    return value


# -- evolution -----------------------------------------------------------------------------------------------------


def check_evolution(old: StructType, new: StructType, topic: str, path: str = "") -> None:
    """Refuse ``new`` as the successor of the table's ``old`` struct (module notes): ``TableSchemaError`` naming
    ``topic`` and the field."""
    old_fields = {f.name: f for f in old.fields}
    new_names = {f.name for f in new.fields}
    for f in new.fields:
        sub = f"{path}.{f.name}" if path else f.name
        before = old_fields.get(f.name)
        if before is None:
            if f.required:
                raise TableSchemaError(
                    f"{topic}: {KEY} adds the required field {sub!r}: rows already in the table have none "
                    "(add it as optional)"
                )
            continue
        if f.required and not before.required:
            raise TableSchemaError(f"{topic}: {KEY} makes the optional field {sub!r} required")
        _check_type(before.field_type, f.field_type, topic, sub)
    for name, before in old_fields.items():
        if name not in new_names and before.required:
            sub = f"{path}.{name}" if path else name
            raise TableSchemaError(f"{topic}: {KEY} removes the required field {sub!r}")


def _check_type(old: IcebergType, new: IcebergType, topic: str, path: str) -> None:
    if isinstance(old, StructType) and isinstance(new, StructType):
        check_evolution(old, new, topic, path)
    elif isinstance(old, ListType) and isinstance(new, ListType):
        if new.element_required and not old.element_required:
            raise TableSchemaError(f"{topic}: {KEY} makes the elements of {path!r} required")
        _check_type(old.element_type, new.element_type, topic, f"{path}[]")
    elif isinstance(old, MapType) and isinstance(new, MapType):
        if new.value_required and not old.value_required:
            raise TableSchemaError(f"{topic}: {KEY} makes the values of {path!r} required")
        _check_type(old.value_type, new.value_type, topic, f"{path}{{}}")
    elif old.is_primitive and new.is_primitive and old == new:
        return
    elif type(old) is not type(new) or old.is_primitive:
        raise TableSchemaError(f"{topic}: {KEY} changes the type of {path!r} from {old} to {new}")
