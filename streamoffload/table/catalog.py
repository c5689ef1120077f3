"""Where the tables are: an Iceberg catalog and a warehouse for their files.

Two kinds of catalog, both pyiceberg's own clients:

- a SQL catalog (``SqlCatalog``, over SQLAlchemy): SQLite, the embedded default, or PostgreSQL
  (``postgresql+psycopg2://user:password@host:5432/db``), the production choice: several writers on several
  hosts, and the catalog's compare-and-swap of a table's metadata pointer is a row update in one transaction;
- a REST catalog (``RestCatalog``: Apache Polaris, AWS Glue's and Unity Catalog's REST endpoints, Nessie,
  Iceberg's own REST server), named ``rest+http://host/path`` or ``rest+https://host/path`` (the ``rest+`` says
  which client; the rest is the server's base URI), configured by ``--catalog-property key=value``
  (``credential``, ``token``, ``scope``, ``oauth2-server-uri``, ``header.X-Iceberg-Access-Delegation``, ...:
  pyiceberg's REST catalog properties). The server commits each change only if the table is still at the
  snapshot the change was made from, which the sync relies on as it does on the SQL catalog's swap.

The embedded default, for a store on a filesystem, is under the store's directory: a SQLite catalog
``<store>/_iceberg/catalog.db`` and the warehouse ``<store>/_iceberg/warehouse`` (no topic directory starts
with ``_``, so nothing of the store's own is there, and the tier moves as one directory). A store on S3 has no
local directory: its catalog is named (``--catalog``). The warehouse defaults to ``warehouse`` beside a SQLite
catalog's file; another SQL catalog names one; a REST catalog's server chooses (``--warehouse``, if given, is
handed to it as its ``warehouse`` property, whose meaning is the server's: a location, or a catalog's name).

Secrets (a URI's password, a property whose name says it holds one) are registered with ``redaction``: no
message, log line or output of this process shows them, and :meth:`CatalogSettings.describe` masks them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlsplit

from pyiceberg.catalog import Catalog

from streamoffload.errors import ConfigError
from streamoffload.redaction import MASK, redact, register_secret
from streamoffload.storage.keys import TABLES_DIR
from streamoffload.storage.location import StoreLocation
from streamoffload.table.errors import TableError

CATALOG_NAME = "streamoffload"

REST_PREFIX = "rest+"
"""``--catalog rest+https://host/path``: pyiceberg's REST catalog on the server at ``https://host/path``."""

CatalogKind = Literal["sql", "rest"]

_SECRET_PROPERTY = re.compile(r"(?i)credential|token|secret|password|passwd|key|authorization|cookie|sas|signature")
"""A catalog property whose value is a secret: ``credential``, ``token``, ``s3.secret-access-key``,
``s3.access-key-id``, ``header.Authorization``, ``adls.account-key``, ``adls.sas-token``, ..."""


class TableConfigError(TableError, ConfigError):
    """A catalog or warehouse that cannot be used as given."""


def secret_property(name: str) -> bool:
    """Whether catalog property ``name`` holds a secret (its value is never shown)."""
    return _SECRET_PROPERTY.search(name) is not None


@dataclass(frozen=True)
class CatalogSettings:
    """A catalog: its kind, its URI (a SQL catalog's SQLAlchemy URI, a REST server's base ``http(s)://`` URI),
    the warehouse (a ``file://`` or ``s3://`` URL; a REST catalog's as given, or None: the server's choice), how
    to reach S3, and further catalog properties (``--catalog-property``)."""

    uri: str
    warehouse: str | None
    s3_endpoint: str | None = None
    s3_region: str | None = None
    kind: CatalogKind = "sql"
    extra: tuple[tuple[str, str], ...] = ()
    """More of pyiceberg's catalog properties, in the order given (``credential``, ``token``, ...)."""

    def __post_init__(self) -> None:
        register_secret(*_uri_secrets(self.uri), *(v for k, v in self.extra if secret_property(k)))

    def describe(self) -> str:
        """The catalog and warehouse for messages: a password in the URI or a secret property is never shown."""
        where = f"warehouse {self.warehouse}" if self.warehouse is not None else "warehouse chosen by the server"
        props = ", ".join(f"{k}={MASK if secret_property(k) else redact(v)}" for k, v in self.extra)
        shown = f"{REST_PREFIX}{redact(self.uri)}" if self.kind == "rest" else shown_uri(self.uri)
        return f"catalog {shown} ({where}{'; ' + props if props else ''})"

    def properties(self) -> dict[str, str]:
        """pyiceberg's catalog properties: ``uri``, ``warehouse``, the S3 endpoint and region, then ``extra``."""
        props = {"uri": self.uri}
        if self.warehouse is not None:
            props["warehouse"] = self.warehouse
        if self.s3_endpoint:
            props["s3.endpoint"] = self.s3_endpoint
        if self.s3_region:
            props["s3.region"] = self.s3_region
        props.update(self.extra)
        return props


