"""Where the tables are: an Iceberg SQL catalog (pyiceberg's, over SQLAlchemy) and a warehouse for their files.

The embedded default, for a store on a filesystem, is under the store's directory: a SQLite catalog
``<store>/_iceberg/catalog.db`` and the warehouse ``<store>/_iceberg/warehouse`` (no topic directory starts
with ``_``, so nothing of the store's own is there, and the tier moves as one directory). A store on S3 has no
local directory: its catalog is named (``--catalog``). The warehouse defaults to ``warehouse`` beside a SQLite
catalog's file; any other catalog names one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from pyiceberg.catalog.sql import SqlCatalog

from streamoffload.errors import ConfigError
from streamoffload.storage.keys import TABLES_DIR
from streamoffload.storage.location import StoreLocation
from streamoffload.table.errors import TableError

CATALOG_NAME = "streamoffload"


class TableConfigError(TableError, ConfigError):
    """A catalog or warehouse that cannot be used as given."""


@dataclass(frozen=True)
class CatalogSettings:
    """A SQL catalog's SQLAlchemy URI, the warehouse (a ``file://`` or ``s3://`` URL) and how to reach S3."""

    uri: str
    warehouse: str
    s3_endpoint: str | None = None
    s3_region: str | None = None

    def describe(self) -> str:
        """The catalog and warehouse for messages: a password in the URI is never shown."""
        return f"catalog {shown_uri(self.uri)} (warehouse {self.warehouse})"

    def properties(self) -> dict[str, str]:
        props = {"uri": self.uri, "warehouse": self.warehouse}
        if self.s3_endpoint:
            props["s3.endpoint"] = self.s3_endpoint
        if self.s3_region:
            props["s3.region"] = self.s3_region
        return props


def shown_uri(uri: str) -> str:
    """A SQLAlchemy URI with its password masked."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(uri).render_as_string(hide_password=True)
    except ArgumentError:
        return "<not a SQLAlchemy URI>"


def catalog_uri(text: str) -> str:
    """``--catalog``: a SQLAlchemy URI (``sqlite:///abs/file.db``, ``postgresql+psycopg2://...``) or the path of a
    SQLite file."""
    if "://" in text:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            make_url(text)
        except ArgumentError:
            raise TableConfigError(
                f"--catalog {shown_uri(text)}: not a SQLAlchemy URI (e.g. sqlite:////var/offload/catalog.db, or a path)"
            ) from None
        return text
    return f"sqlite:///{Path(text).resolve()}"


def sqlite_file(uri: str) -> Path | None:
    """The file of a SQLite catalog URI (None for another database, or SQLite in memory)."""
    from sqlalchemy.engine import make_url

    url = make_url(uri)
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


def catalog_settings(
    store: StoreLocation,
    catalog: str | None = None,
    warehouse: str | None = None,
    *,
    s3_endpoint: str | None = None,
    s3_region: str | None = None,
) -> CatalogSettings:
    """The catalog and warehouse of ``store``'s tables: as given, else the defaults (module notes)."""
    if catalog is None:
        if store.scheme != "file":
            raise TableConfigError(
                f"the store {store.describe()} has no local directory for the default SQLite catalog: give --catalog "
                "(a SQLAlchemy URI such as sqlite:////var/offload/catalog.db, or a path)"
            )
        root = Path(store.path).resolve() / TABLES_DIR
        uri = f"sqlite:///{root / 'catalog.db'}"
    else:
        uri = catalog_uri(catalog)
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
    return CatalogSettings(uri, location, s3_endpoint, s3_region)


def open_catalog(settings: CatalogSettings) -> SqlCatalog:
    """The SQL catalog (its tables created if new; a SQLite file's directory too)."""
    db = sqlite_file(settings.uri)
    if db is not None:
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise TableConfigError(f"catalog {db}: cannot create its directory: {err.strerror or err}") from None
    if settings.warehouse.startswith("file://"):
        path = Path(urlsplit(settings.warehouse).path)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise TableConfigError(f"warehouse {path}: cannot create it: {err.strerror or err}") from None
    from sqlalchemy.exc import SQLAlchemyError

    try:
        return SqlCatalog(CATALOG_NAME, **settings.properties())
    except SQLAlchemyError as err:
        raise TableConfigError(f"{settings.describe()}: cannot open it: {type(err).__name__}") from None
