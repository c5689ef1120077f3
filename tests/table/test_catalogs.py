"""The table on its other catalogs: PostgreSQL (pyiceberg's SQL catalog over psycopg2, a real server started by
``tests/fixtures/postgres.py``) and a REST catalog (pyiceberg's ``RestCatalog`` against Apache Iceberg's own REST
server, ``tests/fixtures/iceberg_rest.py``), a warehouse on S3 (moto), and secrets kept out of every message.

The sync, incremental sync, racing writers and rebuild tests of ``test_table_sync.py`` run here again, each
on both catalogs, through this module's ``tier`` fixture: the same assertions, the same three readers (pyiceberg,
polars, DuckDB over the files the manifests list)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import duckdb
import polars as pl
import pytest

from streamoffload.cli import main
from streamoffload.redaction import MASK
from streamoffload.storage.location import parse_store_url
from streamoffload.table.catalog import (
    CatalogSettings,
    TableConfigError,
    catalog_property,
    catalog_settings,
    open_catalog,
)
from streamoffload.table.sync import sync_topic
from tests.fixtures.iceberg_rest import IcebergRestServer
from tests.fixtures.postgres import PostgresServer
from tests.fixtures.s3 import S3_CREDENTIALS, S3_REGION
from tests.table import test_table_sync as on_sqlite
from tests.table.offload import Row, TopicOffload, row_tuple
from tests.table.test_table_sync import PARTS, TOPIC, Tier, current_files, pyiceberg_rows

CATALOGS = ["postgresql", "rest"]


@pytest.fixture(params=CATALOGS)
def tier(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Tier]:
    """``test_table_sync``'s tier with its catalog on PostgreSQL (a new database, a warehouse directory) or on the
    REST server (emptied first; its warehouse is the server's)."""
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")
    location = parse_store_url(str(tmp_path / "store"))
    if request.param == "postgresql":
        uri: str = request.getfixturevalue("postgres_catalog_uri")
        settings = catalog_settings(location, uri, str(tmp_path / "warehouse"))
    else:
        server: IcebergRestServer = request.getfixturevalue("iceberg_rest_catalog")
        settings = catalog_settings(location, server.catalog)
    scoped = location.open()
    yield Tier(location, scoped, settings, open_catalog(settings), [TopicOffload(scoped, t) for t in PARTS])
    scoped.store.close()


# test_table_sync's tests, collected here too: each runs on this module's tier (both catalogs).
test_sync_publishes_every_message_once_with_its_columns = (
    on_sqlite.test_sync_publishes_every_message_once_with_its_columns
)
test_a_second_sync_appends_exactly_the_new_segments_and_a_replay_nothing = (
    on_sqlite.test_a_second_sync_appends_exactly_the_new_segments_and_a_replay_nothing
)
test_two_writers_racing_never_append_twice = on_sqlite.test_two_writers_racing_never_append_twice
test_rebuild_derives_the_table_again = on_sqlite.test_rebuild_derives_the_table_again


def test_the_catalogs_are_what_they_say(tier: Tier) -> None:
    """PostgreSQL holds the catalog's rows; the REST server answers for a table whose files are in its warehouse."""
    on_sqlite.publish(tier, (4, 3))
    sync_topic(tier.scoped, tier.catalog, TOPIC)
    if tier.settings.kind == "sql":
        import sqlalchemy

        engine = sqlalchemy.create_engine(tier.settings.uri)
        with engine.connect() as conn:
            assert engine.dialect.name == "postgresql"
            rows = conn.execute(
                sqlalchemy.text("SELECT catalog_name, table_namespace, table_name FROM iceberg_tables")
            ).fetchall()
        engine.dispose()
        assert [tuple(r) for r in rows] == [("streamoffload", "public.default", "orders")]
    else:
        from pyiceberg.catalog.rest import RestCatalog

        assert isinstance(tier.catalog, RestCatalog)
        table = tier.table()
        # The server wrote the table's metadata file, under the warehouse it was started with.
        written = urlsplit(table.metadata_location)  # file:/abs/...: Hadoop's spelling of a file URL
        assert written.scheme == "file" and written.path.endswith(".metadata.json")
        assert Path(written.path).is_file()
        assert table.metadata.location.endswith("/public/default/orders")


# --- PostgreSQL: its password in no message, log line or output ---


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["table", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_postgresql_password_never_shows(
    postgres_server: PostgresServer,
    postgres_catalog_uri: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    root = tmp_path / "store"
    offload = TopicOffload(parse_store_url(str(root)).open(), AUDIT)
    offload.publish(9)
    args = ["--store", str(root), "--catalog", postgres_catalog_uri, "--warehouse", str(tmp_path / "wh")]
    code, out, err = run_cli(capsys, "sync", *args, "--json")
    assert code == 0, err
    doc = json.loads(out)["tables"][0]
    assert doc["table"] == "public.default.audit" and doc["rows"] == len(offload.rows)
    assert doc["positions"] == {AUDIT: [3, 8]}
    code, text, err = run_cli(capsys, "show", *args)
    assert code == 0 and text.startswith("public.default.audit (persistent://public/default/audit): snapshot ")
    code, shown, _ = run_cli(capsys, "show", *args, "--json")
    assert code == 0 and json.loads(shown)["tables"][0]["rows"] == len(offload.rows)
    # A wrong password: PostgreSQL refuses it, in one line that shows neither password.
    wrong = postgres_catalog_uri.replace(postgres_server.password, "not-the-password-42")
    code, bad_out, bad_err = run_cli(capsys, "show", *args[:3], wrong, *args[4:])
    assert code == 1 and bad_out == ""
    assert bad_err.count("\n") == 1 and "password authentication failed for user" in bad_err, bad_err
    assert f": catalog postgresql+psycopg2://***@127.0.0.1:{postgres_server.port}/catalog_" in bad_err
    # Nothing unreachable says more: a port where nothing listens.
    gone = postgres_catalog_uri.replace(f":{postgres_server.port}/", ":1/")
    code, _, gone_err = run_cli(capsys, "sync", *args[:3], gone, *args[4:])
    assert code == 1 and gone_err.count("\n") == 1 and "cannot open it: OperationalError" in gone_err, gone_err
    everything = out + text + shown + err + bad_out + bad_err + gone_err + caplog.text
    for secret in (postgres_server.password, "not-the-password-42"):
        assert secret not in everything
    settings = catalog_settings(parse_store_url(str(root)), postgres_catalog_uri, str(tmp_path / "wh"))
    assert postgres_server.password not in settings.describe() + repr(open_catalog(settings).engine)


AUDIT = "persistent://public/default/audit"


# --- REST: the CLI's flags, properties, secrets redacted ---


def test_rest_catalog_from_the_cli_with_properties(
    iceberg_rest_catalog: IcebergRestServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--catalog rest+http://...`` with an OAuth2 client credential (exchanged for a token at the server's token
    endpoint, which grants any client) and a header as properties: sync, show and an incremental sync, read back
    exactly by pyiceberg and DuckDB; the client secret shows nowhere."""
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")
    caplog.set_level(logging.DEBUG)
    credential = "streamoffload:client-secret-0f9e8d7c6b5a"
    token_endpoint = f"{iceberg_rest_catalog.url}/v1/oauth/tokens"
    root = tmp_path / "store"
    scoped = parse_store_url(str(root)).open()
    offload = TopicOffload(scoped, AUDIT)
    offload.publish(11)
    args = [
        "--store",
        str(root),
        "--catalog",
        iceberg_rest_catalog.catalog,
        "--catalog-property",
        f"credential={credential}",
        "--catalog-property",
        f"oauth2-server-uri={token_endpoint}",
        "--catalog-property",
        "header.X-Streamoffload-Test=yes",
    ]
    code, out, err = run_cli(capsys, "sync", *args)
    assert code == 0, err
    assert out.startswith(f"{AUDIT} -> public.default.audit: appended {len(offload.rows)} message(s) of 1 segment(s)")
    offload.publish(6)
    code, again, err = run_cli(capsys, "sync", *args, "--json")
    assert code == 0, err
    assert json.loads(again)["tables"][0]["positions"] == {AUDIT: [3, 16]}
    code, shown, err = run_cli(capsys, "show", *args)
    assert code == 0 and f"  {AUDIT}: table at 3:16, store at 3:16: caught up" in shown
    properties = {"credential": credential, "oauth2-server-uri": token_endpoint}
    settings = catalog_settings(parse_store_url(str(root)), iceberg_rest_catalog.catalog, properties=properties)
    table = open_catalog(settings).load_table("public.default.audit")
    expected = sorted(offload.rows, key=lambda r: r.position)
    assert pyiceberg_rows(table) == expected and on_sqlite.duckdb_rows(table) == expected
    assert all(f.startswith(iceberg_rest_catalog.warehouse.as_uri()) for f in current_files(table))
    assert settings.describe() == (
        f"catalog {iceberg_rest_catalog.catalog} (warehouse chosen by the server; credential=***, "
        f"oauth2-server-uri={token_endpoint})"
    )
    assert "client-secret-0f9e8d7c6b5a" not in out + again + shown + err + caplog.text
    # The credential is used: a token endpoint that is not there fails the sync, in one line without the secret.
    args[args.index(f"oauth2-server-uri={token_endpoint}")] = f"oauth2-server-uri={token_endpoint}-missing"
    code, no_out, no_token = run_cli(capsys, "sync", *args)
    assert code == 1 and no_out == "" and no_token.count("\n") == 1 and "cannot open it: " in no_token, no_token
    assert "client-secret-0f9e8d7c6b5a" not in no_token
    scoped.store.close()


def test_rest_errors_are_one_line_and_keep_secrets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A REST server that is not there, asked for an OAuth token with a client secret: one line, no secret."""
    from bench.s3_endpoint import free_port

    root = tmp_path / "store"
    TopicOffload(parse_store_url(str(root)).open(), AUDIT).publish(2)
    port = free_port()
    credential = "client-id:client-secret-5a4b3c2d"
    argv = ["--store", str(root), "--catalog", f"rest+http://127.0.0.1:{port}/api", "--catalog-property"]
    code, out, err = run_cli(capsys, "sync", *argv, f"credential={credential}")
    assert code == 1 and out == "" and err.count("\n") == 1, err
    assert err.startswith(
        f"streamoffload table: error: catalog rest+http://127.0.0.1:{port}/api (warehouse chosen by the server; "
        "credential=***): cannot open it: "
    ), err
    assert "client-secret-5a4b3c2d" not in err


@pytest.mark.parametrize(
    ("catalog", "properties", "message"),
    [
        ("rest+ftp://h/p", {}, "--catalog rest+ftp://h/p: a REST catalog is rest+http://host[:port]/path"),
        ("rest+https://", {}, "--catalog rest+https://: a REST catalog is rest+http://host[:port]/path or rest+https"),
        (
            "rest+https://h/p",
            {"uri": "https://other"},
            "--catalog-property uri=...: give the catalog's uri as --catalog",
        ),
        ("sqlite:////tmp/c.db", {"uri": "x"}, "--catalog-property uri=...: give the catalog's uri as --catalog"),
    ],
)
def test_catalog_settings_refuse_what_cannot_work(catalog: str, properties: dict[str, str], message: str) -> None:
    with pytest.raises(TableConfigError) as err:
        catalog_settings(parse_store_url("/tmp/store"), catalog, properties=properties)
    assert str(err.value).startswith(message), err.value


def test_catalog_settings_of_each_kind() -> None:
    store = parse_store_url("/srv/store")
    rest = catalog_settings(
        store,
        "rest+https://user:pass-0123456789@polaris.example/api/catalog",
        "analytics",
        properties={"credential": "id:secret-abcdef12", "scope": "PRINCIPAL_ROLE:ALL", "s3.secret-access-key": "k"},
    )
    assert rest == CatalogSettings(
        "https://user:pass-0123456789@polaris.example/api/catalog",
        "analytics",
        kind="rest",
        extra=(("credential", "id:secret-abcdef12"), ("scope", "PRINCIPAL_ROLE:ALL"), ("s3.secret-access-key", "k")),
    )
    assert rest.properties() == {
        "uri": "https://user:pass-0123456789@polaris.example/api/catalog",
        "warehouse": "analytics",
        "credential": "id:secret-abcdef12",
        "scope": "PRINCIPAL_ROLE:ALL",
        "s3.secret-access-key": "k",
    }
    assert rest.describe() == (
        "catalog rest+https://***@polaris.example/api/catalog (warehouse analytics; credential=***, "
        "scope=PRINCIPAL_ROLE:ALL, s3.secret-access-key=***)"
    )
    # The warehouse as a property is the same as --warehouse; two different ones are refused.
    by_property = catalog_settings(store, "rest+http://h:8181", properties={"warehouse": "w"})
    assert by_property.warehouse == "w" and by_property.extra == ()
    with pytest.raises(TableConfigError, match="give the catalog's warehouse as --warehouse"):
        catalog_settings(store, "rest+http://h:8181", "w1", properties={"warehouse": "w2"})
    pg = catalog_settings(store, "postgresql+psycopg2://offload:pw-0123456789@db:5432/iceberg", "/srv/wh")
    assert pg == CatalogSettings("postgresql+psycopg2://offload:pw-0123456789@db:5432/iceberg", "file:///srv/wh")
    assert pg.describe() == "catalog postgresql+psycopg2://offload:***@db:5432/iceberg (warehouse file:///srv/wh)"
    # A store on S3: a REST catalog's client reaches S3 as the store does.
    s3 = parse_store_url("s3://bucket/pulsar", endpoint="http://127.0.0.1:9000", region="eu-west-1")
    on_s3 = catalog_settings(s3, "rest+http://h:8181")
    assert (on_s3.s3_endpoint, on_s3.s3_region) == ("http://127.0.0.1:9000", "eu-west-1")
    assert catalog_property("credential=id:se=cret") == ("credential", "id:se=cret")
    for bad in ("credential", "=x"):
        with pytest.raises(TableConfigError, match="expected key=value"):
            catalog_property(bad)


def test_a_secret_property_is_masked_in_any_later_message() -> None:
    """Secret values are registered with the redaction: an error that echoes one (a server's error body) masks it."""
    from streamoffload.redaction import redact

    catalog_settings(parse_store_url("/srv/store"), "rest+http://h:1", properties={"token": "tok-9a8b7c6d5e4f"})
    assert redact("401: token tok-9a8b7c6d5e4f is expired") == f"401: token {MASK} is expired"
    # A URI's password, as written (percent-encoded) and as the server knows it.
    catalog_settings(parse_store_url("/srv/store"), "postgresql+psycopg2://u:p%40ss-76543210@db/x", "/srv/wh")
    assert redact("auth p@ss-76543210 / p%40ss-76543210") == f"auth {MASK} / {MASK}"


# --- a warehouse on S3 with the PostgreSQL catalog ---


def test_a_store_on_s3_synced_into_an_s3_warehouse(
    postgres_catalog_uri: str,
    moto_server: str,
    s3_bucket: str,
    s3_client: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A store on moto, its table's files in the same bucket under iceberg/, the catalog on PostgreSQL: read back
    exactly by pyiceberg and polars through S3, and by DuckDB over the files the manifests list (fetched)."""
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", S3_CREDENTIALS["access_key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", S3_CREDENTIALS["secret_key"])
    location = parse_store_url(f"s3://{s3_bucket}/pulsar", endpoint=moto_server, region=S3_REGION)
    scoped = location.open()
    try:
        offloads = [TopicOffload(scoped, t) for t in PARTS]
        expected = sorted((r for o, n in zip(offloads, (14, 9), strict=True) for r in o.publish(n)), key=_pos)
        settings = catalog_settings(location, postgres_catalog_uri, f"s3://{s3_bucket}/iceberg")
        assert (settings.s3_endpoint, settings.s3_region) == (moto_server, S3_REGION)
        report = sync_topic(scoped, open_catalog(settings), TOPIC)
        assert report.created and report.rows == len(expected)
        table = open_catalog(settings).load_table("public.default.orders")
        assert table.metadata.location == f"s3://{s3_bucket}/iceberg/public.default/orders"
        files = current_files(table)
        assert files and all(f.startswith(f"s3://{s3_bucket}/iceberg/public.default/orders/data/") for f in files)
        listed = s3_client.list_objects_v2(Bucket=s3_bucket, Prefix="iceberg/")
        keys = {o["Key"] for o in listed.get("Contents", [])}
        assert {f.removeprefix(f"s3://{s3_bucket}/") for f in files} <= keys
        assert pyiceberg_rows(table) == expected
        storage = {
            "aws_endpoint_url": moto_server,
            "aws_region": S3_REGION,
            "aws_access_key_id": S3_CREDENTIALS["access_key"],
            "aws_secret_access_key": S3_CREDENTIALS["secret_key"],
            "aws_allow_http": "true",
        }
        by_polars = pl.scan_iceberg(table, storage_options=storage).collect().to_dicts()
        assert sorted((row_tuple(d) for d in by_polars), key=_pos) == expected
        local = []
        for i, f in enumerate(files):
            body = s3_client.get_object(Bucket=s3_bucket, Key=f.removeprefix(f"s3://{s3_bucket}/"))["Body"].read()
            (tmp_path / f"{i}.parquet").write_bytes(body)
            local.append(str(tmp_path / f"{i}.parquet"))
        relation = duckdb.connect().read_parquet(local)
        docs = [dict(zip(relation.columns, values, strict=True)) for values in relation.fetchall()]
        assert sorted((row_tuple(d) for d in docs), key=_pos) == expected
        # The next sync finds the position in the table on S3: nothing to append.
        assert sync_topic(scoped, open_catalog(settings), TOPIC).commits == []
    finally:
        scoped.store.close()


def _pos(row: Row) -> tuple[str, int, int, int]:
    return row.position