def _uri_secrets(uri: str) -> list[str]:
    """The password of a URI, as written and decoded (``p%40ss`` is ``p@ss`` to the server), to register as
    secrets."""
    try:
        password = urlsplit(uri).password
    except ValueError:
        return []
    return [password, unquote(password)] if password else []


def shown_uri(uri: str) -> str:
    """A SQLAlchemy URI with its password masked."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(uri).render_as_string(hide_password=True)
    except ArgumentError:
        return "<not a SQLAlchemy URI>"


def catalog_uri(text: str) -> str:
    """``--catalog`` for a SQL catalog: a SQLAlchemy URI (``sqlite:///abs/file.db``, ``postgresql+psycopg2://...``)
    or the path of a SQLite file."""
    if "://" in text:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            make_url(text)
        except ArgumentError:
            raise TableConfigError(
                f"--catalog {shown_uri(text)}: not a SQLAlchemy URI (e.g. sqlite:////var/offload/catalog.db, "
                "postgresql+psycopg2://user:password@host/db, rest+https://host/path, or a path)"
            ) from None
        return text
    return f"sqlite:///{Path(text).resolve()}"


def rest_uri(text: str) -> str | None:
    """The server URI of ``--catalog rest+http(s)://host/path`` (None: not a REST catalog)."""
    if not text.lower().startswith(REST_PREFIX):
        return None
    uri = text[len(REST_PREFIX) :]
    try:
        parts = urlsplit(uri)
        ok = parts.scheme.lower() in ("http", "https") and bool(parts.hostname)
    except ValueError:
        ok = False
    if not ok:
        raise TableConfigError(
            f"--catalog {redact(text)}: a REST catalog is rest+http://host[:port]/path or rest+https://host/path"
        )
    return uri


def sqlite_file(uri: str) -> Path | None:
    """The file of a SQLite catalog URI (None for another database, SQLite in memory, or not a SQLAlchemy URI)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(uri)
    except ArgumentError:
        return None
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    return Path(url.database)


def warehouse_url(text: str) -> str:
    """``--warehouse``: a ``file://`` or ``s3://`` URL, or a directory."""
    scheme = urlsplit(text).scheme if "://" in text else ""
    if scheme in ("s3", "s3a"):
        return text
    if scheme == "file":
        return text
    if scheme:
        raise TableConfigError(f"--warehouse {text}: expected file:///dir, s3://bucket/prefix or a directory")
    return Path(text).resolve().as_uri()


def catalog_property(text: str) -> tuple[str, str]:
    """``--catalog-property key=value``: the pair (the value may hold ``=``; it is never shown)."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise TableConfigError(f"--catalog-property {key or '...'}: expected key=value (e.g. credential=id:secret)")
    return key, value


def catalog_settings(
    store: StoreLocation,
    catalog: str | None = None,
    warehouse: str | None = None,
    *,
    s3_endpoint: str | None = None,
    s3_region: str | None = None,
    properties: Mapping[str, str] | None = None,
) -> CatalogSettings:
    """The catalog and warehouse of ``store``'s tables: as given, else the defaults (module notes). ``properties``:
    more catalog properties (``--catalog-property``); ``uri`` is ``catalog``'s, and ``warehouse`` is
    ``warehouse``'s if both are given."""
    extra = tuple((properties or {}).items())
    for key, value in extra:
        if key == "uri" or (key == "warehouse" and warehouse is not None and value != warehouse):
            raise TableConfigError(
                f"--catalog-property {key}=...: give the catalog's {key} as --{'catalog' if key == 'uri' else key}"
            )
    rest = rest_uri(catalog) if catalog is not None else None
    if rest is not None:
        given = dict(extra)
        if warehouse is not None:
            given.setdefault("warehouse", warehouse)
        if s3_endpoint is None and store.scheme == "s3":  # tables beside the store: reach S3 as the store does
            s3_endpoint, s3_region = store.endpoint, s3_region or store.region
        items = tuple((k, v) for k, v in given.items() if k != "warehouse")
        return CatalogSettings(rest, given.get("warehouse"), s3_endpoint, s3_region, "rest", items)
    if catalog is None:
        if store.scheme != "file":
            raise TableConfigError(
                f"the store {store.describe()} has no local directory for the default SQLite catalog: give --catalog "
                "(a SQLAlchemy URI such as sqlite:////var/offload/catalog.db or postgresql+psycopg2://..., "
                "rest+https://host/path, or a path)"
            )
        root = Path(store.path).resolve() / TABLES_DIR
        uri = f"sqlite:///{root / 'catalog.db'}"
    else:
        uri = catalog_uri(catalog)
    register_secret(*_uri_secrets(uri))  # before any message could show it
    if warehouse is None:
        warehouse = dict(extra).get("warehouse")
    extra = tuple((k, v) for k, v in extra if k != "warehouse")
    if warehouse is None:
        db = sqlite_file(uri)
        if db is None:
            raise TableConfigError(
                f"--catalog {shown_uri(uri)} is not a SQLite file: give --warehouse (file:///dir or s3://bucket/prefix)"
            )
        location = (db.parent / "warehouse").as_uri()
    else:
        location = warehouse_url(warehouse)
    if s3_endpoint is None and store.scheme == "s3" and location.startswith(("s3://", "s3a://")):
        s3_endpoint, s3_region = store.endpoint, s3_region or store.region
    return CatalogSettings(uri, location, s3_endpoint, s3_region, "sql", extra)


def open_catalog(settings: CatalogSettings) -> Catalog:
    """The catalog: a SQL catalog's tables created if new (a SQLite file's directory too); a REST catalog's
    server asked for its configuration (so an unreachable server or refused credentials fail here, in one line)."""
    if settings.kind == "rest":
        return _open_rest(settings)
    db = sqlite_file(settings.uri)
    if db is not None:
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise TableConfigError(f"catalog {db}: cannot create its directory: {err.strerror or err}") from None
    if settings.warehouse is not None and settings.warehouse.startswith("file://"):
        path = Path(urlsplit(settings.warehouse).path)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise TableConfigError(f"warehouse {path}: cannot create it: {err.strerror or err}") from None
    from pyiceberg.catalog.sql import SqlCatalog
    from sqlalchemy.exc import SQLAlchemyError

    try:
        return SqlCatalog(CATALOG_NAME, **settings.properties())
    except SQLAlchemyError as err:
        raise TableConfigError(f"{settings.describe()}: cannot open it: {_sql_cause(err)}") from None
    except ModuleNotFoundError as err:  # the database's driver (psycopg2 for PostgreSQL)
        raise TableConfigError(
            f"{settings.describe()}: its driver {err.name} is not installed (pip install 'streamoffload[table]')"
        ) from None


def _sql_cause(err: Exception) -> str:
    """A database error in one line: its class, and the driver's first line (``connection refused``, ``password
    authentication failed for user ...``), without the SQL or its parameters; secrets masked."""
    orig = getattr(err, "orig", None)
    first = str(orig).strip().splitlines()[0] if orig is not None and str(orig).strip() else ""
    return redact(f"{type(err).__name__}: {first}" if first else type(err).__name__)


def _open_rest(settings: CatalogSettings) -> Catalog:
    from pyiceberg.catalog.rest import RestCatalog
    from pyiceberg.exceptions import RESTError
    from requests.exceptions import RequestException

    try:
        return RestCatalog(CATALOG_NAME, **settings.properties())
    except (RESTError, RequestException, ValueError) as err:
        cause = str(err).strip().splitlines()[0] if str(err).strip() else ""
        shown = redact(f"{type(err).__name__}: {cause}" if cause else type(err).__name__)
        raise TableConfigError(f"{settings.describe()}: cannot open it: {shown}") from None
